//! Checks every mapping table against a plain HashMap: shared by the property tests and the
//! `mapping_tables` fuzz target, so both hold the tables to the same standard.

use crate::LearnedMapping;
use ftlab_core::ftl::mapping::{ExtentMapping, FlatMapping, HashMapping, MappingTable};
use std::collections::HashMap;

/// Replays `ops` ((lpn, Some(ppn)) = set or, for some updates of a mapped LPN, relocate;
/// (lpn, None) = remove) on `table`, comparing every returned previous value and the live count
/// with the oracle, and after each op looks up (`peek` and `get`) the LPN and the two after it;
/// then reads back every LPN below `lpns`, before and after `compact()`. `after_op` may inspect
/// the table after each op. Panics on the first difference.
pub fn check_table<M: MappingTable>(
    table: &mut M,
    ops: &[(u32, Option<u32>)],
    lpns: u32,
    after_op: impl FnMut(&M, &HashMap<u32, u32>),
) {
    let every_lpn: Vec<u32> = (0..lpns).collect();
    check_table_probing(table, ops, lpns, &every_lpn, after_op);
}

/// `check_table`, reading back only the LPNs of `probes` (ascending, below `lpns`) at the end,
/// for devices too large to read whole.
pub fn check_table_probing<M: MappingTable>(
    table: &mut M,
    ops: &[(u32, Option<u32>)],
    lpns: u32,
    probes: &[u32],
    mut after_op: impl FnMut(&M, &HashMap<u32, u32>),
) {
    debug_assert!(probes.windows(2).all(|w| w[0] < w[1]) && probes.last() < Some(&lpns));
    let mut oracle: HashMap<u32, u32> = HashMap::new();
    // The largest heap seen after an operation: the table's peak may not be below it.
    let mut most_bytes = table.heap_bytes();
    for &(lpn, value) in ops {
        let (old, expected) = match value {
            // Half of the updates of a mapped LPN to a new PPN go as GC moves do, through
            // `relocate`, which is told the current PPN instead of returning it.
            Some(ppn) => match oracle.get(&lpn).copied() {
                Some(from) if from != ppn && (lpn ^ ppn) & 1 == 1 => {
                    table.relocate(lpn, from, ppn);
                    (Some(from), oracle.insert(lpn, ppn))
                }
                _ => (table.set(lpn, ppn), oracle.insert(lpn, ppn)),
            },
            None => (table.remove(lpn), oracle.remove(&lpn)),
        };
        assert_eq!(
            old,
            expected,
            "{}: previous value of lpn {lpn}",
            table.name()
        );
        assert_eq!(
            table.live_mappings(),
            oracle.len() as u64,
            "{}",
            table.name()
        );
        // Lookups between updates, of the LPN and the two after it: a table that remembers
        // where its last lookup ended (learned: the cursor and the follow-on position) must
        // not answer from what the update changed.
        // A `peek` may know nothing (`None`), but what it does know must be right.
        for l in lpn..lpn.saturating_add(3).min(lpns) {
            let want = oracle.get(&l).copied();
            if let Some(ppn) = table.peek(l) {
                assert_eq!(
                    Some(ppn),
                    want,
                    "{}: peek of lpn {l} after an update of lpn {lpn}",
                    table.name()
                );
            }
            assert_eq!(
                table.get(l),
                want,
                "{}: lpn {l} after an update of lpn {lpn}",
                table.name()
            );
        }
        most_bytes = most_bytes.max(table.heap_bytes());
        assert!(
            table.peak_heap_bytes() >= most_bytes,
            "{}: peak {} below a size it had, {most_bytes}",
            table.name(),
            table.peak_heap_bytes()
        );
        after_op(table, &oracle);
    }
    for &lpn in probes {
        assert_eq!(
            table.get(lpn),
            oracle.get(&lpn).copied(),
            "{} lpn {lpn}",
            table.name()
        );
    }
    // A lookup just before compacting, and the read-back starting right after it: where a
    // lookup ended must not outlive the re-encoding.
    let mid = probes.len() / 2;
    if let Some(&lpn) = probes.get(mid) {
        table.get(lpn);
    }
    table.compact();
    assert!(table.peak_heap_bytes() >= most_bytes, "{}", table.name());
    let (before, after) = probes.split_at((mid + 1).min(probes.len()));
    for &lpn in after.iter().chain(before) {
        let want = oracle.get(&lpn).copied();
        assert_eq!(
            table.get(lpn),
            want,
            "{} lpn {lpn} after compact",
            table.name()
        );
    }
    // Every live mapping listed once, in LPN order (on devices read whole: the listing may
    // look every LPN up).
    if probes.len() == lpns as usize {
        let mut listed = Vec::with_capacity(oracle.len());
        table.for_each_live(u64::from(lpns), &mut |lpn, ppn| listed.push((lpn, ppn)));
        let mut want: Vec<(u32, u32)> = oracle.iter().map(|(&l, &p)| (l, p)).collect();
        want.sort_unstable();
        assert!(
            listed == want,
            "{}: for_each_live lists {} mappings, the oracle {}",
            table.name(),
            listed.len(),
            want.len()
        );
    }
}

