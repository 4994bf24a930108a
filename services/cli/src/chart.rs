//! The PNG of `tandem bench speculative`, drawn with plotters' bitmap backend and a font
//! compiled into the binary (Hack, from `epaint_default_fonts`), so it needs no system
//! font. Left panel: acceptance rate per draft position (x: position 1..γ, y: 0..1), one
//! line per γ, greedy in full colour, sampled paler. Right panel: speedup over plain
//! decoding against γ (y from 0 to the largest speedup, at least 2; a grey line marks 1×),
//! greedy red, sampled blue. The JSON holds the numbers; `tandem bench chart` draws the
//! chart again from a saved JSON report.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde::Deserialize;

use crate::bench_spec::Mode;

const SIZE: (u32, u32) = (1200, 520);
/// The family every text of the chart uses.
pub(crate) const FONT: &str = "sans-serif";

/// Flags of `tandem bench chart`.
#[derive(Args, Debug)]
pub struct ChartArgs {
    /// A report written by `tandem bench speculative --json`.
    #[arg(long)]
    json: PathBuf,
    /// Where to draw the chart.
    #[arg(long)]
    png: PathBuf,
}

/// The part of a saved report the chart reads.
#[derive(Deserialize)]
struct Saved {
    modes: Vec<Mode>,
}

/// Draws the chart of the report at `a.json` into `a.png`.
pub fn redraw(a: ChartArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.json)
        .with_context(|| format!("reading {}", a.json.display()))?;
    let saved: Saved = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a `tandem bench speculative` report",
            a.json.display()
        )
    })?;
    draw(&a.png, &saved.modes).with_context(|| format!("drawing {}", a.png.display()))
}

/// Draws `modes` (greedy first, then sampled) into `path`.
pub fn draw(path: &Path, modes: &[Mode]) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    acceptance(&left.margin(10, 10, 10, 20), modes)?;
    speedup(&right.margin(10, 10, 10, 20), modes)?;
    root.present().map_err(err)
}

/// Registers the embedded font once per process.
pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR)
            .is_ok()
    });
    match ok {
        true => Ok(()),
        false => Err(anyhow!("the embedded chart font is not a valid font")),
    }
}

pub(crate) fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("{e:?}")
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A chart with a caption, labelled axes and integer ticks on x.
fn chart<'a, 'b>(
    area: &'a Area<'b>,
    caption: &str,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (x_desc, y_desc): (&str, &str),
) -> Result<Chart<'a, 'b>> {
    let ticks = (x.end - x.start).round() as usize + 1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 22))
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(ticks)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.1}"))
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FONT, 15))
        .light_line_style(WHITE)
        .draw()
        .map_err(err)?;
    Ok(chart)
}

fn max_gamma(modes: &[Mode]) -> usize {
    modes
        .iter()
        .flat_map(|m| m.runs.iter().map(|r| r.gamma))
        .max()
        .unwrap_or(1)
}

fn mode_name(m: &Mode) -> String {
    match m.temperature {
        0.0 => "greedy".into(),
        t => format!("T = {t}"),
    }
}

fn acceptance(area: &Area<'_>, modes: &[Mode]) -> Result<()> {
    let g = max_gamma(modes) as f64;
    let mut chart = chart(
        area,
        "Acceptance per draft position",
        (0.5..g + 0.5, 0.0..1.05),
        ("draft position", "acceptance rate"),
    )?;
    for (mi, m) in modes.iter().enumerate() {
        for (ri, r) in m.runs.iter().enumerate() {
            let base = Palette99::pick(ri).to_rgba();
            let color = if mi == 0 { base } else { base.mix(0.4) };
            let pts = r
                .acceptance_per_position
                .iter()
                .enumerate()
                .map(|(k, a)| ((k + 1) as f64, *a))
                .collect();
            let label = format!("γ = {}, {}", r.gamma, mode_name(m));
            series(&mut chart, pts, (color, 4), label)?;
        }
    }
    legend(&mut chart)
}

fn speedup(area: &Area<'_>, modes: &[Mode]) -> Result<()> {
    let g = max_gamma(modes) as f64;
    let top = modes
        .iter()
        .flat_map(|m| m.runs.iter().map(|r| r.speedup))
        .fold(2.0f64, f64::max)
        * 1.05;
    let mut chart = chart(
        area,
        "Speedup over plain decoding",
        (0.0..g + 1.0, 0.0..top),
        ("γ (tokens drafted per round)", "speedup (×)"),
    )?;
    chart
        .draw_series(LineSeries::new(
            [(0.0, 1.0), (g + 1.0, 1.0)],
            RGBColor(160, 160, 160).stroke_width(2),
        ))
        .map_err(err)?;
    for (mi, m) in modes.iter().enumerate() {
        let color = if mi == 0 { RED } else { BLUE };
        let pts = m.runs.iter().map(|r| (r.gamma as f64, r.speedup)).collect();
        series(&mut chart, pts, (color.to_rgba(), 5), mode_name(m))?;
    }
    legend(&mut chart)
}

/// A labelled line through `pts` with a dot of `radius` at each point.
fn series<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    pts: Vec<(f64, f64)>,
    (color, radius): (RGBAColor, u32),
    label: String,
) -> Result<()> {
    chart
        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
    chart
        .draw_series(pts.iter().map(|p| Circle::new(*p, radius, color.filled())))
        .map_err(err)?;
    Ok(())
}

fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> Result<()> {
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)
}
