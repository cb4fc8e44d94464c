//! The mapping table as it is persisted: translation pages on flash, and which of them are dirty.
//!
//! The table itself stays in DRAM (any `MappingTable`); what this module models is its durable
//! copy. The LPN space is cut into translation pages of `entries_per_translation_page` entries;
//! the global translation directory (`gtd`) says where each one was last programmed. A mapping
//! change makes its translation page dirty: the change is in DRAM only, covered by power-loss
//! protection (capacitors), which covers at most `budget` dirty pages at once (the protected
//! ratio). Making one more dirty first writes one back (`victim`, by `DirtyVictim`). The FTL
//! programs the pages; this module only keeps the books.
//!
//! Owns: the directory, the dirty set and its order, the protected budget, and (when asked for,
//! to check power-loss safety) the durable copy of every entry.
//! Does not know: flash timing, how the table encodes entries, or where pages are allocated.

use crate::addr::{Lpn, Ppn};
use crate::config::DirtyVictim;
use crate::geometry::Divisor;

/// The end of the dirty list.
const NO_PAGE: u32 = u32::MAX;

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct TranslationPages {
    entries: Divisor,
    /// Translation page -> where it is on flash (`Ppn::NONE`: never written).
    gtd: Vec<Ppn>,
    dirty: Vec<bool>,
    /// The dirty pages, oldest first (`victim` takes the head).
    dirty_list: PageList,
    dirty_count: u32,
    budget: u32,
    max_dirty: u32,
    policy: DirtyVictim,
    /// Every LPN's PPN as the durable state holds it (its translation page on flash), when
    /// kept: what a restart after a power cut would read.
    durable: Option<Vec<u32>>,
    /// The DFTL-style cache of translation pages, when the table is not all in DRAM.
    cache: Option<Cache>,
}

/// Which translation pages are in DRAM, least recently used first.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Cache {
    capacity: u32,
    cached: Vec<bool>,
    lru: PageList,
    len: u32,
}

/// A doubly linked list over translation page numbers, in flat arrays (no allocation per
/// change): the dirty pages in victim order, and the cached pages in LRU order.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct PageList {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
}

impl PageList {
    fn new(pages: usize) -> Self {
        Self {
            prev: vec![NO_PAGE; pages],
            next: vec![NO_PAGE; pages],
            head: NO_PAGE,
            tail: NO_PAGE,
        }
    }

    fn push_tail(&mut self, page: u32) {
        let p = page as usize;
        self.prev[p] = self.tail;
        self.next[p] = NO_PAGE;
        if self.tail == NO_PAGE {
            self.head = page;
        } else {
            self.next[self.tail as usize] = page;
        }
        self.tail = page;
    }

    fn unlink(&mut self, page: u32) {
        let p = page as usize;
        let (before, after) = (self.prev[p], self.next[p]);
        if before == NO_PAGE {
            self.head = after;
        } else {
            self.next[before as usize] = after;
        }
        if after == NO_PAGE {
            self.tail = before;
        } else {
            self.prev[after as usize] = before;
        }
        self.prev[p] = NO_PAGE;
        self.next[p] = NO_PAGE;
    }

    /// `page` (in the list) to the tail.
    fn move_to_tail(&mut self, page: u32) {
        if self.tail != page {
            self.unlink(page);
            self.push_tail(page);
        }
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            (at != NO_PAGE).then(|| {
                let page = at;
                at = self.next[at as usize];
                page
            })
        })
    }

    fn heap_bytes(&self) -> usize {
        (self.prev.capacity() + self.next.capacity()) * 4
    }
}

impl TranslationPages {
    pub fn new(
        entries_per_page: u32,
        pages: u32,
        budget: u32,
        policy: DirtyVictim,
        keep_durable: bool,
    ) -> Self {
        assert!(
            budget >= 1,
            "at least one dirty translation page is protected"
        );
        let n = pages as usize;
        Self {
            entries: Divisor::new(entries_per_page),
            gtd: vec![Ppn::NONE; n],
            dirty: vec![false; n],
            dirty_list: PageList::new(n),
            dirty_count: 0,
            budget,
            max_dirty: 0,
            policy,
            durable: keep_durable.then(|| vec![u32::MAX; n * entries_per_page as usize]),
            cache: None,
        }
    }

