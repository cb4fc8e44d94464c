//! `ftlab plot REPORT.json`: WAF over time and the latency CDF, as PNG and SVG.

use anyhow::{anyhow, Context, Result};
use ftlab::Report;
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

fn register_font() -> Result<()> {
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

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e:?}")
}

fn draw_waf<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (top, rest) = root.split_vertically(SIZE.1 / 2);
    let (bottom, mapping) = rest.split_vertically(SIZE.1 / 4);
    let rows = &r.series;
    let t_end = rows.last().map_or(1.0, |x| x.end_ns as f64 / 1e9).max(1e-9);
    let start = 0.0;
    let waf_max = rows
        .iter()
        .map(|x| x.waf.max(x.waf_cumulative))
        .fold(1.0f64, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!("WAF over time (overall {})", ftlab::report::waf_text(r.waf)),
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(start..t_end, 0.0..waf_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc("WAF")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            rows.iter()
                .filter(|x| x.host_write_pages > 0)
                .map(|x| (x.end_ns as f64 / 1e9, x.waf)),
            &BLUE,
        ))
        .map_err(err)?
        .label("per interval")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(
            rows.iter()
                .map(|x| (x.end_ns as f64 / 1e9, x.waf_cumulative)),
            &RED,
        ))
        .map_err(err)?
        .label("cumulative")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    let free_max = f64::from(r.device.superblocks);
    let mut chart = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(start..t_end, 0.0..free_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc("free superblocks")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            rows.iter()
                .map(|x| (x.end_ns as f64 / 1e9, f64::from(x.free_superblocks))),
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
        .build_cartesian_2d(start..t_end, 0.0..(peak_mib * 1.1).max(1e-3))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc(format!("{} table (MiB)", r.mapping.table))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            rows.iter()
                .map(|x| (x.end_ns as f64 / 1e9, mib(x.mapping_bytes))),
            &MAGENTA,
        ))
        .map_err(err)?;
    chart
        .draw_series(DashedLineSeries::new(
            [(start, peak_mib), (t_end, peak_mib)],
            6,
            4,
            BLACK.into(),
        ))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn draw_latency<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let cdfs = [
        ("read", &r.latency_cdf.read, BLUE),
        ("write", &r.latency_cdf.write, RED),
    ];
    let all = cdfs
        .iter()
        .flat_map(|(_, c, _)| c.iter().map(|p| p.0 as f64 / 1e3));
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if hi <= 0.0 {
        (0.1, 10.0)
    } else {
        ((lo * 0.8).max(0.01), hi * 1.25)
    };
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
    for (name, cdf, color) in cdfs {
        if cdf.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(
                cdf.iter().map(|&(ns, q)| ((ns as f64 / 1e3).max(lo), q)),
                &color,
            ))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
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
    Ok(())
}
