//! Superblock states, valid-page bitmaps and counts, the free pool, erase counts, and the greedy
//! victim index.
//!
//! Owns: which physical pages hold live data and which superblocks are free, open or in use.
//! Does not know: logical addresses, timing, or why a page became invalid.
//!
//! Greedy victim choice is O(1) amortised: used superblocks sit in intrusive doubly linked lists
//! bucketed by valid-page count (flat `next`/`prev` arrays, no allocation), and `min_bucket` never
//! overshoots the emptiest non-empty bucket. Each FDP reclaim group has its own free pool,
//! buckets and `min_bucket`: GC of a group never takes another's superblocks.

use crate::addr::{Ppn, NO_SUPERBLOCK as NONE};
use crate::config::GcPolicy;
use crate::geometry::{Divisor, Geometry};
use std::collections::VecDeque;

#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SuperblockState {
    Free,
    /// A frontier is filling it.
    Open,
    /// Full, a GC candidate.
    Used,
    /// Chosen by GC; its valid pages are being moved out.
    Victim,
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct BlockManager {
    pages_per_superblock: u32,
    pps: Divisor,
    words_per_superblock: usize,
    state: Vec<SuperblockState>,
    stream: Vec<u8>,
    /// Each superblock's reclaim group.
    group: Vec<u8>,
    #[serde(with = "crate::serde_state::words")]
    valid_count: Vec<u32>,
    #[serde(with = "crate::serde_state::words")]
    valid_bits: Vec<u64>,
    erase_count: Vec<u32>,
    /// Per reclaim group.
    #[serde(with = "crate::serde_state::keep_capacity_nested")]
    free: Vec<VecDeque<u32>>,
    /// Group `g`'s bucket `c` at `g * (pages_per_superblock + 1) + c`.
    bucket_head: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Per reclaim group.
    min_bucket: Vec<u32>,
    policy: GcPolicy,
    /// When each superblock was closed, counted in superblocks closed (cost-benefit's age).
    closed_at: Vec<u64>,
    closes: u64,
}

impl BlockManager {
    pub fn new(geometry: &Geometry, policy: GcPolicy) -> Self {
        let n = geometry.superblocks as usize;
        let pps = geometry.pages_per_superblock;
        let words = (pps as usize).div_ceil(64);
        let groups = geometry.reclaim_groups as usize;
        let group: Vec<u8> = (0..n as u32)
            .map(|sb| geometry.reclaim_group_of(sb) as u8)
            .collect();
        let mut free = vec![VecDeque::new(); groups];
        for sb in 0..n as u32 {
            free[usize::from(group[sb as usize])].push_back(sb);
        }
        Self {
            pages_per_superblock: pps,
            pps: geometry.pps,
            words_per_superblock: words,
            state: vec![SuperblockState::Free; n],
            stream: vec![0; n],
            group,
            valid_count: vec![0; n],
            valid_bits: crate::table::filled(n * words, 0),
            erase_count: vec![0; n],
            free,
            bucket_head: vec![NONE; groups * (pps as usize + 1)],
            next: vec![NONE; n],
            prev: vec![NONE; n],
            min_bucket: vec![pps + 1; groups],
            policy,
            closed_at: vec![0; n],
            closes: 0,
        }
    }

    /// Free superblocks in all reclaim groups.
    pub fn free_count(&self) -> u32 {
        self.free.iter().map(|f| f.len() as u32).sum()
    }

    /// Free superblocks in reclaim group `group`.
    #[inline]
    pub fn free_in(&self, group: u8) -> u32 {
        self.free[usize::from(group)].len() as u32
    }

    pub fn group_of(&self, superblock: u32) -> u8 {
        self.group[superblock as usize]
    }

    pub fn state(&self, superblock: u32) -> SuperblockState {
        self.state[superblock as usize]
    }

    pub fn stream_of(&self, superblock: u32) -> u8 {
        self.stream[superblock as usize]
    }

    pub fn valid_count(&self, superblock: u32) -> u32 {
        self.valid_count[superblock as usize]
    }

    /// Erases of each physical block of this superblock (they are always erased together).
    pub fn erase_count(&self, superblock: u32) -> u32 {
        self.erase_count[superblock as usize]
    }

