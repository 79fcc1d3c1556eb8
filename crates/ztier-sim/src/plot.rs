//! Plots of a sweep (the 1999 paper's Figures 3, 4 and 6), as SVG.
//!
//! Top: paging time against memory size, log scale, one line per policy
//! at the first disk cost. Bottom: paging time normalised to no
//! compression, one line per policy and disk cost (1.0 = no change, below
//! = compression helps).

use std::path::Path;

use plotters::prelude::*;

use crate::sim::SweepReport;

const COLORS: [RGBColor; 8] = [
    RGBColor(0, 0, 0),
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
];

/// Writes the plots of `r` to `path` (SVG).
pub fn write_svg(r: &SweepReport, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (900, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(500);
    let mut mems: Vec<usize> = r.results.iter().map(|x| x.memory_pages).collect();
    mems.sort_unstable();
    mems.dedup();
    let (xmin, xmax) = (*mems.first().unwrap_or(&1) as f64, *mems.last().unwrap_or(&2) as f64);
    let xmax = if xmax > xmin { xmax } else { xmin + 1.0 };
    let mut policies: Vec<&str> = Vec::new();
    for x in &r.results {
        if !policies.contains(&x.policy.as_str()) {
            policies.push(&x.policy);
        }
    }
    let disk0 = r.results.first().map_or(0.0, |x| x.disk_ms);

    // Paging time, log scale.
    let times: Vec<f64> =
        r.results.iter().filter(|x| x.disk_ms == disk0).map(|x| x.paging_time_s.max(1e-6)).collect();
    let ymin = times.iter().cloned().fold(f64::INFINITY, f64::min).min(1.0) * 0.8;
    let ymax = times.iter().cloned().fold(0.0, f64::max).max(ymin * 10.0) * 1.2;
    let mut c = ChartBuilder::on(&top)
        .caption(format!("paging time vs memory, disk {disk0} ms ({})", r.codec), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xmin..xmax, (ymin..ymax).log_scale())
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("memory (4 KiB pages)")
        .y_desc("paging time (s)")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, p) in policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = r
            .results
            .iter()
            .filter(|x| x.disk_ms == disk0 && x.policy == *p)
            .map(|x| (x.memory_pages as f64, x.paging_time_s.max(1e-6)))
            .collect();
        c.draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(*p)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        c.draw_series(pts.into_iter().map(|xy| Circle::new(xy, 3, color.filled()))).map_err(|e| err(&e))?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;

    // Normalised paging time, every disk cost.
    let norms: Vec<f64> = r.results.iter().map(|x| x.normalized).filter(|v| v.is_finite()).collect();
    let nmax = norms.iter().cloned().fold(1.2, f64::max).min(5.0);
    let mut c = ChartBuilder::on(&bottom)
        .caption("paging time normalised to no compression", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xmin..xmax, 0.0..nmax)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("memory (4 KiB pages)")
        .y_desc("normalised paging time")
        .draw()
        .map_err(|e| err(&e))?;
    let disks = crate::sim::disk_costs(r);
    let mut k = 0;
    for p in policies.iter().filter(|p| **p != "none") {
        for &d in &disks {
            let color = COLORS[(k + 1) % COLORS.len()];
            k += 1;
            let pts: Vec<(f64, f64)> = r
                .results
                .iter()
                .filter(|x| x.disk_ms == d && x.policy == *p && x.normalized.is_finite())
                .map(|x| (x.memory_pages as f64, x.normalized.min(nmax)))
                .collect();
            c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("{p}, {d} ms"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
    }
    c.draw_series(LineSeries::new(vec![(xmin, 1.0), (xmax, 1.0)], BLACK.stroke_width(1)))
        .map_err(|e| err(&e))?;
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
