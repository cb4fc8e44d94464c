//! The device write buffer: host writes are acknowledged once buffered; a buffered page that is
//! written again is updated in place (coalesced) and costs no flash program.
//!
//! Owns: which logical pages are buffered, and in what order they leave.
//! Does not know: flash addresses or timing. The FTL evicts with [`WriteBuffer::pop_next`] when
//! the buffer is full, on a host flush, and at the end of a run; the eviction order is the
//! [`BufferPolicy`], matched in that one place.
//!
//! `Fifo` keeps a ring: pages leave in the order they entered (a trimmed page's slot leaves as a
//! tombstone). `Hexa` (docs/persistence.md) keeps the buffered pages grouped by translation
//! page and evicts one group at a time, so that the pages programmed together dirty one
//! translation page instead of one each: buckets of groups by size give the largest in O(1).

use crate::addr::Lpn;
pub use crate::config::BufferPolicy;
use crate::ftl::translation::TranslationPages;
use crate::geometry::Divisor;
use crate::request::Placement;
use std::collections::VecDeque;

/// No slot: the page is not buffered. Also the end of every intrusive list here.
const NO_SLOT: u32 = u32::MAX;

/// `Hexa`'s books: slots, each group's list of slots, and groups bucketed by size.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Groups {
    per_page: Divisor,
    slot_lpn: Vec<Lpn>,
    slot_placement: Vec<Placement>,
    slot_seq: Vec<u64>,
    /// The group's list of slots, and the free list (through `slot_next`).
    slot_next: Vec<u32>,
    slot_prev: Vec<u32>,
    free: u32,
    /// Per translation page: buffered pages, and the first slot of its list.
    count: Vec<u32>,
    first: Vec<u32>,
    /// Groups by count (count 0 in none), doubly linked.
    bucket: Vec<u32>,
    group_next: Vec<u32>,
    group_prev: Vec<u32>,
    max_count: u32,
    /// Insertions, oldest first, as (slot, seq): stale ones (the slot since freed or reused)
    /// are skipped when read.
    #[serde(with = "crate::serde_state::keep_capacity")]
    order: VecDeque<(u32, u64)>,
    seq: u64,
    /// A page buffered for more than this many insertions is evicted first (no page starves).
    age_limit: u64,
    /// The group being evicted.
    current: u32,
}

impl Groups {
    fn new(capacity: u32, entries_per_page: u32, translation_pages: u32) -> Self {
        let c = capacity as usize;
        let n = translation_pages as usize;
        Self {
            per_page: Divisor::new(entries_per_page),
            slot_lpn: vec![Lpn::NONE; c],
            slot_placement: vec![Placement::default(); c],
            slot_seq: vec![0; c],
            // All slots free, in order.
            slot_next: (1..=capacity)
                .map(|i| if i == capacity { NO_SLOT } else { i })
                .collect(),
            slot_prev: vec![NO_SLOT; c],
            free: if capacity > 0 { 0 } else { NO_SLOT },
            count: vec![0; n],
            first: vec![NO_SLOT; n],
            bucket: vec![NO_SLOT; c + 1],
            group_next: vec![NO_SLOT; n],
            group_prev: vec![NO_SLOT; n],
            max_count: 0,
            order: VecDeque::with_capacity(c),
            seq: 0,
            age_limit: 2 * u64::from(capacity),
            current: NO_SLOT,
        }
    }

    fn push(&mut self, lpn: Lpn, placement: Placement) -> u32 {
        let slot = self.free;
        debug_assert_ne!(slot, NO_SLOT, "buffer full");
        let s = slot as usize;
        self.free = self.slot_next[s];
        self.seq += 1;
        self.slot_lpn[s] = lpn;
        self.slot_placement[s] = placement;
        self.slot_seq[s] = self.seq;
        self.order.push_back((slot, self.seq));
        let group = self.per_page.quotient(lpn.get());
        let g = group as usize;
        // Into the group's list, at its head.
        self.slot_prev[s] = NO_SLOT;
        self.slot_next[s] = self.first[g];
        if self.first[g] != NO_SLOT {
            self.slot_prev[self.first[g] as usize] = slot;
        }
        self.first[g] = slot;
        self.resize(group, self.count[g] + 1);
        slot
    }

    /// Frees `slot`, taking it out of its group.
    fn remove(&mut self, slot: u32) -> (Lpn, Placement) {
        let s = slot as usize;
        let (lpn, placement) = (self.slot_lpn[s], self.slot_placement[s]);
        let group = self.per_page.quotient(lpn.get());
        let g = group as usize;
        let (before, after) = (self.slot_prev[s], self.slot_next[s]);
        if before == NO_SLOT {
            self.first[g] = after;
        } else {
            self.slot_next[before as usize] = after;
        }
        if after != NO_SLOT {
            self.slot_prev[after as usize] = before;
        }
        self.slot_lpn[s] = Lpn::NONE;
        self.slot_next[s] = self.free;
        self.free = slot;
        self.resize(group, self.count[g] - 1);
        (lpn, placement)
    }

