//! `ftlab sweep SPEC.toml`: a sweep file's points run on this machine's cores (or, with
//! `--dask`, handed to the Python package, which submits them to a Dask cluster), gathered into
//! one table; `ftlab sweep plot RESULTS`: a figure of one column against another.

use crate::plot::{draw_both, draw_legend, err};
use anyhow::{bail, Context, Result};
use ftlab_sweep::run::{run_here, Finished};
use ftlab_sweep::{Spec, Store};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "A sweep file (docs/sweep.md):\n\n  \
seeds = 3                                  # repetitions: workload.seed = 1, 2, 3\n  \
[base]\n  \
preset = \"validation-uniform\"              # then config = [FILES], trace = FILE, set = {KEY = VALUE}\n  \
[grid]                                     # every combination\n  \
\"capacity.over_provisioning\" = [0.07, 0.14, 0.28]\n  \
\"workload.kind\" = [\"uniform\", \"hotcold\"]\n  \
[zip]                                      # paired values, one axis\n  \
\"ftl.write_buffer_mib\" = [0, 64]\n  \
\"ftl.buffer_policy\" = [\"fifo\", \"hexa\"]\n  \
[cases.workload]                           # named sets of keys, one axis (column `workload`)\n  \
random = { \"workload.kind\" = \"uniform\" }\n  \
pgbench = { \"workload.trace\" = \"pgbench.nbdlog.gz\", \"workload.replay\" = \"closed\" }\n\n\
Examples:\n  \
ftlab sweep sweeps/waf-vs-op.toml --dry-run         # the points, and which are done\n  \
ftlab sweep sweeps/waf-vs-op.toml                   # run them; results in sweeps/waf-vs-op-results/\n  \
ftlab sweep plot sweeps/waf-vs-op-results --x capacity.over_provisioning --y waf \\\n      \
--series workload.kind --reference desnoyers\n  \
ftlab sweep big.toml --dask tcp://scheduler:8786   # on a Dask cluster (the Python package)"
)]
pub struct SweepArgs {
    #[command(subcommand)]
    command: Option<SweepCommand>,
    /// The sweep file.
    spec: Option<PathBuf>,
    /// The results folder: points/HASH.json (each point's report), results.csv,
    /// results.parquet. Default: beside the sweep file, its name with -results.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Points simulated at once (default: the machine's cores); each point runs on one thread.
    #[arg(long)]
    jobs: Option<usize>,
    /// List the points (index, hash, done or to run, parameters) and run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Run the points as tasks on this Dask scheduler (tcp://HOST:8786) through the Python
    /// package (`pip install .` here, and dask.distributed) in `$FTLAB_PYTHON` or python3.
    #[arg(long, value_name = "ADDRESS")]
    dask: Option<String>,
    /// No progress, no line per point.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(clap::Subcommand)]
enum SweepCommand {
    /// Draw one column of a results table against another (PNG and SVG): lines over a numeric
    /// x, bars over a named one; rows repeated for seeds are averaged, their range drawn.
    Plot(PlotArgs),
}

#[derive(clap::Args)]
struct PlotArgs {
    /// A results folder (its results.csv) or a results CSV.
    results: PathBuf,
    /// The column along x (a parameter, e.g. capacity.over_provisioning).
    #[arg(long)]
    x: String,
    /// The figure along y (waf, iops, latency_ns.write.p99, mapping.bytes, erases ...).
    #[arg(long)]
    y: String,
    /// A line (or bar) per value of this column.
    #[arg(long)]
    series: Option<String>,
    /// A panel per value of this column.
    #[arg(long)]
    facet: Option<String>,
    /// Draw a closed-form curve too: `desnoyers` (greedy GC under uniform writes against
    /// over-provisioning on x, Desnoyers 2012).
    #[arg(long, value_parser = ["desnoyers"])]
    reference: Option<String>,
    /// Output path prefix (default: RESULTS/Y-vs-X, with .png and .svg).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: SweepArgs) -> Result<()> {
    if let Some(SweepCommand::Plot(p)) = args.command {
        return plot(p);
    }
    let path = args
        .spec
        .context("give a sweep file (ftlab sweep --help)")?;
    let spec = Spec::load(&path)?;
    let out = args.out.unwrap_or_else(|| default_out(&path));
    if let Some(address) = args.dask {
        return dask(&path, &out, &address, args.quiet);
    }
    if args.dry_run {
        let store = Store::at(&out);
        let mut to_run = vec![false; spec.points.len()];
        for p in store.pending(&spec) {
            to_run[p.index] = true;
        }
        let mut text = format!(
            "{} points, {} to run; results in {}\npoint  hash              state   parameters\n",
            spec.points.len(),
            to_run.iter().filter(|&&t| t).count(),
            out.display()
        );
        for p in &spec.points {
            let state = if to_run[p.index] { "to run" } else { "done" };
            let _ = writeln!(text, "{:>5}  {}  {state:<6}  {}", p.index, p.hash, p.label);
        }
        // Into `head` or a pager that quits early: a closed pipe is the reader's choice, not an
        // error (println! would panic on it).
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(e).context("writing the list of points")
            }
            _ => {}
        }
        return Ok(());
    }
    let store = Store::open(&out)?;
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = Instant::now();
    let total = spec.points.len() as u64;
    let bar = (!args.quiet && std::io::stderr().is_terminal()).then(|| {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()).with_style(
            ProgressStyle::with_template("points {pos}/{len} [{bar:40}] {elapsed} eta {eta}")
                .expect("valid template")
                .progress_chars("=> "),
        )
    });
    if !args.quiet {
        eprintln!(
            "ftlab sweep {}: {} points, {jobs} at a time, results in {}",
            path.display(),
            total,
            out.display()
        );
    }
    let counts = Mutex::new((0u64, 0u64)); // (finished, ran)
    let on_finished = |f: Finished| {
        let mut c = counts.lock().unwrap();
        c.0 += 1;
        c.1 += u64::from(f.ran);
        if args.quiet {
            return;
        }
        let p = &spec.points[f.index];
        let line = format!(
            "[{}/{total}] point {}: {}{}",
            c.0,
            p.index,
            p.label,
            if f.ran {
                format!(" ({:.1} s)", f.wall_seconds)
            } else {
                " (done before)".into()
            }
        );
        match &bar {
            Some(b) => {
                b.println(line);
                b.set_position(c.0);
            }
            None => eprintln!("{line}"),
        }
    };
    let result = run_here(&spec, &store, jobs, &on_finished);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    result?;
    store.write_table(&spec)?;
    let (_, ran) = *counts.lock().unwrap();
    if !args.quiet {
        eprintln!(
            "{total} points ({ran} run, {} done before) in {:.1} s; table: {}, {}",
            total - ran,
            started.elapsed().as_secs_f64(),
            store.csv_path().display(),
            store.parquet_path().display()
        );
    }
    Ok(())
}

