//! Property tests of every mapping table against a HashMap oracle: random, sequential, strided,
//! descending and trace-shaped sequences with overwrites and trims across group boundaries. The
//! learned table runs with a tiny buffer so that it merges often, and after every merge every
//! LPN the buffer does not hold is read back from the compressed layer itself.

use crate::support::cases;
use ftlab_core::ftl::mapping::MappingTable;
use ftlab_learned::{oracle, LearnedMapping};
use ftlab_learned::{BUFFER_LIVE_DIVISOR, GROUP_LPNS};
use proptest::prelude::*;

/// Three whole groups and a partial one: every boundary is exercised.
const LPNS: u32 = 3 * GROUP_LPNS as u32 + 123;

/// PPNs of `Pattern::Recycled`: a device of 2^14 pages.
const RECYCLED_PPNS: u64 = 1 << 14;

#[derive(Clone, Debug)]
enum Pattern {
    /// `count` pages from `lpn` upward, PPNs from the log head (a sequential write).
    Sequential {
        lpn: u32,
        count: u32,
    },
    /// Every `stride`-th page.
    Strided {
        lpn: u32,
        count: u32,
        stride: u32,
    },
    /// `count` pages from `lpn` downward.
    Descending {
        lpn: u32,
        count: u32,
    },
    /// One page anywhere.
    Random {
        lpn: u32,
    },
    /// One page with an arbitrary PPN (not the log head): worst-case values.
    RandomPpn {
        lpn: u32,
        ppn: u32,
    },
    Trim {
        lpn: u32,
        count: u32,
    },
    /// `count` pages from `lpn` mapped to the last PPNs (ending at `u32::MAX - 1`, the tables'
    /// largest), then the next `trims` pages trimmed: a run whose next PPN would be `u32::MAX`.
    TopPpns {
        lpn: u32,
        count: u32,
        trims: u32,
    },
    /// A sequential write of `count` pages, then `overwrites` of them (one or two pages at a
    /// time) written again at the log head: a line with outliers (`learned/patches.rs`).
    Aged {
        lpn: u32,
        count: u32,
        overwrites: u32,
        seed: u64,
    },
    /// `count` pages from `lpn` upward with PPNs drawn from a small device's worth (as a
    /// simulator with garbage collection reuses them): updates that fit a group's blob in place.
    Recycled {
        lpn: u32,
        count: u32,
        seed: u64,
    },
}

fn pattern() -> impl Strategy<Value = Pattern> {
    prop_oneof![
        3 => (0..LPNS, 1..3000u32).prop_map(|(lpn, count)| Pattern::Sequential { lpn, count }),
        1 => (0..LPNS, 1..400u32, 2..9u32).prop_map(|(lpn, count, stride)| Pattern::Strided { lpn, count, stride }),
        1 => (0..LPNS, 1..2000u32).prop_map(|(lpn, count)| Pattern::Descending { lpn, count }),
        4 => (0..LPNS).prop_map(|lpn| Pattern::Random { lpn }),
        1 => (0..LPNS, 0..u32::MAX).prop_map(|(lpn, ppn)| Pattern::RandomPpn { lpn, ppn }),
        2 => (0..LPNS, 1..2500u32).prop_map(|(lpn, count)| Pattern::Trim { lpn, count }),
        1 => (0..LPNS, 1..64u32, 0..4u32).prop_map(|(lpn, count, trims)| Pattern::TopPpns { lpn, count, trims }),
        2 => (0..LPNS, 1..3000u32, any::<u64>()).prop_map(|(lpn, count, seed)| Pattern::Recycled { lpn, count, seed }),
        2 => (0..LPNS, 2..5000u32, 1..200u32, any::<u64>()).prop_map(|(lpn, count, overwrites, seed)| Pattern::Aged { lpn, count, overwrites, seed }),
    ]
}

