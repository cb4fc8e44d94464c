//! How fast could a rank-based layout answer a trace's lookups? A bound for design decisions, not
//! a table: one bit per LPN, a rank (u32) per 64-bit word, and a plain u32 per live mapping (no
//! compression, no update buffer, no cursor), against the flat u64 array, on the trace-order
//! lookups `ftlab mapbench` times (log-head PPNs; fastest of seven alternating passes):
//!
//! ```text
//! cargo build --release --example rank_bound
//! target/release/examples/rank_bound ../shared/traces/pgbench.nbdlog.gz
//! ```
//!
//! The rank is a popcount: x86-64's baseline has no POPCNT instruction, and its software
//! replacement is most of this layout's lookup. `RUSTFLAGS="-C target-feature=+popcnt"` (in
//! another target directory) shows the difference.
use ftlab::mapbench::{ops_from_trace, PpnSource, REMOVE};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// Mapped LPNs as a bitmap with a rank per word; their PPNs in LPN order.
struct Rank {
    bits: Vec<u64>,
    before: Vec<u32>,
    vals: Vec<u32>,
}

impl Rank {
    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let w = (lpn / 64) as usize;
        let word = self.bits[w];
        let bit = 1u64 << (lpn % 64);
        if word & bit == 0 {
            return None;
        }
        let r = self.before[w] as usize + (word & (bit - 1)).count_ones() as usize;
        Some(self.vals[r])
    }
}

fn main() -> anyhow::Result<()> {
    let Some(trace) = std::env::args().nth(1) else {
        eprintln!("usage: rank_bound TRACE (any format `ftlab sim` reads)");
        std::process::exit(2);
    };
    let ops = ops_from_trace(Path::new(&trace), None, None, PpnSource::LogHead)?;
    let oracle = ops.oracle();
    let n = oracle.len();
    let mut flat = vec![u64::MAX; n];
    let mut bits = vec![0u64; n.div_ceil(64)];
    let mut vals = Vec::new();
    for (lpn, &v) in oracle.iter().enumerate() {
        if v != REMOVE {
            flat[lpn] = u64::from(v);
            bits[lpn / 64] |= 1 << (lpn % 64);
            vals.push(v);
        }
    }
    let mut before = vec![0u32; bits.len()];
    for w in 1..bits.len() {
        before[w] = before[w - 1] + bits[w - 1].count_ones();
    }
    let rank = Rank { bits, before, vals };
    let bytes = rank.bits.len() * 8 + rank.before.len() * 4 + rank.vals.len() * 4;
    let (mut tf, mut tr) = (f64::MAX, f64::MAX);
    for _ in 0..7 {
        let t = Instant::now();
        for &lpn in &ops.gets {
            let v = flat[black_box(lpn) as usize];
            black_box((v != u64::MAX).then_some(v as u32));
        }
        tf = tf.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for &lpn in &ops.gets {
            black_box(rank.get(black_box(lpn)));
        }
        tr = tr.min(t.elapsed().as_secs_f64());
    }
    let per = |t: f64| t * 1e9 / ops.gets.len() as f64;
    println!(
        "{trace}: flat {:.2} ns, bitmap+rank+u32 {:.2} ns ({:.2}x), {:.2} B per live mapping",
        per(tf),
        per(tr),
        tf / tr,
        bytes as f64 / rank.vals.len().max(1) as f64
    );
    Ok(())
}
