//! When `ftlab serve --store zstd-dict` trains its dictionary. The store only trains when asked
//! (`PageStore::train_dictionary`); a live device must ask by itself, or `zstd-dict` would stay
//! plain zstd forever. A training reads a sample of the stored pages and runs zstd's trainer on
//! one core for a few seconds, so it is done on a schedule that keeps trainings few: first once
//! `FIRST_TRAINING_PAGES` pages are stored compressed (neither same-filled nor raw: what the
//! training samples), then whenever that count has doubled since the last training (one
//! training per doubling of the device's content).
//!
//! Owns: the schedule. Does not know: how training works or what the server does meanwhile.

/// 16 MiB of 4 KiB pages: enough for a dictionary worth having (zstd's trainer wants about a
/// hundred times the dictionary's size of samples; the store's dictionary is at most 1 MiB,
/// and from smaller samples it comes out smaller).
pub const FIRST_TRAINING_PAGES: u64 = 4096;

#[derive(Clone, Debug)]
pub struct DictionarySchedule {
    next_at_pages: u64,
}

impl Default for DictionarySchedule {
    fn default() -> Self {
        Self {
            next_at_pages: FIRST_TRAINING_PAGES,
        }
    }
}

impl DictionarySchedule {
    /// Whether to train now, with `compressed_pages` stored compressed. Once it says yes, the
    /// next training is due at twice this count.
    pub fn due(&mut self, compressed_pages: u64) -> bool {
        if compressed_pages < self.next_at_pages {
            return false;
        }
        self.next_at_pages = compressed_pages.saturating_mul(2);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trains_first_at_the_threshold_then_once_per_doubling() {
        let mut s = DictionarySchedule::default();
        let trained: Vec<u64> = (0..=40_000u64)
            .step_by(100)
            .filter(|&pages| s.due(pages))
            .collect();
        assert_eq!(trained, vec![4100, 8200, 16400, 32800]);
        // A device that shrinks (trims) is not retrained until it has grown past the mark.
        assert!(!s.due(1000));
        assert!(!s.due(65_500));
        assert!(s.due(65_600));
    }
}
