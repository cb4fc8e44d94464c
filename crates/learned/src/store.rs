//! Where the groups' blobs live: one arena of bytes (no allocation, allocator header or padding
//! per blob; one tail pad for all) and a two-level directory from group number to arena
//! position. Each chunk of the directory starts as a sorted list of the groups present (searched
//! on lookup), and becomes a bitmap with ranks (a bit test and a popcount), then a dense array
//! (one load), each once it is smaller than the form before or the whole directory would still
//! cost under 1/16 of the blobs. A sparsely written device (the MSR samples: a few hundred LPNs
//! scattered over 16 GiB, or tiled over 16 TiB) then costs bytes per group present, not per group
//! of the device.
//!
//! Replaced blobs become garbage in the arena, collected (by sliding the live blobs down over
//! it, in place) once an eighth of it is garbage: amortised O(1) bytes moved per byte written.

use super::group;

const CHUNK_SHIFT: u32 = 10;
const CHUNK_GROUPS: usize = 1 << CHUNK_SHIFT;
const NONE: u32 = u32::MAX;
const RANK_WORDS: usize = CHUNK_GROUPS / 64;
/// A bitmap chunk's bytes besides its 4 per present group.
const RANKED_FIXED_BYTES: usize = std::mem::size_of::<Ranked>();
/// Blobs start at multiples of this, so that u32 positions address a 16 GiB arena.
const ALIGN: usize = 4;
/// Below this much garbage the arena is left alone (collection would cost more than it frees).
/// 64 KiB before `peak_heap_bytes` was measured: it set the small tables' peaks (files' 138 KB
/// for 22 KB of blobs); at 4 KiB, 70 KB, at no cost measurable in their SET rates.
const MIN_GARBAGE_BYTES: usize = 4 << 10;
/// The arena is collected once garbage is more than 1 / this of it. A quarter before: the
/// default simulation's table peaked at 14.1 MiB (flat's array is 12.0), 12.3 at an eighth,
/// with no change in its wall time (a collection slides the arena once: about 2 ms for its 9 MB,
/// once per some hundred merges there).
const GARBAGE_DIVISOR: usize = 8;

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
enum Dir {
    /// Group numbers within the chunk (ascending) and their blob positions.
    Sparse {
        #[serde(with = "ftlab_core::serde_state::keep_capacity")]
        ids: Vec<u16>,
        #[serde(with = "ftlab_core::serde_state::keep_capacity")]
        slots: Vec<u32>,
    },
    Ranked(Box<Ranked>),
    Dense(Box<[u32]>),
}

/// A bit per group of the chunk, set where the group has a blob; `before[w]` counts the bits
/// set in the words before `w`, so a present group's blob position is at `slots[before[w] +
/// (bits set below it in word w)]`.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Ranked {
    bits: [u64; RANK_WORDS],
    before: [u16; RANK_WORDS],
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    slots: Vec<u32>,
}

impl Ranked {
    /// (word, bit) of chunk position `k` and the index its slot has or would have.
    #[inline]
    fn index(&self, k: usize) -> (usize, u64, usize) {
        let (w, bit) = (k / 64, 1u64 << (k % 64));
        let below = (self.bits[w] & (bit - 1)).count_ones() as usize;
        (w, bit, usize::from(self.before[w]) + below)
    }

    #[inline]
    fn get(&self, k: usize) -> u32 {
        let (w, bit, i) = self.index(k);
        if self.bits[w] & bit == 0 {
            NONE
        } else {
            self.slots[i]
        }
    }

