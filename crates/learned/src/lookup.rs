//! The read path: a lookup by the cursor, then the buffer of deltas, then the group's blob;
//! what is buffered, what the compressed layer answers.

use super::*;

impl LearnedMapping {
    /// The current mapping and whether the buffer holds it, without counting a lookup.
    #[inline]
    pub(crate) fn lookup(&self, lpn: u32) -> (Option<u32>, bool) {
        self.lookup_with::<false>(lpn)
    }

    /// `lookup`; with `ROOM`, a search of the compressed layer also leaves what the blob could
    /// take in place in `room_hint`.
    #[inline]
    pub(crate) fn lookup_with<const ROOM: bool>(&self, lpn: u32) -> (Option<u32>, bool) {
        let span = self.span.get();
        if let Some(ppn) = span.get(lpn) {
            return (ppn, span.buffered);
        }
        self.lookup_slow::<ROOM>(lpn)
    }

    /// Searches the buffer, then the compressed layer, and remembers the span found; an LPN
    /// right after the last span the compressed layer gave is found without a search.
    pub(crate) fn lookup_slow<const ROOM: bool>(&self, lpn: u32) -> (Option<u32>, bool) {
        let g = lpn >> GROUP_SHIFT;
        let off = lpn & OFFSET_MASK;
        let group_lpn = lpn - off;
        let follow = self.follow.get();
        if lpn == follow.lpn && off != 0 {
            // Its group has a blob, and its buffered runs have not changed since (a write
            // would have forgotten `follow`); the next of them bounds the span.
            if let Some(blob) = self.groups.blob(g) {
                let found = group::lookup_next::<ROOM>(blob, off, follow.at);
                return self.found::<ROOM>(lpn, found, (0, follow.hi));
            }
        }
        // An offset the buffer holds (its bit, or the tail's deferred appends, offsets
        // `p_lo..p_hi`, which have no bits yet) is answered from there.
        let delta = self.delta(g);
        let (mut p_lo, mut p_hi) = (0, 0);
        // Its delta's bits, read once for both the test and the bounds (`None` where it keeps
        // none: its few runs are scanned).
        let mut bits = None;
        if let Some(d) = delta {
            let t = &self.tail;
            if t.pending() != 0 && t.d == d {
                p_hi = t.lpn - group_lpn;
                p_lo = p_hi - t.pending();
            }
            let held;
            (held, bits) = self.delta_holds(d, off);
            if held || off.wrapping_sub(p_lo) < p_hi - p_lo {
                return self.buffered_lookup(d, lpn);
            }
        }
        let found = match self.groups.blob(g) {
            Some(blob) => group::lookup_with::<ROOM>(blob, off),
            None => group::Lookup {
                ppn: None,
                lo: 0,
                hi: GROUP_LPNS as u32,
                room: group::NO_ROOM,
                next: group::Finger::NONE,
            },
        };
        // The buffered offsets nearest `off` bound the span, looked for only as far as the
        // blob's span reaches (for bitmap words, the offset's word).
        let (mut lo, mut hi) = (0, GROUP_LPNS as u32);
        if let Some(d) = delta {
            (lo, hi) = match bits {
                Some(b) => clear_around(b, off, found.lo, found.hi),
                None => runs_clear_around(&self.deltas[d as usize].runs, off),
            };
            if p_lo != p_hi {
                if p_hi <= off {
                    lo = lo.max(p_hi);
                } else {
                    hi = hi.min(p_lo);
                }
            }
            debug_assert_eq!(
                (lo, hi),
                self.buffer_bounds_by_search(d, off, (lo, hi), (found.lo, found.hi)),
                "lpn {lpn}"
            );
        }
        self.found::<ROOM>(lpn, found, (lo, hi))
    }

    /// The buffer's answer for `lpn`, which delta `d` holds (its bit or the tail says so): its
    /// run, kept as the span.
    #[inline(never)]
    pub(crate) fn buffered_lookup(&self, d: u32, lpn: u32) -> (Option<u32>, bool) {
        let off = lpn & OFFSET_MASK;
        let runs = &self.deltas[d as usize].runs;
        let i = runs::upper_spread(runs, off, GROUP_LPNS as u32);
        let mut r = runs[i - 1];
        let t = &self.tail;
        if t.pending() != 0 && (t.d, t.at) == (d, i as u32 - 1) {
            r.len += t.pending() as u16;
        }
        debug_assert!(off - r.start() < r.len(), "lpn {lpn}");
        let ppn = (r.ppn != TOMBSTONE).then(|| r.ppn + (off - r.start()));
        self.span
            .set(Span::at((lpn - off) + r.start(), r.len(), lpn, ppn, true));
        (ppn, true)
    }

