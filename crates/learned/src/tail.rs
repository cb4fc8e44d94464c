//! The tail: a sequential stream of buffered writes continued in registers (`Tail`), the
//! cursor it extends, and the buffer's write clock.

use super::*;

/// Where the last buffered write can be continued without reading its run: writing `lpn` with
/// the run's offset (`tail_off`) lengthens run `at` of delta `d` by one, while `lpn < bound` (the
/// LPN before the group's next buffered run, which a longer run would reach or coalesce with, or
/// the group's end). Kept by every buffered write; forgotten when a delta is dropped (indices
/// move).
///
/// `set` and `remove` continue it in a few registers: the run, its delta's count and the
/// buffer's total are written once the stream ends (`pending` of them, `flush_tail`), and the
/// buffer's bound is not checked per update (`limit`), so a sequential stream moves the tail's
/// `lpn` and the cursor's front only. Everything else flushes first; `lookup_slow` adds
/// `pending` to the run.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub(crate) struct Tail {
    pub(crate) lpn: u32,
    /// What continues the run (`tail_off`): its PPNs less their LPNs (`ppn_off`), the same for
    /// each of them, or `NO_PPN_OFF` for a run of trims. Kept rather than the next PPN, so an
    /// append changes `lpn` alone.
    pub(crate) off: u64,
    pub(crate) bound: u32,
    /// Where deferred appends stop: `bound`, or sooner, where they would use up the room
    /// `merge_while_over_bound` leaves before the buffer could outgrow `buffer_bound`.
    pub(crate) limit: u32,
    /// `lpn` when the deferred appends were last written: `lpn - flushed` of them are pending
    /// (counted so, the append increments `lpn` alone).
    pub(crate) flushed: u32,
    pub(crate) d: u32,
    pub(crate) at: u32,
}

impl Tail {
    /// Whether writing a value of offset `off` (`tail_off`) to `lpn` lengthens the tail's run
    /// by one.
    #[inline(always)]
    pub(crate) fn continued_by(&self, lpn: u32, off: u64) -> bool {
        lpn == self.lpn && off == self.off && lpn < self.bound
    }

    /// Appends to the run not yet written into it (`flush_tail`).
    #[inline(always)]
    pub(crate) fn pending(&self) -> u32 {
        self.lpn - self.flushed
    }

    /// Continues nothing (`lpn < bound` never holds).
    pub(crate) const NONE: Tail = Tail {
        lpn: 0,
        off: 0,
        bound: 0,
        limit: 0,
        flushed: 0,
        d: 0,
        at: 0,
    };
}

/// What a run holding `value` at `lpn` keeps for every LPN (`Tail::off`; `DeltaRun::continues`
/// compares runs this way too): `ppn_off`, or `NO_PPN_OFF` for a trim, which no PPN's offset
/// equals. So a trim continues only trims, and a PPN only PPNs: a run ending at the last valid
/// PPN (`u32::MAX - 1`) would be continued only by `u32::MAX`, which is the tombstone.
#[inline(always)]
pub(crate) fn tail_off(lpn: u32, value: u32) -> u64 {
    if value == TOMBSTONE {
        NO_PPN_OFF
    } else {
        ppn_off(lpn, value)
    }
}

