//! What outliers cost the learned table: a device written sequentially, then `k` random pages
//! per group written again, each taking the next PPN of a log head (as an FTL's overwrites
//! do), the table compacted and checked against a plain array. Prints bytes per group and per
//! overwritten page, and how many groups took each encoding.
//!
//! ```text
//! cargo build --release --example outliers
//! target/release/examples/outliers
//! ```

use ftlab_core::ftl::mapping::MappingTable;
use ftlab_core::rng::SplitMix64;
use ftlab_learned::LearnedMapping;

fn main() {
    let groups = 256u32;
    let lpns = groups * 4096;
    println!("| overwrites per group | bytes per group | bytes per overwrite | B/mapping | run lists, segments, words, patched |");
    println!("|---:|---:|---:|---:|---|");
    let mut base_bytes = 0.0;
    for k in [0u32, 1, 4, 16, 64, 256] {
        let mut table = LearnedMapping::new(u64::from(lpns));
        let mut oracle: Vec<u32> = (0..lpns).collect();
        for lpn in 0..lpns {
            table.set(lpn, lpn);
        }
        let mut rng = SplitMix64::new(7);
        for head in lpns..lpns + k * groups {
            let lpn = rng.bounded(u64::from(lpns)) as u32;
            table.set(lpn, head);
            oracle[lpn as usize] = head;
        }
        table.compact();
        for (lpn, &ppn) in oracle.iter().enumerate() {
            assert_eq!(table.get(lpn as u32), Some(ppn), "lpn {lpn}");
        }
        let per_group = table.heap_bytes() as f64 / f64::from(groups);
        if k == 0 {
            base_bytes = per_group;
        }
        let per_overwrite = if k == 0 {
            "-".to_string()
        } else {
            format!("{:.1}", (per_group - base_bytes) / f64::from(k))
        };
        println!(
            "| {k} | {per_group:.1} | {per_overwrite} | {:.4} | {:?} |",
            table.heap_bytes() as f64 / f64::from(lpns),
            table.encodings()
        );
    }
}
