//! The merge policy: how much the update buffer may hold (`buffer_bound`, and a bound on the
//! groups it holds), which buffered group a merge folds next (a clock hand), and the merge
//! itself: the group's blob decoded, the buffered runs laid over it, the group re-encoded.

use super::cursor::Span;
use super::delta::DeltaRun;
use super::{group, LearnedMapping, BUFFER_MAX_ENTRIES, TOMBSTONE};
use ftlab_core::ftl::mapping::MappingTable;

/// A buffered group costs its record (48 bytes) and its first run list (64 bytes) at least, and
/// 512 bytes of bits once it holds more than 8 runs, so the buffer holds at most one group per
/// this many LPNs of its bound (and at least
/// `MIN_BUFFER_GROUPS`), of the groups whose blobs are small (`UNBOUNDED_BLOB_BYTES`): writes
/// scattered one to a group cannot make it some 75 times its bound's worth of runs. (Uniform
/// random writes over 1 TiB held 38 MB of buffer for 62 K LPNs.) The nbdkit traces and the
/// default simulation never reach it; the traces tiled to 16 TiB do, with the groups of a few
/// LPNs each tile leaves behind (`merge_to_bound`).
pub(super) const BOUND_LPNS_PER_GROUP: u64 = 64;
pub(super) const MIN_BUFFER_GROUPS: u64 = 64;
/// A group whose blob takes at least this many bytes is buffered outside that bound: its
/// buffer's fixed cost (at most about 600 bytes) is then at most about twice its own blob's
/// size, so the buffer stays within a small multiple of the table. Without it, uniformly random
/// writes to a fresh drive (768 groups, soon of a hundred or more random PPNs each, against a
/// bound of 64 groups and more) merged a group of one or two LPNs at about every third write,
/// 0.2 M simulated writes a wall second; sparse devices, whose groups hold a few LPNs each, keep
/// the bound as it was (notes/mapping-log.md, "Random writes to a fresh drive"). 512 until run lists
/// were packed, which made such groups' blobs about a third smaller, then 384 until their offsets
/// took Elias-Fano lists, a quarter smaller again: 288 keeps about the same groups out of the
/// bound (notes/mapping-log.md, "Packed run lists" and "Elias-Fano offsets").
pub(super) const UNBOUNDED_BLOB_BYTES: usize = 288;

/// Working memory of merges, allocated per round of merges (not part of the table at rest).
#[derive(Default)]
pub(super) struct MergeScratch {
    /// The group's current runs, decoded from its blob.
    base: Vec<group::GroupRun>,
    /// Those with the buffered updates laid over them.
    merged: Vec<group::GroupRun>,
    encode: group::Scratch,
}

impl LearnedMapping {
    #[inline]
    pub fn buffer_bound(&self) -> u64 {
        (self.live >> self.buffer_live_shift)
            .min(BUFFER_MAX_ENTRIES)
            .max(self.buffer_min_entries)
    }

    /// The most groups the buffer may hold, for `bound` LPNs (`buffer_bound`).
    #[inline]
    pub(super) fn buffer_group_bound(&self, bound: u64) -> usize {
        (bound / BOUND_LPNS_PER_GROUP).max(self.buffer_min_groups) as usize
    }

    /// Merges until the buffer fits its bound, then gives the tail its budget (`Tail::limit`).
    /// Every update that changes the buffer, other than `defer_tail`, ends with it.
    #[inline]
    pub(super) fn merge_while_over_bound(&mut self) {
        debug_assert_eq!(self.tail.pending(), 0);
        // Merges do not change the live count, so neither do they the bound.
        let bound = self.buffer_bound();
        let group_bound = self.buffer_group_bound(bound);
        if self.buffered_entries > bound || self.small_deltas > group_bound {
            self.merge_to_bound(bound, group_bound);
        }
        self.buffer_group_cap = group_bound;
        // Half the room left: each deferred append adds one LPN to the buffer, and a trim also
        // lowers the bound by at most one per `d` (`live >> buffer_live_shift`, d >= 1), so `k`
        // of them take at most `k + ceil(k / d) <= 2k` of it. Merges therefore happen exactly when
        // checking after every update would make them. (A u32: the bound is at most 2^32.)
        debug_assert!(self.buffered_entries <= bound);
        let budget = ((bound - self.buffered_entries) / 2) as u32;
        let t = &mut self.tail;
        t.limit = t.bound.min(t.lpn.saturating_add(budget));
    }

