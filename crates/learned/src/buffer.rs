//! Buffered writes: a mapping set or removed in a group's delta, the delta dropped when merged,
//! and updates made in place in the compressed layer.

use super::*;

impl LearnedMapping {
    /// Gives delta `d`, which has none, its bits, set from its runs: it holds more than
    /// `BITS_ABOVE_RUNS` runs now (runs are added only where `write_delta_slow` assigns).
    #[cold]
    #[inline(never)]
    pub(crate) fn keep_bits(&mut self, d: u32) {
        let delta = &self.deltas[d as usize];
        debug_assert!(delta.bits == NO_BITS && delta.runs.len() > BITS_ABOVE_RUNS);
        let slot = self.bits_pool.take();
        let bits = self.bits_pool.get_mut(slot);
        for r in &delta.runs {
            set_bits(bits, r.start(), r.start() + r.len(), true);
        }
        self.deltas[d as usize].bits = slot;
        self.note_peak();
    }

    /// Buffers `value` for `lpn` (`None`: forgets a buffered update of an LPN the blob does not
    /// map). The common case, inline: a write continuing the run its group's last write went
    /// to (`runs::extend_at`). The rest stays out of line so callers stay small.
    #[inline(always)]
    pub(crate) fn write_delta(&mut self, lpn: u32, value: Option<u32>) {
        if self.write_times.on {
            if let Some(v) = value.filter(|&v| v != TOMBSTONE) {
                let now = self.tick(1);
                self.write_times.note(v, v, now);
            }
        }
        if !value.is_some_and(|v| self.extend_tail(lpn, v)) {
            self.write_delta_slow(lpn, value);
        }
    }

    /// `remove` where its fast path does not apply. Out of line, as `set_slow` is, so that the
    /// fast path stays small enough to inline into every caller whatever the lookup's size (a
    /// change to the blobs' lookups once took it out of `ftlab mapbench`'s loop: 14 % more
    /// instructions on rocksdb).
    #[inline(never)]
    pub(crate) fn remove_slow(&mut self, lpn: u32) -> Option<u32> {
        let (old, buffered) = self.lookup(lpn);
        let old = old?;
        self.remove_mapped(lpn, buffered);
        Some(old)
    }

    /// `set` where its fast path does not apply.
    #[inline(never)]
    pub(crate) fn set_slow(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        self.flush_tail();
        let (old, buffered) = self.lookup_with::<true>(lpn);
        if old == Some(ppn) {
            return old;
        }
        // The lookup said whether the blob could take `ppn` in place (a packed residual, a
        // one-point segment, a one-page run, with room for the value): most updates of a
        // trace's pages split exact runs or lie past a log-structured group's range, and skip
        // the attempt's second search.
        let (hint_lpn, (room_lo, room_hi)) = self.room_hint.get();
        if old.is_some()
            && !buffered
            && hint_lpn == lpn
            && (room_lo..=room_hi).contains(&ppn)
            && self.update_in_place(lpn, ppn)
        {
            return old;
        }
        self.write_delta(lpn, Some(ppn));
        self.live += u64::from(old.is_none());
        self.merge_while_over_bound();
        old
    }

