//! The lookup cursor: the range of LPNs the last lookup or update resolved (`Span`), which
//! answers sequential lookups and updates without a search, and where the last span the
//! compressed layer gave ended (`Follow`), so that the lookup of the LPN right after it resumes
//! there. `LearnedMapping` keeps one of each in a `Cell` (lookups take `&self`).

use super::group;
use super::GROUP_LPNS;

/// The last lookup's answer for a whole range of LPNs (`lo..lo + len` map to consecutive PPNs,
/// `lpn + ppn_off` each, or are all unmapped), from the buffer or the compressed layer: sequential
/// lookups and updates skip the searches. It caches what the table maps, so merges (which change
/// the representation, not the mapping) leave it valid; an update of an LPN inside it trims it.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, Default)]
pub(super) struct Span {
    pub(super) lo: u32,
    pub(super) len: u32,
    /// Each LPN's PPN less the LPN (`ppn_off`), the same over the whole span, so that
    /// forgetting its first LPN (a stream of writes) moves `lo` and `len` only; `NO_PPN_OFF`
    /// where its LPNs are unmapped.
    pub(super) ppn_off: u64,
    pub(super) buffered: bool,
}

/// A PPN less its LPN, as the lookup cursor (`Span`) and the buffer's tail keep a run: the same
/// for every LPN of the run, and 2^32 more than the difference, so that it is never 0 (the PPN
/// is `lpn + ppn_off` in u32 arithmetic all the same).
#[inline(always)]
pub(super) fn ppn_off(lpn: u32, ppn: u32) -> u64 {
    (u64::from(ppn) | 1 << 32) - u64::from(lpn)
}

/// No PPN's `ppn_off`: unmapped LPNs, trims. 0, which the hot paths test for with no constant.
pub(super) const NO_PPN_OFF: u64 = 0;

/// Where the last span the compressed layer gave ended: the LPN after it, its place in the blob
/// (`group::lookup_next`), and where the group's buffered runs after it begin. Forgotten by
/// every write to the buffer and every merge; kept while a blob changes in place (its layout
/// stays).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub(super) struct Follow {
    /// Never at a group's first offset, so 0 means none (forgetting writes just this).
    pub(super) lpn: u32,
    pub(super) at: group::Finger,
    /// The group offset up to which the buffer holds nothing after `lpn` (`GROUP_LPNS`: to the
    /// group's end): it bounds the span found there.
    pub(super) hi: u32,
}

impl Follow {
    pub(super) const NONE: Follow = Follow {
        lpn: 0,
        at: group::Finger::NONE,
        hi: GROUP_LPNS as u32,
    };
}

impl Span {
    /// The span of `len` LPNs from `lo`, where `lpn` maps to `ppn` (all unmapped: `None`).
    #[inline(always)]
    pub(super) fn at(lo: u32, len: u32, lpn: u32, ppn: Option<u32>, buffered: bool) -> Span {
        Span {
            lo,
            len,
            ppn_off: ppn.map_or(NO_PPN_OFF, |p| ppn_off(lpn, p)),
            buffered,
        }
    }

    /// What `lpn` maps to (`Some(None)`: unmapped), if the span holds it.
    #[inline]
    pub(super) fn get(&self, lpn: u32) -> Option<Option<u32>> {
        let d = lpn.wrapping_sub(self.lo);
        (d < self.len).then(|| self.ppn_of(lpn))
    }

    /// What `lpn` maps to, for an LPN the span holds.
    #[inline(always)]
    pub(super) fn ppn_of(&self, lpn: u32) -> Option<u32> {
        (self.ppn_off != NO_PPN_OFF).then(|| lpn.wrapping_add(self.ppn_off as u32))
    }

    /// Forgets `lpn` (about to change): keeps the part after it, or the part before it.
    #[inline]
    pub(super) fn forget(&mut self, lpn: u32) {
        let d = lpn.wrapping_sub(self.lo);
        if d >= self.len {
            return;
        }
        if d == 0 {
            self.lo += 1;
            self.len -= 1;
        } else {
            self.len = d;
        }
    }
}
