//! What each table reports of its own work beyond mapping (`MappingTable::activity`, the report's
//! `mapping.<table>` object). The types are plain data, here in the core so that the FTL and
//! the report carry them without depending on the tables that fill them.

use serde::{Deserialize, Serialize};

/// A table's own account of its work: one variant per table that has one, serialised under the
/// table's name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TableActivity {
    /// Merges, updates in place, the lookup cursor and the groups' encodings.
    Learned(LearnedActivity),
}

impl TableActivity {
    /// The fraction of lookups answered with no search, for tables with a lookup cursor.
    pub fn cursor_get_fraction(&self) -> Option<f64> {
        match self {
            Self::Learned(a) => a.cursor_get_fraction(),
        }
    }
}

/// The table's counts of its own work (the report's `mapping.learned`, in this order).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnedStats {
    /// Buffered groups folded into their blobs (each re-encodes one group)...
    pub merges: u64,
    /// ...and the buffered LPNs they held.
    pub merged_entries: u64,
    /// Updates and GC moves written into a blob in place (`group::update_in_place`), skipping
    /// the buffer.
    pub updates_in_place: u64,
    /// Buffered runs that rewrote a run of their blob whole (GC moving it, a host rewriting it)
    /// and went into the blob in place (`settle_tail_run`).
    pub runs_moved_in_place: u64,
    /// GC moves that `WriteTimes` showed not to be buffered, without searching the buffer.
    pub gc_moves_known_unbuffered: u64,
}

/// What the table did over a simulation, for its report (`mapping.learned`): how often the
/// buffer was folded into the blobs (the table's own work per update) and how often it was
/// skipped, and how its groups are encoded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnedActivity {
    #[serde(flatten)]
    pub counts: LearnedStats,
    /// LPNs whose latest update was still in the buffer as the run ended.
    pub buffered_entries: u64,
    /// Lookups (`get`), as the caller noted them (`MappingTable::note_gets`)...
    pub gets: u64,
    /// ...and those the lookup cursor (the span of consecutive PPNs the last lookup or update
    /// found) did not answer: each tested the buffer's bits and, unless it followed on from
    /// the last span, searched a blob. The cursor's hit rate is what sets the table's lookup
    /// speed (docs/mapping.md).
    pub get_cursor_misses: u64,
    /// Groups holding mappings, by encoding, as the run ended.
    pub groups: GroupEncodings,
}

impl LearnedActivity {
    /// The fraction of lookups the cursor answered with no search; None before the first.
    pub fn cursor_get_fraction(&self) -> Option<f64> {
        (self.gets > 0).then(|| 1.0 - self.get_cursor_misses as f64 / self.gets as f64)
    }
}

/// Groups by encoding (`group::Encoding`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupEncodings {
    pub runs: u64,
    pub segments: u64,
    pub words: u64,
    /// Any of the three with outliers listed apart.
    pub patched: u64,
}
