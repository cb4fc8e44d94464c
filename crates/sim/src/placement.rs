//! Placement ranges: a file that gives each LBA range its placement ID, as fio's `dp_scheme`
//! file does for `fdp_pli_select=scheme`. One entry per line, `START, END, PID`: byte offsets
//! (decimal, or hex with 0x), END exclusive, PID `H` or `G:H`; `#` starts a comment. A write
//! whose offset lies in a range takes the first such range's PID; a write in none takes the
//! default (0). Reads, trims and flushes are left alone.

use crate::trace::{parse_pid, FieldError, TraceError};
use ftlab_core::request::{Op, Placement, Request};
use std::path::Path;

/// An LBA range and its placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementRange {
    pub start_bytes: u64,
    pub end_bytes: u64,
    pub placement: Placement,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementRanges {
    ranges: Vec<PlacementRange>,
}

/// At most this many ranges (each write scans them in order).
pub const MAX_RANGES: usize = 4096;

impl PlacementRanges {
    /// Reads a range file; errors name the file, line and field.
    pub fn load(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|cause| TraceError::Io {
            path: path.display().to_string(),
            cause,
        })?;
        Self::parse(&text).map_err(|(line, e)| TraceError::BadLine {
            path: path.display().to_string(),
            line,
            field: e.field,
            reason: e.reason,
        })
    }

    /// Parses a range file's text; an error comes with its line number.
    pub fn parse(text: &str) -> Result<Self, (u64, FieldError)> {
        let mut ranges = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let at = i as u64 + 1;
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != 3 {
                return Err((
                    at,
                    FieldError::new(
                        "line",
                        "expected `START, END, PID` (three comma-separated fields)",
                    ),
                ));
            }
            let number = |s: &str, field| {
                let parsed = match s.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => s.parse(),
                };
                parsed.map_err(|_| {
                    FieldError::new(
                        field,
                        format!("`{s}` is not a byte offset (decimal or 0x hex)"),
                    )
                })
            };
            let start_bytes = number(fields[0], "start").map_err(|e| (at, e))?;
            let end_bytes = number(fields[1], "end").map_err(|e| (at, e))?;
            if end_bytes <= start_bytes {
                return Err((
                    at,
                    FieldError::new(
                        "end",
                        format!("{end_bytes} is not past the start, {start_bytes}"),
                    ),
                ));
            }
            let placement = parse_pid(fields[2], "pid").map_err(|e| (at, e))?;
            if ranges.len() == MAX_RANGES {
                return Err((
                    at,
                    FieldError::new("line", format!("more than {MAX_RANGES} ranges")),
                ));
            }
            ranges.push(PlacementRange {
                start_bytes,
                end_bytes,
                placement,
            });
        }
        Ok(Self { ranges })
    }

    pub fn ranges(&self) -> &[PlacementRange] {
        &self.ranges
    }

    /// The placement of a write at `offset_bytes`: the first range holding it, else the
    /// default.
    pub fn placement_of(&self, offset_bytes: u64) -> Placement {
        self.ranges
            .iter()
            .find(|r| (r.start_bytes..r.end_bytes).contains(&offset_bytes))
            .map_or(Placement::default(), |r| r.placement)
    }

    /// Gives a write its range's placement.
    #[inline]
    pub fn apply(&self, request: &mut Request) {
        if request.op == Op::Write {
            request.placement = self.placement_of(request.offset_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_range_places_a_write() {
        let r = PlacementRanges::parse(
            "# WAL, then SSTs\n0, 1048576, 1\n0x100000, 0x200000, 0:2\n0, 0x400000, 3 # shadowed below 2 MiB\n",
        )
        .unwrap();
        assert_eq!(r.ranges().len(), 3);
        assert_eq!(r.placement_of(4096), Placement::handle(1));
        assert_eq!(r.placement_of(1 << 20), Placement::handle(2));
        assert_eq!(r.placement_of(3 << 20), Placement::handle(3));
        assert_eq!(r.placement_of(5 << 20), Placement::default());
        let mut w = Request::new(0, Op::Write, 4096, 4096);
        r.apply(&mut w);
        assert_eq!(w.placement, Placement::handle(1));
        let mut read = Request::new(0, Op::Read, 4096, 4096);
        r.apply(&mut read);
        assert_eq!(read.placement, Placement::default());
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let e = |text: &str| PlacementRanges::parse(text).unwrap_err();
        assert_eq!(e("0, 10, 1\n\n5, 4, 1").0, 3);
        assert_eq!(e("5, 4, 1").1.field, "end");
        assert_eq!(e("x, 4, 1").1.field, "start");
        assert_eq!(e("0, 4, 256").1.field, "pid");
        assert_eq!(e("0, 4").1.field, "line");
    }
}