/// `dir/name.toml` -> `dir/name-results`.
fn default_out(spec: &Path) -> PathBuf {
    let stem = spec
        .file_stem()
        .map_or("sweep".into(), |s| s.to_string_lossy().into_owned());
    spec.with_file_name(format!("{stem}-results"))
}

/// Hands the sweep to the Python package's Dask runner: Dask is Python's, and ftlab has no
/// scheduler of its own.
fn dask(spec: &Path, out: &Path, address: &str, quiet: bool) -> Result<()> {
    let python = std::env::var_os("FTLAB_PYTHON").unwrap_or_else(|| "python3".into());
    let mut command = std::process::Command::new(&python);
    command
        .args(["-m", "ftlab", "sweep"])
        .arg(spec)
        .arg("--out")
        .arg(out)
        .args(["--dask", address]);
    if quiet {
        command.arg("--quiet");
    }
    let status = command.status().with_context(|| {
        format!(
            "running {} for --dask (the Dask sweep runs in the ftlab Python package: `pip \
             install .` in ftlab's folder, and dask.distributed; FTLAB_PYTHON names the python)",
            python.to_string_lossy()
        )
    })?;
    if !status.success() {
        bail!(
            "the Dask sweep failed ({status}); `{} -m ftlab --help` should answer when the \
             Python package is installed",
            python.to_string_lossy()
        );
    }
    Ok(())
}

/// The rows of a results CSV: the header, and each row's fields.
struct Csv {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    path: PathBuf,
}

impl Csv {
    fn read(path: &Path) -> Result<Csv> {
        let path = if path.is_dir() {
            path.join("results.csv")
        } else {
            path.to_path_buf()
        };
        let mut reader = csv::Reader::from_path(&path)
            .with_context(|| format!("reading the results table {}", path.display()))?;
        let header = reader
            .headers()
            .with_context(|| format!("{}: its header", path.display()))?
            .iter()
            .map(String::from)
            .collect();
        let rows = reader
            .records()
            .enumerate()
            .map(|(i, r)| {
                r.map(|r| r.iter().map(String::from).collect())
                    .with_context(|| format!("{}: line {}", path.display(), i + 2))
            })
            .collect::<Result<Vec<Vec<String>>>>()?;
        Ok(Csv { header, rows, path })
    }