/// All four tables on `ops`; the learned one with a buffer of at least `learned_buffer` entries
/// (or one in `learned_divisor` live mappings), and after each of its merges every LPN the
/// buffer does not hold is read from the compressed layer.
pub fn check_all(ops: &[(u32, Option<u32>)], lpns: u32, learned_buffer: u64, learned_divisor: u64) {
    check_table(&mut FlatMapping::new(u64::from(lpns)), ops, lpns, |_, _| {});
    let every_lpn: Vec<u32> = (0..lpns).collect();
    check_sparse_tables(ops, lpns, &every_lpn, learned_buffer, learned_divisor);
}

/// `check_all` but for the flat array (a device's worth of memory), reading back the LPNs of
/// `probes` (ascending): for sparse devices (`SparseDevice`).
pub fn check_sparse_tables(
    ops: &[(u32, Option<u32>)],
    lpns: u32,
    probes: &[u32],
    learned_buffer: u64,
    learned_divisor: u64,
) {
    check_table_probing(&mut HashMapping::new(), ops, lpns, probes, |_, _| {});
    check_table_probing(&mut ExtentMapping::new(), ops, lpns, probes, |_, _| {});
    let mut merges_seen = 0;
    // At most two groups buffered (the tests' few groups never reach the default 64): merges
    // also come from the bound on groups, which takes the clock hand's next group.
    let mut learned = LearnedMapping::with_buffer(u64::from(lpns), learned_buffer)
        .buffer_live_divisor(learned_divisor)
        .buffer_min_groups(2);
    check_table_probing(&mut learned, ops, lpns, probes, |t, oracle| {
        t.assert_buffer_counts();
        if t.stats().merges == merges_seen {
            return;
        }
        merges_seen = t.stats().merges;
        assert!(t.buffered_entries() <= t.buffer_bound());
        for &lpn in probes {
            if !t.is_buffered(lpn) {
                let want = oracle.get(&lpn).copied();
                assert_eq!(t.compressed(lpn), want, "compressed layer, lpn {lpn}");
            }
        }
    });
    assert_eq!(
        learned.buffered_entries(),
        0,
        "compact() leaves nothing buffered"
    );
}

/// A sparse device for `ops_from_bytes`' operations: their LPNs, below `SPARSE_USED_LPNS`, are
/// laid out in `SPARSE_BLOCKS` blocks of `SPARSE_BLOCK_LPNS`, block `k` from LPN `first + k *
/// stride`. The layouts put the blocks in groups far apart, over several chunks of the learned
/// table's delta index and directory (1024 groups each), in devices of up to 400 GiB, or across
/// group boundaries: what the dense device of the other checks never reaches.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub struct SparseDevice {
    pub first: u32,
    pub stride: u32,
}

pub const SPARSE_BLOCK_LPNS: u32 = 512;
pub const SPARSE_BLOCKS: u32 = 24;
pub const SPARSE_USED_LPNS: u32 = SPARSE_BLOCK_LPNS * SPARSE_BLOCKS;

impl SparseDevice {
    /// One of four layouts: blocks at the start of adjacent groups; 227 groups apart (about four
    /// blocks a chunk; blocks 1 to 5 straddle two groups); 1031 groups apart (one a chunk); and
    /// adjacent groups' last 256 LPNs with the next ones' first 256 (every block straddles two).
    pub fn from_byte(b: u8) -> Self {
        const GROUP: u32 = crate::GROUP_LPNS as u32;
        let (first, stride) = match b % 4 {
            0 => (0, GROUP),
            1 => (0, 227 * GROUP + 4001),
            2 => (0, 1031 * GROUP + 123),
            _ => (GROUP - SPARSE_BLOCK_LPNS / 2, GROUP),
        };
        Self { first, stride }
    }

