//! `ftlab bench cache`: the cache of decompressed pages a durable device reads through, ARC
//! against LRU (the baseline, measured in the same run on the same key streams): hit ratio and
//! pages read per second, a miss being a real read of the record from a log on this disk.

use anyhow::Result;
use ftlab_store::cache::{zipf_stream, CachePolicy, PageCache};
use ftlab_store::durable::{DataDir, DirOptions};
use std::path::Path;
use std::time::Instant;

const PAGES: u64 = 65_536;
const PAGE_BYTES: usize = 4096;
const READS: usize = 400_000;

/// A page of text-like bytes (compressible, as files are), distinct per LPN.
fn page(lpn: u64) -> Vec<u8> {
    let words = [
        "block ", "flash ", "erase ", "page ", "write ", "ftlab ", "cache ", "trim ",
    ];
    let mut out = Vec::with_capacity(PAGE_BYTES + 8);
    let mut x = lpn.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < PAGE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(words[(x % 8) as usize].as_bytes());
    }
    out.truncate(PAGE_BYTES);
    out
}

/// Reads `keys` through a cache of `capacity` pages under `policy`: (hit ratio, pages/s).
fn run_stream(
    data: &mut DataDir,
    policy: CachePolicy,
    capacity: usize,
    keys: &[u64],
) -> (f64, f64) {
    let mut cache = PageCache::new(policy, capacity);
    let mut out = vec![0u8; PAGE_BYTES];
    let started = Instant::now();
    for &lpn in keys {
        let located = data.locate(0, lpn).expect("a page of the log");
        let Some(located) = located else { continue };
        let key = located.loc().0;
        if let Some(p) = cache.get(key) {
            out.copy_from_slice(p);
        } else {
            located.read_page(&mut out).expect("the record verifies");
            cache.insert(key, &out);
        }
        std::hint::black_box(&out);
    }
    let secs = started.elapsed().as_secs_f64();
    let s = cache.stats();
    (
        s.hits as f64 / (s.hits + s.misses) as f64,
        keys.len() as f64 / secs,
    )
}

pub fn run(machine: String, work_dir: &Path) -> Result<()> {
    let dir = work_dir.join("cache-log");
    let _ = std::fs::remove_dir_all(&dir);
    let (mut data, _) = DataDir::open(&dir, &DirOptions::new(PAGES, PAGE_BYTES))?;
    for lpn in 0..PAGES {
        data.write_page(0, lpn, &page(lpn))?;
    }
    data.checkpoint()?;
    println!("ftlab bench cache on {machine}: {PAGES} pages of 4 KiB in a device log ({READS} reads a stream)");
    println!("| stream | cache | ARC hit ratio | LRU hit ratio | ARC pages/s | LRU pages/s | ratio (ARC/LRU pages/s) |");
    println!("|---|---|---|---|---|---|---|");
    for (name, s, scan) in [
        ("zipf 0.9", 0.9, 0),
        ("zipf 1.1", 1.1, 0),
        ("zipf 0.9 + scans", 0.9, 3000),
    ] {
        let hot = zipf_stream(PAGES as usize / 4, s, READS, 7);
        let keys: Vec<u64> = if scan == 0 {
            hot
        } else {
            // After every 4000 zipf reads, a scan of `scan` pages read once (a backup, a
            // table scan) from the cold half of the device.
            let mut keys = Vec::with_capacity(READS * 2);
            let mut cold = PAGES / 2;
            for chunk in hot.chunks(4000) {
                keys.extend_from_slice(chunk);
                for _ in 0..scan {
                    keys.push(cold);
                    cold = if cold + 1 == PAGES {
                        PAGES / 2
                    } else {
                        cold + 1
                    };
                }
            }
            keys
        };
        for fraction in [0.02, 0.05] {
            let capacity = (PAGES as f64 * fraction) as usize;
            // Alternating, twice each: the first pass also warms the host's page cache.
            let mut arc = (0.0, Vec::new());
            let mut lru = (0.0, Vec::new());
            for _ in 0..2 {
                let (h, r) = run_stream(&mut data, CachePolicy::Lru, capacity, &keys);
                lru = (h, [lru.1, vec![r]].concat());
                let (h, r) = run_stream(&mut data, CachePolicy::Arc, capacity, &keys);
                arc = (h, [arc.1, vec![r]].concat());
            }
            let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
            let (ra, rl) = (best(&arc.1), best(&lru.1));
            println!(
                "| {name} | {:.0} % ({capacity} pages) | {:.3} | {:.3} | {:.0} | {:.0} | {:.2} |",
                fraction * 100.0,
                arc.0,
                lru.0,
                ra,
                rl,
                ra / rl
            );
        }
    }
    drop(data);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
