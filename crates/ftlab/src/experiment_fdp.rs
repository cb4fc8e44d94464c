//! `ftlab experiment fdp`: the FDP Ethereum Benchmark without a VM: the LSM workload (docs/lsm.md)
//! on the FEMU preset with five reclaim unit handles, placed four ways (the FDP Ethereum Benchmark's tiers as
//! placement IDs, one PID for all, the device's auto placement, ideal placement by true
//! lifetimes) at each GC threshold; a CSV row per point and a figure (WAF over the data written,
//! and the steady-state WAF as bars).

use crate::grid::run_grid;
use crate::plot::draw_both;
use anyhow::{Context, Result};
use ftlab_sim::Report;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct FdpArgs {
    /// The grid: a sweep file (docs/sweep.md) whose points set `workload.lsm_placement`,
    /// `fdp.placement` and `ftl.gc_thres_pcent`. The default is the benchmark's: ten logical
    /// capacities of LSM writes on FEMU's device, four placements at GC thresholds 60 and 75 %.
    #[arg(long, default_value = "sweeps/fdp-placement.toml")]
    sweep: PathBuf,
    /// Where each point's JSON report, fdp.csv and the figure go; points already there (for
    /// the same configuration) are kept.
    #[arg(long, default_value = "target/experiment-fdp")]
    out: PathBuf,
    /// Points simulated at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
}

/// One point: a placement at a GC threshold.
#[derive(Clone, Debug)]
struct Point {
    /// tiers (the host's placement IDs by LSM tier), one (one PID), auto (the device
    /// guesses), ideal (true lifetimes).
    placement: String,
    gc_thres_pcent: f64,
}

impl Point {
    fn of(config: &ftlab_core::Config) -> Point {
        use ftlab_core::config::{LsmPlacement, PlacementPolicy};
        let placement = match (config.workload.lsm_placement, config.fdp.placement) {
            (LsmPlacement::Tiers, PlacementPolicy::Host) => "tiers",
            (LsmPlacement::One, PlacementPolicy::Host) => "one",
            (_, PlacementPolicy::Auto) => "auto",
            (_, PlacementPolicy::Ideal) => "ideal",
        };
        Point {
            placement: placement.to_string(),
            gc_thres_pcent: config.ftl.gc_thres_pcent,
        }
    }
}

/// The steady-state WAF: that of the second half of the data written.
fn steady_waf(r: &Report) -> Option<f64> {
    ftlab_sim::waf_window::steady_waf(&r.series, r.host_write_pages)
}

/// The values each axis of the figure takes, in the sweep's order.
struct Axes {
    gc_thresholds: Vec<f64>,
    placements: Vec<String>,
}

pub fn run(args: FdpArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let spec = ftlab_sweep::Spec::load(&args.sweep)?;
    let points: Vec<Point> = spec.points.iter().map(|p| Point::of(&p.config)).collect();
    let mut axes = Axes {
        gc_thresholds: Vec::new(),
        placements: Vec::new(),
    };
    for p in &points {
        if !axes.gc_thresholds.contains(&p.gc_thres_pcent) {
            axes.gc_thresholds.push(p.gc_thres_pcent);
        }
        if !axes.placements.contains(&p.placement) {
            axes.placements.push(p.placement.clone());
        }
    }
    let describe = |r: &Report| {
        format!(
            "WAF {} (second half {})",
            ftlab_sim::report::waf_text(r.waf),
            ftlab_sim::report::waf_text(steady_waf(r))
        )
    };
    let reports = run_grid("fdp", &spec, &args.out, args.jobs, &describe)?;
    let csv = args.out.join("fdp.csv");
    std::fs::write(&csv, table(&points, &reports))
        .with_context(|| format!("writing {}", csv.display()))?;
    for &gc in &axes.gc_thresholds {
        let steady = |name: &str| {
            points
                .iter()
                .zip(&reports)
                .find(|(p, _)| p.placement == name && p.gc_thres_pcent == gc)
                .and_then(|(_, r)| steady_waf(r))
        };
        if let (Some(tiers), Some(one)) = (steady("tiers"), steady("one")) {
            eprintln!(
                "gc {gc} %: steady WAF one PID {one:.3}, FDP tiers {tiers:.3}: {:+.1} %{}{}",
                (tiers / one - 1.0) * 100.0,
                steady("auto").map_or(String::new(), |a| format!("; auto {a:.3}")),
                steady("ideal").map_or(String::new(), |i| format!("; ideal {i:.3}")),
            );
        }
    }
    eprintln!(
        "wrote {} ({:.0} s in all)",
        csv.display(),
        started.elapsed().as_secs_f64()
    );
    draw_both(
        &args.out.join("fdp"),
        (1400, 900),
        &|area| draw(area, &axes, &points, &reports),
        &|area| draw(area, &axes, &points, &reports),
    )
}

