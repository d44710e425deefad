//! TTFT over time as an SVG: one panel per round (or run), one series per strategy, with the
//! 2 s TTFT objective drawn across.

use std::path::Path;

use plotters::prelude::*;

use crate::report::RequestRecord;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// One series: a label and its (send time s, TTFT s) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// The successful requests of a run as (send time, TTFT) points.
    pub fn from_records(label: impl Into<String>, records: &[RequestRecord]) -> Series {
        Series {
            label: label.into(),
            points: records
                .iter()
                .filter_map(|r| Some((r.sent_s?, r.ttft_s?)))
                .collect(),
        }
    }
}

/// One panel: a title and its series (series with the same index share a colour across panels).
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// Caption.
    pub title: String,
    /// Series.
    pub series: Vec<Series>,
}

/// Draws the panels side by side into an SVG at `path`. Errors are returned as text.
pub fn ttft_over_time(path: &Path, panels: &[Panel]) -> Result<(), String> {
    let all = || {
        panels
            .iter()
            .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter()))
    };
    let x_max = all().map(|p| p.0).fold(1.0f64, f64::max) * 1.02;
    let y_max = all().map(|p| p.1).fold(2.5f64, f64::max) * 1.05;
    let width = 480 * panels.len().clamp(1, 8) as u32;
    let root = SVGBackend::new(path, (width, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((1, panels.len().clamp(1, 8)));
    for (area, panel) in areas.iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(44)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("send time (s)")
            .y_desc("TTFT (s)")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(LineSeries::new([(0.0, 2.0), (x_max, 2.0)], BLACK.mix(0.4)))
            .map_err(|e| e.to_string())?
            .label("TTFT objective 2 s")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], BLACK.mix(0.4)));
        for (i, s) in panel.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|&(x, y)| Circle::new((x, y), 2, color.filled())),
                )
                .map_err(|e| e.to_string())?
                .label(s.label.clone())
                .legend(move |(x, y)| Circle::new((x + 7, y), 3, color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg() {
        let dir = std::env::temp_dir().join(format!("kvroute-sim-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let panel = Panel {
            title: "x".into(),
            series: vec![Series {
                label: "a".into(),
                points: vec![(0.0, 0.2), (1.0, 3.0)],
            }],
        };
        ttft_over_time(&path, &[panel.clone(), panel]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("TTFT"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
