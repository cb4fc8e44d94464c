//! `--tile-to`: one trace's pattern repeated over a much larger device, the learned table alone.

use super::memory::{allocated_since, allocator_in_use, peak_resident_bytes};
use super::updates::PAGE_BYTES;
use super::{MapOps, REMOVE};
use crate::MapbenchError;
use ftlab_core::ftl::mapping::MappingTable;
use ftlab_learned::LearnedMapping;
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// The learned table on a device `tiles` times the trace's: the trace's updates repeated in each
/// slice of the LPN space, PPNs continuing from the log head (tile k's i-th page write takes
/// PPN k x writes + i). Updates are generated on the fly: the sequence itself would not fit in
/// memory at 16 TiB.
#[derive(Clone, Debug, Serialize)]
pub struct TiledResult {
    pub tiles: u64,
    pub logical_pages: u64,
    pub device_bytes: u64,
    pub updates: u64,
    pub live_mappings: u64,
    pub bytes: u64,
    pub allocator_bytes: Option<u64>,
    pub bytes_per_live_mapping: f64,
    /// The most the table held during the run (`MappingTable::peak_heap_bytes`): its buffer at
    /// its fullest and its arena's garbage and growth room included.
    pub bytes_peak: u64,
    pub set_mops: f64,
    pub seconds: f64,
    pub lossless_verified: bool,
    /// The process's peak resident set over the whole run (`getrusage`), the trace's updates
    /// and the read-back's expected values included: a cross-check of `bytes_peak` from above.
    pub peak_resident_bytes: Option<u64>,
    /// What flat arrays would need for the same device.
    pub flat_u32_bytes: u64,
    pub flat_u64_bytes: u64,
}

/// Runs the tiled benchmark; `progress(done_tiles)` is called after each tile.
pub fn run_tiled(
    ops: &MapOps,
    tiles: u64,
    learned_buffer_divisor: u64,
    mut progress: impl FnMut(u64),
) -> Result<TiledResult, MapbenchError> {
    let tile_lpns = ops.logical_pages;
    let logical_pages = tiles * tile_lpns;
    if tiles < 1 {
        return Err(MapbenchError::Tiles(format!(
            "no tile: the device holds none of the trace's {tile_lpns} LPNs"
        )));
    }
    if logical_pages > 1 << 32 {
        return Err(MapbenchError::Tiles(format!(
            "{tiles} tiles of {tile_lpns} LPNs exceed 2^32 LPNs"
        )));
    }
    if u128::from(tiles) * u128::from(ops.writes) >= u128::from(REMOVE) {
        return Err(MapbenchError::Tiles(format!(
            "{tiles} tiles of {} page writes exceed 2^32 PPNs",
            ops.writes
        )));
    }
    let oracle = ops.oracle();
    let before = allocator_in_use();
    let mut table = LearnedMapping::new(logical_pages).buffer_live_divisor(learned_buffer_divisor);
    let t0 = Instant::now();
    for k in 0..tiles {
        let lpn_base = (k * tile_lpns) as u32;
        let ppn_base = (k * ops.writes) as u32;
        for &(lpn, v) in &ops.updates {
            let lpn = lpn_base + lpn;
            if v == REMOVE {
                black_box(table.remove(lpn));
            } else {
                black_box(table.set(lpn, ppn_base + v));
            }
        }
        progress(k + 1);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let bytes_peak = table.peak_heap_bytes() as u64;
    table.compact();
    let bytes = table.heap_bytes() as u64;
    let allocator_bytes = allocated_since(before);
    let live_per_tile = oracle.iter().filter(|&&v| v != REMOVE).count() as u64;
    let mut ok = table.live_mappings() == live_per_tile * tiles;
    for k in 0..tiles {
        let lpn_base = (k * tile_lpns) as u32;
        let ppn_base = (k * ops.writes) as u32;
        for (lpn, &v) in oracle.iter().enumerate() {
            let want = (v != REMOVE).then(|| ppn_base + v);
            ok &= table.get(lpn_base + lpn as u32) == want;
        }
    }
    let live = table.live_mappings();
    Ok(TiledResult {
        tiles,
        logical_pages,
        device_bytes: logical_pages * PAGE_BYTES,
        updates: tiles * ops.updates.len() as u64,
        live_mappings: live,
        bytes,
        allocator_bytes,
        bytes_per_live_mapping: ftlab_sim::report::bytes_per_mapping(bytes, live),
        bytes_peak,
        set_mops: ftlab_sim::report::round6(
            (tiles * ops.updates.len() as u64) as f64 / seconds.max(1e-9) / 1e6,
        ),
        seconds: ftlab_sim::report::round6(seconds),
        lossless_verified: ok,
        peak_resident_bytes: peak_resident_bytes(),
        flat_u32_bytes: logical_pages * 4,
        flat_u64_bytes: logical_pages * 8,
    })
}