    /// Moves `group` to the bucket of `count` pages.
    fn resize(&mut self, group: u32, count: u32) {
        let g = group as usize;
        let old = self.count[g];
        if old > 0 {
            let (before, after) = (self.group_prev[g], self.group_next[g]);
            if before == NO_SLOT {
                self.bucket[old as usize] = after;
            } else {
                self.group_next[before as usize] = after;
            }
            if after != NO_SLOT {
                self.group_prev[after as usize] = before;
            }
        }
        self.count[g] = count;
        if count > 0 {
            let head = self.bucket[count as usize];
            self.group_prev[g] = NO_SLOT;
            self.group_next[g] = head;
            if head != NO_SLOT {
                self.group_prev[head as usize] = group;
            }
            self.bucket[count as usize] = group;
            self.max_count = self.max_count.max(count);
        }
    }

    /// The group to evict next: the oldest page's, if it has waited longer than the age limit;
    /// else the dirty translation page with the most buffered pages (its write-back is due
    /// anyway); else the largest group.
    fn choose(&mut self, dirty: Option<&TranslationPages>) -> u32 {
        while let Some(&(slot, seq)) = self.order.front() {
            if self.slot_seq[slot as usize] == seq && !self.slot_lpn[slot as usize].is_none() {
                if self.seq - seq > self.age_limit {
                    return self.per_page.quotient(self.slot_lpn[slot as usize].get());
                }
                break;
            }
            self.order.pop_front();
        }
        if let Some(t) = dirty {
            let best = t
                .dirty_iter()
                .filter(|&p| self.count[p as usize] > 0)
                .max_by_key(|&p| (self.count[p as usize], std::cmp::Reverse(p)));
            if let Some(page) = best {
                return page;
            }
        }
        while self.bucket[self.max_count as usize] == NO_SLOT {
            self.max_count -= 1;
        }
        self.bucket[self.max_count as usize]
    }

    fn pop(&mut self, dirty: Option<&TranslationPages>) -> (Lpn, Placement) {
        if self.current == NO_SLOT || self.count[self.current as usize] == 0 {
            self.current = self.choose(dirty);
        }
        let slot = self.first[self.current as usize];
        self.remove(slot)
    }
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct WriteBuffer {
    policy: BufferPolicy,
    capacity_pages: u32,
    /// Ring of buffered LPNs, oldest at `head`; `Lpn::NONE` marks a trimmed entry (a tombstone).
    ring_lpn: Vec<Lpn>,
    ring_placement: Vec<Placement>,
    head: u32,
    len: u32,
    /// Slot of each buffered LPN, `NO_SLOT` otherwise; empty when the buffer is disabled.
    slot_of_lpn: Vec<u32>,
    /// `Hexa` only.
    groups: Option<Groups>,
}

impl WriteBuffer {
    /// A buffer of `capacity_pages`; `Hexa` groups pages by translation pages of
    /// `entries_per_translation_page` LPNs.
    pub fn new(
        capacity_pages: u32,
        logical_pages: u64,
        policy: BufferPolicy,
        entries_per_translation_page: u32,
    ) -> Self {
        let lpn_slots = if capacity_pages == 0 {
            0
        } else {
            logical_pages as usize
        };
        Self {
            policy,
            capacity_pages,
            ring_lpn: vec![Lpn::NONE; capacity_pages as usize],
            ring_placement: vec![Placement::default(); capacity_pages as usize],
            head: 0,
            len: 0,
            slot_of_lpn: crate::table::filled(lpn_slots, NO_SLOT),
            groups: (policy == BufferPolicy::Hexa && capacity_pages > 0).then(|| {
                let pages = logical_pages.div_ceil(u64::from(entries_per_translation_page));
                Groups::new(capacity_pages, entries_per_translation_page, pages as u32)
            }),
        }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.capacity_pages > 0
    }

    #[inline]
    pub fn contains(&self, lpn: Lpn) -> bool {
        self.enabled() && self.slot_of_lpn[lpn.index()] != NO_SLOT
    }

    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.capacity_pages
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a page that is not buffered yet; the caller made room first.
    #[inline]
    pub fn push(&mut self, lpn: Lpn, placement: Placement) {
        debug_assert!(!self.is_full() && !self.contains(lpn));
        let slot = match &mut self.groups {
            Some(groups) => groups.push(lpn, placement),
            None => {
                let slot = (self.head + self.len) % self.capacity_pages;
                self.ring_lpn[slot as usize] = lpn;
                self.ring_placement[slot as usize] = placement;
                slot
            }
        };
        self.slot_of_lpn[lpn.index()] = slot;
        self.len += 1;
    }

