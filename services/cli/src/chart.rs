//! The PNG of `tandem bench speculative`, drawn with plotters' bitmap backend and no text
//! (no font or system library needed). Left panel: acceptance rate per draft position
//! (x: position 1..γ, y: 0..1), one line per γ, greedy in full colour, sampled paler.
//! Right panel: speedup over plain decoding against γ (y from 0 to the largest speedup,
//! at least 2; a grey line marks 1×), greedy red, sampled blue. Axes are black lines;
//! the JSON holds the numbers.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::bench_spec::Mode;

const SIZE: (u32, u32) = (1200, 500);

/// Draws `modes` (greedy first, then sampled) into `path`.
pub fn draw(path: &Path, modes: &[Mode]) -> Result<()> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    acceptance(&left.margin(30, 30, 30, 30), modes)?;
    speedup(&right.margin(30, 30, 30, 30), modes)?;
    root.present().map_err(err)
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("{e:?}")
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn acceptance(area: &Area<'_>, modes: &[Mode]) -> Result<()> {
    let max_gamma = modes
        .iter()
        .flat_map(|m| m.runs.iter().map(|r| r.gamma))
        .max()
        .unwrap_or(1);
    let mut chart = ChartBuilder::on(area)
        .build_cartesian_2d(0.5f64..max_gamma as f64 + 0.5, 0f64..1.05)
        .map_err(err)?;
    axes(&mut chart, (0.5, max_gamma as f64 + 0.5), 0.0)?;
    for (mi, m) in modes.iter().enumerate() {
        for (ri, r) in m.runs.iter().enumerate() {
            let base = Palette99::pick(ri).to_rgba();
            let color = if mi == 0 { base } else { base.mix(0.4) };
            let pts: Vec<(f64, f64)> = r
                .acceptance_per_position
                .iter()
                .enumerate()
                .map(|(k, a)| ((k + 1) as f64, *a))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
                .map_err(err)?;
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
                .map_err(err)?;
        }
    }
    Ok(())
}

fn speedup(area: &Area<'_>, modes: &[Mode]) -> Result<()> {
    let max_gamma = modes
        .iter()
        .flat_map(|m| m.runs.iter().map(|r| r.gamma))
        .max()
        .unwrap_or(1) as f64;
    let top = modes
        .iter()
        .flat_map(|m| m.runs.iter().map(|r| r.speedup))
        .fold(2.0f64, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(area)
        .build_cartesian_2d(0f64..max_gamma + 1.0, 0f64..top)
        .map_err(err)?;
    axes(&mut chart, (0.0, max_gamma + 1.0), 0.0)?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, 1.0), (max_gamma + 1.0, 1.0)],
            RGBColor(160, 160, 160).stroke_width(2),
        ))
        .map_err(err)?;
    for (mi, m) in modes.iter().enumerate() {
        let color = if mi == 0 { RED } else { BLUE };
        let pts: Vec<(f64, f64)> = m.runs.iter().map(|r| (r.gamma as f64, r.speedup)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
            .map_err(err)?;
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 5, color.filled())))
            .map_err(err)?;
    }
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The x axis at `y0` and the y axis at the left end, as plain black lines.
fn axes(chart: &mut Chart<'_, '_>, (x0, x1): (f64, f64), y0: f64) -> Result<()> {
    let top = chart.y_range().end;
    chart
        .draw_series(LineSeries::new([(x0, y0), (x1, y0)], BLACK.stroke_width(2)))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            [(x0, y0), (x0, top)],
            BLACK.stroke_width(2),
        ))
        .map_err(err)?;
    Ok(())
}
