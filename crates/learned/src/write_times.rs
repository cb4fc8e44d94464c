//! When each chunk of PPNs was last written to the update buffer, so that a GC move can be told
//! the buffer does not hold its LPN without searching it.

/// PPNs per entry of `WriteTimes` (a quarter of the default preset's superblock).
const TIME_CHUNK_SHIFT: u32 = 12;

/// For GC moves: when (by `LearnedMapping::buffer_clock`, which counts buffered writes) a PPN of
/// each chunk of `2^TIME_CHUNK_SHIFT` was last written to the buffer. A move of `lpn` from `from`
/// is told `from` is its current PPN; were the buffer to hold `lpn`, it would hold `from`,
/// buffered no earlier than the delta was made (`Delta::since`). So where `from`'s chunk was
/// last buffered before that, the buffer does not hold `lpn`, and the search of the delta's runs
/// (a fifth of the default preset's time, on cache misses) is skipped. Moves come from old,
/// mostly invalid blocks, written before their groups' last merges made the deltas they have
/// now. Kept only once the table has seen a move (`ftlab mapbench` without GC does not carry
/// it); a chunk not written since reads as `floor`, the clock then, which skips nothing for
/// deltas as old.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default)]
pub(super) struct WriteTimes {
    pub(super) on: bool,
    pub(super) floor: u32,
    #[serde(with = "ftlab_core::serde_state::keep_capacity")]
    pub(super) chunks: Vec<u32>,
}

impl WriteTimes {
    /// Records that PPNs `first..=last` were buffered at `time`.
    #[inline]
    pub(super) fn note(&mut self, first: u32, last: u32, time: u32) {
        let (a, b) = (
            (first >> TIME_CHUNK_SHIFT) as usize,
            (last >> TIME_CHUNK_SHIFT) as usize,
        );
        if b >= self.chunks.len() {
            // Grown by half again at least, so a device filled in PPN order costs O(1) amortised.
            let want = (b + 1).max(self.chunks.len() * 3 / 2);
            self.chunks.resize(want, self.floor);
        }
        self.chunks[a..=b].fill(time);
    }

    /// Whether no PPN of `ppn`'s chunk was buffered at `since` or later.
    #[inline]
    pub(super) fn before(&self, ppn: u32, since: u32) -> bool {
        self.on
            && self
                .chunks
                .get((ppn >> TIME_CHUNK_SHIFT) as usize)
                .map_or(self.floor, |&t| t)
                < since
    }
}