    /// For debug builds: `lo..hi` (what `clear_around` gave for unbuffered `off`), checked
    /// against a search of delta `d`'s runs and the tail: no buffered offset in it, and a buffered
    /// offset (or the group's edge) right outside it unless it reaches past the blob's span
    /// `found_lo..found_hi` or `BOUND_SCAN_WORDS` words.
    /// Returns `lo..hi` when it holds.
    pub(crate) fn buffer_bounds_by_search(
        &self,
        d: u32,
        off: u32,
        (lo, hi): (u32, u32),
        (found_lo, found_hi): (u32, u32),
    ) -> (u32, u32) {
        let runs = &self.deltas[d as usize].runs;
        let t = &self.tail;
        let (mut below, mut above) = (None, None);
        for (k, r) in runs.iter().enumerate() {
            let extra = if t.pending() != 0 && (t.d, t.at) == (d, k as u32) {
                t.pending()
            } else {
                0
            };
            let (start, end) = (r.start(), r.start() + r.len() + extra);
            assert!(off < start || off >= end, "{off} is buffered");
            if end <= off {
                below = Some(end);
            } else if above.is_none() {
                above = Some(start);
            }
        }
        let true_lo = below.unwrap_or(0);
        let true_hi = above.unwrap_or(GROUP_LPNS as u32);
        let scan = 64 * BOUND_SCAN_WORDS as u32;
        assert!(
            lo >= true_lo && hi <= true_hi,
            "{lo}..{hi} against {true_lo}..{true_hi}"
        );
        assert!(
            lo == true_lo || lo <= found_lo || off - lo >= scan,
            "{lo} against {true_lo}"
        );
        assert!(
            hi == true_hi || hi > found_hi || hi - off > scan,
            "{hi} against {true_hi}"
        );
        (lo, hi)
    }

    /// Remembers what the compressed layer answered for `lpn`, within `lo..hi` (offsets the
    /// buffer does not hold): the span; where the next lookup may follow on, when the span
    /// ends before `hi` (which the follow-on lookup's span must not pass either); and for an
    /// update, the room in place.
    #[inline(always)]
    pub(crate) fn found<const ROOM: bool>(
        &self,
        lpn: u32,
        found: group::Lookup,
        (lo, hi): (u32, u32),
    ) -> (Option<u32>, bool) {
        let off = lpn & OFFSET_MASK;
        let group_lpn = lpn - off;
        // The answer's span, within the offsets the buffer does not hold.
        let (span_lo, span_hi) = (lo.max(found.lo), hi.min(found.hi));
        self.span.set(Span::at(
            group_lpn + span_lo,
            span_hi - span_lo,
            lpn,
            found.ppn,
            false,
        ));
        // (An empty group's span is the whole group: nothing follows it.)
        if found.hi < hi {
            self.follow.set(Follow {
                lpn: group_lpn + found.hi,
                at: found.next,
                hi,
            });
        }
        if ROOM {
            self.room_hint.set((lpn, found.room));
        }
        (found.ppn, false)
    }

    /// The buffered updates of group `g`, if any (no hashing while the buffer is empty).
    #[inline]
    pub(crate) fn delta(&self, g: u32) -> Option<u32> {
        if self.deltas.is_empty() {
            None
        } else {
            self.delta_index.get(g)
        }
    }

    /// Whether delta `d`'s runs hold offset `off` (its bit, or a scan of its few runs; the
    /// tail's deferred appends are not looked at), and its bits if it keeps them.
    #[inline]
    pub(crate) fn delta_holds(&self, d: u32, off: u32) -> (bool, Option<&BufferedBits>) {
        let delta = &self.deltas[d as usize];
        if delta.bits == NO_BITS {
            (runs_hold(&delta.runs, off), None)
        } else {
            let bits = self.bits_pool.get(delta.bits);
            (is_buffered_bit(bits, off), Some(bits))
        }
    }

    /// Whether the buffer holds the latest update of `lpn` (then the compressed layer may be
    /// stale for it).
    pub fn is_buffered(&self, lpn: u32) -> bool {
        self.lookup(lpn).1
    }

    /// What the compressed layer alone maps `lpn` to.
    #[inline]
    pub fn compressed(&self, lpn: u32) -> Option<u32> {
        let blob = self.groups.blob(lpn >> GROUP_SHIFT)?;
        group::get(blob, lpn & OFFSET_MASK)
    }
}