impl LearnedMapping {
    /// Buffers `lpn -> value` if it continues the last buffered write (`Tail`), which it
    /// lengthens by one without reading it; false, changing nothing, otherwise. (Reading the run
    /// back to check it, as `extend_cursor` does, cost streams of updates a quarter more
    /// instructions: notes/mapping-log.md.) For the slow paths, which have flushed the tail and check
    /// the bound themselves; `set` and `remove` use `defer_tail`.
    #[inline(always)]
    pub(crate) fn extend_tail(&mut self, lpn: u32, value: u32) -> bool {
        let t = self.tail;
        debug_assert_eq!(t.pending(), 0);
        if !t.continued_by(lpn, tail_off(lpn, value)) {
            return false;
        }
        let delta = &mut self.deltas[t.d as usize];
        let r = &mut delta.runs[t.at as usize];
        let group_lpn = delta.group << GROUP_SHIFT;
        debug_assert_eq!(
            (t.lpn & OFFSET_MASK, t.off),
            (r.start() + r.len(), tail_off(group_lpn + r.start(), r.ppn))
        );
        r.len += 1;
        delta.entries += 1;
        self.bits_pool.set_bit(delta.bits, lpn & OFFSET_MASK, true);
        self.buffered_entries += 1;
        self.step_tail(lpn);
        self.tail.flushed = self.tail.lpn;
        true
    }

    /// `extend_tail` for `set` and `remove`: the run and the counts are written by
    /// `flush_tail`, and no merge is due (`limit`). False, changing nothing, where it does not
    /// apply. `off` is `tail_off` of the value: `set` passes its PPN's, `remove` `NO_PPN_OFF`.
    #[inline(always)]
    pub(crate) fn defer_tail(&mut self, lpn: u32, off: u64) -> bool {
        let t = &self.tail;
        debug_assert!(t.limit <= t.bound);
        if lpn != t.lpn || off != t.off || lpn >= t.limit {
            return false;
        }
        self.step_tail(lpn);
        true
    }

    /// The tail now ends after `lpn` (just appended); the cursor and the follow-on position no
    /// longer hold for it.
    #[inline(always)]
    pub(crate) fn step_tail(&mut self, lpn: u32) {
        self.tail.lpn += 1;
        self.span.get_mut().forget(lpn);
        self.follow.get_mut().lpn = 0;
    }

    /// Advances the buffer's clock by `n` writes and returns it; restarts it first where it
    /// would wrap.
    #[inline]
    pub(crate) fn tick(&mut self, n: u32) -> u32 {
        if self.buffer_clock > u32::MAX - n {
            self.restart_clock();
        }
        self.buffer_clock += n;
        self.buffer_clock
    }

    /// Every delta and chunk so far reads as time 1, which tells nothing of any of them (a delta
    /// of `since` 1 skips no search); later writes read 2 and on.
    #[cold]
    pub(crate) fn restart_clock(&mut self) {
        self.buffer_clock = 1;
        for delta in &mut self.deltas {
            delta.since = 1;
        }
        self.write_times.floor = 1;
        self.write_times.chunks.fill(1);
    }

    /// Writes the deferred appends (`Tail::pending`) into the tail's run and the counts. Every
    /// update that is not `defer_tail` calls it first.
    #[inline]
    pub(crate) fn flush_tail(&mut self) {
        let t = &mut self.tail;
        let pending = t.pending();
        if pending == 0 {
            return;
        }
        let first_lpn = t.flushed;
        t.flushed = t.lpn;
        if self.write_times.on && t.off != NO_PPN_OFF {
            // The deferred appends were LPNs `first_lpn..t.lpn`, each at its LPN plus `off`.
            let off = t.off as u32;
            let (first, last) = (first_lpn.wrapping_add(off), (t.lpn - 1).wrapping_add(off));
            let now = self.tick(pending);
            self.write_times.note(first, last, now);
        }
        let t = self.tail;
        let delta = &mut self.deltas[t.d as usize];
        let end = t.lpn - (delta.group << GROUP_SHIFT);
        self.bits_pool
            .set_bits(delta.bits, end - pending, end, true);
        // A delta covers at most GROUP_LPNS offsets, so the counts fit their u16s.
        delta.runs[t.at as usize].len += pending as u16;
        delta.entries += pending as u16;
        self.buffered_entries += u64::from(pending);
    }

