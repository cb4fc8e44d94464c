//! A size-class slab allocator for compressed pages, in the manner of Linux's zsmalloc.
//!
//! Objects are rounded up to a class (every `page_size / 128` bytes; zsmalloc's
//! `ZS_SIZE_CLASS_DELTA` is `page_size / 256`), and each class carves slabs of 4 KiB units (the
//! fewest of the 4 smallest that hold an object wasting under 2 %, as zsmalloc sizes its zspages)
//! into equal slots. An emptied slab's
//! memory goes back to the system, except a few kept for the next new slab (`SPARE_SLABS`);
//! `compact` moves objects out of sparse slabs into fuller ones of the same class and frees the
//! emptied slabs. `bytes()` is the memory the slabs hold: zram's `mem_used_total`.
//!
//! Written by hand: no crate offers a zsmalloc-style pool whose objects can be moved by their
//! owner during compaction.

use std::mem::MaybeUninit;

/// Where an object lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub class: u16,
    pub object: u16,
    pub slab: u32,
}

/// An `owner` entry with this bit set is a free slot; its low 16 bits link to the next free one.
const FREE: u64 = 1 << 63;
const NO_FREE: u16 = u16::MAX;
const MAX_OBJECT_BYTES: usize = 16384;
/// Slabs are whole numbers of this many bytes, the system's page (zsmalloc's zspages are made of
/// them), whatever the store's page size. Slabs counted in 16 KiB store pages left up to 32 KiB
/// half-empty per class and shard: a third of the memory on a 256 MiB device under fio.
const SLAB_UNIT_BYTES: usize = 4096;
/// Emptied slabs' memory kept for reuse. zsmalloc frees a zspage to the kernel at once, which
/// costs it nothing; a user-space allocator that does the same makes malloc shrink and regrow
/// its heap, and the kernel clears every page it hands back: under a sequential overwrite of
/// incompressible pages (one slab each) that clearing was a third of the server's CPU time.
const SPARE_SLABS: usize = 4;

/// The owner entry of each object of a slab. The first is kept inline: a slab of the large
/// classes holds one object, and a separate allocation for its one entry cost a malloc, a free
/// and a cache miss per incompressible page stored.
#[derive(Debug)]
struct Owners {
    first: u64,
    rest: Box<[u64]>,
}

impl Owners {
    /// All slots free, each linking to the next.
    fn new(objects: u16) -> Self {
        let free = |i: u16| FREE | u64::from(if i + 1 == objects { NO_FREE } else { i + 1 });
        Owners {
            first: free(0),
            rest: (1..objects).map(free).collect(),
        }
    }

    #[inline]
    fn get(&self, object: u16) -> u64 {
        match object {
            0 => self.first,
            _ => self.rest[usize::from(object) - 1],
        }
    }

    #[inline]
    fn set(&mut self, object: u16, entry: u64) {
        match object {
            0 => self.first = entry,
            _ => self.rest[usize::from(object) - 1] = entry,
        }
    }

    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.first).chain(self.rest.iter().copied())
    }
}

/// 48 bytes of bookkeeping per slab: with large objects a slab often holds one page.
#[derive(Debug)]
struct Slab {
    /// Uninitialised until written: a new slab is not zeroed (zeroing it cost a fifth of a
    /// sequential write's time, on memory the kernel had just zeroed). Only the prefix of a slot
    /// its object wrote is ever read as bytes (`slot`); compaction copies slots as
    /// `MaybeUninit`, which keeps that prefix initialised.
    memory: Option<Box<[MaybeUninit<u8>]>>,
    /// The key (LPN) of each object, so compaction can tell the owner where its object moved;
    /// a free slot holds FREE | next free slot (a free list threaded through the array).
    owner: Owners,
    free_head: u16,
    live: u16,
    in_partial: bool,
}

impl Slab {
    fn new(memory: Box<[MaybeUninit<u8>]>, objects: u16) -> Self {
        Slab {
            memory: Some(memory),
            owner: Owners::new(objects),
            free_head: 0,
            live: 0,
            in_partial: true,
        }
    }

    fn has_free(&self) -> bool {
        self.free_head != NO_FREE
    }

    fn take_free(&mut self, owner: u64) -> u16 {
        let object = self.free_head;
        debug_assert_ne!(object, NO_FREE);
        self.free_head = (self.owner.get(object) & 0xFFFF) as u16;
        self.owner.set(object, owner);
        self.live += 1;
        object
    }

