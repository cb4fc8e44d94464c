//! Group number -> index of its delta (its buffered updates) in `LearnedMapping::deltas`. Every
//! lookup the cursor misses asks this first, so it is two loads, not a hash probe: a chunk of
//! `CHUNK_GROUPS` slots is allocated where a group in it is first buffered, so a device costs 8
//! bytes per chunk of groups plus 4 KiB per chunk holding buffered groups (the buffer is written
//! where the host writes, a few chunks at a time), not 4 bytes per group of a 16 TiB device.
//! `clear` frees the chunks (and their list) once nothing is buffered, so a compacted table
//! carries none of it.
//!
//! (A hash map from group to delta did this before; its probe was about a tenth of a lookup the
//! cursor missed on pgbench.)

const CHUNK_SHIFT: u32 = 10;
const CHUNK_GROUPS: usize = 1 << CHUNK_SHIFT;
const NONE: u32 = u32::MAX;

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default)]
pub struct DeltaIndex {
    /// Empty, or one entry per chunk of the device's groups.
    #[serde(with = "ftlab_core::serde_state::boxed_options")]
    chunks: Vec<Option<Box<[u32; CHUNK_GROUPS]>>>,
    n_chunks: usize,
    /// Groups with a delta.
    len: usize,
    /// Chunks allocated (so `heap_bytes` is O(1)).
    allocated: usize,
}

impl DeltaIndex {
    pub fn new(groups: usize) -> Self {
        Self {
            chunks: Vec::new(),
            n_chunks: groups.div_ceil(CHUNK_GROUPS),
            len: 0,
            allocated: 0,
        }
    }

    /// Group `g`'s delta, if it has one.
    #[inline]
    pub fn get(&self, g: u32) -> Option<u32> {
        let chunk = self.chunks.get((g >> CHUNK_SHIFT) as usize)?.as_deref()?;
        let d = chunk[g as usize & (CHUNK_GROUPS - 1)];
        (d != NONE).then_some(d)
    }

    /// Points group `g` at delta `d` (it may have had another).
    pub fn set(&mut self, g: u32, d: u32) {
        debug_assert_ne!(d, NONE);
        if self.chunks.is_empty() {
            self.chunks = vec![None; self.n_chunks];
        }
        let allocated = &mut self.allocated;
        let chunk = self.chunks[(g >> CHUNK_SHIFT) as usize].get_or_insert_with(|| {
            *allocated += 1;
            Box::new([NONE; CHUNK_GROUPS])
        });
        let slot = &mut chunk[g as usize & (CHUNK_GROUPS - 1)];
        self.len += usize::from(*slot == NONE);
        *slot = d;
    }

    /// Group `g` has no delta any more.
    pub fn remove(&mut self, g: u32) {
        if let Some(Some(chunk)) = self.chunks.get_mut((g >> CHUNK_SHIFT) as usize) {
            let slot = &mut chunk[g as usize & (CHUNK_GROUPS - 1)];
            self.len -= usize::from(*slot != NONE);
            *slot = NONE;
        }
    }

    /// Groups with a delta.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Frees every chunk and their list; nothing may be buffered.
    pub fn clear(&mut self) {
        debug_assert_eq!(self.len, 0);
        self.chunks = Vec::new();
        self.allocated = 0;
    }

    pub fn heap_bytes(&self) -> usize {
        debug_assert_eq!(self.allocated, self.chunks.iter().flatten().count());
        self.chunks.capacity() * std::mem::size_of::<Option<Box<[u32; CHUNK_GROUPS]>>>()
            + self.allocated * CHUNK_GROUPS * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map_and_frees_its_chunks() {
        let groups = 5 * CHUNK_GROUPS + 17;
        let mut index = DeltaIndex::new(groups);
        let mut oracle = HashMap::new();
        let mut rng = ftlab_core::rng::SplitMix64::new(12345);
        for step in 0..20_000u32 {
            let g = rng.bounded(groups as u64) as u32;
            if rng.bounded(4) == 0 {
                index.remove(g);
                oracle.remove(&g);
            } else {
                index.set(g, step);
                oracle.insert(g, step);
            }
            assert_eq!(index.len(), oracle.len());
        }
        for g in 0..groups as u32 {
            assert_eq!(index.get(g), oracle.get(&g).copied(), "group {g}");
        }
        for g in 0..groups as u32 {
            index.remove(g);
        }
        index.clear();
        assert_eq!(index.heap_bytes(), 0);
        assert_eq!(index.get(3), None);
        index.set(3, 7);
        assert_eq!((index.get(3), index.len()), (Some(7), 1));
    }
}
