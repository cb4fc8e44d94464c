//! `ftlab experiment NAME`: a paper's evaluation grid, each point a simulation of its own, run in
//! parallel, resumable (a point whose report exists is not run again), gathered into one CSV and
//! drawn as the paper's figure.
//!
//! `hexa`: the Hexa-SSD paper's grid on the `hexa` preset: protected ratio
//! x write buffer x buffer policy x workload (IOPS; UD/MD/GUD/GMD traffic). `fdp`: the FDP
//! Ethereum Benchmark's, in `experiment_fdp`.

use crate::grid::{run_grid, GridPoint};
use crate::plot::draw_both;
use anyhow::{Context, Result};
use ftlab_core::config::ConfigBuilder;
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
    /// The Hexa-SSD evaluation grid: protected ratio x write buffer x FIFO/Hexa x random,
    /// JESD219, pgbench, into target/experiment-hexa/ (hexa.csv, hexa.png/svg).
    Hexa(HexaArgs),
    /// The FDP benchmark: the LSM workload with FDP tiers, one PID, auto placement and ideal
    /// placement, at GC thresholds 60 % and 75 %, into target/experiment-fdp/ (fdp.csv,
    /// fdp.png/svg).
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
    /// Where each point's JSON report, the CSV and the figure go; points already there are kept.
    #[arg(long, default_value = "target/experiment-hexa")]
    out: PathBuf,
    /// Points simulated at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// GiB written per synthetic point (the paper wrote 64 GB into a 4 GB area).
    #[arg(long, default_value_t = 64.0)]
    write_gib: f64,
    /// Protected ratios, in percent.
    #[arg(long, value_delimiter = ',', default_value = "1,2,5,10,20,50,100")]
    protected: Vec<f64>,
    /// Write buffer sizes, MiB.
    #[arg(long, value_delimiter = ',', default_value = "64,1024")]
    buffers_mib: Vec<u64>,
    /// Workloads: random (4 KiB random writes), jesd219, pgbench (the trace standing in for
    /// TPC-C, on a device 75 % full).
    #[arg(long, value_delimiter = ',', default_value = "random,jesd219,pgbench")]
    workloads: Vec<String>,
    /// The pgbench trace.
    #[arg(long, default_value = "../shared/traces/pgbench.nbdlog.gz")]
    pgbench: PathBuf,
}

/// One point of the grid.
#[derive(Clone, Debug)]
struct Point {
    workload: String,
    buffer_mib: u64,
    policy: &'static str,
    protected_pct: f64,
}

impl Point {
    fn name(&self) -> String {
        format!(
            "{}-{}MiB-{}-{}pct",
            self.workload, self.buffer_mib, self.policy, self.protected_pct
        )
    }

    fn settings(&self, args: &HexaArgs) -> Result<Vec<String>> {
        let mut s = vec![
            format!("ftl.write_buffer_mib={}", self.buffer_mib),
            format!("ftl.buffer_policy={}", self.policy),
            format!("ftl.protected_ratio={}", self.protected_pct / 100.0),
        ];
        // The paper's fio jobs: 4 threads writing 64 GB into a 4 GB area of a fresh drive.
        let requests = (args.write_gib * (1u64 << 30) as f64 / 4096.0).round() as u64;
        match self.workload.as_str() {
            "random" | "jesd219" => s.extend([
                format!(
                    "workload.kind={}",
                    if self.workload == "random" {
                        "uniform"
                    } else {
                        "jesd219"
                    }
                ),
                format!("workload.requests={requests}"),
                "workload.span_bytes=4294967296".into(),
                "workload.precondition=false".into(),
            ]),
            "pgbench" => s.extend([
                format!(
                    "workload.trace={}",
                    toml::Value::String(args.pgbench.display().to_string())
                ),
                "workload.wrap=true".into(),
                // The paper's TPC-C ran 10 threads: closed loop, 10 outstanding (at the trace's
                // own timestamps every policy would show the trace's IOPS).
                "workload.replay=closed".into(),
                "workload.queue_depth=10".into(),
                // The paper's TPC-C ran on a drive 75 % full.
                "workload.precondition=true".into(),
                "workload.precondition_fill=0.75".into(),
                "workload.precondition_overwrites=0".into(),
            ]),
            other => anyhow::bail!("unknown workload `{other}` (random, jesd219, pgbench)"),
        }
        Ok(s)
    }
}

fn grid(args: &HexaArgs) -> Vec<Point> {
    let mut points = Vec::new();
    for workload in &args.workloads {
        for &buffer_mib in &args.buffers_mib {
            for policy in ["fifo", "hexa"] {
                for &protected_pct in &args.protected {
                    points.push(Point {
                        workload: workload.clone(),
                        buffer_mib,
                        policy,
                        protected_pct,
                    });
                }
            }
        }
    }
    points
}

fn run_hexa(args: HexaArgs) -> Result<()> {
    let started = Instant::now();
    let points = grid(&args);
    let mut grid_points = Vec::new();
    for point in &points {
        let mut b = ConfigBuilder::from_preset("hexa")?;
        for s in point.settings(&args)? {
            b.set(&s)?;
        }
        grid_points.push(GridPoint {
            name: point.name(),
            config: b.build()?,
        });
    }
    let describe = |r: &Report| {
        format!(
            "WAF {} IOPS {:.0}",
            ftlab_sim::report::waf_text(r.waf),
            r.iops
        )
    };
    let reports = run_grid("hexa", &grid_points, &args.out, args.jobs, &describe)?;
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
        &|area| draw(area, &args, &points, &reports),
        &|area| draw(area, &args, &points, &reports),
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
    args: &HexaArgs,
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
