//! A host request, as every front end (trace parser, generator, live server) hands it to the FTL.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    /// Deallocate (TRIM / discard / NBD write-zeroes).
    Trim,
    /// Make buffered writes durable.
    Flush,
}

/// Where a write goes: an NVMe FDP placement ID resolved to the device's reclaim group and
/// reclaim unit handle (a stream is a handle). The default, (0, 0), is every write's that
/// names none.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Placement {
    pub reclaim_group: u8,
    pub handle: u8,
}

impl Placement {
    /// Handle `handle` in reclaim group 0.
    pub const fn handle(handle: u8) -> Self {
        Self {
            reclaim_group: 0,
            handle,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// When the host issues it (open-loop replay); generators leave 0.
    pub arrival_ns: u64,
    pub op: Op,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// Where a write is placed (reclaim group and handle); ignored by other operations.
    pub placement: Placement,
}

impl Request {
    /// A request with the default placement.
    pub fn new(arrival_ns: u64, op: Op, offset_bytes: u64, length_bytes: u64) -> Self {
        Self {
            arrival_ns,
            op,
            offset_bytes,
            length_bytes,
            placement: Placement::default(),
        }
    }
}

/// The pages a byte range touches and which of them it covers whole: the one place a request is
/// split into pages (the FTL's page loops, the server's data phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageSpan {
    offset_bytes: u64,
    end_bytes: u64,
    page_bytes: u64,
}

impl PageSpan {
    /// `[offset_bytes, offset_bytes + length_bytes)` over pages of `page_bytes`; the caller has
    /// checked that the end does not overflow.
    #[inline]
    pub fn new(offset_bytes: u64, length_bytes: u64, page_bytes: u64) -> Self {
        debug_assert!(page_bytes > 0);
        Self {
            offset_bytes,
            end_bytes: offset_bytes + length_bytes,
            page_bytes,
        }
    }

    /// The pages the range touches (none for an empty range).
    #[inline]
    pub fn touched(&self) -> std::ops::Range<u64> {
        if self.end_bytes == self.offset_bytes {
            return 0..0;
        }
        self.offset_bytes / self.page_bytes..self.end_bytes.div_ceil(self.page_bytes)
    }

    /// The pages the range covers entirely (what a trim deallocates), possibly none.
    #[inline]
    pub fn whole(&self) -> std::ops::Range<u64> {
        let first = self.offset_bytes.div_ceil(self.page_bytes);
        first..(self.end_bytes / self.page_bytes).max(first)
    }

    /// The bytes `[a, b)` of page `lpn` (one it touches) that the range covers.
    #[inline]
    pub fn covered(&self, lpn: u64) -> (usize, usize) {
        let page_start = lpn * self.page_bytes;
        let start = page_start.max(self.offset_bytes);
        let end = (page_start + self.page_bytes).min(self.end_bytes);
        ((start - page_start) as usize, (end - page_start) as usize)
    }

    /// Whether the range covers page `lpn` (one it touches) entirely.
    #[inline]
    pub fn is_whole(&self, lpn: u64) -> bool {
        let (a, b) = self.covered(lpn);
        (b - a) as u64 == self.page_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_splits_into_the_pages_it_touches_and_covers() {
        let s = PageSpan::new(1000, 9000, 4096);
        assert_eq!(s.touched(), 0..3);
        assert_eq!(s.whole(), 1..2);
        assert_eq!(s.covered(0), (1000, 4096));
        assert_eq!(s.covered(1), (0, 4096));
        assert_eq!(s.covered(2), (0, 10000 - 8192));
        assert!(!s.is_whole(0) && s.is_whole(1) && !s.is_whole(2));
        // Within one page: touched, none whole.
        let s = PageSpan::new(10, 20, 4096);
        assert_eq!((s.touched(), s.whole()), (0..1, 1..1));
        // Aligned, and empty.
        assert_eq!(PageSpan::new(8192, 8192, 4096).whole(), 2..4);
        assert_eq!(PageSpan::new(8192, 0, 4096).touched(), 0..0);
        assert!(PageSpan::new(8192, 0, 4096).whole().is_empty());
    }
}