/// Expands patterns into (lpn, Some(ppn) | None) operations; PPNs come from a log head, as a
/// log-structured FTL assigns them.
fn expand(patterns: &[Pattern]) -> Vec<(u32, Option<u32>)> {
    let mut ops = Vec::new();
    let mut head = 0u32;
    let mut write = |lpn: u32, ops: &mut Vec<_>| {
        ops.push((lpn, Some(head)));
        head += 1;
    };
    for p in patterns {
        match *p {
            Pattern::Sequential { lpn, count } => {
                for l in lpn..(lpn + count).min(LPNS) {
                    write(l, &mut ops);
                }
            }
            Pattern::Strided { lpn, count, stride } => {
                for k in 0..count {
                    let l = lpn + k * stride;
                    if l < LPNS {
                        write(l, &mut ops);
                    }
                }
            }
            Pattern::Descending { lpn, count } => {
                for l in (lpn.saturating_sub(count)..=lpn).rev() {
                    write(l, &mut ops);
                }
            }
            Pattern::Random { lpn } => write(lpn, &mut ops),
            Pattern::RandomPpn { lpn, ppn } => ops.push((lpn, Some(ppn))),
            Pattern::Trim { lpn, count } => {
                for l in lpn..(lpn + count).min(LPNS) {
                    ops.push((l, None));
                }
            }
            Pattern::TopPpns { lpn, count, trims } => {
                let end = (lpn + count).min(LPNS);
                for l in lpn..end {
                    ops.push((l, Some(u32::MAX - 1 - (end - 1 - l))));
                }
                for l in end..(end + trims).min(LPNS) {
                    ops.push((l, None));
                }
            }
            Pattern::Aged {
                lpn,
                count,
                overwrites,
                seed,
            } => {
                let end = (lpn + count).min(LPNS);
                for l in lpn..end {
                    write(l, &mut ops);
                }
                let mut rng = ftlab_core::rng::SplitMix64::new(seed);
                for _ in 0..overwrites {
                    let l = lpn + rng.bounded(u64::from(end - lpn)) as u32;
                    for l in l..(l + 1 + rng.bounded(2) as u32).min(end) {
                        write(l, &mut ops);
                    }
                }
            }
            Pattern::Recycled { lpn, count, seed } => {
                let mut rng = ftlab_core::rng::SplitMix64::new(seed);
                for l in lpn..(lpn + count).min(LPNS) {
                    ops.push((l, Some(rng.bounded(RECYCLED_PPNS) as u32)));
                }
            }
        }
    }
    ops
}

