//! `ftlab experiment fdp`: the FDP Ethereum Benchmark without a VM: the LSM workload (docs/lsm.md)
//! on the FEMU preset with five reclaim unit handles, placed four ways (the seed's tiers as
//! placement IDs, one PID for all, the device's auto placement, ideal placement by true
//! lifetimes) at each GC threshold; a CSV row per point and a figure (WAF over the data written,
//! and the steady-state WAF as bars).

use crate::grid::{run_grid, GridPoint};
use crate::plot::draw_both;
use anyhow::{Context, Result};
use ftlab_core::config::ConfigBuilder;
use ftlab_sim::Report;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct FdpArgs {
    /// Where each point's JSON report, fdp.csv and the figure go; points already there (for
    /// the same configuration) are kept.
    #[arg(long, default_value = "target/experiment-fdp")]
    out: PathBuf,
    /// Points simulated at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Logical capacities of data the LSM writes per point (WAL, flushes and compactions).
    #[arg(long, default_value_t = 10.0)]
    overwrites: f64,
    /// GC thresholds (ftl.gc_thres_pcent: background GC once this share of superblocks is used).
    #[arg(long, value_delimiter = ',', default_value = "60,75")]
    gc_thresholds: Vec<f64>,
    /// Placements: tiers (the seed's FDP), one (one PID), auto (the device guesses), ideal.
    #[arg(long, value_delimiter = ',', default_value = "tiers,one,auto,ideal")]
    placements: Vec<String>,
    /// The LSM's key space (the last level's size), GiB of the 12 GiB device: 8 fills it as the
    /// seed's import had filled its drive when GC began.
    #[arg(long, default_value_t = 8.0)]
    key_space_gib: f64,
    /// Further configuration for every point, e.g. --set flash.blocks_per_die=64 for a quick run.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

/// One point: a placement at a GC threshold.
#[derive(Clone, Debug)]
struct Point {
    placement: String,
    gc_thres_pcent: f64,
}

impl Point {
    fn name(&self) -> String {
        format!("{}-gc{}", self.placement, self.gc_thres_pcent)
    }

    fn settings(&self, args: &FdpArgs) -> Result<Vec<String>> {
        let key_space = (args.key_space_gib * (1u64 << 30) as f64) as u64;
        let mut s = vec![
            "workload.kind=lsm".to_string(),
            "workload.precondition=false".into(),
            format!("workload.overwrites={}", args.overwrites),
            format!("workload.lsm_key_space_bytes={key_space}"),
            // The seed's five tiers, each its own persistently isolated handle.
            "ftl.streams=5".into(),
            format!("ftl.gc_thres_pcent={}", self.gc_thres_pcent),
        ];
        s.extend(
            match self.placement.as_str() {
                "tiers" => ["workload.lsm_placement=\"tiers\"", "fdp.placement=\"host\""],
                "one" => ["workload.lsm_placement=\"one\"", "fdp.placement=\"host\""],
                "auto" => ["workload.lsm_placement=\"one\"", "fdp.placement=\"auto\""],
                "ideal" => ["workload.lsm_placement=\"one\"", "fdp.placement=\"ideal\""],
                other => anyhow::bail!("unknown placement `{other}` (tiers, one, auto, ideal)"),
            }
            .map(String::from),
        );
        s.extend(args.sets.iter().cloned());
        Ok(s)
    }
}

/// The steady-state WAF: that of the second half of the data written.
fn steady_waf(r: &Report) -> Option<f64> {
    ftlab_sim::waf_window::steady_waf(&r.series, r.host_write_pages)
}

pub fn run(args: FdpArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let mut points = Vec::new();
    for &gc_thres_pcent in &args.gc_thresholds {
        for placement in &args.placements {
            points.push(Point {
                placement: placement.clone(),
                gc_thres_pcent,
            });
        }
    }
    let mut grid = Vec::new();
    for p in &points {
        let mut b = ConfigBuilder::from_preset("femu")?;
        for s in p.settings(&args)? {
            b.set(&s)?;
        }
        grid.push(GridPoint {
            name: p.name(),
            config: b.build().with_context(|| p.name())?,
        });
    }
    let describe = |r: &Report| {
        format!(
            "WAF {} (second half {})",
            ftlab_sim::report::waf_text(r.waf),
            ftlab_sim::report::waf_text(steady_waf(r))
        )
    };
    let reports = run_grid("fdp", &grid, &args.out, args.jobs, &describe)?;
    let csv = args.out.join("fdp.csv");
    std::fs::write(&csv, table(&points, &reports))
        .with_context(|| format!("writing {}", csv.display()))?;
    for &gc in &args.gc_thresholds {
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
        &|area| draw(area, &args, &points, &reports),
        &|area| draw(area, &args, &points, &reports),
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
    args: &FdpArgs,
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