    fn column(&self, name: &str) -> Result<usize> {
        self.header.iter().position(|h| h == name).with_context(|| {
            format!(
                "{}: no column `{name}` (columns: {})",
                self.path.display(),
                self.header.join(", ")
            )
        })
    }
}

/// One line (or bar group) of a panel: its label and (x, mean, min, max) per x.
struct Line {
    label: String,
    points: Vec<(String, f64, f64, f64)>,
}

struct Panel {
    title: String,
    lines: Vec<Line>,
}

fn plot(args: PlotArgs) -> Result<()> {
    let csv = Csv::read(&args.results)?;
    let x = csv.column(&args.x)?;
    let y = csv.column(&args.y)?;
    let series = args.series.as_deref().map(|s| csv.column(s)).transpose()?;
    let facet = args.facet.as_deref().map(|s| csv.column(s)).transpose()?;
    let mut panels: Vec<Panel> = Vec::new();
    // Rows grouped by (facet, series, x) in order of first appearance; y averaged over repeats.
    let mut groups: Vec<(String, String, String, Vec<f64>)> = Vec::new();
    for (i, row) in csv.rows.iter().enumerate() {
        let Ok(value) = row[y].parse::<f64>() else {
            if row[y].is_empty() {
                continue; // null: no figure for this point (WAF without host writes)
            }
            bail!(
                "{}: line {}: `{}` is `{}`, not a number",
                csv.path.display(),
                i + 2,
                args.y,
                row[y]
            );
        };
        let f = facet.map_or(String::new(), |c| row[c].clone());
        let s = series.map_or(String::new(), |c| row[c].clone());
        match groups
            .iter_mut()
            .find(|g| g.0 == f && g.1 == s && g.2 == row[x])
        {
            Some(g) => g.3.push(value),
            None => groups.push((f, s, row[x].clone(), vec![value])),
        }
    }
    if groups.is_empty() {
        bail!("{}: no row has a value of `{}`", csv.path.display(), args.y);
    }
    for (f, s, xv, ys) in groups {
        let mean = ys.iter().sum::<f64>() / ys.len() as f64;
        let min = ys.iter().copied().fold(f64::INFINITY, f64::min);
        let max = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let title = match &args.facet {
            Some(name) => format!("{name} = {f}"),
            None => String::new(),
        };
        let panel = match panels.iter_mut().position(|p| p.title == title) {
            Some(i) => &mut panels[i],
            None => {
                panels.push(Panel {
                    title,
                    lines: Vec::new(),
                });
                panels.last_mut().unwrap()
            }
        };
        let label = match &args.series {
            Some(name) => format!("{name} = {s}"),
            None => args.y.clone(),
        };
        let line = match panel.lines.iter_mut().position(|l| l.label == label) {
            Some(i) => &mut panel.lines[i],
            None => {
                panel.lines.push(Line {
                    label,
                    points: Vec::new(),
                });
                panel.lines.last_mut().unwrap()
            }
        };
        line.points.push((xv, mean, min, max));
    }
    let numeric = panels
        .iter()
        .flat_map(|p| &p.lines)
        .flat_map(|l| &l.points)
        .all(|p| p.0.parse::<f64>().is_ok());
    if args.reference.is_some() && !numeric {
        bail!("--reference needs a numeric x (over-provisioning)");
    }
    let out = args.out.clone().unwrap_or_else(|| {
        let dir = if args.results.is_dir() {
            args.results.clone()
        } else {
            args.results
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        // Dots would read as an extension (which .png and .svg replace).
        dir.join(format!("{}-vs-{}", args.y, args.x).replace('.', "_"))
    });
    let size = (700 * panels.len().min(4) as u32 + 100, 600);
    draw_both(
        &out,
        size,
        &|area| draw(area, &args, &panels, numeric),
        &|area| draw(area, &args, &panels, numeric),
    )
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    args: &PlotArgs,
    panels: &[Panel],
    numeric: bool,
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, panels.len()));
    for (panel, area) in panels.iter().zip(&areas) {
        let all = panel.lines.iter().flat_map(|l| &l.points);
        let y_max = all.clone().map(|p| p.3).fold(0.0f64, f64::max);
        let y_min = all.clone().map(|p| p.2).fold(0.0f64, f64::min);
        let mut chart = ChartBuilder::on(area);
        chart
            .caption(&panel.title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70);
        if numeric {
            let xs: Vec<f64> = all.clone().map(|p| p.0.parse().expect("numeric")).collect();
            let (lo, hi) = xs
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                    (a.min(v), b.max(v))
                });
            let pad = ((hi - lo) * 0.05).max(1e-9);
            let mut reference: Vec<(f64, f64)> = Vec::new();
            if args.reference.as_deref() == Some("desnoyers") {
                reference = (0..=100)
                    .map(|i| lo + (hi - lo) * i as f64 / 100.0)
                    .filter(|&rho| rho > 0.0)
                    .map(|rho| (rho, ftlab_sim::analytic::desnoyers_greedy_waf(rho)))
                    .collect();
            }
            // Lines: the axis spans the values (with room above for the legend), not from 0.
            let top = reference.iter().map(|p| p.1).fold(y_max, f64::max);
            let bottom = all.clone().map(|p| p.2).fold(f64::INFINITY, f64::min);
            let span = (top - bottom).max(top.abs() * 0.05).max(1e-9);
            let mut c = chart
                .build_cartesian_2d(
                    (lo - pad)..(hi + pad),
                    (bottom - 0.1 * span)..(top + 0.3 * span),
                )
                .map_err(err)?;
            c.configure_mesh()
                .x_desc(&args.x)
                .y_desc(&args.y)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            for (i, line) in panel.lines.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let mut pts: Vec<(f64, f64, f64, f64)> = line
                    .points
                    .iter()
                    .map(|p| (p.0.parse().expect("numeric"), p.1, p.2, p.3))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                c.draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, p.1)),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(&line.label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
                c.draw_series(
                    pts.iter()
                        .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
                )
                .map_err(err)?;
                c.draw_series(
                    pts.iter()
                        .filter(|p| p.3 > p.2)
                        .map(|p| PathElement::new([(p.0, p.2), (p.0, p.3)], color.stroke_width(2))),
                )
                .map_err(err)?;
            }
            if !reference.is_empty() {
                c.draw_series(DashedLineSeries::new(
                    reference,
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?
                .label("Desnoyers' greedy limit (uniform)")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK));
            }
            // The legend where the lines are low: a falling curve leaves the upper right free.
            let first = panel
                .lines
                .iter()
                .filter_map(|l| l.points.first())
                .map(|p| p.1);
            let last = panel
                .lines
                .iter()
                .filter_map(|l| l.points.last())
                .map(|p| p.1);
            let falling = first.sum::<f64>() > last.sum::<f64>();
            draw_legend(
                &mut c,
                if falling {
                    SeriesLabelPosition::UpperRight
                } else {
                    SeriesLabelPosition::UpperLeft
                },
            )?;
        } else {
            // Bars: one slot per x value (in first-appearance order), a bar per line inside.
            let mut xs: Vec<&str> = Vec::new();
            for p in panel.lines.iter().flat_map(|l| &l.points) {
                if !xs.contains(&p.0.as_str()) {
                    xs.push(&p.0);
                }
            }
            let n = panel.lines.len() as f64;
            let mut c = chart
                .build_cartesian_2d(0.0..xs.len() as f64, y_min..(y_max * 1.15).max(1e-9))
                .map_err(err)?;
            let labels = xs.clone();
            c.configure_mesh()
                .disable_x_mesh()
                .x_labels(xs.len() * 2 + 1)
                .x_label_formatter(&|v| {
                    let i = v.floor() as usize;
                    if (v - i as f64 - 0.5).abs() < 1e-6 && i < labels.len() {
                        labels[i].to_string()
                    } else {
                        String::new()
                    }
                })
                .x_desc(&args.x)
                .y_desc(&args.y)
                .label_style(("sans-serif", 15))
                .draw()
                .map_err(err)?;
            for (i, line) in panel.lines.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let width = 0.8 / n;
                c.draw_series(line.points.iter().map(|p| {
                    let slot = xs.iter().position(|x| *x == p.0).expect("listed") as f64;
                    let left = slot + 0.1 + width * i as f64;
                    Rectangle::new([(left, 0.0), (left + width, p.1)], color.filled())
                }))
                .map_err(err)?
                .label(&line.label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled())
                });
            }
            draw_legend(&mut c, SeriesLabelPosition::UpperRight)?;
        }
    }
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_go_beside_the_sweep_file() {
        assert_eq!(
            default_out(Path::new("sweeps/waf-vs-op.toml")),
            PathBuf::from("sweeps/waf-vs-op-results")
        );
    }
}