/// Update streams of the real traces (log-head PPNs), read once.
fn real_updates() -> &'static [Vec<(u32, u32)>] {
    static UPDATES: std::sync::OnceLock<Vec<Vec<(u32, u32)>>> = std::sync::OnceLock::new();
    UPDATES.get_or_init(|| {
        ["rocksdb.nbdlog.gz", "pgbench.nbdlog.gz", "files.nbdlog.gz"]
            .iter()
            .map(|name| {
                let path = crate::support::trace(name);
                ftlab_mapbench::ops_from_trace(
                    &path,
                    None,
                    None,
                    ftlab_mapbench::PpnSource::LogHead,
                )
                .expect("trace reads")
                .updates
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// Trace-shaped sequences: a window of a real trace's updates (writes in runs, trims of
    /// whole files, rewrites), its LPNs folded into the small test space.
    #[test]
    fn real_trace_windows_match_a_hashmap(trace in 0..3usize, start in 0..1_000_000usize, len in 1..6000usize, divisor_log2 in 0..6u32) {
        let updates = &real_updates()[trace];
        let start = start % updates.len();
        let window = &updates[start..(start + len).min(updates.len())];
        let ops: Vec<(u32, Option<u32>)> = window
            .iter()
            .map(|&(lpn, v)| (lpn % LPNS, (v != ftlab_mapbench::REMOVE).then_some(v)))
            .collect();
        oracle::check_all(&ops, LPNS, 64, 1 << divisor_log2);
    }

    #[test]
    fn every_table_matches_a_hashmap(patterns in prop::collection::vec(pattern(), 1..40)) {
        oracle::check_all(&expand(&patterns), LPNS, 64, BUFFER_LIVE_DIVISOR);
    }

    #[test]
    fn fuzz_decoded_operations_match_a_hashmap(data in prop::collection::vec(any::<u8>(), 0..400)) {
        oracle::check_all(&oracle::ops_from_bytes(&data, LPNS), LPNS, 32, BUFFER_LIVE_DIVISOR);
    }

    /// The `mapping_sparse` fuzz target's check, on random bytes: the same operations over
    /// blocks of LPNs far apart in a device of up to 400 GiB.
    #[test]
    fn fuzz_decoded_operations_on_a_sparse_device_match_a_hashmap(data in prop::collection::vec(any::<u8>(), 0..400)) {
        oracle::SparseDevice::check_bytes(&data);
    }

    /// The `group_encodings` fuzz target's check, on random bytes: one group in its chosen
    /// encoding and in bitmap words, read back lookup by lookup and updated in place.
    #[test]
    fn fuzz_decoded_groups_read_back_in_every_encoding(data in prop::collection::vec(any::<u8>(), 0..700)) {
        let (dense, updates) = oracle::group_from_bytes(&data);
        ftlab_learned::group::check_encodings(&dense, &updates);
    }
}

#[test]
fn uniformly_random_ppns_cost_at_most_four_and_a_half_bytes() {
    let mut t = LearnedMapping::new(1 << 20);
    let mut x = 12345u64;
    for lpn in 0..1u32 << 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        t.set(lpn, ((x >> 32) as u32).min(u32::MAX - 1));
    }
    t.compact();
    let per = t.heap_bytes() as f64 / t.live_mappings() as f64;
    eprintln!("uniformly random 32-bit PPNs: {per:.4} bytes per mapping");
    assert!(per <= 4.5, "{per} bytes per mapping");
}

/// Uniformly random writes to a fresh device, as the simulator's generators make without
/// preconditioning: more groups are written than the bound on buffered groups allows at first,
/// but their blobs soon hold hundreds of random PPNs each, beside which a buffered group's fixed
/// cost is small, so they stay buffered and a merge folds many LPNs rather than one or two
/// (merges forced by the bound on groups took about every third write: 0.2 M simulated writes a
/// wall second). Every mapping reads back.
#[test]
fn random_writes_to_a_fresh_device_merge_many_lpns_at_a_time() {
    let (lpns, ops) = random_writes(768, 400_000, 11, |i| i);
    let mut t = LearnedMapping::new(u64::from(lpns));
    oracle::check_table(&mut t, &ops, lpns, |_, _| {});
    let stats = t.stats();
    let per_merge = stats.merged_entries as f64 / stats.merges as f64;
    eprintln!("{} merges, {per_merge:.1} LPNs each", stats.merges);
    assert!(per_merge >= 4.0, "{stats:?}");
}

/// `count` writes of uniformly random LPNs over `groups` whole groups, the i-th to PPN `ppn(i)`,
/// and the LPNs the groups hold.
fn random_writes(
    groups: u32,
    count: u32,
    seed: u64,
    ppn: impl Fn(u32) -> u32,
) -> (u32, Vec<(u32, Option<u32>)>) {
    let lpns = groups * GROUP_LPNS as u32;
    let mut rng = ftlab_core::rng::SplitMix64::new(seed);
    let ops = (0..count)
        .map(|i| (rng.bounded(u64::from(lpns)) as u32, Some(ppn(i))))
        .collect();
    (lpns, ops)
}

/// Writes scattered over a thousand groups, a few to each (a sparsely written device): the
/// buffer holds at most its bound's worth of groups, so its bytes (each group's record and runs,
/// and the index) stay near that many groups' worth, not the thousand groups'; and a group of a
/// few buffered runs keeps no bits (512 bytes, 32 KB for 64 groups), its runs are scanned
/// instead. Every mapping reads back.
#[test]
fn scattered_writes_bound_the_groups_buffered() {
    let (lpns, ops) = random_writes(1000, 20_000, 5, |i| 3 * i + 1);
    let mut t = LearnedMapping::new(u64::from(lpns));
    let (mut most_groups, mut most_buffer_bytes) = (0, 0);
    oracle::check_table(&mut t, &ops, lpns, |t, _| {
        t.assert_buffer_counts();
        most_groups = most_groups.max(t.buffered_groups());
        most_buffer_bytes = most_buffer_bytes.max(t.heap_bytes() - t.compressed_bytes());
    });
    assert!(most_groups <= 64, "{most_groups} groups buffered");
    eprintln!("{most_buffer_bytes} bytes of buffer at most");
    // 64 groups' records, their first run lists and the index's 4 KiB chunk take about 12 KB
    // (their slab's capacity may have doubled past 64 once): 14.5 KB here, where bits for every
    // buffered group took 79 KB.
    assert!(
        most_buffer_bytes <= 24 * 1024,
        "{most_buffer_bytes} bytes of buffer at most"
    );
}

/// Random overwrites with PPNs a simulator would reuse: most go into the groups' blobs in
/// place (a packed residual, a one-point segment), through `set` and `relocate` alike, and every
/// mapping reads back.
#[test]
fn random_overwrites_of_reused_ppns_go_in_place_and_read_back() {
    const N: u32 = 1 << 16;
    let mut rng = ftlab_core::rng::SplitMix64::new(7);
    let mut ops: Vec<(u32, Option<u32>)> = (0..N)
        .map(|lpn| (lpn, Some(rng.bounded(1 << 18) as u32)))
        .collect();
    ops.extend((0..200_000).map(|_| {
        (
            rng.bounded(u64::from(N)) as u32,
            Some(rng.bounded(1 << 18) as u32),
        )
    }));
    let mut t = LearnedMapping::new(u64::from(N));
    oracle::check_table(&mut t, &ops, N, |_, _| {});
    let in_place = t.stats().updates_in_place;
    assert!(
        in_place > 150_000,
        "{in_place} of 200000 overwrites in place"
    );
}

/// GC moves on a log with FIFO cleaning and reused PPNs (`oracle::check_fifo_cleaning`): most
/// are of pages written before their groups' deltas were made, which the table answers without
/// searching its buffer (`gc_moves_known_unbuffered`; debug builds check each such answer against
/// the search), and every mapping matches a HashMap.
#[test]
fn gc_moves_of_old_pages_skip_the_buffer_search_and_read_back() {
    const N: u32 = 1 << 15;
    // A buffer of 64 LPNs: merges often enough that a slot's pages are cleaned after their
    // groups' next merges (most of these overwrites go into the blobs in place).
    let mut t = LearnedMapping::with_buffer(u64::from(N), 64).buffer_live_divisor(1 << 20);
    let moves = oracle::check_fifo_cleaning(&mut t, N, N + N / 4, 400_000, 11, |_, _| {});
    let skipped = t.stats().gc_moves_known_unbuffered;
    let settled = t.stats().runs_moved_in_place;
    eprintln!(
        "{skipped} of {moves} moves skipped the search; {settled} buffered runs went in place"
    );
    assert!(moves > 100_000, "{moves} moves");
    assert!(
        skipped * 2 > moves,
        "{skipped} of {moves} moves skipped the search"
    );
}

/// A run of a bitmap-word blob rewritten whole (as GC moves it, or a host rewrites it) goes into
/// the blob in place once the stream ends, with no merge; a run rewritten in part stays in the
/// buffer. Every mapping reads back.
#[test]
fn a_whole_run_rewritten_goes_into_its_blob_in_place() {
    // One group: runs of three pages with a hole after each, PPNs scattered (bitmap words).
    let mut rng = ftlab_core::rng::SplitMix64::new(5);
    let mut t = LearnedMapping::new(GROUP_LPNS as u64);
    let mut oracle = std::collections::HashMap::new();
    let mut set = |t: &mut LearnedMapping, lpn: u32, ppn: u32| {
        assert_eq!(t.set(lpn, ppn), oracle.insert(lpn, ppn), "lpn {lpn}");
    };
    let mut first_ppn = Vec::new();
    for run in 0..GROUP_LPNS as u32 / 4 {
        let ppn = 8 * rng.bounded(1 << 20) as u32;
        first_ppn.push(ppn);
        for k in 0..3 {
            set(&mut t, 4 * run + k, ppn + k);
        }
    }
    t.compact();
    assert_eq!(t.encodings(), [0, 0, 1, 0], "one group, in bitmap words");
    let merges = t.stats().merges;
    // Run 10 (offsets 40..43) takes run 12's PPNs: within its word's range, next to no run.
    let p = first_ppn[12];
    for k in 0..3 {
        set(&mut t, 40 + k, p + k);
    }
    // Run 20 (offsets 80..83) is rewritten in part.
    for k in 0..2 {
        set(&mut t, 80 + k, p + 10 + k);
    }
    // A write elsewhere ends each stream.
    set(&mut t, 4000, 12345);
    let stats = t.stats().clone();
    assert_eq!(stats.runs_moved_in_place, 1, "{stats:?}");
    assert_eq!(stats.merges, merges, "{stats:?}");
    // Run 20's two pages and the write at 4000 are buffered; run 10 is not.
    assert_eq!(t.buffered_entries(), 3);
    assert!(!t.is_buffered(41) && t.is_buffered(80));
    assert_eq!(t.compressed(42), Some(p + 2));
    for lpn in 0..GROUP_LPNS as u32 {
        assert_eq!(t.get(lpn), oracle.get(&lpn).copied(), "lpn {lpn}");
    }
}

#[test]
fn a_sequential_fill_costs_almost_nothing() {
    let mut t = LearnedMapping::new(1 << 20);
    for lpn in 0..1u32 << 20 {
        t.set(lpn, lpn + 77);
    }
    t.compact();
    let per = t.heap_bytes() as f64 / t.live_mappings() as f64;
    assert!(per < 0.02, "{per} bytes per mapping");
    assert_eq!(t.get(12345), Some(12345 + 77));
}

/// The compressed fraction counts GETs only: none before the first (updates, prefetch hints and
/// the FTL's checks look the table up too, and do not count), then, once the caller has noted its
/// GETs (`note_gets`), the share the buffer did not answer.
#[test]
fn the_compressed_fraction_counts_gets_only() {
    let mut t = LearnedMapping::new(1 << 16);
    t.set(60_000, 7);
    for lpn in 0..1000 {
        t.set(lpn, lpn + 5);
    }
    t.remove(3);
    // A lookup that is not a GET leaves the range it found in the cursor.
    t.is_buffered(10);
    assert_eq!(t.peek(11), Some(16), "the cursor holds the range found");
    // Mapped, but outside the cursor: a hint answers from the cursor alone.
    assert_eq!(t.peek(60_000), None, "no lookup behind a hint");
    assert_eq!(t.get_uncounted(60_000), Some(7));
    assert_eq!(t.get_uncounted(999), Some(1004));
    assert_eq!(t.compressed_get_fraction(), None);
    // 1000 buffered LPNs: more than the buffer's minimum, so some are merged.
    assert!(t.buffered_entries() < 1000);
    let buffered = (0..1000).filter(|&l| t.is_buffered(l)).count() as f64;
    for lpn in 0..1000 {
        assert_eq!(t.get(lpn), (lpn != 3).then_some(lpn + 5));
    }
    t.note_gets(1000);
    let f = t.compressed_get_fraction().expect("after GETs");
    assert!(
        (f - (1.0 - buffered / 1000.0)).abs() < 1e-9,
        "{f} vs {buffered} buffered"
    );
}

/// The cursor's count: lookups of one run of consecutive PPNs, in order, search once (the span
/// found holds the rest); lookups of pages that each map apart search every time, buffered or
/// merged; the other lookups (updates, hints, checks) are not counted.
#[test]
fn the_cursor_counts_the_gets_it_did_not_answer() {
    let misses = |t: &LearnedMapping| {
        let a = t.activity();
        (a.gets, a.get_cursor_misses)
    };
    for merged in [false, true] {
        let mut t = LearnedMapping::new(1 << 16);
        // One run (LPNs 0..2000 to PPNs 10_000..), then pages that each map apart (every
        // third PPN).
        for lpn in 0..2000 {
            t.set(lpn, 10_000 + lpn);
        }
        for lpn in 4096..6096 {
            t.set(lpn, 3 * lpn);
        }
        if merged {
            t.compact();
        }
        // Not counted, and leave the cursor away from the run.
        t.is_buffered(7);
        t.get_uncounted(5000);
        assert_eq!(misses(&t), (0, 0), "merged {merged}");
        for lpn in 0..2000 {
            assert_eq!(t.get(lpn), Some(10_000 + lpn));
        }
        t.note_gets(2000);
        assert_eq!(misses(&t), (2000, 1), "merged {merged}");
        for lpn in 4096..6096 {
            assert_eq!(t.get(lpn), Some(3 * lpn));
        }
        t.note_gets(2000);
        assert_eq!(misses(&t), (4000, 2001), "merged {merged}");
        t.reset_activity();
        assert_eq!(misses(&t), (0, 0));
    }
}

/// The memory bar on the real traces (log-head PPNs, after compaction): the learned table
/// is never larger than the extent map, at most 0.15 B per live mapping on rocksdb, at most 0.6x
/// the extent map on pgbench; every table reads every mapping back.
#[test]
fn learned_is_smaller_than_extent_on_every_real_trace() {
    use ftlab_mapbench::{ops_from_trace, PpnSource};
    let traces = [
        "rocksdb.nbdlog.gz",
        "pgbench.nbdlog.gz",
        "files.nbdlog.gz",
        "rocksdb.msr.csv.gz",
        "pgbench.msr.csv.gz",
        "files.msr.csv.gz",
        "msr-hm0-sample.csv",
        "msr-rsrch0-sample.csv",
    ];
    for name in traces {
        let ops = ops_from_trace(&crate::support::trace(name), None, None, PpnSource::LogHead)
            .expect("trace reads");
        let oracle = ops.oracle();
        let mut extent = ftlab_core::ftl::mapping::ExtentMapping::new();
        let mut learned = LearnedMapping::new(ops.logical_pages);
        for &(lpn, v) in &ops.updates {
            if v == ftlab_mapbench::REMOVE {
                extent.remove(lpn);
                learned.remove(lpn);
            } else {
                extent.set(lpn, v);
                learned.set(lpn, v);
            }
        }
        extent.compact();
        learned.compact();
        for (lpn, &v) in oracle.iter().enumerate() {
            let want = (v != ftlab_mapbench::REMOVE).then_some(v);
            assert_eq!(learned.get(lpn as u32), want, "{name} lpn {lpn}");
        }
        let live = learned.live_mappings() as f64;
        let (l, e) = (
            learned.heap_bytes() as f64 / live,
            extent.heap_bytes() as f64 / live,
        );
        let [runs, segments, words, patched] = learned.encodings();
        eprintln!(
            "{name}: learned {l:.3} B/mapping, extent {e:.3}; groups: {runs} run lists, \
             {segments} segments, {words} bitmap words, {patched} patched"
        );
        assert!(l <= e, "{name}: learned {l} > extent {e}");
        if name == "rocksdb.nbdlog.gz" {
            assert!(l <= 0.15, "{name}: {l}");
        }
        if name == "pgbench.nbdlog.gz" {
            assert!(l <= 0.6 * e, "{name}: {l} vs extent {e}");
            // Its short runs are what the bitmap words are for (and what the read-back above
            // checks them on).
            assert!(
                words > segments,
                "{name}: {words} bitmap words, {segments} segments"
            );
        }
    }
}

/// `--ppns simulator` hands the tables the simulated drive's own updates: on a trace that writes
/// three times the device, randomly, the GC moves pages, and each move is one more SET (its
/// count must match the drive's report); the moves are what makes these PPNs differ from a log
/// head's, and every table still reads the final mapping back.
#[test]
fn simulator_ppns_carry_the_gc_relocations() {
    use ftlab_mapbench::{ops_from_trace, PpnSource, REMOVE};
    let dir = crate::support::temp_dir("mapbench-gc");
    let path = dir.path().join("random.csv");
    const DEVICE: u64 = 1 << 30;
    const CHUNK: u64 = 64 << 10;
    random_writes_trace(&path, DEVICE, CHUNK, 3 * DEVICE / CHUNK, 11);

    let log = ops_from_trace(&path, None, Some(DEVICE), PpnSource::LogHead).unwrap();
    let sim = ops_from_trace(&path, None, Some(DEVICE), PpnSource::Simulator).unwrap();
    let run = sim.simulator.clone().expect("the simulator's figures");
    assert!(
        run.gc_write_pages > 0 && run.erases > 0 && run.waf.unwrap() > 1.0,
        "{run:?}"
    );
    let host_pages = 3 * DEVICE / 4096;
    assert_eq!(log.writes, host_pages);
    assert_eq!(sim.writes, host_pages + run.gc_write_pages, "{run:?}");
    let (log_map, sim_map) = (log.oracle(), sim.oracle());
    let live = |m: &[u32]| m.iter().filter(|&&v| v != REMOVE).count();
    assert_eq!(live(&log_map), live(&sim_map));
    assert_ne!(log_map, sim_map, "GC moved pages, so some PPNs differ");
    let result = extent_and_learned_read_back(&sim);
    assert_eq!(
        result.simulator.as_ref().unwrap().gc_write_pages,
        run.gc_write_pages
    );
}

/// `ftlab mapbench`'s run of the extent and learned tables over the simulator's `ops`, each
/// table checked to read every mapping back.
fn extent_and_learned_read_back(ops: &ftlab_mapbench::MapOps) -> ftlab_mapbench::MapBench {
    let result = ftlab_mapbench::run(
        "random.csv",
        ftlab_mapbench::PpnSource::Simulator,
        ops,
        &["extent".to_string(), "learned".to_string()],
        1,
        ftlab_learned::BUFFER_LIVE_DIVISOR,
        &mut |_| {},
    );
    for t in &result.tables {
        assert!(t.lossless_verified, "{}", t.name);
    }
    result
}

/// Writes an MSR trace of `requests` writes of `chunk_bytes` each, at random chunk-aligned
/// offsets of a `device_bytes` device; returns the pages they write.
fn random_writes_trace(
    path: &std::path::Path,
    device_bytes: u64,
    chunk_bytes: u64,
    requests: u64,
    seed: u64,
) -> u64 {
    let mut rng = ftlab_core::rng::SplitMix64::new(seed);
    let mut text = String::from("Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n");
    for i in 0..requests {
        let offset = rng.bounded(device_bytes / chunk_bytes) * chunk_bytes;
        text.push_str(&format!(
            "{},t,0,Write,{offset},{chunk_bytes},0\n",
            10_000 * (i + 1)
        ));
    }
    std::fs::write(path, text).unwrap();
    requests * chunk_bytes / 4096
}

/// A fill (`mapbench --precondition`) writes every LPN once, in order, before the trace, so a
/// trace that writes less than the spare moves no page on an empty drive and many on a full
/// one. The fill's updates come first and are counted; with a log head they map LPN i to PPN i
/// and the trace's PPNs follow on; every table reads the final mapping back.
#[test]
fn a_fill_makes_the_gc_move_pages_for_a_short_trace() {
    use ftlab_mapbench::{ops_from_trace_with, OpsOptions, PpnSource, REMOVE};
    let dir = crate::support::temp_dir("mapbench-fill");
    let path = dir.path().join("random.csv");
    const DEVICE: u64 = 1 << 30;
    let pages = DEVICE / 4096;
    // A tenth of the device, 8 KiB at random offsets: less than the 7 % spare (plus the blocks
    // that round the flash up) can take without moving anything.
    let host_pages = random_writes_trace(&path, DEVICE, 8 << 10, DEVICE / 10 / (8 << 10), 5);

    let ops = |source, fill| {
        let options = OpsOptions {
            fill,
            ..OpsOptions::default()
        };
        ops_from_trace_with(&path, None, Some(DEVICE), source, &options, &mut |_| {}).unwrap()
    };
    let empty = ops(PpnSource::Simulator, false);
    assert_eq!(empty.fill_updates, 0);
    assert_eq!(empty.simulator.as_ref().unwrap().gc_write_pages, 0);

    let full = ops(PpnSource::Simulator, true);
    let run = full.simulator.clone().unwrap();
    assert!(run.gc_write_pages > host_pages, "{run:?}");
    // The fill writes every page once (its GC moves, if any, are the fill's too).
    assert!(full.fill_updates >= pages, "{}", full.fill_updates);
    assert_eq!(
        full.writes,
        full.fill_updates + host_pages + run.gc_write_pages,
        "{run:?}"
    );
    let live = |m: &[u32]| m.iter().filter(|&&v| v != REMOVE).count() as u64;
    assert_eq!(live(&full.oracle()), pages);

    let log = ops(PpnSource::LogHead, true);
    assert_eq!(log.fill_updates, pages);
    assert_eq!(log.writes, pages + host_pages);
    assert!(log.updates[..pages as usize]
        .iter()
        .enumerate()
        .all(|(i, &(lpn, ppn))| lpn as usize == i && ppn as usize == i));
    assert_eq!(log.updates[pages as usize].1 as u64, pages);
    assert_eq!(live(&log.oracle()), pages);

    let result = extent_and_learned_read_back(&full);
    assert_eq!(result.fill_updates, full.fill_updates);
    // Devices too large to fill are refused, naming the trace.
    let err = ops_from_trace_with(
        &path,
        None,
        Some(1 << 41),
        PpnSource::LogHead,
        &OpsOptions {
            fill: true,
            ..OpsOptions::default()
        },
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("random.csv") && err.contains("--precondition"),
        "{err}"
    );
}

/// The drive behind the simulator's PPNs is the caller's: with GC only when out of room, more
/// spare moves fewer pages on the same full drive; random overwrites after the fill (an aged
/// drive) come before the trace and count as the fill's; GC moves to a frontier of their own
/// still arrive as SETs, read back losslessly; the settings are reported as given; keys
/// mapbench sets itself are refused.
#[test]
fn the_simulated_drive_is_the_callers() {
    use ftlab_mapbench::{ops_from_trace_with, DriveSetup, OpsOptions, PpnSource};
    let dir = crate::support::temp_dir("mapbench-drive");
    let path = dir.path().join("random.csv");
    const DEVICE: u64 = 1 << 30;
    let pages = DEVICE / 4096;
    // Three tenths of the device, 8 KiB at random offsets: more than the spare holds.
    let host_pages = random_writes_trace(&path, DEVICE, 8 << 10, DEVICE * 3 / 10 / (8 << 10), 7);
    let run = |spare_factor: f64, settings: &[&str]| {
        let options = OpsOptions {
            fill: true,
            drive: DriveSetup {
                spare_factor,
                settings: settings.iter().map(|s| s.to_string()).collect(),
            },
        };
        ops_from_trace_with(
            &path,
            None,
            Some(DEVICE),
            PpnSource::Simulator,
            &options,
            &mut |_| {},
        )
    };

    let tight = run(0.07, &[]).unwrap();
    let t = tight.simulator.clone().unwrap();
    assert_eq!(t.spare_factor, 0.07);
    assert!(t.settings.is_empty());
    // The preset's background GC (FEMU's: while under a quarter of the superblocks are free,
    // any block an eighth invalid) runs whatever the spare; with GC only when the drive is out
    // of room, the spare decides how much it moves.
    let lazy = ["ftl.gc_thres_pcent=100", "ftl.gc_thres_pcent_high=100"];
    let lazy_tight = run(0.07, &lazy).unwrap().simulator.unwrap();
    let lazy_roomy = run(0.25, &lazy).unwrap().simulator.unwrap();
    assert_eq!(lazy_roomy.spare_factor, 0.25);
    assert_eq!(lazy_roomy.settings, lazy);
    assert!(
        lazy_roomy.gc_write_pages * 2 < lazy_tight.gc_write_pages
            && lazy_tight.gc_write_pages < t.gc_write_pages,
        "{lazy_tight:?} against {lazy_roomy:?} and {t:?}"
    );

    let aged = run(0.07, &["workload.precondition_overwrites=1"]).unwrap();
    // The fill and a capacity of random overwrites (and their GC moves) come first.
    assert!(aged.fill_updates >= 2 * pages, "{}", aged.fill_updates);
    assert_eq!(
        aged.updates.len() as u64 - aged.fill_updates,
        tight.updates.len() as u64 - tight.fill_updates
            + aged.simulator.as_ref().unwrap().gc_write_pages
            - t.gc_write_pages,
        "the trace's own writes are the same {host_pages}"
    );

    let separate = run(0.07, &["ftl.gc_separate_frontier=true"]).unwrap();
    let s = separate.simulator.clone().unwrap();
    assert_eq!(s.settings, ["ftl.gc_separate_frontier=true"]);
    assert_eq!(
        separate.writes,
        separate.fill_updates + host_pages + s.gc_write_pages,
        "{s:?}"
    );
    assert_ne!(separate.updates, tight.updates);
    extent_and_learned_read_back(&separate);

    for (setting, says) in [
        ("capacity.spare_factor=0.2", "--spare-factor"),
        ("flash.blocks_per_die=64", "--spare-factor"),
        ("flash.page_size_bytes=8192", "4096 bytes"),
        ("workload.precondition=false", "--precondition"),
        ("ftl.mapping=\"learned\"", "mapbench's own table"),
        ("ftl.no_such_key=1", "no_such_key"),
        ("ftl.gc_thres_pcent", "KEY=VALUE"),
    ] {
        let err = format!("{:#}", run(0.07, &[setting]).unwrap_err());
        assert!(
            err.contains("--sim-set") && err.contains(says),
            "{setting}: {err}"
        );
    }
}

/// `peak_heap_bytes` is what DRAM a table needed at its largest: never less than its heap after
/// any operation (`oracle::check_table` samples it after every one), and for the tables
/// whose memory shrinks (the learned table's merges and arena collections, the extent map's
/// emptied chunks, any table's `compact`) more than it ends with. Debug builds (these tests')
/// also check the learned and extent tables' O(1) byte counts against full sums on every call.
#[test]
fn the_peak_bytes_bound_every_size_the_table_went_through() {
    use ftlab_core::ftl::mapping::{ExtentMapping, FlatMapping, HashMapping};
    // Streams, random pages, and trims of whole stretches (which empty groups and extent
    // chunks), with PPNs from a log head.
    let mut rng = ftlab_core::rng::SplitMix64::new(21);
    let (mut ops, mut head) = (Vec::new(), 0u32);
    for step in 0..20_000u32 {
        let lpn = rng.bounded(u64::from(LPNS)) as u32;
        let (len, trim) = match step % 7 {
            0..=2 => (16, false),
            3..=5 => (1, false),
            _ => (300, true),
        };
        for l in lpn..(lpn + len).min(LPNS) {
            ops.push((l, (!trim).then_some(head)));
            head += u32::from(!trim);
        }
    }
    // `check_table` asserts after every operation, and after `compact`, that the peak is not
    // below any heap the table had; this returns the peak, the heap at the end and compacted.
    fn drive<M: MappingTable>(mut table: M, ops: &[(u32, Option<u32>)]) -> (usize, usize, usize) {
        let mut end = 0;
        oracle::check_table(&mut table, ops, LPNS, |t, _| end = t.heap_bytes());
        (table.peak_heap_bytes(), end, table.heap_bytes())
    }
    let (peak, end, compacted) = drive(FlatMapping::new(u64::from(LPNS)), &ops);
    assert!(peak == end && end == compacted);
    let (peak, _, compacted) = drive(HashMapping::new(), &ops);
    assert!(peak > compacted, "{peak} {compacted}");
    let (peak, _, compacted) = drive(ExtentMapping::new(), &ops);
    assert!(peak > compacted, "{peak} {compacted}");
    let (peak, end, compacted) = drive(
        LearnedMapping::with_buffer(u64::from(LPNS), 64).buffer_min_groups(2),
        &ops,
    );
    assert!(peak > end && end > compacted, "{peak} {end} {compacted}");
}
