//! The `extent` baseline: sorted runs `(lpn, ppn, len)` where consecutive LPNs map to consecutive
//! PPNs, 12 bytes per run, the structure a careful engineer tries first. Runs live in chunks of
//! at most `CHUNK_RUNS` (a one-level B+ tree: a sorted array of each chunk's first LPN above
//! them), so an update moves at most one chunk's entries.

use super::runs::{self, Run};
use super::MappingTable;

const CHUNK_RUNS: usize = 512;

#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub lpn: u32,
    pub ppn: u32,
    pub len: u32,
}

impl Run for Extent {
    #[inline]
    fn start(&self) -> u32 {
        self.lpn
    }
    #[inline]
    fn len(&self) -> u32 {
        self.len
    }
    #[inline]
    fn value(&self) -> u32 {
        self.ppn
    }
    #[inline]
    fn make(lpn: u32, len: u32, ppn: u32) -> Self {
        Extent { lpn, ppn, len }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default)]
pub struct ExtentMapping {
    /// First LPN of each chunk's first run, ascending.
    #[serde(with = "crate::serde_state::keep_capacity")]
    first_lpn: Vec<u32>,
    #[serde(with = "crate::serde_state::keep_capacity_nested")]
    chunks: Vec<Vec<Extent>>,
    live: u64,
    /// The chunks' capacities in bytes (so the heap is known in O(1) after each update).
    run_bytes: usize,
    /// The heap at its largest so far.
    peak_bytes: usize,
}

const EXTENT_BYTES: usize = std::mem::size_of::<Extent>();

