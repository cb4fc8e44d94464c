//! A sweep file's points run in parallel and resumably, a report per point kept in a sweep
//! store: the runner `ftlab experiment hexa` and `ftlab experiment fdp` share.

use anyhow::{Context, Result};
use ftlab_sim::Report;
use ftlab_sweep::Spec;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs every point of `spec` `jobs` at a time (default: the cores), each unless its report is in
/// `dir` already (for the same configuration: the sweep store's rule, `ftlab_sweep::Store`),
/// printing one line per point with `describe`; returns the reports in order.
pub fn run_grid(
    label: &str,
    spec: &Spec,
    dir: &Path,
    jobs: Option<usize>,
    describe: &(dyn Fn(&Report) -> String + Sync),
) -> Result<Vec<Report>> {
    let points = &spec.points;
    let store = ftlab_sweep::Store::open(dir)?;
    let jobs = jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    eprintln!(
        "ftlab experiment {label}: {} points, {jobs} at a time, reports in {}",
        points.len(),
        dir.display()
    );
    let finished = AtomicUsize::new(0);
    let report_of = |i: usize| -> Result<Report> {
        let json = store
            .load(&spec.points[i])
            .with_context(|| format!("{}: no report", points[i].label))?;
        Ok(serde_json::from_str(&json)?)
    };
    ftlab_sweep::run::run_here(spec, &store, jobs, &|f| {
        let n = finished.fetch_add(1, Ordering::Relaxed) + 1;
        let figures = report_of(f.index).map_or_else(|e| format!("{e:#}"), |r| describe(&r));
        eprintln!(
            "[{n}/{}] {}: {figures}{}",
            points.len(),
            points[f.index].label,
            if f.ran {
                format!(" ({:.1} s)", f.wall_seconds)
            } else {
                " (kept from an earlier run)".into()
            }
        );
    })?;
    (0..points.len()).map(report_of).collect()
}
