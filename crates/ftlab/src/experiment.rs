//! `ftlab experiment NAME`: a paper's evaluation grid, a sweep file in `sweeps/` (the one
//! definition of the grid: `ftlab sweep` runs the same file), each point a simulation of its
//! own, run in parallel, resumable (a point whose report exists is not run again), gathered
//! into one CSV and drawn as the paper's figure.
//!
//! `hexa`: the Hexa-SSD paper's grid on the `hexa` preset: protected ratio
//! x write buffer x buffer policy x workload (IOPS; UD/MD/GUD/GMD traffic). `fdp`: the FDP
//! Ethereum Benchmark's, in `experiment_fdp`.

use crate::grid::run_grid;
use crate::plot::draw_both;
use anyhow::{Context, Result};
use ftlab_sim::Report;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct ExperimentArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    /// The Hexa-SSD evaluation grid (sweeps/hexa.toml): protected ratio x write buffer x
    /// FIFO/Hexa x random, JESD219, pgbench, into target/experiment-hexa/ (hexa.csv,
    /// hexa.png/svg).
    Hexa(HexaArgs),
    /// The FDP benchmark (sweeps/fdp-placement.toml): the LSM workload with FDP tiers, one PID,
    /// auto placement and ideal placement, at GC thresholds 60 % and 75 %, into
    /// target/experiment-fdp/ (fdp.csv, fdp.png/svg).
    Fdp(crate::experiment_fdp::FdpArgs),
}

pub fn run(args: ExperimentArgs) -> Result<()> {
    match args.which {
        Which::Hexa(a) => run_hexa(a),
        Which::Fdp(a) => crate::experiment_fdp::run(a),
    }
}

#[derive(clap::Args)]
pub struct HexaArgs {
    /// The grid: a sweep file (docs/sweep.md) whose points set `ftl.write_buffer_mib`,
    /// `ftl.buffer_policy` and `ftl.protected_ratio`, and name their workload in a `workload`
    /// column (a `[cases.workload]` axis). The default is the paper's: 64 GiB written into a
    /// 4 GiB area by random writes and JESD219, and the pgbench trace on a drive 75 % full.
    #[arg(long, default_value = "sweeps/hexa.toml")]
    sweep: PathBuf,
    /// Where each point's JSON report, the CSV and the figure go; points already there are kept.
    #[arg(long, default_value = "target/experiment-hexa")]
    out: PathBuf,
    /// Points simulated at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
}

/// One point of the grid, as the figure and the CSV name it.
#[derive(Clone, Debug)]
struct Point {
    workload: String,
    buffer_mib: u64,
    policy: String,
    protected_pct: f64,
}

impl Point {
    /// What the sweep's point sets: its workload from the `workload` column (or, without one,
    /// `workload.kind`), the rest from its configuration.
    fn of(spec: &ftlab_sweep::Spec, p: &ftlab_sweep::Point) -> Point {
        let workload = spec
            .parameters
            .iter()
            .position(|k| k == "workload")
            .and_then(|i| p.values[i].as_str().map(String::from))
            .unwrap_or_else(|| p.config.workload.kind.clone());
        let ftl = &p.config.ftl;
        Point {
            workload,
            buffer_mib: ftl.write_buffer_mib as u64,
            policy: format!("{:?}", ftl.buffer_policy).to_lowercase(),
            // Percent, as the paper plots it (0.01 -> 1).
            protected_pct: (ftl.protected_ratio * 1e4).round() / 100.0,
        }
    }
}

/// The values each axis of the figure takes, in the order drawn.
struct Axes {
    workloads: Vec<String>,
    protected: Vec<f64>,
    buffers_mib: Vec<u64>,
}

impl Axes {
    fn of(points: &[Point]) -> Axes {
        let mut axes = Axes {
            workloads: Vec::new(),
            protected: Vec::new(),
            buffers_mib: Vec::new(),
        };
        for p in points {
            if !axes.workloads.contains(&p.workload) {
                axes.workloads.push(p.workload.clone());
            }
            if !axes.protected.contains(&p.protected_pct) {
                axes.protected.push(p.protected_pct);
            }
            if !axes.buffers_mib.contains(&p.buffer_mib) {
                axes.buffers_mib.push(p.buffer_mib);
            }
        }
        axes.protected.sort_by(f64::total_cmp);
        axes.buffers_mib.sort_unstable();
        axes
    }
}

fn run_hexa(args: HexaArgs) -> Result<()> {
    let started = Instant::now();
    let spec = ftlab_sweep::Spec::load(&args.sweep)?;
    let points: Vec<Point> = spec.points.iter().map(|p| Point::of(&spec, p)).collect();
    let axes = Axes::of(&points);
    let describe = |r: &Report| {
        format!(
            "WAF {} IOPS {:.0}",
            ftlab_sim::report::waf_text(r.waf),
            r.iops
        )
    };
    let reports = run_grid("hexa", &spec, &args.out, args.jobs, &describe)?;
    let csv = args.out.join("hexa.csv");
    std::fs::write(&csv, table(&points, &reports))
        .with_context(|| format!("writing {}", csv.display()))?;
    eprintln!(
        "wrote {} ({:.0} s in all)",
        csv.display(),
        started.elapsed().as_secs_f64()
    );
    draw_both(
        &args.out.join("hexa"),
        (1500, 900),
        &|area| draw(area, &axes, &points, &reports),
        &|area| draw(area, &axes, &points, &reports),
    )
}

