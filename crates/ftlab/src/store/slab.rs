//! A size-class slab allocator for compressed pages, in the manner of Linux's zsmalloc.
//!
//! Objects are rounded up to a class (every `page_size / 256` bytes, as zsmalloc's
//! `ZS_SIZE_CLASS_DELTA`), and each class carves slabs of 1 to 4 pages (the count that wastes
//! least, as zsmalloc sizes its zspages) into equal slots. An emptied slab is returned to the
//! system at once; `compact` moves objects out of sparse slabs into fuller ones of the same class
//! and frees the emptied slabs. `bytes()` is the memory the slabs hold: zram's `mem_used_total`.
//!
//! Written by hand: no crate offers a zsmalloc-style pool whose objects can be moved by their
//! owner during compaction.

/// Where an object lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub class: u16,
    pub object: u16,
    pub slab: u32,
}

const FREE: u64 = u64::MAX;
const MAX_OBJECT_BYTES: usize = 16384;

#[derive(Debug)]
struct Slab {
    memory: Option<Box<[u8]>>,
    free: Vec<u16>,
    /// The key (LPN) of each object, FREE where the slot is empty: compaction needs it to tell
    /// the owner where its object moved.
    owner: Vec<u64>,
    live: u16,
    in_partial: bool,
}

#[derive(Debug)]
struct Class {
    object_bytes: u32,
    objects_per_slab: u16,
    slab_bytes: u32,
    slabs: Vec<Slab>,
    released: Vec<u32>,
    /// Slabs with free slots (possibly stale entries: checked when popped).
    partial: Vec<u32>,
}

#[derive(Debug)]
pub struct SlabAllocator {
    page_bytes: usize,
    class_delta: usize,
    classes: Vec<Class>,
    bytes: usize,
    /// Slab bytes freed by compaction, in pages (zram's `pages_compacted`).
    pages_compacted: u64,
}