    /// Buffers `lpn -> value` if it continues the run group `g`'s last write went to
    /// (`runs::extend_at`, which also handles reaching the next run); false, changing nothing,
    /// otherwise. `last_delta` must be `g`'s.
    pub(crate) fn extend_cursor(&mut self, lpn: u32, value: u32) -> bool {
        let (g, d) = self.last_delta;
        debug_assert_eq!(g, lpn >> GROUP_SHIFT);
        let delta = &mut self.deltas[d as usize];
        let at = usize::from(delta.cursor);
        let off = lpn & OFFSET_MASK;
        let Some(covered) = runs::extend_at(&mut delta.runs, at, off, value) else {
            return false;
        };
        self.bits_pool.set_bit(delta.bits, off, true);
        if !covered {
            delta.entries += 1;
            self.buffered_entries += 1;
        }
        self.span.get_mut().forget(lpn);
        self.follow.get_mut().lpn = 0;
        true
    }

    /// Points `tail` after the run group `g`'s last write went to (`last_delta` is `g`'s).
    pub(crate) fn set_tail(&mut self) {
        let (g, d) = self.last_delta;
        let delta = &self.deltas[d as usize];
        let at = usize::from(delta.cursor);
        let group_lpn = g << GROUP_SHIFT;
        self.tail = match delta.runs.get(at) {
            Some(r) => Tail {
                lpn: group_lpn + r.start() + r.len(),
                off: tail_off(group_lpn + r.start(), r.ppn),
                // A next run starts after `r`'s start, so at 1 or later.
                bound: group_lpn
                    + delta
                        .runs
                        .get(at + 1)
                        .map_or(GROUP_LPNS as u32, |next| next.start() - 1),
                // No deferred appends until `merge_while_over_bound` gives the room.
                limit: 0,
                flushed: group_lpn + r.start() + r.len(),
                d,
                at: at as u32,
            },
            None => Tail::NONE,
        };
    }

    /// GC moves a run's pages one after another, each into the buffer (a page inside a run cannot
    /// go in place alone), as a stream continuing the tail. When a write does not continue it,
    /// and the tail's run covers exactly a run of its group's blob, the blob takes the new PPNs
    /// in place where they fit (`group::move_run_in_place`) and the buffer drops the run: no
    /// merge for it. In the default preset most moves the blobs refused were of such runs (from
    /// the sequential fill). Only bitmap words take a run so (their runs lie within a word), and
    /// only the buffer's runs of two or more pages are tried, once each.
    pub(crate) fn settle_tail_run(&mut self) {
        let t = self.tail;
        debug_assert_eq!(t.pending(), 0);
        let Some(delta) = self.deltas.get(t.d as usize) else {
            return;
        };
        let Some(&r) = delta.runs.get(t.at as usize) else {
            return;
        };
        let g = delta.group;
        // `Tail::NONE`, or a tail that is not this run's end, continues nothing here.
        if r.len < 2
            || r.ppn == TOMBSTONE
            || (g << GROUP_SHIFT) + r.start() + r.len() != t.lpn
            || !words::within_a_word(r.start(), r.len())
        {
            return;
        }
        let Some(blob) = self.groups.blob_mut(g) else {
            return;
        };
        if !group::move_run_in_place(blob, r.start(), r.len(), r.ppn) {
            return;
        }
        let delta = &mut self.deltas[t.d as usize];
        delta.runs.remove(t.at as usize);
        self.bits_pool
            .set_bits(delta.bits, r.start(), r.start() + r.len(), false);
        delta.cursor = delta.cursor.min(delta.runs.len().saturating_sub(1) as u16);
        delta.entries -= r.len;
        self.buffered_entries -= u64::from(r.len);
        // Run indices moved; what the lookup cursor caches did not change.
        self.tail = Tail::NONE;
        self.last_delta = NO_LAST_DELTA;
        self.follow.get_mut().lpn = 0;
        if self.deltas[t.d as usize].entries == 0 {
            self.drop_delta(t.d);
        }
        self.stats.runs_moved_in_place += 1;
    }
}
