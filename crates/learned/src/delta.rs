//! The update buffer's record of one group (`Delta`): its buffered runs (`DeltaRun`), the
//! group's bits slot, and what the merge policy and GC moves ask of it.

use super::{tail_off, TOMBSTONE};
use ftlab_core::ftl::mapping::runs::Run;

/// Buffered updates of one group: offsets `off..off + len` map to `ppn, ppn + 1, ...`, or are
/// all trimmed (`ppn == TOMBSTONE`). 8 bytes per run.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub(super) struct DeltaRun {
    pub(super) off: u16,
    pub(super) len: u16,
    pub(super) ppn: u32,
}

impl Run for DeltaRun {
    #[inline]
    fn start(&self) -> u32 {
        u32::from(self.off)
    }
    #[inline]
    fn len(&self) -> u32 {
        u32::from(self.len)
    }
    #[inline]
    fn value(&self) -> u32 {
        self.ppn
    }
    #[inline]
    fn make(start: u32, len: u32, ppn: u32) -> Self {
        DeltaRun {
            off: start as u16,
            len: len as u16,
            ppn,
        }
    }
    #[inline]
    fn advance(value: u32, by: u32) -> u32 {
        if value == TOMBSTONE {
            TOMBSTONE
        } else {
            value + by
        }
    }
    /// The same offset (`tail_off`) `by` keys on: a trim continues only trims, and a PPN only
    /// PPNs (a run ending at the last valid PPN, `u32::MAX - 1`, advances to `u32::MAX`, which is
    /// the tombstone, not its next PPN).
    #[inline]
    fn continues(value: u32, by: u32, next: u32) -> bool {
        tail_off(0, value) == tail_off(by, next)
    }
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub(super) struct Delta {
    pub(super) group: u32,
    /// LPNs covered by `runs` (at most `GROUP_LPNS`).
    pub(super) entries: u16,
    /// The run the group's last write went to: where a sequential write continues
    /// (`runs::extend_at`). Only a hint, in 16 bits.
    pub(super) cursor: u16,
    /// The buffer's clock when the delta was made: every update it holds was buffered then or
    /// later (`WriteTimes`).
    pub(super) since: u32,
    /// Whether its group's blob, when the delta was made, took fewer than
    /// `UNBOUNDED_BLOB_BYTES` (the blob keeps its length until the delta is merged): only such
    /// deltas count against the bound on groups (`small_deltas`).
    pub(super) small: bool,
    /// Its slot in `bits_pool` (which offsets `runs` hold), kept once it holds more than
    /// `BITS_ABOVE_RUNS` runs (until then they are scanned); `NO_BITS` before.
    pub(super) bits: u32,
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    pub(super) runs: Vec<DeltaRun>,
}

// A delta's record, as `BOUND_LPNS_PER_GROUP`'s comment counts it (on 64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Delta>() == 48);