    /// Only `capacity` translation pages are in DRAM (a DFTL-style cache); at least the
    /// protected budget, since dirty pages stay cached.
    pub fn with_cache(mut self, capacity: u32) -> Self {
        assert!(capacity >= self.budget, "dirty pages must fit in the cache");
        let n = self.gtd.len();
        self.cache = Some(Cache {
            capacity,
            cached: vec![false; n],
            lru: PageList::new(n),
            len: 0,
        });
        self
    }

    /// The cache's size in pages, when the table is not all cached.
    pub fn cache_capacity(&self) -> Option<u32> {
        self.cache.as_ref().map(|c| c.capacity)
    }

    /// Whether `page` is in DRAM (always, without a cache); a hit counts as a use.
    #[inline]
    pub fn use_cached(&mut self, page: u32) -> bool {
        let Some(c) = &mut self.cache else {
            return true;
        };
        if !c.cached[page as usize] {
            return false;
        }
        c.lru.move_to_tail(page);
        true
    }

    /// The page to drop before one more can be cached: the least recently used, when full.
    pub fn cache_victim(&self) -> Option<u32> {
        let c = self.cache.as_ref()?;
        (c.len >= c.capacity).then_some(c.lru.head)
    }

    /// Drops clean page `page` from the cache.
    pub fn uncache(&mut self, page: u32) {
        assert!(
            !self.dirty[page as usize],
            "a dirty page is dropped only once written back"
        );
        let c = self.cache.as_mut().expect("a cache");
        debug_assert!(c.cached[page as usize]);
        c.lru.unlink(page);
        c.cached[page as usize] = false;
        c.len -= 1;
    }

    /// `page` was read into the cache.
    pub fn cache(&mut self, page: u32) {
        let c = self.cache.as_mut().expect("a cache");
        debug_assert!(!c.cached[page as usize] && c.len < c.capacity);
        c.cached[page as usize] = true;
        c.len += 1;
        c.lru.push_tail(page);
    }

    /// The translation page holding `lpn`'s entry.
    #[inline(always)]
    pub fn page_of(&self, lpn: Lpn) -> u32 {
        self.entries.quotient(lpn.get())
    }

    /// The LPNs whose entries translation page `page` holds.
    pub fn lpns_of(&self, page: u32, logical_pages: u64) -> std::ops::Range<u32> {
        let per = self.entries_per_page();
        let start = u64::from(page) * u64::from(per);
        let end = (start + u64::from(per)).min(logical_pages);
        start as u32..end as u32
    }

    pub fn entries_per_page(&self) -> u32 {
        self.entries.value
    }

    /// The page that must be written back before `page` may become dirty, if any: None when
    /// `page` is dirty already or the budget has room.
    #[inline]
    pub fn must_write_back_for(&self, page: u32) -> Option<u32> {
        if self.dirty[page as usize] || self.dirty_count < self.budget {
            return None;
        }
        Some(self.dirty_list.head)
    }

    /// `page` changed in DRAM (the caller wrote back what `must_write_back_for` named first).
    #[inline]
    pub fn touch(&mut self, page: u32) {
        let p = page as usize;
        if self.dirty[p] {
            if self.policy == DirtyVictim::Lru {
                self.dirty_list.move_to_tail(page);
            }
            return;
        }
        debug_assert!(self.dirty_count < self.budget, "protected budget exceeded");
        self.dirty[p] = true;
        self.dirty_count += 1;
        self.max_dirty = self.max_dirty.max(self.dirty_count);
        self.dirty_list.push_tail(page);
    }

    /// `page` was programmed at `at` with the entries `entry_of` gives: it is clean, and
    /// `at` holds it. Returns where it was before (to invalidate).
    pub fn written(&mut self, page: u32, at: Ppn, entry_of: impl Fn(u32) -> u32) -> Ppn {
        if self.dirty[page as usize] {
            self.dirty[page as usize] = false;
            self.dirty_count -= 1;
            self.dirty_list.unlink(page);
        }
        if let Some(durable) = &mut self.durable {
            let per = self.entries.value as usize;
            let start = page as usize * per;
            for (i, slot) in durable[start..start + per].iter_mut().enumerate() {
                *slot = entry_of((start + i) as u32);
            }
        }
        std::mem::replace(&mut self.gtd[page as usize], at)
    }

