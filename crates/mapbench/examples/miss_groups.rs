//! Where the learned table's lookup cursor misses, for notes/mapping-log.md ("More lookup
//! cursors", "Where the cursor's misses land"): a trace's lookups in order over its final mapping
//! (log-head PPNs), a miss wherever a lookup leaves the run of the lookup before (a maximal range
//! of consecutive PPNs, or of unmapped LPNs, within one 4096-LPN group: the table's spans are
//! these or shorter). For k = 1, 2, 4, 8, 16 it counts the misses that a list of the k most
//! recently used runs would still miss, the misses that land in one of the k groups of the
//! misses before, and the misses at the start of the run right after one of the k most recently
//! used runs (where a follow-on position kept for each of k recent spans, `Follow`, would skip
//! the searches; the table keeps one).
//!
//! Then, for a cache of decoded blocks of 16, 64 or 256 LPNs holding a quarter, a sixteenth or a
//! sixty-fourth of the live mappings' worth of LPNs (least recently used out), how many of the
//! misses land in a cached block ("A cache of decoded blocks" in the log); and how many lookups
//! leave an aligned window of 64 LPNs, the one such block a one-entry decoded window would hold
//! (notes/mapping-log.md, "Checks" of the lookup cursor).
//!
//! ```text
//! cargo build --release --example miss_groups
//! target/release/examples/miss_groups ../shared/traces/files.nbdlog.gz
//! ```

use ftlab_learned::{GROUP_LPNS, GROUP_SHIFT};
use ftlab_mapbench::{ops_from_trace, PpnSource, REMOVE};
use std::collections::BTreeSet;
use std::path::Path;

const KS: [usize; 5] = [1, 2, 4, 8, 16];

/// Moves `key` to the front of the most-recently-used list `mru`; returns its place before, if
/// it was there.
fn touch(mru: &mut Vec<u32>, key: u32) -> Option<usize> {
    let at = mru.iter().position(|&k| k == key);
    if let Some(i) = at {
        mru.remove(i);
    }
    mru.insert(0, key);
    mru.truncate(KS[KS.len() - 1]);
    at
}

/// The misses (LPNs where a lookup leaves the run before) that land in one of the `capacity`
/// most recently used blocks of `1 << block_shift` LPNs.
fn block_cache_hits(misses: &[u32], block_shift: u32, capacity: usize) -> u64 {
    let blocks = (misses.iter().max().map_or(0, |&l| l >> block_shift) + 1) as usize;
    // Each block's last use (0: never), and the cached blocks ordered by it.
    let mut last_use = vec![0u64; blocks];
    let mut cached = BTreeSet::new();
    let mut hits = 0;
    for (now, &lpn) in (1u64..).zip(misses) {
        let block = (lpn >> block_shift) as usize;
        if cached.remove(&(last_use[block], block)) {
            hits += 1;
        } else if cached.len() == capacity {
            cached.pop_first();
        }
        last_use[block] = now;
        cached.insert((now, block));
    }
    hits
}

fn main() -> anyhow::Result<()> {
    let Some(trace) = std::env::args().nth(1) else {
        eprintln!("usage: miss_groups TRACE (any format `ftlab sim` reads)");
        std::process::exit(2);
    };
    let ops = ops_from_trace(Path::new(&trace), None, None, PpnSource::LogHead)?;
    // The final mapping, as a plain array (the oracle every table is checked against).
    let map = ops.oracle();
    // Each LPN's run, named by its first LPN, in one pass.
    let mut run_of = vec![0u32; map.len()];
    for lpn in 0..map.len() {
        let continues = lpn % GROUP_LPNS != 0
            && match (map[lpn - 1], map[lpn]) {
                (REMOVE, REMOVE) => true,
                (REMOVE, _) | (_, REMOVE) => false,
                (before, ppn) => before.wrapping_add(1) == ppn,
            };
        run_of[lpn] = if continues {
            run_of[lpn - 1]
        } else {
            lpn as u32
        };
    }
    let (mut run_misses, mut group_hits) = ([0u64; KS.len()], [0u64; KS.len()]);
    let (mut at_run_start, mut follow_hits) = (0u64, [0u64; KS.len()]);
    let (mut runs, mut groups) = (Vec::new(), Vec::new());
    let mut last_run = u32::MAX;
    let mut miss_lpns = Vec::new();
    for &lpn in &ops.gets {
        let run = run_of[lpn as usize];
        if run == last_run {
            continue;
        }
        last_run = run;
        miss_lpns.push(lpn);
        // The run just before this one in the group, if the miss lands on this run's start.
        let at_start = lpn == run && !(lpn as usize).is_multiple_of(GROUP_LPNS);
        at_run_start += u64::from(at_start);
        let before_at = at_start
            .then(|| runs.iter().position(|&r| r == run_of[lpn as usize - 1]))
            .flatten();
        let run_at = touch(&mut runs, run);
        let group_at = touch(&mut groups, lpn >> GROUP_SHIFT);
        for (i, &k) in KS.iter().enumerate() {
            run_misses[i] += u64::from(run_at.is_none_or(|at| at >= k));
            group_hits[i] += u64::from(group_at.is_some_and(|at| at < k));
            follow_hits[i] += u64::from(before_at.is_some_and(|at| at < k));
        }
    }
    let live_groups = {
        let mut g: Vec<u32> = (0..map.len())
            .filter(|&l| map[l] != REMOVE)
            .map(|l| (l >> GROUP_SHIFT) as u32)
            .collect();
        g.dedup();
        g.len()
    };
    let misses = miss_lpns.len();
    let pct = |n: u64| 100.0 * n as f64 / misses.max(1) as f64;
    println!(
        "{trace}: {} lookups, {misses} leave the run before; groups with live mappings: {live_groups}",
        ops.gets.len()
    );
    println!(
        "misses at a run's start (not a group's): {at_run_start} ({:.1} %)",
        pct(at_run_start)
    );
    println!(
        "| k | misses with k recent runs | misses in one of the k groups before | misses starting the run after one of k recent runs |"
    );
    println!("|---:|---:|---:|---:|");
    for (i, k) in KS.iter().enumerate() {
        println!(
            "| {k} | {} | {} ({:.1} %) | {} ({:.1} %) |",
            run_misses[i],
            group_hits[i],
            pct(group_hits[i]),
            follow_hits[i],
            pct(follow_hits[i])
        );
    }
    let live = map.iter().filter(|&&ppn| ppn != REMOVE).count();
    println!("live mappings: {live}");
    println!("| cache holds LPNs of | block LPNs | blocks | misses in a cached block |");
    println!("|---|---:|---:|---:|");
    for divisor in [4, 16, 64] {
        for block_shift in [4, 6, 8] {
            let capacity = ((live / divisor) >> block_shift).max(1);
            let hits = block_cache_hits(&miss_lpns, block_shift, capacity);
            println!(
                "| live / {divisor} | {} | {capacity} | {hits} ({:.1} %) |",
                1 << block_shift,
                pct(hits)
            );
        }
    }
    // A one-entry window: every lookup outside the last one's aligned block of 64 LPNs misses,
    // whether or not it leaves its run.
    let window_misses = ops
        .gets
        .iter()
        .scan(u32::MAX, |window, &lpn| {
            let left = lpn >> 6 != *window;
            *window = lpn >> 6;
            Some(u64::from(left))
        })
        .sum::<u64>();
    println!("lookups leaving an aligned window of 64 LPNs (one entry): {window_misses}");
    Ok(())
}
