//! `ftlab plot REPORT.json`: WAF over time, the latency CDF, and (with several FDP handles)
//! each handle's WAF over time, as PNG and SVG.

use anyhow::{anyhow, Context, Result};
use ftlab_sim::Report;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (1000, 700);

/// Where a TrueType font for the text is looked for.
const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

pub(crate) fn register_font() -> Result<()> {
    let candidates: Vec<PathBuf> = std::env::var_os("FTLAB_FONT")
        .map(PathBuf::from)
        .into_iter()
        .chain(FONT_PATHS.iter().map(PathBuf::from))
        .collect();
    for path in &candidates {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps registered fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return register_font_bytes(bytes)
                .map_err(|_| anyhow!("{}: not a usable TrueType font", path.display()));
        }
    }
    Err(anyhow!(
        "plots need a TrueType font for their text: install fonts-dejavu-core or set FTLAB_FONT (looked in {})",
        FONT_PATHS.join(", ")
    ))
}

fn register_font_bytes(bytes: &'static [u8]) -> Result<(), ()> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| ())
}

pub(crate) fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e:?}")
}

/// The time axis: simulated seconds, or ms or us for a short run (a run of 2 ms in seconds
/// labelled every tick "0.0").
fn time_unit(end_ns: u64) -> (f64, &'static str) {
    match end_ns {
        0..=999_999 => (1e3, "us"),
        1_000_000..=999_999_999 => (1e6, "ms"),
        _ => (1e9, "s"),
    }
}

/// The WAF axis's top, and how many intervals lie above it. A single interval can read 800 (GC
/// moved a superblock while the host wrote a page): scaled to it, the cumulative curve, the one
/// that matters, lies flat on the floor. So the axis covers the cumulative curve (twice its
/// highest) and 95 % of the intervals; those above are drawn clipped at the top, and counted.
fn waf_axis(rows: &[ftlab_sim::report::SeriesRow]) -> (f64, usize) {
    let mut per_interval: Vec<f64> = rows
        .iter()
        .filter(|x| x.host_write_pages > 0)
        .map(|x| x.waf)
        .collect();
    per_interval.sort_by(f64::total_cmp);
    let p95 = per_interval
        .get((per_interval.len() * 95 / 100).min(per_interval.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let cumulative = rows.iter().map(|x| x.waf_cumulative).fold(1.0f64, f64::max);
    let top = (2.0 * cumulative).max(p95).max(1.0) * 1.1;
    let above = per_interval.iter().filter(|&&w| w > top).count();
    (top, above)
}

/// The series' labels, in one style for every panel.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// "no samples" text in the middle of an empty panel, so that an empty report does not draw
/// axes of zeros.
fn draw_empty<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, what: &str) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        what.to_string(),
        (w as i32 / 2 - 200, h as i32 / 2),
        ("sans-serif", 22),
    ))
    .map_err(err)
}

fn draw_waf<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let rows = &r.series;
    if rows.is_empty() {
        draw_empty(&root, "no time series: the run measured nothing")?;
        root.present().map_err(err)?;
        return Ok(());
    }
    let (top, rest) = root.split_vertically(SIZE.1 / 2);
    let (bottom, mapping) = rest.split_vertically(SIZE.1 / 4);
    let end_ns = rows.last().map_or(0, |x| x.end_ns);
    let (per_unit, unit) = time_unit(end_ns);
    let t = |ns: u64| ns as f64 / per_unit;
    let t_end = t(end_ns).max(1e-9);
    let start = 0.0;
    let (waf_max, above) = waf_axis(rows);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "WAF over time (overall {})",
                ftlab_sim::report::waf_text(r.waf)
            ),
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(start..t_end, 0.0..waf_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("simulated time ({unit})"))
        .y_desc("WAF")
        .draw()
        .map_err(err)?;
    let label = if above > 0 {
        let highest = rows.iter().map(|x| x.waf).fold(0.0f64, f64::max);
        format!("per interval ({above} above the axis, up to {highest:.0}: drawn at its top, ▲)")
    } else {
        "per interval".to_string()
    };
    chart
        .draw_series(LineSeries::new(
            rows.iter()
                .filter(|x| x.host_write_pages > 0)
                .map(|x| (t(x.end_ns), x.waf.min(waf_max))),
            &BLUE,
        ))
        .map_err(err)?
        .label(label)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(
            rows.iter()
                .filter(|x| x.host_write_pages > 0 && x.waf > waf_max)
                .map(|x| TriangleMarker::new((t(x.end_ns), waf_max), 6, BLUE.filled())),
        )
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            rows.iter().map(|x| (t(x.end_ns), x.waf_cumulative)),
            RED.stroke_width(2),
        ))
        .map_err(err)?
        .label("cumulative")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    // With the mapping persisted: the translation pages written back per host page (MD), the
    // part of each interval's WAF that protection ran out for.
    if rows.iter().any(|x| x.traffic.mapping_pages > 0) {
        chart
            .draw_series(LineSeries::new(
                rows.iter().filter(|x| x.host_write_pages > 0).map(|x| {
                    let md = x.traffic.mapping_pages as f64 / x.host_write_pages as f64;
                    (t(x.end_ns), md.min(waf_max))
                }),
                BLACK.stroke_width(1),
            ))
            .map_err(err)?
            .label("of which mapping writes (MD) per interval")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    let free_max = f64::from(r.device.superblocks);
    let mut chart = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(start..t_end, 0.0..free_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("simulated time ({unit})"))
        .y_desc("free superblocks")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            rows.iter()
                .map(|x| (t(x.end_ns), f64::from(x.free_superblocks))),
            &GREEN,
        ))
        .map_err(err)?;
    // The mapping table's DRAM: flat for an array, breathing for a table with an update buffer
    // and garbage to collect; its peak (preconditioning included) as a dashed line.
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let peak_mib = mib(r.mapping.bytes_peak.max(r.mapping.bytes));
    let mut chart = ChartBuilder::on(&mapping)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(start..t_end, 0.0..(peak_mib * 1.25).max(1e-3))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("simulated time ({unit})"))
        .y_desc(format!("{} table (MiB)", r.mapping.table))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            rows.iter().map(|x| (t(x.end_ns), mib(x.mapping_bytes))),
            &MAGENTA,
        ))
        .map_err(err)?
        .label("mapping table")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MAGENTA));
    chart
        .draw_series(DashedLineSeries::new(
            [(start, peak_mib), (t_end, peak_mib)],
            6,
            4,
            BLACK.into(),
        ))
        .map_err(err)?
        .label(format!(
            "its peak, preconditioning included ({peak_mib:.2} MiB)"
        ))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Each placement's cumulative WAF over time (its media pages over its host pages, GC's moves