/// The CSV: one row per point.
fn table(points: &[Point], reports: &[Report]) -> String {
    let mut out = String::from(
        "placement,gc_thres_pcent,waf,waf_steady,host_write_pages,nand_write_pages,gc_write_pages,erases,sim_time_ns,iops,write_p99_ns,handle_host_pages,handle_waf\n",
    );
    for (p, r) in points.iter().zip(reports) {
        let handles = r
            .fdp
            .placements
            .iter()
            .filter(|h| h.kind == "persistent" || h.kind == "initial");
        let host: Vec<String> = handles.clone().map(|h| h.host_pages.to_string()).collect();
        let waf: Vec<String> = handles
            .map(|h| h.waf.map_or(String::new(), |w| format!("{w:.3}")))
            .collect();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{:.1},{},{},{}",
            p.placement,
            p.gc_thres_pcent,
            r.waf.map_or(String::new(), |w| format!("{w:.4}")),
            steady_waf(r).map_or(String::new(), |w| format!("{w:.4}")),
            r.host_write_pages,
            r.nand_write_pages,
            r.gc_write_pages,
            r.erases,
            r.sim_time_ns,
            r.iops,
            r.latency_ns.write.p99,
            host.join(" "),
            waf.join(" ")
        );
    }
    out
}

/// WAF over the data written (a window of a twentieth of the run per point), a line per
/// placement, above; the steady-state WAF as bars, below; a column per GC threshold.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    args: &Axes,
    points: &[Point],
    reports: &[Report],
) -> Result<()> {
    let err = crate::plot::err;
    root.fill(&WHITE).map_err(err)?;
    let columns = args.gc_thresholds.len().max(1);
    let panels = root.split_evenly((2, columns));
    let colors = [RED, BLUE, GREEN, BLACK, MAGENTA, CYAN];
    let color_of = |name: &str| {
        let i = args.placements.iter().position(|p| p == name).unwrap_or(0);
        colors[i % colors.len()]
    };
    let page = |r: &Report| u64::from(r.config.flash.page_size_bytes);
    for (c, &gc) in args.gc_thresholds.iter().enumerate() {
        let here: Vec<(&Point, &Report)> = points
            .iter()
            .zip(reports)
            .filter(|(p, _)| p.gc_thres_pcent == gc)
            .collect();
        let lines: Vec<(&str, Vec<(f64, f64)>)> = here
            .iter()
            .map(|(p, r)| (p.placement.as_str(), windowed_waf(r, page(r))))
            .collect();
        let x_end = lines
            .iter()
            .flat_map(|(_, l)| l.iter().map(|p| p.0))
            .fold(1e-9f64, f64::max);
        let y_top = lines
            .iter()
            .flat_map(|(_, l)| l.iter().map(|p| p.1))
            .fold(1.0f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&panels[c])
            .caption(
                format!("LSM on FDP, GC at {gc} % used: WAF over the data written"),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_end, 0.0..y_top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("GiB written by the host")
            .y_desc("WAF (window)")
            .draw()
            .map_err(err)?;
        for (name, line) in lines {
            let color = color_of(name);
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))
                .map_err(err)?
                .label(name.to_string())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
        }
        crate::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        // Steady-state bars.
        let bars: Vec<(&str, f64)> = here
            .iter()
            .map(|(p, r)| (p.placement.as_str(), steady_waf(r).unwrap_or(0.0)))
            .collect();
        let top = bars.iter().map(|b| b.1).fold(1.0f64, f64::max) * 1.2;
        let n = bars.len();
        let names: Vec<String> = bars.iter().map(|b| b.0.to_string()).collect();
        let mut chart = ChartBuilder::on(&panels[columns + c])
            .caption(
                format!("steady-state WAF (second half of the data), GC at {gc} %"),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                names
                    .get(x.round().max(0.0) as usize)
                    .cloned()
                    .unwrap_or_default()
            })
            .y_desc("WAF")
            .draw()
            .map_err(err)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (name, w))| {
                let x = i as f64;
                Rectangle::new(
                    [(x - 0.3, 0.0), (x + 0.3, *w)],
                    color_of(name).mix(0.7).filled(),
                )
            }))
            .map_err(err)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, w))| {
                Text::new(
                    format!("{w:.2}"),
                    (i as f64 - 0.1, w + top * 0.03),
                    ("sans-serif", 16),
                )
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// (GiB written, WAF over the last twentieth of the run) at each interval's end.
fn windowed_waf(r: &Report, page_bytes: u64) -> Vec<(f64, f64)> {
    ftlab_sim::waf_window::windowed_waf(&r.series, r.host_write_pages, page_bytes)
}
