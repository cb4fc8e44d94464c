//! Same-fill detection: is a page one 8-byte word repeated? (zram's `page_same_filled`.)
//!
//! The page is compared 64 bytes at a time with no branch inside a block, so the compiler turns
//! each block into a few vector compares; the only branch is once per block.

/// The repeated word if `page` (a multiple of 64 bytes long) is one word repeated.
#[inline]
pub fn same_filled(page: &[u8]) -> Option<u64> {
    debug_assert!(page.len().is_multiple_of(64) && !page.is_empty());
    let first = u64::from_ne_bytes(page[..8].try_into().expect("8 bytes"));
    for block in page.chunks_exact(64) {
        let mut diff = 0u64;
        for word in block.chunks_exact(8) {
            diff |= u64::from_ne_bytes(word.try_into().expect("8 bytes")) ^ first;
        }
        if diff != 0 {
            return None;
        }
    }
    Some(first)
}

/// Fills `out` with `word` repeated.
#[inline]
pub fn fill(out: &mut [u8], word: u64) {
    for chunk in out.chunks_exact_mut(8) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_repeated_words_only() {
        let mut page = vec![0u8; 4096];
        assert_eq!(same_filled(&page), Some(0));
        fill(&mut page, 0xDEAD_BEEF_0123_4567);
        assert_eq!(same_filled(&page), Some(0xDEAD_BEEF_0123_4567));
        for at in [0, 7, 8, 63, 64, 2048, 4095] {
            let mut p = page.clone();
            p[at] ^= 1;
            assert_eq!(same_filled(&p), None, "flip at {at}");
        }
        // A repeated 4-byte pattern is a repeated 8-byte word too.
        let p: Vec<u8> = (0..4096).map(|i| [1, 2, 3, 4][i % 4]).collect();
        assert!(same_filled(&p).is_some());
        let p: Vec<u8> = (0..4096).map(|i| (i % 3) as u8).collect();
        assert_eq!(same_filled(&p), None);
    }
}