    pub fn erase_counts(&self) -> &[u32] {
        &self.erase_count
    }

    /// The oldest free superblock of `group` (FIFO reuse spreads erases), now open for
    /// `stream` (its placement).
    pub fn take_free(&mut self, group: u8, stream: u8) -> Option<u32> {
        let sb = self.free[usize::from(group)].pop_front()?;
        assert_eq!(self.state[sb as usize], SuperblockState::Free);
        debug_assert_eq!(self.valid_count[sb as usize], 0);
        self.state[sb as usize] = SuperblockState::Open;
        self.stream[sb as usize] = stream;
        Some(sb)
    }

    /// A full open superblock becomes a GC candidate.
    pub fn close(&mut self, superblock: u32) {
        debug_assert_eq!(self.state[superblock as usize], SuperblockState::Open);
        self.state[superblock as usize] = SuperblockState::Used;
        self.closes += 1;
        self.closed_at[superblock as usize] = self.closes;
        self.link(superblock, self.valid_count[superblock as usize]);
    }

    #[inline]
    pub fn is_valid(&self, ppn: Ppn) -> bool {
        let (sb, slot) = self.split(ppn);
        let word = self.valid_bits[sb * self.words_per_superblock + slot / 64];
        word & (1u64 << (slot % 64)) != 0
    }

    #[inline]
    fn split(&self, ppn: Ppn) -> (usize, usize) {
        (
            self.pps.quotient(ppn.get()) as usize,
            self.pps.remainder(ppn.get()) as usize,
        )
    }

    /// A page of an open superblock was just programmed with live data.
    #[inline]
    pub fn mark_valid(&mut self, ppn: Ppn) {
        let (sb, slot) = self.split(ppn);
        debug_assert_eq!(self.state[sb], SuperblockState::Open);
        let word = &mut self.valid_bits[sb * self.words_per_superblock + slot / 64];
        let bit = 1u64 << (slot % 64);
        debug_assert!(*word & bit == 0, "ppn {ppn} programmed twice");
        *word |= bit;
        self.valid_count[sb] += 1;
    }

    /// Brings the validity state of `ppn`'s superblock into cache ahead of an invalidation.
    #[inline]
    pub fn prefetch(&self, ppn: Ppn) {
        let (sb, slot) = self.split(ppn);
        if let Some(word) = self
            .valid_bits
            .get(sb * self.words_per_superblock + slot / 64)
        {
            crate::ftl::mapping::prefetch_line(word);
            crate::ftl::mapping::prefetch_line(&self.valid_count[sb]);
        }
    }

    /// The data in `ppn` was overwritten, trimmed, or relocated.
    #[inline]
    pub fn invalidate(&mut self, ppn: Ppn) {
        let (sb, slot) = self.split(ppn);
        let word = &mut self.valid_bits[sb * self.words_per_superblock + slot / 64];
        let bit = 1u64 << (slot % 64);
        assert!(*word & bit != 0, "ppn {ppn} invalidated but not valid");
        *word &= !bit;
        let count = self.valid_count[sb];
        self.valid_count[sb] = count - 1;
        if self.state[sb] == SuperblockState::Used {
            let sb = sb as u32;
            self.unlink(sb, count);
            self.link(sb, count - 1);
        }
    }

    /// GC's victim in reclaim group `group`, if one has at least `min_invalid` invalid pages:
    /// by the policy, among the superblocks of placement `only` when given and it has one, else
    /// among all the group's. It leaves the candidate index until [`erase`](Self::erase).
    pub fn pick_victim(&mut self, group: u8, min_invalid: u32, only: Option<u8>) -> Option<u32> {
        let limit = self.pages_per_superblock.checked_sub(min_invalid.max(1))?;
        let scanned = match (only, self.policy) {
            (Some(_), _) | (None, GcPolicy::CostBenefit) => self
                .scan_victim(group, limit, only)
                .or_else(|| only.and_then(|_| self.scan_victim(group, limit, None))),
            (None, GcPolicy::Greedy) => None,
        };
        let sb = match scanned {
            Some(sb) => sb,
            None if self.policy == GcPolicy::CostBenefit => return None,
            None => {
                // Greedy over the group's buckets.
                let g = usize::from(group);
                let base = g * (self.pages_per_superblock as usize + 1);
                let mut min = self.min_bucket[g];
                while min <= limit && self.bucket_head[base + min as usize] == NONE {
                    min += 1;
                }
                self.min_bucket[g] = min;
                if min > limit {
                    return None;
                }
                self.bucket_head[base + min as usize]
            }
        };
        self.unlink(sb, self.valid_count[sb as usize]);
        self.state[sb as usize] = SuperblockState::Victim;
        Some(sb)
    }

