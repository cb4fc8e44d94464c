//! What a segment blob's list of mapped offsets (intervals: 4 bytes per run of mapped LPNs, none
//! for a full group) costs on a trace's final mapping (log-head PPNs), against an Elias-Fano
//! list of the same offsets, over the groups neither empty nor full; with the learned table's
//! compacted bytes and encodings for scale. For notes/mapping-log.md ("Three checks" of the offset lists).
//!
//! ```text
//! cargo build --release --example offset_codes
//! target/release/examples/offset_codes ../shared/traces/files.nbdlog.gz
//! ```

use ftlab_core::ftl::mapping::MappingTable;
use ftlab_learned::{LearnedMapping, GROUP_LPNS};
use ftlab_mapbench::{ops_from_trace, PpnSource, REMOVE};
use std::path::Path;

/// Bits of an Elias-Fano list of `n` values below `universe`: `l` low bits each, and the high
/// parts in unary (`n` ones and `universe >> l` zeros).
fn elias_fano_bits(n: u64, universe: u64) -> u64 {
    let l = if universe > n {
        u64::from((universe / n).ilog2())
    } else {
        0
    };
    n * l + n + (universe >> l) + 1
}

fn main() -> anyhow::Result<()> {
    let Some(trace) = std::env::args().nth(1) else {
        eprintln!("usage: offset_codes TRACE (any format `ftlab sim` reads)");
        std::process::exit(2);
    };
    let ops = ops_from_trace(Path::new(&trace), None, None, PpnSource::LogHead)?;
    let mut map = vec![REMOVE; ops.logical_pages as usize];
    let mut table = LearnedMapping::new(ops.logical_pages);
    for &(lpn, ppn) in &ops.updates {
        map[lpn as usize] = ppn;
        if ppn == REMOVE {
            table.remove(lpn);
        } else {
            table.set(lpn, ppn);
        }
    }
    table.compact();
    let (mut live, mut interval_bytes, mut ef_bytes) = (0u64, 0u64, 0u64);
    for group in map.chunks(GROUP_LPNS) {
        let n = group.iter().filter(|&&p| p != REMOVE).count() as u64;
        live += n;
        if n == 0 || n == group.len() as u64 {
            continue;
        }
        let runs = (0..group.len())
            .filter(|&i| group[i] != REMOVE && (i == 0 || group[i - 1] == REMOVE))
            .count() as u64;
        interval_bytes += 4 * runs;
        ef_bytes += elias_fano_bits(n, GROUP_LPNS as u64).div_ceil(8);
    }
    let per = |b: u64| b as f64 / live as f64;
    println!(
        "{trace}: {live} live mappings; learned table {} bytes ({:.3} a mapping), encodings \
         [runs, segments, words, patched] {:?}; intervals {interval_bytes} bytes ({:.3}), \
         Elias-Fano {ef_bytes} bytes ({:.3})",
        table.heap_bytes(),
        per(table.heap_bytes() as u64),
        table.encodings(),
        per(interval_bytes),
        per(ef_bytes)
    );
    Ok(())
}