    pub fn lpns(&self) -> u32 {
        self.first + SPARSE_BLOCKS * self.stride
    }

    /// The device LPN of used LPN `v` (< `SPARSE_USED_LPNS`).
    pub fn lpn(&self, v: u32) -> u32 {
        self.first + v / SPARSE_BLOCK_LPNS * self.stride + v % SPARSE_BLOCK_LPNS
    }

    /// Every block's LPNs and the LPN either side of it, ascending: what a read-back checks.
    pub fn probes(&self) -> Vec<u32> {
        let mut probes: Vec<u32> = (0..SPARSE_BLOCKS)
            .flat_map(|k| {
                let first = self.lpn(k * SPARSE_BLOCK_LPNS);
                first.saturating_sub(1)..(first + SPARSE_BLOCK_LPNS + 1).min(self.lpns())
            })
            .collect();
        probes.dedup();
        probes
    }

    /// The `mapping_sparse` fuzz target's check, and its property test's: `data`'s operations
    /// on the device its first byte picks (`ops_from_bytes`), on every table but the flat array
    /// (`check_sparse_tables`), the learned table's buffer at least 32 entries, as in the
    /// `mapping_tables` target.
    pub fn check_bytes(data: &[u8]) {
        let (device, ops) = Self::ops_from_bytes(data);
        let divisor = crate::BUFFER_LIVE_DIVISOR;
        check_sparse_tables(&ops, device.lpns(), &device.probes(), 32, divisor);
    }

    /// Fuzzer bytes as operations on this device: the first byte picks the layout, the rest go
    /// to `ops_from_bytes`.
    pub fn ops_from_bytes(data: &[u8]) -> (Self, Vec<(u32, Option<u32>)>) {
        let device = Self::from_byte(data.first().copied().unwrap_or(0));
        let mut ops = ops_from_bytes(data.get(1..).unwrap_or(&[]), SPARSE_USED_LPNS);
        for (lpn, _) in &mut ops {
            *lpn = device.lpn(*lpn);
        }
        (device, ops)
    }
}

/// A log-structured device with FIFO cleaning, against a HashMap: `steps` host writes (a fill of
/// `lpns` LPNs, then random overwrites) take the next of `slots` physical pages in a ring (so
/// PPNs are reused), and before the head comes within an eighth of the ring of the oldest slot,
/// the valid pages there move to the head through `relocate`, as GC moves them. Every old PPN
/// `set` returns and, at the end, every mapping before and after `compact` must match.
/// `before_step(table, step)` runs before each host write. Returns the number of moves.
pub fn check_fifo_cleaning<M: MappingTable>(
    table: &mut M,
    lpns: u32,
    slots: u32,
    steps: u32,
    seed: u64,
    mut before_step: impl FnMut(&mut M, u32),
) -> u64 {
    // Cleaning stops at an eighth of the ring free, so every LPN must fit in the rest.
    assert!(
        slots - slots / 8 > lpns,
        "the ring must hold every LPN and an eighth spare"
    );
    let mut rng = ftlab_core::rng::SplitMix64::new(seed);
    let mut oracle: HashMap<u32, u32> = HashMap::new();
    // Slot -> the LPN last written there (valid while that LPN still maps to the slot).
    let mut owner = vec![u32::MAX; slots as usize];
    let (mut head, mut tail, mut moves) = (0u64, 0u64, 0u64);
    let slot = |i: u64| (i % u64::from(slots)) as u32;
    for step in 0..steps {
        while head - tail >= u64::from(slots - slots / 8) {
            let from = slot(tail);
            tail += 1;
            let lpn = owner[from as usize];
            if lpn != u32::MAX && oracle.get(&lpn) == Some(&from) {
                let to = slot(head);
                head += 1;
                table.relocate(lpn, from, to);
                oracle.insert(lpn, to);
                owner[to as usize] = lpn;
                moves += 1;
            }
        }
        before_step(table, step);
        let lpn = if step < lpns {
            step
        } else {
            rng.bounded(u64::from(lpns)) as u32
        };
        let ppn = slot(head);
        head += 1;
        assert_eq!(table.set(lpn, ppn), oracle.insert(lpn, ppn), "lpn {lpn}");
        owner[ppn as usize] = lpn;
    }
    for lpn in 0..lpns {
        assert_eq!(table.get(lpn), oracle.get(&lpn).copied(), "lpn {lpn}");
    }
    table.compact();
    for lpn in 0..lpns {
        let want = oracle.get(&lpn).copied();
        assert_eq!(table.get(lpn), want, "lpn {lpn} after compact");
    }
    moves
}

