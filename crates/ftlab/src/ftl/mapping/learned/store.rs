//! Where the groups' blobs live: one arena of bytes (no allocation, allocator header or padding
//! per blob; one tail pad for all) and a two-level directory from group number to arena
//! position, whose per-chunk level stays a sorted list of the groups present until a dense array
//! would be smaller. A sparsely written device (the MSR samples: a few hundred LPNs scattered
//! over 16 GiB) then costs bytes per group present, not per group of the device.
//!
//! Replaced blobs become garbage in the arena, collected (by copying the live blobs) once it is
//! half garbage: amortised O(1) bytes moved per byte written.

use super::group;

const CHUNK_SHIFT: u32 = 10;
const CHUNK_GROUPS: usize = 1 << CHUNK_SHIFT;
const NONE: u32 = u32::MAX;
/// Blobs start at multiples of this, so that u32 positions address a 16 GiB arena.
const ALIGN: usize = 4;
/// Below this much garbage the arena is left alone (collection would cost more than it frees).
const MIN_GARBAGE_BYTES: usize = 64 << 10;

#[derive(Clone, Debug)]
enum Dir {
    /// Group numbers within the chunk (ascending) and their blob positions.
    Sparse {
        ids: Vec<u16>,
        slots: Vec<u32>,
    },
    Dense(Box<[u32]>),
}

#[derive(Clone, Debug)]
pub struct GroupStore {
    groups: usize,
    chunks: Vec<Dir>,
    arena: Vec<u8>,
    garbage_bytes: usize,
}

#[inline]
fn padded(len: usize) -> usize {
    len.next_multiple_of(ALIGN)
}

impl GroupStore {
    pub fn new(groups: usize) -> Self {
        Self {
            groups,
            chunks: vec![
                Dir::Sparse {
                    ids: Vec::new(),
                    slots: Vec::new(),
                };
                groups.div_ceil(CHUNK_GROUPS)
            ],
            arena: vec![0; group::TAIL_PAD],
            garbage_bytes: 0,
        }
    }

    #[inline]
    fn slot(&self, g: u32) -> u32 {
        let k = g as usize & (CHUNK_GROUPS - 1);
        match &self.chunks[(g >> CHUNK_SHIFT) as usize] {
            Dir::Dense(slots) => slots[k],
            Dir::Sparse { ids, slots } => {
                let i = super::super::runs::count_le(ids.len(), |i| usize::from(ids[i]) <= k);
                match i.checked_sub(1) {
                    Some(i) if usize::from(ids[i]) == k => slots[i],
                    _ => NONE,
                }
            }
        }
    }

    /// Group `g`'s blob (followed by at least `TAIL_PAD` readable bytes), if it has one.
    #[inline]
    pub fn blob(&self, g: u32) -> Option<&[u8]> {
        let slot = self.slot(g);
        (slot != NONE).then(|| &self.arena[slot as usize * ALIGN..])
    }

    /// A hint that group `g`'s directory entry will be read soon.
    #[inline]
    pub fn prefetch(&self, g: u32) {
        if let Some(Dir::Dense(slots)) = self.chunks.get((g >> CHUNK_SHIFT) as usize) {
            super::super::prefetch_line(&slots[g as usize & (CHUNK_GROUPS - 1)]);
        }
    }

    /// Replaces group `g`'s blob (None: the group maps nothing).
    pub fn set(&mut self, g: u32, blob: Option<&[u8]>) {
        if let Some(old_len) = self.blob(g).map(group::encoded_len) {
            self.garbage_bytes += padded(old_len);
        }
        let slot = match blob {
            None => NONE,
            Some(b) => {
                let at = self.arena.len() - group::TAIL_PAD;
                // Grow by an eighth, not by doubling: the arena is most of the table, and
                // doubling would leave up to half of it spare.
                let need = b.len() + ALIGN;
                if self.arena.capacity() - self.arena.len() < need {
                    self.arena.reserve_exact(need + self.arena.len() / 8);
                }
                self.arena.truncate(at);
                self.arena.extend_from_slice(b);
                self.arena
                    .resize(padded(self.arena.len()) + group::TAIL_PAD, 0);
                u32::try_from(at / ALIGN).expect("the arena stays below 16 GiB")
            }
        };
        self.put_slot(g, slot);
        if self.garbage_bytes > MIN_GARBAGE_BYTES && 4 * self.garbage_bytes > self.arena.len() {
            self.collect();
        }
    }