/// The CSV: one row per point.
fn table(points: &[Point], reports: &[Report]) -> String {
    let mut out = String::from(
        "workload,buffer_mib,policy,protected_pct,waf,iops,host_write_pages,user_pages,mapping_pages,gc_user_pages,gc_mapping_pages,map_read_pages,max_dirty_translation_pages,protected_translation_pages,erases,write_p99_ns\n",
    );
    for (p, r) in points.iter().zip(reports) {
        let t = &r.traffic;
        let (max_dirty, protected) = r.power_loss.as_ref().map_or((0, 0), |l| {
            (l.max_dirty_translation_pages, l.protected_translation_pages)
        });
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{},{}",
            p.workload,
            p.buffer_mib,
            p.policy,
            p.protected_pct,
            r.waf.map_or(String::new(), |w| format!("{w:.4}")),
            r.iops,
            r.host_write_pages,
            t.user_pages,
            t.mapping_pages,
            t.gc_user_pages,
            t.gc_mapping_pages,
            t.map_read_pages,
            max_dirty,
            protected,
            r.erases,
            r.latency_ns.write.p99
        );
    }
    out
}

/// The paper's figure: a column per workload; IOPS over the protected ratio above (a line per
/// policy and buffer), the write traffic per host page below (stacked UD, MD, GUD, GMD; FIFO and
/// Hexa side by side at each ratio, largest buffer).
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    args: &Axes,
    points: &[Point],
    reports: &[Report],
) -> Result<()> {
    let err = crate::plot::err;
    root.fill(&WHITE).map_err(err)?;
    let rows = root.split_evenly((2, args.workloads.len().max(1)));
    let ratios = &args.protected;
    let x_of = |pct: f64| ratios.iter().position(|&r| r == pct).unwrap_or(0) as f64;
    let colors = [BLUE, RED, CYAN, MAGENTA];
    for (w, workload) in args.workloads.iter().enumerate() {
        let of = |p: &Point| p.workload == *workload;
        // IOPS.
        let top = points
            .iter()
            .zip(reports)
            .filter(|(p, _)| of(p))
            .map(|(_, r)| r.iops)
            .fold(1.0f64, f64::max);
        let mut chart = ratio_chart(&rows[w], &format!("{workload}: IOPS"), ratios, top)?;
        let mut series = 0;
        for &buffer in &args.buffers_mib {
            for policy in ["fifo", "hexa"] {
                let line: Vec<(f64, f64)> = points
                    .iter()
                    .zip(reports)
                    .filter(|(p, _)| of(p) && p.buffer_mib == buffer && p.policy == policy)
                    .map(|(p, r)| (x_of(p.protected_pct), r.iops))
                    .collect();
                let color = colors[series % colors.len()];
                series += 1;
                let label = format!(
                    "{}-{}",
                    if policy == "fifo" { "F" } else { "H" },
                    if buffer >= 1024 {
                        format!("{}G", buffer / 1024)
                    } else {
                        format!("{buffer}M")
                    }
                );
                chart
                    .draw_series(LineSeries::new(line, color.stroke_width(2)))
                    .map_err(err)?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
            }
        }
        crate::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        // Traffic per host page at the largest buffer.
        let buffer = args.buffers_mib.iter().copied().max().unwrap_or(0);
        let bars: Vec<(f64, [f64; 4])> = points
            .iter()
            .zip(reports)
            .filter(|(p, _)| of(p) && p.buffer_mib == buffer)
            .map(|(p, r)| {
                let host = r.host_write_pages.max(1) as f64;
                let t = &r.traffic;
                let offset = if p.policy == "fifo" { -0.2 } else { 0.2 };
                (
                    x_of(p.protected_pct) + offset,
                    [
                        t.user_pages as f64 / host,
                        t.mapping_pages as f64 / host,
                        t.gc_user_pages as f64 / host,
                        t.gc_mapping_pages as f64 / host,
                    ],
                )
            })
            .collect();
        let top = bars
            .iter()
            .map(|(_, v)| v.iter().sum::<f64>())
            .fold(1.0f64, f64::max);
        let mut chart = ratio_chart(
            &rows[args.workloads.len() + w],
            &format!("{workload}: write traffic per host page, {buffer} MiB buffer (F | H)"),
            ratios,
            top,
        )?;
        let parts = ["UD", "MD", "GUD", "GMD"];
        let fills = [BLUE.mix(0.6), RED.mix(0.6), GREEN.mix(0.6), BLACK.mix(0.5)];
        for (k, (name, fill)) in parts.iter().zip(fills).enumerate() {
            chart
                .draw_series(bars.iter().map(|(x, v)| {
                    let below: f64 = v[..k].iter().sum();
                    Rectangle::new([(x - 0.17, below), (x + 0.17, below + v[k])], fill.filled())
                }))
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], fill.filled()));
        }
        crate::plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// A panel over the protected ratios (one column each, labelled in percent) from 0 to a
/// little above `top`, its mesh drawn.
fn ratio_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    ratios: &[f64],
    top: f64,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>> {
    let err = crate::plot::err;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..ratios.len() as f64 - 0.5, 0.0..top * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(ratios.len())
        .x_label_formatter(&|x| {
            ratios
                .get(x.round().max(0.0) as usize)
                .map_or(String::new(), |r| format!("{r}%"))
        })
        .x_desc("protected ratio")
        .draw()
        .map_err(err)?;
    Ok(chart)
}