    /// A scan of the used superblocks of `group` (of placement `only`, when given) with at most
    /// `limit` valid pages: the best by the policy, ties to the lowest number. Greedy: the fewest
    /// valid pages. Cost-benefit: the highest age x (1 - u) / 2u (u its valid share; an empty
    /// one first).
    fn scan_victim(&self, group: u8, limit: u32, only: Option<u8>) -> Option<u32> {
        let pps = f64::from(self.pages_per_superblock);
        let mut best: Option<(f64, u32)> = None;
        for sb in 0..self.state.len() as u32 {
            let s = sb as usize;
            let valid = self.valid_count[s];
            if self.state[s] != SuperblockState::Used
                || valid > limit
                || self.group[s] != group
                || only.is_some_and(|p| self.stream[s] != p)
            {
                continue;
            }
            let score = match self.policy {
                GcPolicy::Greedy => -f64::from(valid),
                GcPolicy::CostBenefit if valid == 0 => f64::INFINITY,
                GcPolicy::CostBenefit => {
                    let age = (self.closes - self.closed_at[s] + 1) as f64;
                    let u = f64::from(valid) / pps;
                    age * (1.0 - u) / (2.0 * u)
                }
            };
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, sb));
            }
        }
        best.map(|(_, sb)| sb)
    }

    /// Valid-page bitmap words of a superblock (bit i = slot i).
    #[inline]
    pub fn valid_words(&self, superblock: u32) -> &[u64] {
        let start = superblock as usize * self.words_per_superblock;
        &self.valid_bits[start..start + self.words_per_superblock]
    }

    /// An emptied victim is erased and returns to the free pool.
    pub fn erase(&mut self, superblock: u32) {
        let sb = superblock as usize;
        assert_eq!(self.state[sb], SuperblockState::Victim);
        assert_eq!(
            self.valid_count[sb], 0,
            "erasing superblock {sb} with valid pages"
        );
        self.state[sb] = SuperblockState::Free;
        self.erase_count[sb] += 1;
        self.free[usize::from(self.group[sb])].push_back(superblock);
    }

    /// Superblock `sb`'s reclaim group (no memory access with one group: the common case is
    /// on every invalidation's path).
    #[inline(always)]
    fn group_index(&self, sb: u32) -> usize {
        if self.free.len() == 1 {
            0
        } else {
            usize::from(self.group[sb as usize])
        }
    }

    /// Where superblock `sb`'s bucket `bucket` (of its group) is in `bucket_head`.
    #[inline]
    fn bucket_index(&self, sb: u32, bucket: u32) -> usize {
        self.group_index(sb) * (self.pages_per_superblock as usize + 1) + bucket as usize
    }

    fn link(&mut self, sb: u32, bucket: u32) {
        let at = self.bucket_index(sb, bucket);
        let head = self.bucket_head[at];
        self.next[sb as usize] = head;
        self.prev[sb as usize] = NONE;
        if head != NONE {
            self.prev[head as usize] = sb;
        }
        self.bucket_head[at] = sb;
        let g = self.group_index(sb);
        self.min_bucket[g] = self.min_bucket[g].min(bucket);
    }

    fn unlink(&mut self, sb: u32, bucket: u32) {
        let (p, n) = (self.prev[sb as usize], self.next[sb as usize]);
        if p == NONE {
            let at = self.bucket_index(sb, bucket);
            debug_assert_eq!(self.bucket_head[at], sb);
            self.bucket_head[at] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        }
    }

    /// Counts per state: (free, open, used, victim).
    pub fn state_counts(&self) -> (u32, u32, u32, u32) {
        let mut c = (0, 0, 0, 0);
        for s in &self.state {
            match s {
                SuperblockState::Free => c.0 += 1,
                SuperblockState::Open => c.1 += 1,
                SuperblockState::Used => c.2 += 1,
                SuperblockState::Victim => c.3 += 1,
            }
        }
        c
    }

    pub fn heap_bytes(&self) -> usize {
        self.state.len() * (1 + 1 + 1 + 4 + 4 + 4 + 4)
            + self.valid_bits.len() * 8
            + self.free.iter().map(|f| f.capacity() * 4).sum::<usize>()
            + self.bucket_head.len() * 4
    }

    /// Panics with a description if any internal relation is broken.
    pub fn check_invariants(&self) {
        let n = self.state.len();
        for sb in 0..n {
            let bits: u32 = self
                .valid_words(sb as u32)
                .iter()
                .map(|w| w.count_ones())
                .sum();
            assert_eq!(
                bits, self.valid_count[sb],
                "superblock {sb}: bitmap vs count"
            );
        }
        let (free, open, used, victim) = self.state_counts();
        assert_eq!(free + open + used + victim, n as u32);
        assert_eq!(free, self.free_count(), "free pool vs Free states");
        for (g, pool) in self.free.iter().enumerate() {
            for &sb in pool {
                assert_eq!(self.state[sb as usize], SuperblockState::Free);
                assert_eq!(
                    usize::from(self.group[sb as usize]),
                    g,
                    "free pool of group {g}"
                );
            }
        }
        // Every used superblock is in exactly the bucket of its valid count, in its group.
        let mut seen = 0;
        let buckets = self.pages_per_superblock as usize + 1;
        for (at, &head) in self.bucket_head.iter().enumerate() {
            let (g, bucket) = (at / buckets, at % buckets);
            let mut sb = head;
            let mut prev = NONE;
            while sb != NONE {
                assert_eq!(self.state[sb as usize], SuperblockState::Used);
                assert_eq!(self.valid_count[sb as usize] as usize, bucket);
                assert_eq!(usize::from(self.group[sb as usize]), g);
                assert_eq!(self.prev[sb as usize], prev);
                assert!(bucket as u32 >= self.min_bucket[g], "min_bucket overshoots");
                seen += 1;
                prev = sb;
                sb = self.next[sb as usize];
            }
        }
        assert_eq!(seen, used, "used superblocks missing from the victim index");
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;
    use crate::config::ConfigBuilder;

    /// Two used superblocks of 8 pages: A, closed first, half valid; B, closed after it, 3 of 8
    /// valid. Greedy takes B (fewer valid pages); cost-benefit takes A (age 2 x 0.5/1.0 = 1.0
    /// against 1 x 0.625/0.75 = 0.83): older cold data before younger data still emptying.
    #[test]
    fn greedy_takes_the_emptiest_and_cost_benefit_weighs_age() {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        for s in [
            "flash.channels=1",
            "flash.dies_per_channel=1",
            "flash.blocks_per_die=16",
            "flash.pages_per_block=8",
            "flash.superblock_dies=1",
            "capacity.over_provisioning=0.5",
        ] {
            b.set(s).unwrap();
        }
        let g = b.build().unwrap().geometry().unwrap();
        for (policy, expected) in [(GcPolicy::Greedy, 1), (GcPolicy::CostBenefit, 0)] {
            let mut m = BlockManager::new(&g, policy);
            let mut used = Vec::new();
            for valid in [4u32, 3] {
                let sb = m.take_free(0, 0).unwrap();
                for slot in 0..8 {
                    m.mark_valid(Ppn::new(sb * 8 + slot));
                }
                m.close(sb);
                for slot in valid..8 {
                    m.invalidate(Ppn::new(sb * 8 + slot));
                }
                used.push(sb);
            }
            assert_eq!(
                m.pick_victim(0, 1, None),
                Some(used[expected]),
                "{policy:?}"
            );
            m.check_invariants();
        }
    }
}