    fn put_slot(&mut self, g: u32, slot: u32) {
        let k = g as usize & (CHUNK_GROUPS - 1);
        let live_blob_bytes = self.arena.len() - self.garbage_bytes;
        let c = (g >> CHUNK_SHIFT) as usize;
        // The last chunk covers only the groups the device has.
        let chunk_groups = CHUNK_GROUPS.min(self.groups - c * CHUNK_GROUPS);
        let chunk = &mut self.chunks[c];
        match chunk {
            Dir::Dense(slots) => slots[k] = slot,
            Dir::Sparse { ids, slots } => {
                match (ids.binary_search(&(k as u16)), slot) {
                    (Ok(i), NONE) => {
                        ids.remove(i);
                        slots.remove(i);
                    }
                    (Ok(i), _) => slots[i] = slot,
                    (Err(_), NONE) => {}
                    (Err(i), _) => {
                        ids.insert(i, k as u16);
                        slots.insert(i, slot);
                    }
                }
                // Dense once it is smaller (6 bytes per present group against 4 per group of
                // the chunk), or once it costs under 1/32 of the blobs: a lookup then finds its
                // group in one load instead of a search.
                let dense_bytes = chunk_groups * 4;
                if ids.len() * 6 > dense_bytes || dense_bytes * 32 <= live_blob_bytes {
                    let mut dense = vec![NONE; chunk_groups].into_boxed_slice();
                    for (&id, &s) in ids.iter().zip(slots.iter()) {
                        dense[usize::from(id)] = s;
                    }
                    *chunk = Dir::Dense(dense);
                }
            }
        }
    }

    /// Copies the live blobs into a fresh arena, in group order.
    fn collect(&mut self) {
        let live = self.arena.len() - self.garbage_bytes;
        let mut arena = Vec::with_capacity(live);
        let old = std::mem::take(&mut self.arena);
        let mut move_blob = |slot: &mut u32| {
            if *slot != NONE {
                let b = &old[*slot as usize * ALIGN..];
                let len = group::encoded_len(b);
                *slot = (arena.len() / ALIGN) as u32;
                arena.extend_from_slice(&b[..len]);
                arena.resize(padded(arena.len()), 0);
            }
        };
        for chunk in &mut self.chunks {
            match chunk {
                Dir::Dense(slots) => slots.iter_mut().for_each(&mut move_blob),
                Dir::Sparse { slots, .. } => slots.iter_mut().for_each(&mut move_blob),
            }
        }
        arena.resize(arena.len() + group::TAIL_PAD, 0);
        self.arena = arena;
        self.garbage_bytes = 0;
    }

    /// Collects garbage and returns spare capacity.
    pub fn shrink(&mut self) {
        if self.garbage_bytes > 0 {
            self.collect();
        }
        self.arena.shrink_to_fit();
        for chunk in &mut self.chunks {
            if let Dir::Sparse { ids, slots } = chunk {
                ids.shrink_to_fit();
                slots.shrink_to_fit();
            }
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.arena.capacity()
            + self.chunks.capacity() * std::mem::size_of::<Dir>()
            + self
                .chunks
                .iter()
                .map(|c| match c {
                    Dir::Dense(slots) => slots.len() * 4,
                    Dir::Sparse { ids, slots } => ids.capacity() * 2 + slots.capacity() * 4,
                })
                .sum::<usize>()
    }
}
