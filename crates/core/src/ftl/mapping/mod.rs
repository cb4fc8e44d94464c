//! The logical-to-physical mapping table, behind one trait so that other encodings (hash, learned,
//! demand-paged) plug into the same FTL. The FTL is generic over it: one monomorphised hot path per
//! table, no dynamic dispatch per page.

/// Maps logical page numbers to physical page numbers, as raw numbers (`Lpn::get`,
/// `Ppn::get`: encodings do arithmetic on them). LPNs are `< logical_pages`; PPNs fit in u32
/// (the geometry guarantees it) and `u32::MAX` (`Ppn::NONE`) is never a valid PPN.
pub trait MappingTable {
    fn name(&self) -> &'static str;
    fn get(&self, lpn: u32) -> Option<u32>;
    /// Maps `lpn` to `ppn`, returning the previous PPN.
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32>;
    /// Maps `lpn`, which maps to `from` now, to `to` (a GC move: the FTL read the page at
    /// `from`). Tables that search to find the previous PPN skip that search.
    #[inline]
    fn relocate(&mut self, lpn: u32, from: u32, to: u32) {
        let old = self.set(lpn, to);
        debug_assert_eq!(old, Some(from));
    }
    /// Unmaps `lpn` (TRIM), returning the previous PPN.
    fn remove(&mut self, lpn: u32) -> Option<u32>;
    fn live_mappings(&self) -> u64;
    /// Bytes of DRAM the table occupies (heap included).
    fn heap_bytes(&self) -> usize;
    /// The most `heap_bytes` has been since the table was made: what DRAM it needed at its
    /// largest. The default is for a table whose memory never shrinks (the flat arrays); the
    /// others keep their peak as they go.
    fn peak_heap_bytes(&self) -> usize {
        self.heap_bytes()
    }
    /// A hint that `lpn` will be looked up or set soon (GC knows its next moves in advance).
    #[inline]
    fn prefetch(&self, _lpn: u32) {}
    /// The second stage of `prefetch`, for the same `lpn` some time later: lines that only
    /// reading what `prefetch` brought can find (a compressed table's packed value).
    #[inline]
    fn prefetch_near(&self, _lpn: u32) {}
    /// The caller made `n` more lookups (`get`) that count: the total behind
    /// `compressed_get_fraction` and `activity`. `get` does not count itself: that
    /// would be a load and a store on every lookup, the ones a lookup cursor answers in a few
    /// instructions included (a few per cent of the GET rate on sequential traces). So the
    /// count is the caller's, made in bulk where it
    /// can: the FTL notes each host lookup, `ftlab mapbench` each pass. Tables that report
    /// neither fraction ignore it.
    #[inline]
    fn note_gets(&self, _n: u64) {}
    /// `get` for the FTL's own checks (assertions, invariants): not counted in
    /// `compressed_get_fraction`, so a debug build reports what a release build does.
    #[inline]
    fn get_uncounted(&self, lpn: u32) -> Option<u32> {
        self.get(lpn)
    }
    /// What `lpn` maps to, for prefetching what depends on it, if the table can tell about as
    /// cheaply as an array can (`None` otherwise: a prefetch must not cost a whole lookup). A
    /// hint, not a GET: it is not counted in `compressed_get_fraction`.
    #[inline]
    fn peek(&self, lpn: u32) -> Option<u32> {
        self.get(lpn)
    }
    /// Folds pending updates into the table's compact form and returns spare capacity, so that
    /// `heap_bytes` measures the table itself (used before reporting memory).
    fn compact(&mut self) {}
    /// For tables with an update buffer in front of a compressed layer: the fraction of lookups
    /// (`get`, as many as `note_gets` was told) the compressed layer answered; None before the
    /// first.
    fn compressed_get_fraction(&self) -> Option<f64> {
        None
    }
    /// What the table did beyond mapping, in its own terms (the report's `mapping.<table>`
    /// object); None for a table with nothing to tell.
    fn activity(&self) -> Option<TableActivity> {
        None
    }
    /// Starts the counts behind `activity` and `compressed_get_fraction` over.
    fn reset_activity(&mut self) {}
    /// Calls `f(lpn, ppn)` for every live mapping, in ascending LPN order, the LPNs below
    /// `logical_pages`: what saving the table or copying it for a snapshot walks. The default
    /// looks every LPN up; tables that can list their mappings faster do so.
    fn for_each_live(&self, logical_pages: u64, f: &mut dyn FnMut(u32, u32)) {
        for lpn in 0..logical_pages.min(u64::from(u32::MAX)) as u32 {
            if let Some(ppn) = self.get_uncounted(lpn) {
                f(lpn, ppn);
            }
        }
    }
}

/// Asks the CPU to bring the cache line holding `*p` closer. A no-op where unsupported.
#[inline(always)]
pub fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, even for an invalid address.
    unsafe {
        core::arch::x86_64::_mm_prefetch(p as *const i8, core::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

pub mod activity;
pub mod extent;
pub mod hash;
pub mod runs;

pub use activity::TableActivity;
pub use extent::ExtentMapping;
pub use hash::HashMapping;

const UNMAPPED: u32 = u32::MAX;

/// One u32 per logical page: 4 bytes x capacity / page size, the DRAM a page-level FTL needs.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct FlatMapping {
    #[serde(with = "crate::serde_state::words")]
    ppn_of_lpn: Vec<u32>,
    live: u64,
}

impl FlatMapping {
    pub fn new(logical_pages: u64) -> Self {
        Self {
            ppn_of_lpn: crate::table::filled(logical_pages as usize, UNMAPPED),
            live: 0,
        }
    }
}

impl MappingTable for FlatMapping {
    fn name(&self) -> &'static str {
        "flat"
    }

    #[inline]
    fn get(&self, lpn: u32) -> Option<u32> {
        let ppn = self.ppn_of_lpn[lpn as usize];
        (ppn != UNMAPPED).then_some(ppn)
    }

    #[inline]
    fn set(&mut self, lpn: u32, ppn: u32) -> Option<u32> {
        debug_assert_ne!(ppn, UNMAPPED);
        let old = std::mem::replace(&mut self.ppn_of_lpn[lpn as usize], ppn);
        if old == UNMAPPED {
            self.live += 1;
            None
        } else {
            Some(old)
        }
    }

    #[inline]
    fn remove(&mut self, lpn: u32) -> Option<u32> {
        let old = std::mem::replace(&mut self.ppn_of_lpn[lpn as usize], UNMAPPED);
        if old == UNMAPPED {
            None
        } else {
            self.live -= 1;
            Some(old)
        }
    }

    fn live_mappings(&self) -> u64 {
        self.live
    }

    fn heap_bytes(&self) -> usize {
        self.ppn_of_lpn.capacity() * std::mem::size_of::<u32>()
    }

    #[inline]
    fn prefetch(&self, lpn: u32) {
        if let Some(entry) = self.ppn_of_lpn.get(lpn as usize) {
            prefetch_line(entry);
        }
    }
}