    #[inline(never)]
    pub(crate) fn write_delta_slow(&mut self, lpn: u32, value: Option<u32>) {
        self.settle_tail_run();
        self.span.get_mut().forget(lpn);
        self.follow.get_mut().lpn = 0;
        let g = lpn >> GROUP_SHIFT;
        let off = lpn & OFFSET_MASK;
        let cached = self.last_delta;
        let d = match if cached.0 == g {
            Some(cached.1)
        } else {
            self.delta_index.get(g)
        } {
            Some(d) => d,
            None => {
                if value.is_none() {
                    return;
                }
                let d = self.deltas.len() as u32;
                let small = self
                    .groups
                    .blob(g)
                    .is_none_or(|b| group::encoded_len(b) < UNBOUNDED_BLOB_BYTES);
                self.small_deltas += usize::from(small);
                self.deltas.push(Delta {
                    group: g,
                    entries: 0,
                    cursor: 0,
                    since: self.buffer_clock,
                    small,
                    bits: NO_BITS,
                    runs: Vec::new(),
                });
                self.delta_index.set(g, d);
                self.note_peak();
                d
            }
        };
        self.last_delta = (g, d);
        // A sequential write (or trim) continues the run the group's last write went to:
        // `write_delta` tried the last buffered write's; here it is the first write after a
        // switch of groups, or one reaching the next buffered run.
        if value.is_some_and(|v| self.extend_cursor(lpn, v)) {
            self.set_tail();
            return;
        }
        let delta = &mut self.deltas[d as usize];
        // `assign` adds at most two runs. Growth by doubling would leave up to half of the
        // buffer's lists spare (counted in the table's bytes); by a quarter it leaves a fifth,
        // amortised O(1) all the same. Short lists grow by `MIN_RUNS_GROWTH` runs: growing by two
        // at a time cost this function 13 % more instructions on files' simulated updates, and
        // 48 more bytes are little beside a delta's record; the first list's 8 runs are as many
        // as a delta without bits holds (`BITS_ABOVE_RUNS`).
        if delta.runs.capacity() - delta.runs.len() < 2 {
            let before = delta.runs.capacity();
            delta
                .runs
                .reserve_exact((delta.runs.len() / 4).max(MIN_RUNS_GROWTH));
            self.run_bytes += (delta.runs.capacity() - before) * std::mem::size_of::<DeltaRun>();
            self.note_peak();
        }
        let delta = &mut self.deltas[d as usize];
        let (old, at) = runs::assign_at(&mut delta.runs, off, value);
        self.bits_pool.set_bit(delta.bits, off, value.is_some());
        let many = delta.bits == NO_BITS && delta.runs.len() > BITS_ABOVE_RUNS;
        // Fewer than GROUP_LPNS runs, so the index fits.
        delta.cursor = at as u16;
        match (old, value) {
            (None, Some(_)) => {
                delta.entries += 1;
                self.buffered_entries += 1;
            }
            (Some(_), None) => {
                delta.entries -= 1;
                self.buffered_entries -= 1;
            }
            _ => {}
        }
        if delta.entries == 0 {
            self.drop_delta(d);
        } else {
            if many {
                self.keep_bits(d);
            }
            self.set_tail();
        }
    }

    /// Counts `heap_bytes` into the peak. Called where the buffer grows (a new delta and its
    /// index chunk, a longer list) and before a delta is freed (`drop_delta`: merges, trims), so
    /// `write_times`, which grows elsewhere and shrinks only in `compact`, is counted before
    /// anything else goes. (The arena's growth within a merge: `merge`.)
    #[inline]
    pub(crate) fn note_peak(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.heap_bytes());
    }

    /// Removes delta `d` from the slab (swap-remove) and returns it; the peak counts it first.
    pub(crate) fn drop_delta(&mut self, d: u32) -> Delta {
        debug_assert_eq!(self.tail.pending(), 0);
        self.note_peak();
        let delta = self.deltas.swap_remove(d as usize);
        self.bits_pool.free(delta.bits);
        self.run_bytes -= delta.runs.capacity() * std::mem::size_of::<DeltaRun>();
        self.last_delta = NO_LAST_DELTA;
        self.tail = Tail::NONE;
        self.delta_index.remove(delta.group);
        if let Some(moved) = self.deltas.get(d as usize) {
            self.delta_index.set(moved.group, d);
        }
        self.buffered_entries -= u64::from(delta.entries);
        self.small_deltas -= usize::from(delta.small);
        delta
    }

    /// Writes `ppn` for mapped, unbuffered `lpn` into its group's blob when it fits there: a
    /// random overwrite then costs one search and a few bits, where the buffer would take an
    /// insertion and its share of a merge that re-encodes the whole group.
    #[inline]
    pub(crate) fn update_in_place(&mut self, lpn: u32, ppn: u32) -> bool {
        let Some(blob) = self.groups.blob_mut(lpn >> GROUP_SHIFT) else {
            return false;
        };
        if !group::update_in_place(blob, lpn & OFFSET_MASK, ppn) {
            return false;
        }
        self.span.get_mut().forget(lpn);
        self.stats.updates_in_place += 1;
        true
    }

    #[inline(never)]
    pub(crate) fn remove_mapped(&mut self, lpn: u32, buffered: bool) {
        self.flush_tail();
        // A tombstone only where the blob still maps the LPN; otherwise forgetting is enough.
        // An answer from the compressed layer says it does, without a second search.
        let blob_maps = !buffered || self.compressed(lpn).is_some();
        self.write_delta(lpn, blob_maps.then_some(TOMBSTONE));
        self.live -= 1;
        self.merge_while_over_bound();
    }
}
