//! The `extent` baseline: sorted runs `(lpn, ppn, len)` where consecutive LPNs map to consecutive
//! PPNs, 12 bytes per run, the structure a careful engineer tries first. Runs live in chunks of
//! at most `CHUNK_RUNS` (a one-level B+ tree: a sorted array of each chunk's first LPN above
//! them), so an update moves at most one chunk's entries.

use super::runs::{self, Run};
use super::MappingTable;

const CHUNK_RUNS: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

#[derive(Clone, Debug, Default)]
pub struct ExtentMapping {
    /// First LPN of each chunk's first run, ascending.
    first_lpn: Vec<u32>,
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

    fn compact(&mut self) {
        self.first_lpn.shrink_to_fit();
        self.chunks.shrink_to_fit();
        for c in &mut self.chunks {
            c.shrink_to_fit();
        }
        self.run_bytes = self
            .chunks
            .iter()
            .map(|c| c.capacity() * EXTENT_BYTES)
            .sum();
    }
}