    fn put(&mut self, k: usize, slot: u32) {
        let (w, bit, i) = self.index(k);
        let present = self.bits[w] & bit != 0;
        match (present, slot) {
            (true, NONE) => {
                self.slots.remove(i);
                self.bits[w] &= !bit;
                self.before[w + 1..].iter_mut().for_each(|b| *b -= 1);
            }
            (true, _) => self.slots[i] = slot,
            (false, NONE) => {}
            (false, _) => {
                self.slots.insert(i, slot);
                self.bits[w] |= bit;
                self.before[w + 1..].iter_mut().for_each(|b| *b += 1);
            }
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct GroupStore {
    groups: usize,
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    chunks: Vec<Dir>,
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    arena: Vec<u8>,
    garbage_bytes: usize,
    /// The chunks' directory bytes, `form_bytes` summed (what a faster form may add is
    /// bounded by the blobs).
    directory_bytes: usize,
    /// The chunks' heap, `form_heap_bytes` summed (capacities), so `heap_bytes` is O(1).
    directory_heap_bytes: usize,
    /// `heap_bytes` at its largest during the last `set` (a grown arena before its garbage is
    /// collected), for the table's peak.
    set_peak_heap_bytes: usize,
}

/// Directory bytes of a chunk listing `n` groups, as `put_slot` weighs the forms.
fn list_bytes(n: usize) -> usize {
    6 * n
}

/// Directory bytes of a chunk's bitmap with `n` groups present.
fn ranked_bytes(n: usize) -> usize {
    RANKED_FIXED_BYTES + 4 * n
}

/// A chunk's directory bytes in its form, as `put_slot` weighs them (lengths, not capacities).
fn form_bytes(dir: &Dir) -> usize {
    match dir {
        Dir::Sparse { ids, .. } => list_bytes(ids.len()),
        Dir::Ranked(r) => ranked_bytes(r.slots.len()),
        Dir::Dense(slots) => slots.len() * 4,
    }
}

/// A chunk's heap bytes (capacities).
fn form_heap_bytes(dir: &Dir) -> usize {
    match dir {
        Dir::Dense(slots) => slots.len() * 4,
        Dir::Ranked(r) => RANKED_FIXED_BYTES + r.slots.capacity() * 4,
        Dir::Sparse { ids, slots } => ids.capacity() * 2 + slots.capacity() * 4,
    }
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
            directory_bytes: 0,
            directory_heap_bytes: 0,
            set_peak_heap_bytes: 0,
        }
    }

    /// Group `g`'s blob position, or `NONE`. The dense form inline (every group of a filled
    /// device's chunk has a blob), the others out of line: they take a search or a popcount.
    #[inline(always)]
    fn slot(&self, g: u32) -> u32 {
        let k = g as usize & (CHUNK_GROUPS - 1);
        match &self.chunks[(g >> CHUNK_SHIFT) as usize] {
            Dir::Dense(slots) => slots[k],
            other => Self::slot_in(other, k),
        }
    }

    /// `slot` in chunk `dir` at position `k` (any form; `slot` asks only for the others).
    #[inline(never)]
    fn slot_in(dir: &Dir, k: usize) -> u32 {
        match dir {
            Dir::Dense(slots) => slots[k],
            Dir::Ranked(r) => r.get(k),
            Dir::Sparse { ids, slots } => {
                let i = ftlab_core::ftl::mapping::runs::count_le(ids.len(), |i| {
                    usize::from(ids[i]) <= k
                });
                match i.checked_sub(1) {
                    Some(i) if usize::from(ids[i]) == k => slots[i],
                    _ => NONE,
                }
            }
        }
    }

    /// Groups of the device (with a blob or not).
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Group `g`'s blob (followed by at least `TAIL_PAD` readable bytes), if it has one.
    /// Always inlined, with `slot`'s dense form: left to the compiler they stayed calls from
    /// every lookup the cursor misses and every GC move's prefetches (with both inline,
    /// pgbench's trace-order lookups took 107.4 M -> 103.5 M instructions, the default job's
    /// simulation 39.25 G -> 38.70 G).
    #[inline(always)]
    pub fn blob(&self, g: u32) -> Option<&[u8]> {
        let slot = self.slot(g);
        (slot != NONE).then(|| &self.arena[slot as usize * ALIGN..])
    }

    /// Group `g`'s blob to change in place (its length must stay the same), if it has one.
    pub fn blob_mut(&mut self, g: u32) -> Option<&mut [u8]> {
        let slot = self.slot(g);
        (slot != NONE).then(|| &mut self.arena[slot as usize * ALIGN..])
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
                // Grow by a sixteenth, not by doubling: the arena is most of the table, and
                // doubling would leave up to half of it spare. (Large blocks grow by `mremap`,
                // without a copy, so growing often costs little.)
                let need = b.len() + ALIGN;
                if self.arena.capacity() - self.arena.len() < need {
                    self.arena.reserve_exact(need + self.arena.len() / 16);
                }
                self.arena.truncate(at);
                self.arena.extend_from_slice(b);
                self.arena
                    .resize(padded(self.arena.len()) + group::TAIL_PAD, 0);
                u32::try_from(at / ALIGN).expect("the arena stays below 16 GiB")
            }
        };
        self.put_slot(g, slot);
        // Before any collection: the arena may have grown, the directory too.
        self.set_peak_heap_bytes = self.heap_bytes();
        if self.garbage_bytes > MIN_GARBAGE_BYTES
            && GARBAGE_DIVISOR * self.garbage_bytes > self.arena.len()
        {
            self.collect();
        }
    }

    /// `heap_bytes` at its largest during the last `set`.
    pub fn set_peak_heap_bytes(&self) -> usize {
        self.set_peak_heap_bytes
    }

    fn put_slot(&mut self, g: u32, slot: u32) {
        let k = g as usize & (CHUNK_GROUPS - 1);
        let live_blob_bytes = self.arena.len() - self.garbage_bytes;
        let c = (g >> CHUNK_SHIFT) as usize;
        // The last chunk covers only the groups the device has.
        let chunk_groups = CHUNK_GROUPS.min(self.groups - c * CHUNK_GROUPS);
        let other_chunks_bytes = self.directory_bytes - form_bytes(&self.chunks[c]);
        let other_chunks_heap_bytes = self.directory_heap_bytes - form_heap_bytes(&self.chunks[c]);
        let chunk = &mut self.chunks[c];
        // A chunk moves to a faster form (list -> bitmap -> array) once that is smaller, or
        // while the whole directory would still cost under 1/16 of the blobs: then a lookup
        // finds its group in a load or two instead of a search. (Comparing one chunk's form
        // with all the blobs let every chunk of a sparsely written large device take the
        // array, 4 KiB per 16 GiB of LPNs: the MSR hm0 sample tiled over 1 TiB cost 10.6 bytes
        // per live mapping instead of 4.5.)
        let faster_pays = |faster_bytes: usize, current_bytes: usize| {
            faster_bytes < current_bytes
                || (other_chunks_bytes + faster_bytes) * 16 <= live_blob_bytes
        };
        let dense_bytes = chunk_groups * 4;
        match chunk {
            Dir::Dense(slots) => slots[k] = slot,
            Dir::Ranked(r) => {
                r.put(k, slot);
                if faster_pays(dense_bytes, ranked_bytes(r.slots.len())) {
                    let mut dense = vec![NONE; chunk_groups].into_boxed_slice();
                    for (k, d) in dense.iter_mut().enumerate() {
                        *d = r.get(k);
                    }
                    *chunk = Dir::Dense(dense);
                }
            }
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
                let list_bytes = list_bytes(ids.len());
                if faster_pays(dense_bytes, list_bytes) {
                    let mut dense = vec![NONE; chunk_groups].into_boxed_slice();
                    for (&id, &s) in ids.iter().zip(slots.iter()) {
                        dense[usize::from(id)] = s;
                    }
                    *chunk = Dir::Dense(dense);
                } else if faster_pays(ranked_bytes(ids.len()), list_bytes) {
                    let mut r = Box::new(Ranked {
                        bits: [0; RANK_WORDS],
                        before: [0; RANK_WORDS],
                        slots: std::mem::take(slots),
                    });
                    for &id in ids.iter() {
                        r.bits[usize::from(id) / 64] |= 1 << (id % 64);
                    }
                    for w in 1..RANK_WORDS {
                        r.before[w] = r.before[w - 1] + r.bits[w - 1].count_ones() as u16;
                    }
                    *chunk = Dir::Ranked(r);
                }
            }
        }
        self.directory_bytes = other_chunks_bytes + form_bytes(&self.chunks[c]);
        self.directory_heap_bytes = other_chunks_heap_bytes + form_heap_bytes(&self.chunks[c]);
    }

    /// Slides the live blobs down over the garbage, in arena order, within the same buffer.
    /// Copying them into a fresh arena (as this did before) held both arenas at once: at the
    /// default simulation's peak (`ftlab sim --set ftl.mapping=learned`, compacting for the
    /// report) the new arena was 9 MB of its 43 MB of heap. Here the only extra memory is a
    /// passing list of the live blobs, 8 bytes per group that has one, sorted by position.
    fn collect(&mut self) {
        // Position << 32 | group, for every group with a blob.
        let mut order = Vec::new();
        for (c, chunk) in self.chunks.iter().enumerate() {
            let base = (c * CHUNK_GROUPS) as u64;
            let mut note = |k: usize, slot: u32| {
                if slot != NONE {
                    order.push(u64::from(slot) << 32 | (base + k as u64));
                }
            };
            match chunk {
                Dir::Dense(slots) => slots.iter().enumerate().for_each(|(k, &s)| note(k, s)),
                Dir::Ranked(r) => {
                    for k in 0..CHUNK_GROUPS {
                        if r.bits[k / 64] >> (k % 64) & 1 != 0 {
                            note(k, r.get(k));
                        }
                    }
                }
                Dir::Sparse { ids, slots } => {
                    for (&k, &s) in ids.iter().zip(slots.iter()) {
                        note(usize::from(k), s);
                    }
                }
            }
        }
        order.sort_unstable();
        let mut to = 0usize;
        for &entry in &order {
            let from = (entry >> 32) as usize * ALIGN;
            let g = entry as u32;
            let len = group::encoded_len(&self.arena[from..]);
            // `to <= from`: the blobs before this one only shrank their gaps.
            debug_assert!(to <= from);
            self.arena.copy_within(from..from + len, to);
            self.set_slot(g, (to / ALIGN) as u32);
            to = padded(to + len);
        }
        self.arena.truncate(to);
        self.arena.resize(to + group::TAIL_PAD, 0);
        // The freed end goes back, as the fresh arena's did (the allocator shrinks a block in
        // place), so the table's bytes between merges are what they were.
        self.arena.shrink_to_fit();
        self.garbage_bytes = 0;
    }

    /// Points group `g`'s directory entry, which exists, at `slot` (no change of form).
    fn set_slot(&mut self, g: u32, slot: u32) {
        let k = g as usize & (CHUNK_GROUPS - 1);
        match &mut self.chunks[(g >> CHUNK_SHIFT) as usize] {
            Dir::Dense(slots) => slots[k] = slot,
            Dir::Ranked(r) => {
                let (_, _, i) = r.index(k);
                r.slots[i] = slot;
            }
            Dir::Sparse { ids, slots } => {
                let i = ids
                    .binary_search(&(k as u16))
                    .expect("a group with a blob is listed");
                slots[i] = slot;
            }
        }
    }

    /// Collects garbage and returns spare capacity.
    pub fn shrink(&mut self) {
        if self.garbage_bytes > 0 {
            self.collect();
        }
        self.arena.shrink_to_fit();
        for chunk in &mut self.chunks {
            match chunk {
                Dir::Sparse { ids, slots } => {
                    ids.shrink_to_fit();
                    slots.shrink_to_fit();
                }
                Dir::Ranked(r) => r.slots.shrink_to_fit(),
                Dir::Dense(_) => {}
            }
        }
        self.directory_heap_bytes = self.chunks.iter().map(form_heap_bytes).sum();
    }

    /// O(1): the directory's share is kept as it changes (`directory_heap_bytes`).
    pub fn heap_bytes(&self) -> usize {
        debug_assert_eq!(
            self.directory_heap_bytes,
            self.chunks.iter().map(form_heap_bytes).sum::<usize>()
        );
        self.arena.capacity()
            + self.chunks.capacity() * std::mem::size_of::<Dir>()
            + self.directory_heap_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftlab_core::rng::SplitMix64;
    use std::collections::HashMap;

    /// A blob mapping `runs` runs of 3 offsets, the first at PPN `ppn`: lengths vary with `runs`.
    fn blob(ppn: u32, runs: u32) -> Vec<u8> {
        let mut rs = Vec::new();
        for i in 0..runs {
            group::push_run(&mut rs, i * 8, 3, ppn + i * 1000);
        }
        let mut scratch = group::Scratch::default();
        group::encode_runs(&rs, &mut scratch)
            .expect("non-empty")
            .to_vec()
    }

    fn form(s: &GroupStore, g: u32) -> &'static str {
        match &s.chunks[(g >> CHUNK_SHIFT) as usize] {
            Dir::Sparse { .. } => "list",
            Dir::Ranked(_) => "bitmap",
            Dir::Dense(_) => "array",
        }
    }

    /// A sparsely written large device: three groups in each of 256 chunks, with blobs enough
    /// that one chunk's array would cost under 1/16 of them. The directory as a whole stays
    /// within 1/16 of the blobs (or its lists' size), not an array per chunk.
    #[test]
    fn a_sparse_device_keeps_its_directory_small() {
        let chunks = 256;
        let mut s = GroupStore::new(chunks * CHUNK_GROUPS);
        let mut oracle = HashMap::new();
        for c in 0..chunks {
            for j in 0..3 {
                let g = (c * CHUNK_GROUPS + j * 300) as u32;
                let b = blob(g, 30);
                s.set(g, Some(&b));
                oracle.insert(g, b);
            }
        }
        let blob_bytes = s.arena.len() - s.garbage_bytes;
        assert!(
            CHUNK_GROUPS * 4 * 16 <= blob_bytes,
            "{blob_bytes} bytes of blobs"
        );
        assert_eq!(
            s.directory_bytes,
            s.chunks.iter().map(form_bytes).sum::<usize>()
        );
        let lists = chunks * 3 * 6;
        assert!(
            s.directory_bytes <= lists.max(blob_bytes / 16),
            "directory {} bytes for {blob_bytes} bytes of blobs",
            s.directory_bytes
        );
        for (g, b) in &oracle {
            let got = s.blob(*g).map(|x| &x[..group::encoded_len(x)]);
            assert_eq!(got, Some(&b[..]), "group {g}");
        }
    }

    /// Groups arrive, change and leave at random in chunks filled to different densities, so
    /// each chunk passes through the list, bitmap and array forms (the test checks it does);
    /// after every step each touched group's blob reads back as the oracle's.
    #[test]
    fn directory_forms_agree_with_an_oracle() {
        let groups = 3 * CHUNK_GROUPS + 100; // the last chunk is partial
        let mut s = GroupStore::new(groups);
        let mut oracle: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut rng = SplitMix64::new(11);
        let mut seen = std::collections::BTreeSet::new();
        // Chunk c draws its groups from its first `reach[c]` positions.
        let reach = [40, 600, CHUNK_GROUPS, 100];
        // Collections (the garbage falls back to none) move the live blobs, which the read-backs
        // below then check: the test must see some.
        let mut collections = 0u32;
        for step in 0..20_000u32 {
            let c = rng.bounded(4) as usize;
            let g = (c * CHUNK_GROUPS) as u32 + rng.bounded(reach[c] as u64) as u32;
            // Blobs grow over the run, so the arena outgrows each form's directory in turn.
            let runs = 1 + step / 500 + rng.bounded(6) as u32;
            let value = (rng.bounded(5) > 0).then(|| blob(step, runs));
            let garbage_before = s.garbage_bytes;
            s.set(g, value.as_deref());
            collections += u32::from(s.garbage_bytes < garbage_before);
            match value {
                Some(b) => oracle.insert(g, b),
                None => oracle.remove(&g),
            };
            seen.insert((c, form(&s, g)));
            for probe in [g, g ^ 1, g.saturating_sub(64)] {
                if (probe as usize) < groups {
                    let got = s.blob(probe).map(|b| &b[..group::encoded_len(b)]);
                    assert_eq!(got, oracle.get(&probe).map(|b| &b[..]), "group {probe}");
                }
            }
        }
        for g in 0..groups as u32 {
            let got = s.blob(g).map(|b| &b[..group::encoded_len(b)]);
            assert_eq!(got, oracle.get(&g).map(|b| &b[..]), "group {g}");
        }
        assert!(collections >= 10, "{collections} collections");
        assert_eq!(
            s.directory_bytes,
            s.chunks.iter().map(form_bytes).sum::<usize>()
        );
        // Every chunk starts as a list; the full ones pass through the bitmap to the array.
        for c in 0..4 {
            assert!(seen.contains(&(c, "list")), "chunk {c}: {seen:?}");
        }
        for c in 1..3 {
            assert!(seen.contains(&(c, "bitmap")), "chunk {c}: {seen:?}");
            assert!(seen.contains(&(c, "array")), "chunk {c}: {seen:?}");
        }
    }
}