impl ExtentMapping {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn runs(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    #[inline]
    fn chunk_of(&self, lpn: u32) -> usize {
        self.first_lpn
            .partition_point(|&f| f <= lpn)
            .saturating_sub(1)
    }

    fn assign(&mut self, lpn: u32, ppn: Option<u32>) -> Option<u32> {
        if self.chunks.is_empty() {
            ppn?;
            self.chunks.push(Vec::new());
            self.first_lpn.push(lpn);
        }
        let c = self.chunk_of(lpn);
        let chunk = &mut self.chunks[c];
        let before = chunk.capacity();
        let old = runs::assign(chunk, lpn, ppn);
        // (Inserting and removing runs never shrinks a chunk.)
        let grown = (chunk.capacity() - before) * EXTENT_BYTES;
        self.run_bytes += grown;
        // The peak is noted where the heap grew (a chunk's capacity, a split) and before a chunk
        // is freed: the heap changes nowhere else.
        if chunk.is_empty() {
            let freed = chunk.capacity() * EXTENT_BYTES;
            self.note_peak();
            self.run_bytes -= freed;
            self.chunks.remove(c);
            self.first_lpn.remove(c);
        } else {
            self.first_lpn[c] = chunk[0].lpn;
            if chunk.len() > CHUNK_RUNS {
                let upper = chunk.split_off(CHUNK_RUNS / 2);
                self.run_bytes += upper.capacity() * EXTENT_BYTES;
                self.first_lpn.insert(c + 1, upper[0].lpn);
                self.chunks.insert(c + 1, upper);
                self.note_peak();
            } else if grown > 0 {
                self.note_peak();
            }
        }
        old
    }

    /// The heap now, in O(1).
    #[inline]
    fn heap_now(&self) -> usize {
        self.first_lpn.capacity() * 4
            + self.chunks.capacity() * std::mem::size_of::<Vec<Extent>>()
            + self.run_bytes
    }

    #[inline]
    fn note_peak(&mut self) {
        self.peak_bytes = self.peak_bytes.max(self.heap_now());
    }
}

impl MappingTable for ExtentMapping {
    fn name(&self) -> &'static str {
        "extent"
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        runs::lookup(self.chunks.get(self.chunk_of(lpn))?, lpn)
    }

    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        let old = self.assign(lpn, Some(ppn));
        self.live += u64::from(old.is_none());
        old
    }

    fn remove(&mut self, lpn: u32) -> Option<u32> {
        let old = self.assign(lpn, None);
        self.live -= u64::from(old.is_some());
        old
    }

    fn for_each_live(&self, logical_pages: u64, f: &mut dyn FnMut(u32, u32)) {
        for run in self.chunks.iter().flatten() {
            for i in 0..run.len {
                let lpn = run.lpn + i;
                if u64::from(lpn) >= logical_pages {
                    return;
                }
                f(lpn, run.ppn.wrapping_add(i));
            }
        }
    }

    fn live_mappings(&self) -> u64 {
        self.live
    }

    fn heap_bytes(&self) -> usize {
        debug_assert_eq!(
            self.run_bytes,
            self.chunks
                .iter()
                .map(|c| c.capacity() * EXTENT_BYTES)
                .sum::<usize>()
        );
        self.heap_now()
    }

    fn peak_heap_bytes(&self) -> usize {
        self.peak_bytes.max(self.heap_now())
    }

    /// Rebuilds the table at its structure's minimum: runs that continue each other across a
    /// chunk boundary (which updates never merge, as each works in one chunk) become one, and
    /// the runs are packed into full chunks of exact capacity. What is left is 12 bytes a run
    /// plus, per `CHUNK_RUNS` runs, a chunk's first LPN and its `Vec` (28 bytes): the baseline's
    /// honest size. (Only shrinking each chunk's allocation left chunks that splits and
    /// removals had half emptied, about 50 % over 12 bytes a run on a trace of short runs.)
    fn compact(&mut self) {
        let mut all: Vec<Extent> = Vec::with_capacity(self.runs());
        for chunk in self.chunks.drain(..) {
            for run in chunk {
                match all.last_mut() {
                    Some(last)
                        if u64::from(last.lpn) + u64::from(last.len) == u64::from(run.lpn)
                            && last.ppn.wrapping_add(last.len) == run.ppn =>
                    {
                        last.len += run.len;
                    }
                    _ => all.push(run),
                }
            }
        }
        self.first_lpn = all.chunks(CHUNK_RUNS).map(|c| c[0].lpn).collect();
        self.chunks = all.chunks(CHUNK_RUNS).map(<[Extent]>::to_vec).collect();
        self.first_lpn.shrink_to_fit();
        self.chunks.shrink_to_fit();
        self.run_bytes = self
            .chunks
            .iter()
            .map(|c| c.capacity() * EXTENT_BYTES)
            .sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The runs of consecutive LPNs mapping to consecutive PPNs in `map`: the fewest any run
    /// table can hold it in.
    fn minimum_runs(map: &std::collections::BTreeMap<u32, u32>) -> usize {
        let mut runs = 0;
        let mut last: Option<(u32, u32)> = None;
        for (&lpn, &ppn) in map {
            if last != Some((lpn.wrapping_sub(1), ppn.wrapping_sub(1))) {
                runs += 1;
            }
            last = Some((lpn, ppn));
        }
        runs
    }

    /// Compacted, the extent map is 12 bytes a run of the live mappings, plus 28 bytes per
    /// chunk of 512 runs: many short runs, rewritten and trimmed so that chunks split and
    /// half-empty, once left it about 50 % larger.
    #[test]
    fn compaction_leaves_twelve_bytes_a_run_of_the_live_mappings() {
        let mut rng = SplitMix64::new(11);
        let mut table = ExtentMapping::new();
        let mut oracle = std::collections::BTreeMap::new();
        let mut next_ppn = 0u32;
        for round in 0..60_000u32 {
            let lpn = rng.bounded(200_000) as u32;
            let len = 1 + rng.bounded(6) as u32;
            for l in lpn..lpn + len {
                if round % 7 == 0 {
                    assert_eq!(table.remove(l), oracle.remove(&l));
                } else {
                    assert_eq!(table.set(l, next_ppn), oracle.insert(l, next_ppn));
                    next_ppn += 1;
                }
            }
        }
        table.compact();
        let runs = minimum_runs(&oracle);
        assert_eq!(table.runs(), runs, "every mergeable pair merged");
        let chunks = runs.div_ceil(CHUNK_RUNS);
        assert_eq!(
            table.heap_bytes(),
            12 * runs + chunks * (4 + std::mem::size_of::<Vec<Extent>>())
        );
        assert_eq!(table.live_mappings(), oracle.len() as u64);
        for (&lpn, &ppn) in &oracle {
            assert_eq!(table.get(lpn), Some(ppn));
        }
        // And it keeps working after: chunks split and merge again.
        for l in 0..1000 {
            table.set(l * 3, l);
            oracle.insert(l * 3, l);
        }
        for (&lpn, &ppn) in &oracle {
            assert_eq!(table.get(lpn), Some(ppn));
        }
    }
}
