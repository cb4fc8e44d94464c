//! The learned table alone on a trace's update stream, each phase in a function of its own, so
//! that callgrind can count one phase's instructions (reproducible where wall-clock timings on a
//! shared VM are not; `ftlab mapbench` re-executes itself and times every table, which gets in
//! the way of a profiler):
//!
//! ```text
//! cargo build --release --example mapprof
//! valgrind --tool=callgrind --toggle-collect='mapprof::updates' \
//!     target/release/examples/mapprof ../shared/traces/pgbench.nbdlog.gz
//! ```
//!
//! Phases: `updates` (every SET and REMOVE; PPNs from a log head, or with a second argument
//! `simulator` from the simulator, as `ftlab mapbench --ppns`), `trace_gets` (the trace's lookups in
//! order) and `random_gets` (every live LPN once, shuffled). It prints each phase's wall time per
//! operation and the table's merge statistics.
//!
//! With `MAPPROF_COMPACTED=1` it then merges the whole buffer (`compact`) and times, fastest of
//! three passes, the trace's lookups through `get` (the lookup cursor and an empty buffer) and
//! both lookup lists through `compressed_gets`, which asks the compressed layer alone (directory
//! and blob, no cursor, no buffer): what each layer costs a lookup.

use ftlab_core::ftl::mapping::MappingTable;
use ftlab_learned::LearnedMapping;
use ftlab_mapbench::{ops_from_trace, PpnSource, REMOVE};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

#[inline(never)]
fn updates(table: &mut LearnedMapping, updates: &[(u32, u32)]) {
    for &(lpn, v) in updates {
        if v == REMOVE {
            black_box(table.remove(lpn));
        } else {
            black_box(table.set(lpn, v));
        }
    }
}

#[inline(never)]
fn trace_gets(table: &LearnedMapping, lpns: &[u32]) -> u64 {
    lpns.iter().fold(0u64, |sum, &lpn| {
        sum.wrapping_add(u64::from(black_box(table.get(black_box(lpn))).unwrap_or(0)))
    })
}

/// Not folded into `trace_gets` by the linker (identical code would be): it sums differently.
#[inline(never)]
fn random_gets(table: &LearnedMapping, lpns: &[u32]) -> u64 {
    lpns.iter().fold(1u64, |sum, &lpn| {
        sum.wrapping_mul(3)
            .wrapping_add(u64::from(black_box(table.get(black_box(lpn))).unwrap_or(0)))
    })
}

/// Lookups of the compressed layer alone (`LearnedMapping::compressed`).
#[inline(never)]
fn compressed_gets(table: &LearnedMapping, lpns: &[u32]) -> u64 {
    lpns.iter().fold(0u64, |sum, &lpn| {
        sum.wrapping_add(u64::from(
            black_box(table.compressed(black_box(lpn))).unwrap_or(0),
        ))
    })
}

fn main() -> anyhow::Result<()> {
    let Some(trace) = std::env::args().nth(1) else {
        eprintln!("usage: mapprof TRACE [log-head|simulator] (any format `ftlab sim` reads)");
        std::process::exit(2);
    };
    let source = match std::env::args().nth(2).as_deref() {
        None | Some("log-head") => PpnSource::LogHead,
        Some("simulator") => PpnSource::Simulator,
        Some(other) => anyhow::bail!("PPN source {other:?}: log-head or simulator"),
    };
    let ops = ops_from_trace(Path::new(&trace), None, None, source)?;
    let mut table = LearnedMapping::new(ops.logical_pages);
    let per_op = |start: Instant, n: usize| start.elapsed().as_nanos() as f64 / n.max(1) as f64;

    // `MAPPROF_REPEAT=N` runs the update phase N times over (each on a fresh table), so that a
    // sampling profiler (`perf record -e cpu-clock`) collects enough samples of a phase that
    // lasts a few milliseconds; the time printed is the last run's.
    let repeat: usize = std::env::var("MAPPROF_REPEAT").map_or(Ok(1), |s| s.parse())?;
    let mut set_ns = 0.0;
    for _ in 0..repeat.max(1) {
        table = LearnedMapping::new(ops.logical_pages);
        let t = Instant::now();
        updates(&mut table, &ops.updates);
        set_ns = per_op(t, ops.updates.len());
    }
    // `MAPPROF_GET_REPEAT=N` does the same for the trace-order lookups (the time printed is the
    // last pass's), for `perf record` of the lookup path.
    let get_repeat: usize = std::env::var("MAPPROF_GET_REPEAT").map_or(Ok(1), |s| s.parse())?;
    let mut a = 0;
    let mut get_ns = 0.0;
    for _ in 0..get_repeat.max(1) {
        let t = Instant::now();
        a = trace_gets(&table, &ops.gets);
        get_ns = per_op(t, ops.gets.len());
    }
    let t = Instant::now();
    let b = random_gets(&table, &ops.random_gets);
    let random_ns = per_op(t, ops.random_gets.len());

    println!(
        "{trace}: {} updates {set_ns:.1} ns each; {} trace-order gets {get_ns:.1} ns; {} random gets {random_ns:.1} ns (checksums {a} {b})",
        ops.updates.len(),
        ops.gets.len(),
        ops.random_gets.len(),
    );
    println!(
        "{:?}; {} LPNs buffered at the end",
        table.stats(),
        table.buffered_entries()
    );
    if std::env::var_os("MAPPROF_COMPACTED").is_some() {
        table.compact();
        let fastest = |f: &dyn Fn() -> u64, n: usize| {
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    black_box(f());
                    per_op(t, n)
                })
                .fold(f64::MAX, f64::min)
        };
        let get_ns = fastest(&|| trace_gets(&table, &ops.gets), ops.gets.len());
        let random_get_ns = fastest(
            &|| random_gets(&table, &ops.random_gets),
            ops.random_gets.len(),
        );
        let bare_ns = fastest(&|| compressed_gets(&table, &ops.gets), ops.gets.len());
        let bare_random_ns = fastest(
            &|| compressed_gets(&table, &ops.random_gets),
            ops.random_gets.len(),
        );
        println!(
            "compacted: trace-order gets {get_ns:.2} ns, random gets {random_get_ns:.2} ns; compressed layer alone: trace order {bare_ns:.2} ns, random {bare_random_ns:.2} ns"
        );
    }
    Ok(())
}