    fn give_back(&mut self, object: u16) {
        self.owner.set(object, FREE | u64::from(self.free_head));
        self.free_head = object;
        self.live -= 1;
    }

    fn release(&mut self) -> Box<[MaybeUninit<u8>]> {
        self.owner = Owners {
            first: FREE | u64::from(NO_FREE),
            rest: Box::new([]),
        };
        self.free_head = NO_FREE;
        self.memory.take().expect("a live slab")
    }
}

#[derive(Debug)]
struct Class {
    object_bytes: u32,
    objects_per_slab: u16,
    slab_bytes: u32,
    slabs: Vec<Slab>,
    /// Slabs holding memory; at zero the class drops its bookkeeping too.
    live_slabs: u32,
    released: Vec<u32>,
    /// Slabs with free slots (possibly stale entries: checked when popped).
    partial: Vec<u32>,
}

impl Class {
    /// One slab gave its memory back; with none left, the bookkeeping goes too, so an emptied
    /// store holds nothing.
    fn release_one(&mut self) {
        self.live_slabs -= 1;
        if self.live_slabs == 0 {
            self.slabs = Vec::new();
            self.released = Vec::new();
            self.partial = Vec::new();
        }
    }
}

#[derive(Debug)]
pub struct SlabAllocator {
    page_bytes: usize,
    class_delta: usize,
    classes: Vec<Class>,
    /// Slab memory held, spare slabs included (zram's `mem_used_total`).
    bytes: usize,
    /// Memory of emptied slabs, for the next new slab of the same size; dropped when no slab
    /// is live (an emptied store holds nothing) and by `compact`.
    spare: Vec<Box<[MaybeUninit<u8>]>>,
    /// Slabs holding objects, over all classes.
    live_slabs: usize,
    /// Slab bytes freed by compaction, in pages (zram's `pages_compacted`).
    pages_compacted: u64,
}

impl SlabAllocator {
    pub fn new(page_bytes: usize) -> Self {
        assert!(page_bytes <= MAX_OBJECT_BYTES, "pages up to 16 KiB");
        // Twice zsmalloc's granularity: half as many classes means half as many part-filled
        // slabs per shard, for about 8 more bytes of rounding per object.
        let class_delta = (page_bytes / 128).max(8);
        let classes = (1..=page_bytes / class_delta)
            .map(|i| {
                let object_bytes = i * class_delta;
                // The fewest units (of the 4 that can hold an object, as zsmalloc's zspages of
                // up to 4 pages) whose unusable tail is under 2 %, else the least waste. Bigger
                // slabs pack some sizes better but leave a bigger half-empty slab per class and
                // shard.
                let fewest = object_bytes.div_ceil(SLAB_UNIT_BYTES);
                let waste =
                    |u: usize| (u * SLAB_UNIT_BYTES % object_bytes) * 1000 / (u * SLAB_UNIT_BYTES);
                let units = (fewest..fewest + 4)
                    .find(|&u| waste(u) < 20)
                    .unwrap_or_else(|| {
                        (fewest..fewest + 4)
                            .min_by_key(|&u| waste(u))
                            .expect("candidates")
                    });
                let slab_bytes = units * SLAB_UNIT_BYTES;
                Class {
                    object_bytes: object_bytes as u32,
                    objects_per_slab: (slab_bytes / object_bytes) as u16,
                    slab_bytes: slab_bytes as u32,
                    slabs: Vec::new(),
                    live_slabs: 0,
                    released: Vec::new(),
                    partial: Vec::new(),
                }
            })
            .collect();
        Self {
            page_bytes,
            class_delta,
            classes,
            bytes: 0,
            spare: Vec::new(),
            live_slabs: 0,
            pages_compacted: 0,
        }
    }

