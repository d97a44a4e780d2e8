//! SVG charts of the sweeps, written next to the JSON (plotters' SVG
//! backend needs no fonts).

use std::path::Path;

use plotters::prelude::*;

/// One named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws `series` as lines with markers on log-log axes.
pub fn log_log(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> anyhow::Result<()> {
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    if all.is_empty() {
        return Ok(());
    }
    let fmin =
        |v: &mut dyn Iterator<Item = f64>| v.filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
    let fmax = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0f64, f64::max);
    let (x0, x1) = (
        fmin(&mut all.iter().map(|p| p.0)),
        fmax(&mut all.iter().map(|p| p.0)),
    );
    let (y0, y1) = (
        fmin(&mut all.iter().map(|p| p.1)),
        fmax(&mut all.iter().map(|p| p.1)),
    );
    let (x0, x1) = (x0.min(x1) * 0.8, x1.max(x0) * 1.25);
    let (y0, y1) = ((y0.min(y1) * 0.5).max(1e-3), y1.max(y0) * 2.0);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
