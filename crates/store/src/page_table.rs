//! One shard's page table: LPN → entry, in chunks of `CHUNK` consecutive LPNs of the shard.
//!
//! A shard holds every `shards`-th LPN, so its keys are dense: a chunk is a plain array, and
//! neighbouring pages share cache lines (a sequential write touches each line once, and the
//! prefetcher sees the stride). A hash map of pages cost two cache misses per lookup at any
//! size beyond the caches (its control bytes and its bucket): the largest share of a sequential
//! write's time in the store once compression was skipped for incompressible data. The chunk
//! directory is a hash map too, but 64 times smaller and so cache-resident.
//!
//! Cost: 24 bytes per slot of a chunk in use, plus the directory, so about 25 bytes per page
//! when pages are dense (a hash map: 38-75, at 33 bytes a bucket 7/8 to 7/16 full) and up to a
//! chunk (1.5 KiB) per page when every page is alone in its chunk. zram's own table costs 16
//! bytes for every page of the disk.

use rustc_hash::FxHashMap;

const CHUNK_BITS: u32 = 6;
const CHUNK: usize = 1 << CHUNK_BITS;

#[derive(Debug)]
struct Chunk<T> {
    slots: [Option<T>; CHUNK],
    live: u32,
}

#[derive(Debug)]
pub struct PageTable<T> {
    chunks: FxHashMap<u64, Box<Chunk<T>>>,
    /// log2 of the shard count: a shard's LPNs differ by multiples of `1 << stride_bits`.
    stride_bits: u32,
    /// The low `stride_bits` bits every LPN of this shard has.
    shard: u64,
    len: usize,
}

impl<T: Copy> PageTable<T> {
    pub fn new(stride_bits: u32, shard: u64) -> Self {
        debug_assert!(shard < 1 << stride_bits);
        Self {
            chunks: FxHashMap::default(),
            stride_bits,
            shard,
            len: 0,
        }
    }

    fn split(&self, lpn: u64) -> (u64, usize) {
        debug_assert_eq!(lpn & ((1 << self.stride_bits) - 1), self.shard);
        let key = lpn >> self.stride_bits;
        (key >> CHUNK_BITS, (key as usize) & (CHUNK - 1))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, lpn: u64) -> Option<&T> {
        let (chunk, slot) = self.split(lpn);
        self.chunks.get(&chunk)?.slots[slot].as_ref()
    }

    pub fn get_mut(&mut self, lpn: u64) -> Option<&mut T> {
        let (chunk, slot) = self.split(lpn);
        self.chunks.get_mut(&chunk)?.slots[slot].as_mut()
    }

    /// Sets `lpn`'s entry; returns the one it replaces.
    pub fn insert(&mut self, lpn: u64, value: T) -> Option<T> {
        let (chunk, slot) = self.split(lpn);
        let chunk = self.chunks.entry(chunk).or_insert_with(|| {
            Box::new(Chunk {
                slots: [None; CHUNK],
                live: 0,
            })
        });
        let old = chunk.slots[slot].replace(value);
        if old.is_none() {
            chunk.live += 1;
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, lpn: u64) -> Option<T> {
        let (index, slot) = self.split(lpn);
        let chunk = self.chunks.get_mut(&index)?;
        let old = chunk.slots[slot].take()?;
        chunk.live -= 1;
        self.len -= 1;
        if chunk.live == 0 {
            self.chunks.remove(&index);
            // A directory emptied by trims gives its memory back (amortised: a quarter full).
            if self.chunks.capacity() > 64 && self.chunks.len() * 4 < self.chunks.capacity() {
                self.chunks.shrink_to(self.chunks.len() * 2);
            }
        }
        Some(old)
    }

    /// Every (LPN, entry), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> + '_ {
        self.chunks.iter().flat_map(move |(&chunk, c)| {
            c.slots.iter().enumerate().filter_map(move |(slot, v)| {
                let key = (chunk << CHUNK_BITS) | slot as u64;
                v.as_ref()
                    .map(|v| ((key << self.stride_bits) | self.shard, v))
            })
        })
    }

    pub fn values(&self) -> impl Iterator<Item = &T> + '_ {
        self.chunks
            .values()
            .flat_map(|c| c.slots.iter().filter_map(Option::as_ref))
    }

    /// Heap bytes: the chunks and the directory.
    pub fn heap_bytes(&self) -> usize {
        self.chunks.len() * std::mem::size_of::<Chunk<T>>()
            + ftlab_core::heap::hashbrown_bytes(
                self.chunks.capacity(),
                std::mem::size_of::<(u64, Box<Chunk<T>>)>(),
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map() {
        let (bits, shard) = (3, 5u64);
        let mut table = PageTable::new(bits, shard);
        let mut oracle = HashMap::new();
        let mut rng = ftlab_core::rng::SplitMix64::new(11);
        for step in 0..20_000u64 {
            let r = rng.next_u64();
            // Dense keys near the start, and a few far away.
            let key = if r.is_multiple_of(16) {
                r >> 8
            } else {
                r % 3000
            };
            let lpn = (key << bits) | shard;
            if r.is_multiple_of(3) {
                assert_eq!(table.remove(lpn), oracle.remove(&lpn), "step {step}");
            } else {
                assert_eq!(table.insert(lpn, step), oracle.insert(lpn, step));
            }
            assert_eq!(table.get(lpn), oracle.get(&lpn));
            assert_eq!(table.len(), oracle.len());
        }
        let mut all: Vec<(u64, u64)> = table.iter().map(|(k, &v)| (k, v)).collect();
        all.sort_unstable();
        let mut expected: Vec<(u64, u64)> = oracle.iter().map(|(&k, &v)| (k, v)).collect();
        expected.sort_unstable();
        assert_eq!(all, expected);
        assert_eq!(table.values().count(), oracle.len());
        for (lpn, _) in expected {
            table.remove(lpn);
        }
        assert_eq!(table.len(), 0);
        assert!(table.heap_bytes() < 4096, "{}", table.heap_bytes());
    }
}
