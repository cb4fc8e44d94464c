//! Where a sweep's results live and how its points run on this machine.
//!
//! `OUT/points/HASH.json` is a point's report, named by the hash of its configuration, written
//! whole or not at all (beside, then renamed): a point whose report is there is not run again,
//! whoever ran it (this machine's threads, a Dask worker, another sweep with the same point).
//! `OUT/results.csv` and `OUT/results.parquet` are the table, rewritten at the end of a sweep.

use crate::spec::{Point, Spec};
use crate::table::Table;
use crate::{atomic, io, Result, SweepError};
use ftlab_core::atomic_file::AtomicFile;
use ftlab_core::Config;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A sweep's output folder.
pub struct Store {
    dir: PathBuf,
}

/// A point finished: by a run now, or found done.
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    pub index: usize,
    /// False when its report was there already.
    pub ran: bool,
    pub wall_seconds: f64,
}

impl Store {
    /// The folder as it is, created by nothing (what `--dry-run` reads).
    pub fn at(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
        }
    }

    /// The folder, created with its `points/` when missing.
    pub fn open(dir: &Path) -> Result<Store> {
        let points = dir.join("points");
        std::fs::create_dir_all(&points).map_err(io(&points))?;
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn report_path(&self, point: &Point) -> PathBuf {
        self.dir.join("points").join(format!("{}.json", point.hash))
    }

    pub fn csv_path(&self) -> PathBuf {
        self.dir.join("results.csv")
    }

    pub fn parquet_path(&self) -> PathBuf {
        self.dir.join("results.parquet")
    }

    /// `point`'s report when one is kept for its very configuration (a hash collision, or a file
    /// that does not parse, is not taken for it).
    pub fn load(&self, point: &Point) -> Option<String> {
        let text = std::fs::read_to_string(self.report_path(point)).ok()?;
        let report: ftlab_sim::Report = serde_json::from_str(&text).ok()?;
        (report.config == point.config && report.ftlab_version == env!("CARGO_PKG_VERSION"))
            .then_some(text)
    }

    /// Keeps `point`'s report: written beside under a name no other writer uses, then renamed.
    pub fn save(&self, point: &Point, json: &str) -> Result<()> {
        let path = self.report_path(point);
        let mut file = AtomicFile::create_unique(&path).map_err(atomic)?;
        file.write_all(json.as_bytes()).map_err(atomic)?;
        file.commit().map_err(atomic)
    }

    /// The points of `spec` without a report here.
    pub fn pending<'a>(&self, spec: &'a Spec) -> Vec<&'a Point> {
        spec.points
            .iter()
            .filter(|p| self.load(p).is_none())
            .collect()
    }

    /// Gathers every point's report into the table, writes `results.csv` and `results.parquet`
    /// (each replaced whole) and returns it; an error names the first point without a report.
    pub fn write_table(&self, spec: &Spec) -> Result<Table> {
        let reports = spec
            .points
            .iter()
            .map(|p| {
                self.load(p).ok_or_else(|| SweepError::NoReport {
                    index: p.index,
                    label: p.label.clone(),
                    dir: self.dir.display().to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let table = Table::build(spec, &reports)?;
        for (path, bytes) in [
            (self.csv_path(), table.to_csv()),
            (self.parquet_path(), table.to_parquet()?),
        ] {
            let mut file = AtomicFile::create_unique(&path).map_err(atomic)?;
            file.write_all(&bytes).map_err(atomic)?;
            file.commit().map_err(atomic)?;
        }
        Ok(table)
    }
}

/// Simulates one configuration (on the calling thread: a point is single-threaded, and so
/// deterministic) and returns its JSON report.
pub fn simulate(config: &Config) -> Result<String, ftlab_sim::sim::SimError> {
    Ok(ftlab_sim::sim::run(config, &mut |_| {})?.to_json())
}

/// Runs every point of `spec` without a report in `store`, `jobs` at a time on this machine's
/// threads, telling `on_finished` of each point as it finishes (those found done first). The
/// first failure stops new points from starting and is returned naming its point.
pub fn run_here(
    spec: &Spec,
    store: &Store,
    jobs: usize,
    on_finished: &(dyn Fn(Finished) + Sync),
) -> Result<()> {
    let pending = store.pending(spec);
    let mut to_run = vec![false; spec.points.len()];
    for p in &pending {
        to_run[p.index] = true;
    }
    for p in &spec.points {
        if !to_run[p.index] {
            on_finished(Finished {
                index: p.index,
                ran: false,
                wall_seconds: 0.0,
            });
        }
    }
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<SweepError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1).min(pending.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pending.len() || failure.lock().unwrap().is_some() {
                    return;
                }
                let point = pending[i];
                let started = Instant::now();
                let done = simulate(&point.config)
                    .map_err(|cause| SweepError::Point {
                        index: point.index,
                        label: point.label.clone(),
                        cause,
                    })
                    .and_then(|json| store.save(point, &json));
                match done {
                    Ok(()) => on_finished(Finished {
                        index: point.index,
                        ran: true,
                        wall_seconds: started.elapsed().as_secs_f64(),
                    }),
                    Err(e) => {
                        failure.lock().unwrap().get_or_insert(e);
                    }
                }
            });
        }
    });
    match failure.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "[base]\npreset = \"validation-uniform\"\n\
        set = { \"flash.blocks_per_die\" = 256, \"workload.overwrites\" = 0.5, \"workload.precondition_overwrites\" = 1 }\n\
        [grid]\n\"capacity.over_provisioning\" = [0.1, 0.2, 0.3]\n\"workload.kind\" = [\"uniform\", \"hotcold\"]\n";

    #[test]
    fn one_thread_and_two_give_the_same_table_and_a_second_run_runs_nothing() {
        let spec = Spec::parse(SMALL, "s.toml", Path::new("/")).unwrap();
        assert_eq!(spec.points.len(), 6);
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let (sa, sb) = (
            Store::open(a.path()).unwrap(),
            Store::open(b.path()).unwrap(),
        );
        let ran = AtomicUsize::new(0);
        let count = |f: Finished| {
            if f.ran {
                ran.fetch_add(1, Ordering::Relaxed);
            }
        };
        run_here(&spec, &sa, 1, &count).unwrap();
        run_here(&spec, &sb, 2, &count).unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 12);
        let (ta, tb) = (
            sa.write_table(&spec).unwrap(),
            sb.write_table(&spec).unwrap(),
        );
        assert_eq!(ta, tb);
        assert_eq!(
            std::fs::read(sa.csv_path()).unwrap(),
            std::fs::read(sb.csv_path()).unwrap()
        );
        assert_eq!(
            std::fs::read(sa.parquet_path()).unwrap(),
            std::fs::read(sb.parquet_path()).unwrap()
        );
        // More over-provisioning, less GC: the table's WAF column says so.
        let waf = ta.names.iter().position(|n| n == "waf").unwrap();
        let w = |i: usize| match ta.rows[i][waf] {
            crate::table::Cell::Float(w) => w,
            ref c => panic!("{c:?}"),
        };
        assert!(w(0) > w(2) && w(2) > w(4), "{} {} {}", w(0), w(2), w(4));
        run_here(&spec, &sa, 2, &count).unwrap();
        assert_eq!(
            ran.load(Ordering::Relaxed),
            12,
            "a finished point ran again"
        );
        // A report removed is the one point run again.
        std::fs::remove_file(sa.report_path(&spec.points[3])).unwrap();
        assert_eq!(sa.pending(&spec).len(), 1);
        run_here(&spec, &sa, 2, &count).unwrap();
        assert_eq!(ran.load(Ordering::Relaxed), 13);
        assert_eq!(sa.write_table(&spec).unwrap(), ta);
    }

    #[test]
    fn a_report_of_another_configuration_is_not_taken() {
        let spec = Spec::parse(SMALL, "s.toml", Path::new("/")).unwrap();
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let other = simulate(&spec.points[1].config).unwrap();
        store.save(&spec.points[0], &other).unwrap();
        assert!(store.load(&spec.points[0]).is_none());
        std::fs::write(store.report_path(&spec.points[0]), "{").unwrap();
        assert!(store.load(&spec.points[0]).is_none());
        let e = store.write_table(&spec).unwrap_err();
        assert!(format!("{e}").contains("point 0"), "{e}");
    }
}
