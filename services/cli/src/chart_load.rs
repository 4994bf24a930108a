//! The PNG of `tandem bench load`: left, aggregate tok/s against concurrent clients; right,
//! per-user tok/s against concurrent clients; one line per mode (plain grey, fixed γ red,
//! scheduled blue; with several rounds, their mean). The x axis is logarithmic in the
//! clients (1, 2, 4, …).

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use crate::bench_load::{Level, LoadMode, LoadReport};
use crate::chart::{err, register_font, FONT};

const SIZE: (u32, u32) = (1200, 520);

/// Draws `report` into `path`.
pub fn draw(path: &Path, report: &LoadReport) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let title = |what: &str| {
        format!(
            "{what}, {} tokens, T = {}{}",
            report.max_tokens,
            report.temperature,
            if report.batching { "" } else { ", unbatched" }
        )
    };
    panel(
        &left.margin(10, 10, 10, 20),
        &title("aggregate tok/s"),
        &report.levels,
        |l| l.aggregate_tok_s,
    )?;
    panel(
        &right.margin(10, 10, 10, 20),
        &title("per-user tok/s"),
        &report.levels,
        |l| l.per_user_tok_s,
    )?;
    root.present().map_err(err)
}

fn colour(mode: LoadMode) -> RGBColor {
    match mode {
        LoadMode::Plain => RGBColor(120, 120, 120),
        LoadMode::Fixed => RGBColor(200, 40, 40),
        LoadMode::Scheduled => RGBColor(40, 80, 200),
    }
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    levels: &[Level],
    y: fn(&Level) -> f64,
) -> Result<()> {
    let x = |l: &Level| (l.concurrency as f64).log2();
    let x_max = levels.iter().map(x).fold(1.0, f64::max);
    let y_max = levels.iter().map(y).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 20))
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(-0.2..x_max + 0.2, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(x_max as usize + 1)
        .x_label_formatter(&|v| format!("{:.0}", 2f64.powf(v.round())))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_desc("concurrent clients")
        .y_desc("tok/s")
        .label_style((FONT, 15))
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    for mode in [LoadMode::Plain, LoadMode::Fixed, LoadMode::Scheduled] {
        let points = means(levels, mode, x, y);
        if points.is_empty() {
            continue;
        }
        let c = colour(mode);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(format!("{mode:?}").to_lowercase())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// `(x, mean y)` of `mode`'s levels at each concurrency, in the order first run.
fn means(
    levels: &[Level],
    mode: LoadMode,
    x: impl Fn(&Level) -> f64,
    y: fn(&Level) -> f64,
) -> Vec<(f64, f64)> {
    let mut sums: Vec<(usize, f64, f64, usize)> = Vec::new();
    for l in levels.iter().filter(|l| l.mode == mode) {
        match sums.iter_mut().find(|s| s.0 == l.concurrency) {
            Some(s) => (s.2, s.3) = (s.2 + y(l), s.3 + 1),
            None => sums.push((l.concurrency, x(l), y(l), 1)),
        }
    }
    sums.into_iter()
        .map(|(_, x, total, n)| (x, total / n as f64))
        .collect()
}