/// Decodes fuzzer bytes into one group's mappings and updates to try in place: the first half
/// of `ops_from_bytes`' operations over one group laid into a dense array (one PPN or
/// `group::UNMAPPED` per offset), the second half's writes as (offset, PPN) updates.
pub fn group_from_bytes(data: &[u8]) -> (Vec<u32>, Vec<(u32, u32)>) {
    use crate::{group, GROUP_LPNS};
    let ops = ops_from_bytes(data, GROUP_LPNS as u32);
    let (build, update) = ops.split_at(ops.len() / 2);
    let mut dense = vec![group::UNMAPPED; GROUP_LPNS];
    for &(lpn, value) in build {
        dense[lpn as usize] = value.unwrap_or(group::UNMAPPED);
    }
    let updates = update
        .iter()
        .filter_map(|&(lpn, value)| Some((lpn, value?)))
        .collect();
    (dense, updates)
}

/// Decodes fuzzer bytes into operations over `lpns` LPNs: 7 bytes per op (kind, lpn, ppn);
/// kinds write runs, strided runs, single pages with arbitrary PPNs, trims, or runs of pages
/// with PPNs from a small pool (reused as a simulator reuses them: updates that go in place).
pub fn ops_from_bytes(data: &[u8], lpns: u32) -> Vec<(u32, Option<u32>)> {
    let mut ops = Vec::new();
    let mut head = 0u32;
    for c in data.chunks_exact(7) {
        let lpn = u32::from(u16::from_le_bytes([c[1], c[2]])) % lpns;
        let x = u32::from_le_bytes([c[3], c[4], c[5], c[6]]);
        let count = 1 + x % 512;
        match c[0] % 5 {
            0 => {
                for l in lpn..(lpn + count).min(lpns) {
                    ops.push((l, Some(head)));
                    head = head.wrapping_add(1) % (u32::MAX - 1);
                }
            }
            1 => {
                let stride = 1 + (x >> 16) % 7;
                for k in 0..count % 64 {
                    let l = lpn + k * stride;
                    if l < lpns {
                        ops.push((l, Some(head)));
                        head = head.wrapping_add(1) % (u32::MAX - 1);
                    }
                }
            }
            2 => ops.push((lpn, Some(x.min(u32::MAX - 1)))),
            3 => ops.extend((lpn..(lpn + count).min(lpns)).map(|l| (l, None))),
            _ => {
                let mut y = x;
                for l in lpn..(lpn + count % 64).min(lpns) {
                    y = y.wrapping_mul(747796405).wrapping_add(2891336453);
                    ops.push((l, Some(y >> 20)));
                }
            }
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GROUP_LPNS;

    /// The layouts are what `SparseDevice::from_byte` says: probes ascending and on the device,
    /// the blocks straddling groups and spread over directory chunks as described.
    #[test]
    fn sparse_layouts_straddle_and_spread_as_described() {
        let group = GROUP_LPNS as u32;
        let chunk_lpns = 1024 * group;
        for (byte, straddling, chunks) in [(0u8, 0, 1), (1, 5, 6), (2, 0, 24), (3, 24, 1)] {
            let d = SparseDevice::from_byte(byte);
            let probes = d.probes();
            assert!(probes.windows(2).all(|w| w[0] < w[1]), "layout {byte}");
            assert!(*probes.last().unwrap() < d.lpns(), "layout {byte}");
            let firsts: Vec<u32> = (0..SPARSE_BLOCKS)
                .map(|k| d.lpn(k * SPARSE_BLOCK_LPNS))
                .collect();
            let straddle = firsts
                .iter()
                .filter(|&&f| f / group != (f + SPARSE_BLOCK_LPNS - 1) / group)
                .count();
            assert_eq!(straddle, straddling, "layout {byte}");
            let mut spanned: Vec<u32> = firsts.iter().map(|f| f / chunk_lpns).collect();
            spanned.dedup();
            assert_eq!(spanned.len(), chunks, "layout {byte}");
        }
    }
}
