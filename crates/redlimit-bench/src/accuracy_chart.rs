//! The accuracy picture: per algorithm, admitted requests per sliding window against the limit.

use plotters::prelude::*;

use crate::accuracy::{LIMIT, Outcome, Phase, WINDOW_MS, sample_seconds};

/// Draws one panel per algorithm into an SVG at `path`.
pub(crate) fn draw(path: &str, phases: &[Phase], outcomes: &[Outcome]) -> Result<(), String> {
    let root = SVGBackend::new(path, (1200, 960)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let title = format!(
        "admitted in the last {} s, one client, limit {LIMIT} (dashed); phases: {}",
        WINDOW_MS / 1000,
        phases
            .iter()
            .map(|p| format!("{}-{} s {}", p.span.start / 1000, p.span.end / 1000, p.name))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let root = root
        .titled(&title, ("sans-serif", 16))
        .map_err(|e| e.to_string())?;
    let panels = root.split_evenly((outcomes.len().div_ceil(2), 2));
    let end = outcomes
        .iter()
        .map(|o| sample_seconds(o.curve.len()))
        .fold(0.0, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let (limit, top) = (LIMIT as f64, 2.0 * LIMIT as f64 + 2.0);
    for (panel, outcome) in panels.iter().zip(outcomes) {
        let mut chart = ChartBuilder::on(panel)
            .caption(outcome.algorithm.name(), ("sans-serif", 18))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(32)
            .build_cartesian_2d(0.0..end, 0.0..top)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| e.to_string())?;
        #[allow(clippy::cast_precision_loss)]
        let curve = outcome
            .curve
            .iter()
            .enumerate()
            .map(|(i, n)| (sample_seconds(i), *n as f64));
        chart
            .draw_series(LineSeries::new(curve, BLUE.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, limit), (end, limit)],
                8,
                6,
                RED.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