    /// Memory held by slabs (live and spare).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn pages_compacted(&self) -> u64 {
        self.pages_compacted
    }

    /// The class an object of `len` bytes goes to (`len` <= page size).
    pub fn class_of(&self, len: usize) -> usize {
        debug_assert!(len > 0 && len <= self.page_bytes);
        len.div_ceil(self.class_delta) - 1
    }

    pub fn object_bytes(&self, class: usize) -> usize {
        self.classes[class].object_bytes as usize
    }

    /// A slot for `len` bytes owned by `owner` (< 2^63).
    pub fn alloc(&mut self, len: usize, owner: u64) -> Handle {
        assert_eq!(owner & FREE, 0, "owner keys are below 2^63");
        let class_index = self.class_of(len);
        let class = &mut self.classes[class_index];
        let slab_index = loop {
            match class.partial.last().copied() {
                Some(s) => {
                    let slab = &mut class.slabs[s as usize];
                    if slab.memory.is_some() && slab.has_free() {
                        break s;
                    }
                    slab.in_partial = false;
                    class.partial.pop();
                }
                None => {
                    let slab_bytes = class.slab_bytes as usize;
                    let memory = match self.spare.iter().position(|m| m.len() == slab_bytes) {
                        Some(i) => self.spare.swap_remove(i),
                        None => {
                            self.bytes += slab_bytes;
                            Box::new_uninit_slice(slab_bytes)
                        }
                    };
                    let slab = Slab::new(memory, class.objects_per_slab);
                    class.live_slabs += 1;
                    self.live_slabs += 1;
                    let s = match class.released.pop() {
                        Some(s) => {
                            class.slabs[s as usize] = slab;
                            s
                        }
                        None => {
                            class.slabs.push(slab);
                            (class.slabs.len() - 1) as u32
                        }
                    };
                    class.partial.push(s);
                    break s;
                }
            }
        };
        let object = class.slabs[slab_index as usize].take_free(owner);
        Handle {
            class: class_index as u16,
            object,
            slab: slab_index,
        }
    }

    fn slot_memory(&self, h: Handle) -> &[MaybeUninit<u8>] {
        let class = &self.classes[h.class as usize];
        let size = class.object_bytes as usize;
        let memory = class.slabs[h.slab as usize]
            .memory
            .as_deref()
            .expect("handle to a live slab");
        &memory[h.object as usize * size..(h.object as usize + 1) * size]
    }

    fn slot_memory_mut(&mut self, h: Handle) -> &mut [MaybeUninit<u8>] {
        let class = &mut self.classes[h.class as usize];
        let size = class.object_bytes as usize;
        let memory = class.slabs[h.slab as usize]
            .memory
            .as_deref_mut()
            .expect("handle to a live slab");
        &mut memory[h.object as usize * size..(h.object as usize + 1) * size]
    }

    /// Stores `bytes` at the start of the slot.
    pub fn write(&mut self, h: Handle, bytes: &[u8]) {
        let slot = &mut self.slot_memory_mut(h)[..bytes.len()];
        super::stream_copy::copy(slot, bytes);
    }

    /// The first `len` bytes of the slot, which `write` must have stored.
    pub fn slot(&self, h: Handle, len: usize) -> &[u8] {
        let prefix = &self.slot_memory(h)[..len];
        // SAFETY: the caller wrote at least `len` bytes with `write` (the store reads back only
        // the length it stored), and compaction moves slots whole, so they are initialised.
        unsafe { &*(prefix as *const [MaybeUninit<u8>] as *const [u8]) }
    }

    /// The first `len` stored bytes, mutably (tests corrupt pages through it).
    #[doc(hidden)]
    pub fn slot_mut(&mut self, h: Handle, len: usize) -> &mut [u8] {
        let prefix = &mut self.slot_memory_mut(h)[..len];
        // SAFETY: as in `slot`.
        unsafe { &mut *(prefix as *mut [MaybeUninit<u8>] as *mut [u8]) }
    }

    pub fn free(&mut self, h: Handle) {
        let class = &mut self.classes[h.class as usize];
        let slab = &mut class.slabs[h.slab as usize];
        assert_eq!(slab.owner.get(h.object) & FREE, 0, "double free of {h:?}");
        slab.give_back(h.object);
        if slab.live == 0 {
            // The slab id is reused by the next new slab of the class, the memory by the next
            // new slab of its size (or returned now).
            let memory = slab.release();
            class.released.push(h.slab);
            class.release_one();
            self.live_slabs -= 1;
            if self.live_slabs > 0 && self.spare.len() < SPARE_SLABS {
                self.spare.push(memory);
            } else {
                self.bytes -= memory.len();
                drop(memory);
                if self.live_slabs == 0 {
                    self.release_spare();
                }
            }
        } else if !slab.in_partial {
            slab.in_partial = true;
            class.partial.push(h.slab);
        }
    }

    /// Moves objects out of the sparsest slabs of each class into the fullest ones, releasing
    /// the slabs that empty. `moved(owner, new_handle)` is told of every move. Returns the bytes
    /// released.
    pub fn compact(&mut self, mut moved: impl FnMut(u64, Handle)) -> usize {
        let before = self.bytes;
        self.release_spare();
        for class_index in 0..self.classes.len() {
            let class = &mut self.classes[class_index];
            let mut candidates: Vec<u32> = (0..class.slabs.len() as u32)
                .filter(|&s| {
                    let slab = &class.slabs[s as usize];
                    slab.memory.is_some() && slab.has_free()
                })
                .collect();
            if candidates.len() < 2 {
                continue;
            }
            // Fullest first; objects move from the back (sparsest) to the front.
            candidates.sort_by_key(|&s| std::cmp::Reverse(class.slabs[s as usize].live));
            let size = class.object_bytes as usize;
            let (mut dst_i, mut src_i) = (0, candidates.len() - 1);
            while dst_i < src_i {
                let (dst, src) = (candidates[dst_i] as usize, candidates[src_i] as usize);
                if !class.slabs[dst].has_free() {
                    dst_i += 1;
                    continue;
                }
                let Some(from) = class.slabs[src].owner.iter().position(|o| o & FREE == 0) else {
                    src_i -= 1;
                    continue;
                };
                let owner = class.slabs[src].owner.get(from as u16);
                let to = class.slabs[dst].take_free(owner);
                let mut buf = [MaybeUninit::<u8>::uninit(); MAX_OBJECT_BYTES];
                let bytes = &mut buf[..size];
                bytes.copy_from_slice(
                    &class.slabs[src].memory.as_deref().expect("live")
                        [from * size..(from + 1) * size],
                );
                class.slabs[dst].memory.as_deref_mut().expect("live")
                    [to as usize * size..(to as usize + 1) * size]
                    .copy_from_slice(bytes);
                class.slabs[src].give_back(from as u16);
                moved(
                    owner,
                    Handle {
                        class: class_index as u16,
                        object: to,
                        slab: dst as u32,
                    },
                );
                if class.slabs[src].live == 0 {
                    drop(class.slabs[src].release());
                    self.bytes -= class.slab_bytes as usize;
                    class.released.push(src as u32);
                    class.live_slabs -= 1;
                    self.live_slabs -= 1;
                    src_i -= 1;
                }
            }
            // Rebuild the partial list from what is left.
            class.partial.clear();
            for (s, slab) in class.slabs.iter_mut().enumerate() {
                slab.in_partial = slab.memory.is_some() && slab.has_free();
                if slab.in_partial {
                    class.partial.push(s as u32);
                }
            }
        }
        let released = before - self.bytes;
        self.pages_compacted += (released / SLAB_UNIT_BYTES) as u64;
        released
    }

    /// Returns the spare slabs' memory to the system.
    fn release_spare(&mut self) {
        self.bytes -= self.spare.iter().map(|m| m.len()).sum::<usize>();
        self.spare = Vec::new();
    }

    /// Bytes that slabs may hold beyond their objects without being fragmentation: half a slab
    /// for each class in use, and the spare slabs.
    pub fn tail_allowance(&self) -> usize {
        let spare: usize = self.spare.iter().map(|m| m.len()).sum();
        let tails: usize = self
            .classes
            .iter()
            .filter(|c| c.live_slabs > 0)
            .map(|c| c.slab_bytes as usize / 2)
            .sum();
        spare + tails
    }

    /// Heap bytes of the allocator's own bookkeeping (not the slabs).
    pub fn bookkeeping_bytes(&self) -> usize {
        let mut b = self.classes.capacity() * std::mem::size_of::<Class>();
        for c in &self.classes {
            b += c.slabs.capacity() * std::mem::size_of::<Slab>()
                + (c.released.capacity() + c.partial.capacity()) * 4;
            for s in &c.slabs {
                b += s.owner.rest.len() * 8;
            }
        }
        b
    }

    /// Checks the counts; for tests.
    pub fn check(&self) {
        let mut bytes = self.spare.iter().map(|m| m.len()).sum::<usize>();
        assert!(self.spare.len() <= SPARE_SLABS);
        let mut live_slabs = 0;
        for class in &self.classes {
            for slab in &class.slabs {
                if let Some(m) = &slab.memory {
                    bytes += m.len();
                    live_slabs += 1;
                    let live = slab.owner.iter().filter(|o| o & FREE == 0).count();
                    assert_eq!(live, slab.live as usize);
                    let mut free = 0;
                    let mut at = slab.free_head;
                    while at != NO_FREE {
                        assert_ne!(
                            slab.owner.get(at) & FREE,
                            0,
                            "free list reaches a live slot"
                        );
                        free += 1;
                        at = (slab.owner.get(at) & 0xFFFF) as u16;
                    }
                    assert_eq!(live + free, class.objects_per_slab as usize);
                }
            }
        }
        assert_eq!(bytes, self.bytes);
        assert_eq!(live_slabs, self.live_slabs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_and_slabs_come_and_go() {
        let mut a = SlabAllocator::new(4096);
        assert_eq!(a.class_of(1), 0);
        assert_eq!(a.object_bytes(a.class_of(17)), 32);
        assert_eq!(a.object_bytes(a.class_of(4096)), 4096);
        let h: Vec<Handle> = (0..100).map(|i| a.alloc(1000, i)).collect();
        a.write(h[5], b"abcd");
        assert_eq!(a.slot(h[5], 4), b"abcd");
        assert!(a.bytes() >= 100 * 1008);
        a.check();
        for x in h {
            a.free(x);
        }
        a.check();
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn slabs_are_small_whatever_the_page_size() {
        // A part-filled slab per class and shard is the memory beyond the compressed bytes, so
        // a slab is the fewest 4 KiB units that hold its objects well, for any page size.
        for page_bytes in [4096, 8192, 16384] {
            let a = SlabAllocator::new(page_bytes);
            for c in &a.classes {
                let (object, slab) = (c.object_bytes as usize, c.slab_bytes as usize);
                assert_eq!(slab % SLAB_UNIT_BYTES, 0);
                assert!(
                    slab >= object && slab < object + 4 * SLAB_UNIT_BYTES,
                    "{page_bytes}: {object} in {slab}"
                );
                assert_eq!(c.objects_per_slab as usize, slab / object);
            }
        }
        // One small object takes 4 KiB with 16 KiB pages too.
        let mut a = SlabAllocator::new(16384);
        a.alloc(100, 0);
        assert_eq!(a.bytes(), 4096);
    }

    #[test]
    fn compaction_frees_sparse_slabs_and_reports_moves() {
        let mut a = SlabAllocator::new(4096);
        let handles: Vec<Handle> = (0..1000).map(|i| a.alloc(500, i)).collect();
        let full = a.bytes();
        let mut kept = std::collections::HashMap::new();
        for (i, h) in handles.into_iter().enumerate() {
            if i % 5 == 0 {
                a.write(h, &(i as u64).to_le_bytes());
                kept.insert(i as u64, h);
            } else {
                a.free(h);
            }
        }
        let released = a.compact(|owner, h| {
            kept.insert(owner, h);
        });
        a.check();
        assert!(
            released > 0 && a.bytes() < full / 3,
            "{} of {full}",
            a.bytes()
        );
        for (owner, h) in kept {
            assert_eq!(a.slot(h, 8), owner.to_le_bytes());
        }
    }

    #[test]
    fn emptied_slabs_are_reused_then_returned() {
        let mut a = SlabAllocator::new(4096);
        // Raw pages: one slab each. Overwriting (new slot, then the old one freed) reuses the
        // freed slab's memory; no more than SPARE_SLABS stay spare.
        let mut handles: Vec<Handle> = (0..16).map(|i| a.alloc(4096, i)).collect();
        let full = a.bytes();
        for round in 0..3 {
            for (i, h) in handles.iter_mut().enumerate() {
                let new = a.alloc(4096, i as u64);
                a.free(std::mem::replace(h, new));
                assert!(a.bytes() <= full + 4096, "round {round}: {}", a.bytes());
            }
        }
        a.check();
        for h in handles.drain(8..) {
            a.free(h);
        }
        a.check();
        assert_eq!(a.bytes(), (8 + SPARE_SLABS) * 4096);
        assert_eq!(
            a.compact(|_, _| unreachable!("nothing to move")),
            SPARE_SLABS * 4096
        );
        assert_eq!(a.bytes(), 8 * 4096);
        let h = a.alloc(4096, 99);
        a.free(h);
        a.check();
        for h in handles {
            a.free(h);
        }
        a.check();
        assert_eq!(a.bytes(), 0, "an emptied allocator holds nothing");
    }
}