    /// A GC move of translation page `page` from `from` to `to` (its contents unchanged).
    pub fn moved(&mut self, page: u32, from: Ppn, to: Ppn) {
        debug_assert_eq!(self.gtd[page as usize], from);
        self.gtd[page as usize] = to;
    }

    /// The dirty pages, oldest first, without allocating.
    pub fn dirty_iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.dirty_list.iter()
    }

    /// The dirty pages, oldest first.
    pub fn dirty_pages(&self) -> Vec<u32> {
        self.dirty_iter().collect()
    }

    pub fn is_dirty(&self, page: u32) -> bool {
        self.dirty[page as usize]
    }

    pub fn location(&self, page: u32) -> Ppn {
        self.gtd[page as usize]
    }

    pub fn dirty_count(&self) -> u32 {
        self.dirty_count
    }

    pub fn budget(&self) -> u32 {
        self.budget
    }

    /// The most pages dirty at once since the start (or `reset_max`): what the capacitors had to
    /// be able to write.
    pub fn max_dirty(&self) -> u32 {
        self.max_dirty
    }

    /// Starts the high-water mark over from the pages dirty now (after preconditioning).
    pub fn reset_max(&mut self) {
        self.max_dirty = self.dirty_count;
    }

    /// The durable copy of `lpn`'s entry (`u32::MAX`: unmapped), when kept.
    pub fn durable(&self, lpn: Lpn) -> Option<u32> {
        self.durable.as_ref().map(|d| d[lpn.index()])
    }

    pub fn heap_bytes(&self) -> usize {
        self.gtd.capacity() * 4
            + self.dirty.capacity()
            + self.dirty_list.heap_bytes()
            + self.durable.as_ref().map_or(0, |d| d.capacity() * 4)
            + self
                .cache
                .as_ref()
                .map_or(0, |c| c.cached.len() + c.lru.heap_bytes())
    }

    /// Panics if the dirty list, flags and count disagree or the budget is exceeded.
    pub fn check(&self) {
        assert!(
            self.dirty_count <= self.budget,
            "dirty pages over the budget"
        );
        let listed = self.dirty_pages();
        assert_eq!(listed.len() as u32, self.dirty_count);
        assert!(listed.iter().all(|&p| self.dirty[p as usize]));
        assert_eq!(
            self.dirty.iter().filter(|&&d| d).count() as u32,
            self.dirty_count
        );
        if let Some(c) = &self.cache {
            assert!(c.len <= c.capacity);
            assert_eq!(c.cached.iter().filter(|&&x| x).count() as u32, c.len);
            assert!(
                listed.iter().all(|&p| c.cached[p as usize]),
                "a dirty page not cached"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(policy: DirtyVictim) -> TranslationPages {
        TranslationPages::new(4, 8, 2, policy, false)
    }

    /// With a budget of two, a third page to become dirty first writes back the least recently
    /// changed (LRU) or the first dirtied (FIFO).
    #[test]
    fn the_victim_is_the_least_recently_changed_or_the_first_dirtied() {
        for (policy, victim) in [(DirtyVictim::Lru, 1), (DirtyVictim::Fifo, 0)] {
            let mut t = pages(policy);
            t.touch(0);
            t.touch(1);
            t.touch(0); // 0 changes again: LRU now holds 1 as the oldest
            assert_eq!(t.must_write_back_for(0), None, "dirty already");
            assert_eq!(t.must_write_back_for(2), Some(victim), "{policy:?}");
            t.written(victim, Ppn::new(10), |_| 0);
            assert_eq!(t.must_write_back_for(2), None);
            t.touch(2);
            assert_eq!(t.dirty_count(), 2);
            assert_eq!(t.max_dirty(), 2);
            t.check();
        }
    }

    #[test]
    fn the_durable_copy_takes_a_page_s_entries_when_it_is_written() {
        let mut t = TranslationPages::new(4, 2, 1, DirtyVictim::Lru, true);
        assert_eq!(t.page_of(Lpn::new(5)), 1);
        t.touch(1);
        let old = t.written(1, Ppn::new(3), |lpn| lpn * 10);
        assert_eq!(old, Ppn::NONE);
        assert_eq!(t.durable(Lpn::new(5)), Some(50));
        assert_eq!(
            t.durable(Lpn::new(1)),
            Some(u32::MAX),
            "page 0 never written"
        );
        assert_eq!(t.location(1), Ppn::new(3));
        assert!(!t.is_dirty(1));
    }
}