    #[cold]
    fn merge_to_bound(&mut self, bound: u64, group_bound: usize) {
        let mut work = MergeScratch::default();
        while self.buffered_entries > bound || self.small_deltas > group_bound {
            if self.buffered_entries <= bound {
                // Too many groups, not too many LPNs: the hand's next counted group, whatever
                // it holds. Groups of a few LPNs that a stream left behind are never at the
                // mean, and otherwise stayed until the end (the files trace tiled to 16 TiB: 25
                // K groups, 98 % of them of at most 8 LPNs, 24 MB of buffer for its 1 M LPNs);
                // taking them in turn leaves none behind for long. The hand passes each
                // uncounted group at most once a rotation.
                let d = loop {
                    let d = self.clock_next();
                    if self.deltas[d].small {
                        break d;
                    }
                };
                self.merge(d as u32, &mut work);
                continue;
            }
            // A clock hand over the buffered groups picks the next one holding at least the
            // mean number of entries, rounded down (one always does): each merge folds about an
            // average share of the buffer. With n groups buffered, that mean m and the largest
            // holding `max`, the q groups that qualify satisfy q (max - m + 1) >= n, so over a
            // rotation the hand passes at most max - m + 1 groups a merge, however many are
            // buffered. Rounded up, one group of two entries among thousands of one (a sparse
            // device: the MSR hm0 sample tiled to 16 TiB) cost a scan of the whole buffer per
            // merge: 0.8 M updates a second, 15.8 M rounded down.
            let mean = self.buffered_entries / self.deltas.len() as u64;
            let d = loop {
                let d = self.clock_next();
                if u64::from(self.deltas[d].entries) >= mean {
                    break d;
                }
            };
            self.merge(d as u32, &mut work);
        }
    }

    /// The buffered group under the clock hand, which then moves on (wrapping).
    fn clock_next(&mut self) -> usize {
        if self.clock >= self.deltas.len() {
            self.clock = 0;
        }
        self.clock += 1;
        self.clock - 1
    }

    /// Folds delta `d` into its group's blob.
    pub(super) fn merge(&mut self, d: u32, work: &mut MergeScratch) {
        let delta = self.drop_delta(d);
        let g = delta.group;
        work.base.clear();
        if let Some(blob) = self.groups.blob(g) {
            group::decode_runs(blob, &mut work.base);
        }
        group::overlay(
            &work.base,
            &delta.runs,
            |r| {
                let ppn = (r.ppn != TOMBSTONE).then_some(r.ppn);
                (u32::from(r.off), u32::from(r.len), ppn)
            },
            &mut work.merged,
        );
        self.groups
            .set(g, group::encode_runs(&work.merged, &mut work.encode));
        // The arena may have grown before its garbage was collected; the delta is still held.
        let rest = self.heap_bytes() - self.groups.heap_bytes();
        self.peak_bytes = self.peak_bytes.max(
            self.groups.set_peak_heap_bytes()
                + rest
                + delta.runs.capacity() * std::mem::size_of::<DeltaRun>(),
        );
        // The span may say "buffered" for what is now compressed (only the statistics care).
        *self.span.get_mut() = Span::default();
        self.follow.get_mut().lpn = 0;
        self.stats.merges += 1;
        self.stats.merged_entries += u64::from(delta.entries);
    }
}
