//! The reliability diagram of `tandem calibrate`: one small panel per sampling regime (rows)
//! and draft position (columns) for the model's tokens, x the confidence, y the measured
//! acceptance on held-out rounds, one dot per confidence bin (its area grows with its count)
//! before calibration in grey and after in blue, the diagonal of perfect calibration, and
//! the expected calibration error before → after in each panel's caption.

use std::path::Path;

use anyhow::{bail, Result};
use plotters::prelude::*;

use crate::calibrate::{Bin, SourceReport};
use crate::chart::{err, register_font, FONT};

/// Pixels of one panel.
const PANEL: u32 = 230;

/// Draws the model-token panels of `sources` into `path`.
pub fn draw(path: &Path, sources: &[SourceReport]) -> Result<()> {
    let rows: Vec<&SourceReport> = sources.iter().filter(|s| s.source == "model").collect();
    let cols = rows.iter().map(|s| s.positions.len()).max().unwrap_or(0);
    if rows.is_empty() || cols == 0 {
        bail!("no model tokens were observed: nothing to draw");
    }
    register_font()?;
    let size = (PANEL * cols as u32, PANEL * rows.len() as u32 + 40);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (title, body) = root.split_vertically(40);
    title
        .titled(
            "Reliability of the drafter's confidences on held-out rounds (grey: raw, blue: calibrated)",
            (FONT, 20),
        )
        .map_err(err)?;
    let panels = body.split_evenly((rows.len(), cols));
    for (r, s) in rows.iter().enumerate() {
        for (k, p) in s.positions.iter().enumerate() {
            let caption = format!(
                "{} pos {}: {:.3}→{:.3}",
                regime(s.temperature),
                p.position,
                p.ece_before,
                p.ece_after
            );
            panel(&panels[r * cols + k], &caption, &p.before, &p.after)?;
        }
    }
    root.present().map_err(err)
}

fn regime(t: f32) -> String {
    match t {
        0.0 => "greedy".into(),
        t => format!("T={t}"),
    }
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn panel(area: &Area<'_>, caption: &str, before: &[Bin], after: &[Bin]) -> Result<()> {
    let mut chart = ChartBuilder::on(&area.margin(4, 4, 4, 4))
        .caption(caption, (FONT, 13))
        .x_label_area_size(22)
        .y_label_area_size(30)
        .build_cartesian_2d(0.0..1.0, 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(3)
        .y_labels(3)
        .label_style((FONT, 11))
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, 0.0), (1.0, 1.0)],
            RGBColor(170, 170, 170).stroke_width(1),
        ))
        .map_err(err)?;
    let total: usize = before.iter().map(|b| b.n).sum::<usize>().max(1);
    for (bins, color) in [(before, RGBColor(150, 150, 150)), (after, BLUE)] {
        let dots = bins.iter().map(|b| {
            let radius = 2 + (12.0 * (b.n as f64 / total as f64).sqrt()) as u32;
            Circle::new(
                (b.confidence, b.acceptance),
                radius,
                color.mix(0.7).filled(),
            )
        });
        chart.draw_series(dots).map_err(err)?;
    }
    Ok(())
}
