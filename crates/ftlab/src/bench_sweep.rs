//! `ftlab bench sweep`: a 16-point grid run on one thread and on two (`ftlab sweep --jobs 2`'s
//! pool), alternating, each round into a fresh folder so that nothing is resumed; the ratio of
//! the medians is what two cores buy a sweep.

use anyhow::Result;
use ftlab_sweep::{Spec, Store};
use std::time::Instant;

/// 4 over-provisioning x 2 workloads x 2 seeds on the WAF reference device (2 Mi pages):
/// points of about a second, unequal (low over-provisioning means more GC), as real grids are.
const GRID: &str = r#"seeds = 2
[base]
preset = "validation-uniform"
set = { "workload.overwrites" = 1, "workload.precondition_overwrites" = 2 }
[grid]
"capacity.over_provisioning" = [0.07, 0.14, 0.28, 0.5]
"workload.kind" = ["uniform", "hotcold"]
"#;

pub fn run(machine: String, repeat: u32, work_dir: &std::path::Path) -> Result<()> {
    let spec = Spec::parse(GRID, "the bench grid", std::path::Path::new("."))?;
    assert_eq!(spec.points.len(), 16);
    println!(
        "ftlab bench sweep: {} points, one thread against two, {repeat} alternating rounds ({machine})",
        spec.points.len()
    );
    let mut serial = Vec::new();
    let mut parallel = Vec::new();
    for round in 1..=repeat {
        for (jobs, times) in [(1, &mut serial), (2, &mut parallel)] {
            let dir = work_dir.join(format!("sweep-jobs{jobs}"));
            let _ = std::fs::remove_dir_all(&dir);
            let store = Store::open(&dir)?;
            let started = Instant::now();
            ftlab_sweep::run::run_here(&spec, &store, jobs, &|_| {})?;
            store.write_table(&spec)?;
            let seconds = started.elapsed().as_secs_f64();
            println!("  round {round}: --jobs {jobs}: {seconds:.2} s");
            std::fs::remove_dir_all(&dir)?;
            times.push(seconds);
        }
    }
    let (s, p) = (median(&mut serial), median(&mut parallel));
    println!(
        "median: --jobs 1 {s:.2} s, --jobs 2 {p:.2} s: {:.3}x the serial time ({:.2}x faster)",
        p / s,
        s / p
    );
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