impl SlabAllocator {
    pub fn new(page_bytes: usize) -> Self {
        assert!(page_bytes <= MAX_OBJECT_BYTES, "pages up to 16 KiB");
        let class_delta = (page_bytes / 256).max(8);
        let classes = (1..=page_bytes / class_delta)
            .map(|i| {
                let object_bytes = i * class_delta;
                // 1..=4 pages per slab, whichever leaves the smallest unusable tail.
                let pages = (1..=4)
                    .min_by_key(|&p| {
                        let slab = p * page_bytes;
                        (slab % object_bytes) * 1000 / slab
                    })
                    .expect("four candidates");
                let slab_bytes = pages * page_bytes;
                Class {
                    object_bytes: object_bytes as u32,
                    objects_per_slab: (slab_bytes / object_bytes) as u16,
                    slab_bytes: slab_bytes as u32,
                    slabs: Vec::new(),
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
            pages_compacted: 0,
        }
    }

    /// Memory held by slabs.
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

    /// A slot for `len` bytes owned by `owner`.
    pub fn alloc(&mut self, len: usize, owner: u64) -> Handle {
        let class_index = self.class_of(len);
        let class = &mut self.classes[class_index];
        let slab_index = loop {
            match class.partial.last().copied() {
                Some(s) => {
                    let slab = &mut class.slabs[s as usize];
                    if slab.memory.is_some() && !slab.free.is_empty() {
                        break s;
                    }
                    slab.in_partial = false;
                    class.partial.pop();
                }
                None => {
                    let n = class.objects_per_slab;
                    let slab = Slab {
                        memory: Some(vec![0u8; class.slab_bytes as usize].into_boxed_slice()),
                        free: (0..n).rev().collect(),
                        owner: vec![FREE; n as usize],
                        live: 0,
                        in_partial: true,
                    };
                    self.bytes += class.slab_bytes as usize;
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
        let slab = &mut class.slabs[slab_index as usize];
        let object = slab.free.pop().expect("partial slab has a free slot");
        slab.live += 1;
        slab.owner[object as usize] = owner;
        Handle {
            class: class_index as u16,
            object,
            slab: slab_index,
        }
    }

    /// The slot's bytes (the whole slot; callers use the prefix they stored).
    pub fn slot(&self, h: Handle) -> &[u8] {
        let class = &self.classes[h.class as usize];
        let size = class.object_bytes as usize;
        let memory = class.slabs[h.slab as usize]
            .memory
            .as_deref()
            .expect("handle to a live slab");
        &memory[h.object as usize * size..(h.object as usize + 1) * size]
    }

    pub fn slot_mut(&mut self, h: Handle) -> &mut [u8] {
        let class = &mut self.classes[h.class as usize];
        let size = class.object_bytes as usize;
        let memory = class.slabs[h.slab as usize]
            .memory
            .as_deref_mut()
            .expect("handle to a live slab");
        &mut memory[h.object as usize * size..(h.object as usize + 1) * size]
    }

    pub fn free(&mut self, h: Handle) {
        let class = &mut self.classes[h.class as usize];
        let slab = &mut class.slabs[h.slab as usize];
        assert_ne!(slab.owner[h.object as usize], FREE, "double free of {h:?}");
        slab.owner[h.object as usize] = FREE;
        slab.free.push(h.object);
        slab.live -= 1;
        if slab.live == 0 {
            // Return the memory now; the slab id is reused by the next new slab.
            slab.memory = None;
            slab.free = Vec::new();
            slab.owner = Vec::new();
            self.bytes -= class.slab_bytes as usize;
            class.released.push(h.slab);
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
        for class_index in 0..self.classes.len() {
            let class = &mut self.classes[class_index];
            let mut candidates: Vec<u32> = (0..class.slabs.len() as u32)
                .filter(|&s| {
                    let slab = &class.slabs[s as usize];
                    slab.memory.is_some() && !slab.free.is_empty()
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
                if class.slabs[dst].free.is_empty() {
                    dst_i += 1;
                    continue;
                }
                let Some(from) = (0..class.objects_per_slab as usize)
                    .find(|&o| class.slabs[src].owner[o] != FREE)
                else {
                    src_i -= 1;
                    continue;
                };
                let to = class.slabs[dst].free.pop().expect("checked non-empty");
                let owner = class.slabs[src].owner[from];
                let mut buf = [0u8; MAX_OBJECT_BYTES];
                let bytes = &mut buf[..size];
                bytes.copy_from_slice(
                    &class.slabs[src].memory.as_deref().expect("live")
                        [from * size..(from + 1) * size],
                );
                class.slabs[dst].memory.as_deref_mut().expect("live")
                    [to as usize * size..(to as usize + 1) * size]
                    .copy_from_slice(bytes);
                class.slabs[dst].owner[to as usize] = owner;
                class.slabs[dst].live += 1;
                class.slabs[src].owner[from] = FREE;
                class.slabs[src].free.push(from as u16);
                class.slabs[src].live -= 1;
                moved(
                    owner,
                    Handle {
                        class: class_index as u16,
                        object: to,
                        slab: dst as u32,
                    },
                );
                if class.slabs[src].live == 0 {
                    let slab = &mut class.slabs[src];
                    slab.memory = None;
                    slab.free = Vec::new();
                    slab.owner = Vec::new();
                    self.bytes -= class.slab_bytes as usize;
                    class.released.push(src as u32);
                    src_i -= 1;
                }
            }
            // Rebuild the partial list from what is left.
            class.partial.clear();
            for (s, slab) in class.slabs.iter_mut().enumerate() {
                slab.in_partial = slab.memory.is_some() && !slab.free.is_empty();
                if slab.in_partial {
                    class.partial.push(s as u32);
                }
            }
        }
        let released = before - self.bytes;
        self.pages_compacted += (released / self.page_bytes) as u64;
        released
    }

    /// Checks the counts; for tests.
    pub fn check(&self) {
        let mut bytes = 0;
        for class in &self.classes {
            for slab in &class.slabs {
                if let Some(m) = &slab.memory {
                    bytes += m.len();
                    let live = slab.owner.iter().filter(|&&o| o != FREE).count();
                    assert_eq!(live, slab.live as usize);
                    assert_eq!(live + slab.free.len(), class.objects_per_slab as usize);
                }
            }
        }
        assert_eq!(bytes, self.bytes);
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
        a.slot_mut(h[5])[..4].copy_from_slice(b"abcd");
        assert_eq!(&a.slot(h[5])[..4], b"abcd");
        assert!(a.bytes() >= 100 * 1008);
        a.check();
        for x in h {
            a.free(x);
        }
        a.check();
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn compaction_frees_sparse_slabs_and_reports_moves() {
        let mut a = SlabAllocator::new(4096);
        let handles: Vec<Handle> = (0..1000).map(|i| a.alloc(500, i)).collect();
        let full = a.bytes();
        let mut kept = std::collections::HashMap::new();
        for (i, h) in handles.into_iter().enumerate() {
            if i % 5 == 0 {
                a.slot_mut(h)[..8].copy_from_slice(&(i as u64).to_le_bytes());
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
            assert_eq!(a.slot(h)[..8], owner.to_le_bytes());
        }
    }
}
