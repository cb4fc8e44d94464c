//! `mem_used_total` against the heap as the process's allocator sees it: a counting global
//! allocator (hence a test binary of its own) measures what the store really holds.

use ftlab_core::rng::SplitMix64;
use ftlab_store::codec::Codec;
use ftlab_store::{PageStore, StoreConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Text-like pages of varied compressibility, some zero, some random.
fn page(seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let kind = rng.bounded(10);
    let mut p = vec![0u8; 4096];
    match kind {
        0 => {}
        1 => p.iter_mut().for_each(|b| *b = rng.next_u64() as u8),
        _ => {
            let alphabet = 4 + rng.bounded(60) as u8;
            for b in p.iter_mut() {
                *b = b'a' + (rng.next_u64() % u64::from(alphabet)) as u8;
            }
        }
    }
    p
}

#[test]
fn mem_used_total_is_what_the_allocator_holds_and_trim_returns_it() {
    for codec in [Codec::Lz4, Codec::Zstd { level: 3 }] {
        let mut config = StoreConfig::new(4096, codec);
        config.shards = 4;
        let store = PageStore::new(config).unwrap();
        // Warm the per-thread codec contexts and scratch buffers: they are not the store's.
        store.write(0, &page(1)).unwrap();
        store.trim(0);
        let mut buf = vec![0u8; 4096];
        store.read(0, &mut buf).unwrap();
        let base = live();

        let pages = 20_000u64;
        for lpn in 0..pages {
            store.write(lpn, &page(lpn)).unwrap();
        }
        // Random overwrite churn, then compaction.
        let mut rng = SplitMix64::new(9);
        for i in 0..pages {
            let lpn = rng.bounded(pages);
            store.write(lpn, &page(pages + i)).unwrap();
        }
        let check = |stage: &str| {
            let s = store.stats();
            let heap = (live() - base) as u64;
            let metadata = heap as i64 - s.mem_used_total as i64;
            println!(
                "{stage}: heap {heap} mem_used_total {} compr {} metadata {metadata} ({:.1} B/page), estimated {}",
                s.mem_used_total,
                s.compr_data_size,
                metadata as f64 / pages as f64,
                store.metadata_bytes()
            );
            // The slabs are in the heap; what else the store holds is bookkeeping, bounded per page.
            assert!(
                heap >= s.mem_used_total,
                "{stage}: slabs not all counted by the allocator?"
            );
            assert!(
                metadata as u64 <= 160 * pages + (1 << 20),
                "{stage}: {metadata} B of bookkeeping"
            );
            // The store's own estimate of its bookkeeping is close to what the allocator saw.
            let estimate = store.metadata_bytes() as i64;
            assert!(
                (estimate - metadata).abs() < metadata / 5 + (64 << 10),
                "{stage}: estimate {estimate}"
            );
        };
        check("after churn");
        store.compact();
        check("after compaction");
        store.check();

        for lpn in 0..pages {
            store.trim(lpn);
        }
        let s = store.stats();
        assert_eq!(
            (s.mem_used_total, s.compr_data_size, s.pages_stored),
            (0, 0, 0)
        );
        let left = live() - base;
        println!("{codec:?}: after trimming everything, {left} bytes remain");
        assert!(
            left.abs() < 256 << 10,
            "{left} bytes left after trimming everything"
        );
        drop(store);
    }
}