    /// The next page to write to flash, by policy; `Some((Lpn::NONE, _))` is a trimmed entry
    /// whose slot is simply freed. `dirty`: the translation pages' books, which `Hexa` prefers
    /// to evict into.
    #[inline]
    pub fn pop_next(&mut self, dirty: Option<&TranslationPages>) -> Option<(Lpn, Placement)> {
        if self.len == 0 {
            return None;
        }
        match self.policy {
            BufferPolicy::Hexa => {
                let groups = self.groups.as_mut().expect("Hexa keeps groups");
                let (lpn, placement) = groups.pop(dirty);
                self.slot_of_lpn[lpn.index()] = NO_SLOT;
                self.len -= 1;
                Some((lpn, placement))
            }
            BufferPolicy::Fifo => {
                let slot = self.head as usize;
                let lpn = self.ring_lpn[slot];
                let placement = self.ring_placement[slot];
                self.ring_lpn[slot] = Lpn::NONE;
                self.head = (self.head + 1) % self.capacity_pages;
                self.len -= 1;
                if !lpn.is_none() {
                    self.slot_of_lpn[lpn.index()] = NO_SLOT;
                }
                Some((lpn, placement))
            }
        }
    }

    /// A buffered page was written again: it leaves with the newer write's placement.
    #[inline]
    pub fn replace_placement(&mut self, lpn: Lpn, placement: Placement) {
        let slot = self.slot_of_lpn[lpn.index()] as usize;
        match &mut self.groups {
            Some(groups) => groups.slot_placement[slot] = placement,
            None => self.ring_placement[slot] = placement,
        }
    }

    /// TRIM of a buffered page: its data must never reach flash.
    #[inline]
    pub fn discard(&mut self, lpn: Lpn) {
        if !self.enabled() {
            return;
        }
        let slot = std::mem::replace(&mut self.slot_of_lpn[lpn.index()], NO_SLOT);
        if slot == NO_SLOT {
            return;
        }
        match &mut self.groups {
            // Its slot is free at once.
            Some(groups) => {
                groups.remove(slot);
                self.len -= 1;
            }
            None => self.ring_lpn[slot as usize] = Lpn::NONE,
        }
    }

    pub fn heap_bytes(&self) -> usize {
        let groups = self.groups.as_ref().map_or(0, |g| {
            g.slot_lpn.len() * (4 + 2 + 8 + 4 + 4)
                + g.count.len() * (4 * 4)
                + g.bucket.len() * 4
                + g.order.capacity() * 16
        });
        self.ring_lpn.len() * 6 + self.slot_of_lpn.len() * 4 + groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DirtyVictim;

    fn lpns(b: &mut WriteBuffer, dirty: Option<&TranslationPages>) -> Vec<u32> {
        std::iter::from_fn(|| b.pop_next(dirty))
            .map(|(l, _)| l.get())
            .collect()
    }

    fn filled(policy: BufferPolicy, pushes: &[u32]) -> WriteBuffer {
        let mut b = WriteBuffer::new(8, 16, policy, 4);
        for &l in pushes {
            b.push(Lpn::new(l), Placement::default());
        }
        b
    }

    /// Translation pages of 4 LPNs: 0-3, 4-7, 8-11.
    const PUSHES: [u32; 6] = [0, 4, 1, 8, 5, 2];

    #[test]
    fn fifo_evicts_in_arrival_order_and_trimmed_pages_leave_as_tombstones() {
        let mut b = filled(BufferPolicy::Fifo, &PUSHES);
        b.discard(Lpn::new(8));
        assert_eq!(lpns(&mut b, None), [0, 4, 1, u32::MAX, 5, 2]);
    }

    /// The largest group first, each group whole (its pages newest first).
    #[test]
    fn hexa_evicts_the_largest_translation_page_group_whole() {
        let mut b = filled(BufferPolicy::Hexa, &PUSHES);
        assert_eq!(lpns(&mut b, None), [2, 1, 0, 5, 4, 8]);
        // A trimmed page leaves its group at once.
        let mut b = filled(BufferPolicy::Hexa, &PUSHES);
        b.discard(Lpn::new(1));
        b.discard(Lpn::new(2));
        assert_eq!(b.len(), 4);
        assert_eq!(lpns(&mut b, None), [5, 4, 0, 8]);
    }

    /// A translation page that is dirty already goes first: its write-back is due anyway.
    #[test]
    fn hexa_prefers_a_dirty_translation_page() {
        let mut t = TranslationPages::new(4, 4, 2, DirtyVictim::Lru, false);
        t.touch(2);
        let mut b = filled(BufferPolicy::Hexa, &PUSHES);
        assert_eq!(lpns(&mut b, Some(&t)), [8, 2, 1, 0, 5, 4]);
    }

    /// A page that has waited two buffers' worth of insertions leaves next, whatever the sizes.
    #[test]
    fn hexa_lets_no_page_starve() {
        let mut b = WriteBuffer::new(4, 64, BufferPolicy::Hexa, 4);
        b.push(Lpn::new(40), Placement::default()); // a group of one, the oldest
        let mut out = Vec::new();
        // Groups of two keep arriving; each pop takes the largest until 40 is too old.
        for i in 0..8u32 {
            b.push(Lpn::new(i * 4), Placement::default());
            b.push(Lpn::new(i * 4 + 1), Placement::default());
            while b.len() > 2 {
                out.push(b.pop_next(None).unwrap().0.get());
            }
        }
        let at = out.iter().position(|&l| l == 40).expect("40 left");
        assert!(at <= 10, "40 waited until pop {at}: {out:?}");
    }
}