/// counted where they land), one line per placement that took host writes; and the shared GC
/// reclaim units' programs per host page of the whole device, when there are any.
fn draw_handles<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let rows = &r.series;
    let end_ns = rows.last().map_or(0, |x| x.end_ns);
    let (per_unit, unit) = time_unit(end_ns);
    let t = |ns: u64| ns as f64 / per_unit;
    // Per placement: (time, cumulative WAF) points.
    let mut lines: std::collections::BTreeMap<u8, Vec<(f64, f64)>> = Default::default();
    let mut totals = [(0u64, 0u64); 256];
    let mut device_host = 0u64;
    for row in rows {
        device_host += row.host_write_pages;
        for p in &row.placements {
            let total = &mut totals[usize::from(p.placement)];
            total.0 += p.host_pages;
            total.1 += p.media_pages;
        }
        for (p, &(host, media)) in totals.iter().enumerate() {
            let shared = p == usize::from(ftlab_core::flash::SHARED_GC_PLACEMENT);
            let (num, den) = if shared {
                (media, device_host)
            } else {
                (media, host)
            };
            if den > 0 && (host > 0 || shared && media > 0) {
                lines
                    .entry(p as u8)
                    .or_default()
                    .push((t(row.end_ns), num as f64 / den as f64));
            }
        }
    }
    if lines.is_empty() {
        draw_empty(&root, "no per-handle series: the run had one handle")?;
        root.present().map_err(err)?;
        return Ok(());
    }
    let top = lines
        .values()
        .flat_map(|l| l.iter().map(|p| p.1))
        .fold(1.0f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "WAF over time per reclaim unit handle (cumulative)",
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t(end_ns).max(1e-9), 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("simulated time ({unit})"))
        .y_desc("media pages / host pages")
        .draw()
        .map_err(err)?;
    for (i, (p, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let kind = r
            .fdp
            .placements
            .iter()
            .find(|x| x.placement == p)
            .map_or("", |x| x.kind.as_str());
        let label = if p == ftlab_core::flash::SHARED_GC_PLACEMENT {
            "shared GC units (per device host page)".to_string()
        } else {
            format!("handle {p} ({kind})")
        };
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A latency at or below this took no simulated time.
const ZERO_NS: u64 = ftlab_sim::report::ZERO_LATENCY_NS;

fn draw_latency<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let c = &r.latency_cdf;
    let cdfs = [
        ("read", &c.read, c.read_at_zero, BLUE),
        ("write", &c.write, c.write_at_zero, RED),
    ];
    // Zero latencies (buffer hits, unwritten pages) have no place on a log axis: leaving them
    // at its left edge drew a diagonal from there that no request took. They are said in the
    // legend, and each curve starts at its first latency above zero.
    let all = cdfs
        .iter()
        .flat_map(|(_, c, _, _)| c.iter().filter(|p| p.0 > ZERO_NS).map(|p| p.0 as f64 / 1e3));
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi <= 0.0 {
        let what = if cdfs.iter().all(|(_, c, _, _)| c.is_empty()) {
            "no reads or writes: no latency to draw"
        } else {
            "every read and write took no simulated time"
        };
        draw_empty(&root, what)?;
        root.present().map_err(err)?;
        return Ok(());
    }
    let (lo, hi) = ((lo * 0.8).max(0.01), hi * 1.25);
    let mut chart = ChartBuilder::on(&root)
        .caption("Request latency CDF", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (us, log scale)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(err)?;
    for (name, cdf, at_zero, color) in cdfs {
        if cdf.is_empty() {
            continue;
        }
        let label = if at_zero > 0.0 {
            format!(
                "{name} ({:.1} % took 0 us, not on the log axis)",
                at_zero * 100.0
            )
        } else {
            name.to_string()
        };
        chart
            .draw_series(LineSeries::new(
                cdf.iter()
                    .filter(|p| p.0 > ZERO_NS)
                    .map(|&(ns, q)| (ns as f64 / 1e3, q)),
                &color,
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)?;
    Ok(())
}

pub fn run(report: &Path, out: Option<&Path>) -> Result<()> {
    let text =
        std::fs::read_to_string(report).with_context(|| format!("reading {}", report.display()))?;
    let r: Report = serde_json::from_str(&text)
        .with_context(|| format!("{}: not an ftlab JSON report", report.display()))?;
    let prefix = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| report.with_extension(""));
    let name = |suffix: &str| PathBuf::from(format!("{}-{suffix}", prefix.display()));
    // Text layout needs font metrics, for SVG too.
    register_font()?;
    let (waf_svg, lat_svg) = (name("waf.svg"), name("latency.svg"));
    draw_waf(SVGBackend::new(&waf_svg, SIZE).into_drawing_area(), &r)?;
    draw_latency(SVGBackend::new(&lat_svg, SIZE).into_drawing_area(), &r)?;
    println!("wrote {} and {}", waf_svg.display(), lat_svg.display());
    let (waf_png, lat_png) = (name("waf.png"), name("latency.png"));
    draw_waf(BitMapBackend::new(&waf_png, SIZE).into_drawing_area(), &r)?;
    draw_latency(BitMapBackend::new(&lat_png, SIZE).into_drawing_area(), &r)?;
    println!("wrote {} and {}", waf_png.display(), lat_png.display());
    if r.series.iter().any(|x| !x.placements.is_empty()) {
        let (svg, png) = (name("handles.svg"), name("handles.png"));
        draw_handles(SVGBackend::new(&svg, SIZE).into_drawing_area(), &r)?;
        draw_handles(BitMapBackend::new(&png, SIZE).into_drawing_area(), &r)?;
        println!("wrote {} and {}", svg.display(), png.display());
    }
    Ok(())
}

/// Writes a figure as SVG and PNG beside each other (`stem.svg`, `stem.png`).
pub fn draw_both(
    stem: &Path,
    size: (u32, u32),
    draw_svg: &dyn Fn(DrawingArea<SVGBackend, Shift>) -> Result<()>,
    draw_png: &dyn Fn(DrawingArea<BitMapBackend, Shift>) -> Result<()>,
) -> Result<()> {
    crate::plot::register_font()?;
    let svg = stem.with_extension("svg");
    draw_svg(SVGBackend::new(&svg, size).into_drawing_area())?;
    eprintln!("wrote {}", svg.display());
    let png = stem.with_extension("png");
    draw_png(BitMapBackend::new(&png, size).into_drawing_area())?;
    eprintln!("wrote {}", png.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftlab_sim::report::SeriesRow;

    fn row(end_ns: u64, waf: f64, waf_cumulative: f64) -> SeriesRow {
        SeriesRow {
            end_ns,
            host_write_pages: 10,
            nand_write_pages: 10,
            waf,
            waf_cumulative,
            iops: 0.0,
            free_superblocks: 0,
            mapping_bytes: 0,
            traffic: Default::default(),
            placements: Vec::new(),
        }
    }

    #[test]
    fn a_spike_is_clipped_and_counted_so_the_cumulative_curve_keeps_the_axis() {
        let mut rows: Vec<SeriesRow> = (0..100)
            .map(|i| row(i, 3.0 + (i % 5) as f64, 5.0))
            .collect();
        rows[40].waf = 800.0;
        let (top, above) = waf_axis(&rows);
        assert!((10.0..=12.0).contains(&top), "{top}");
        assert_eq!(above, 1);
        // No spike: nothing above, the axis covers every interval.
        rows[40].waf = 4.0;
        let (top, above) = waf_axis(&rows);
        assert_eq!(above, 0);
        assert!(top >= 7.0);
    }

    #[test]
    fn short_runs_get_a_time_unit_that_shows_them() {
        assert_eq!(time_unit(2_000_000).1, "ms");
        assert_eq!(time_unit(500_000).1, "us");
        assert_eq!(time_unit(24_000_000_000).1, "s");
    }
}
