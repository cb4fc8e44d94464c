//! Which of the store's zstd dictionaries a page uses: one for text (mostly printable ASCII:
//! logs, sources, configuration, a database's text columns), one for everything else.
//!
//! A dictionary trained from a sample of a whole device learns mostly what most of its pages
//! are, often binaries, and then gains little on its text pages. One dictionary per class,
//! each from its own class's pages and the total size split by their shares of the sample, did
//! better on every kind of page measured (docs/store.md has the figures).

/// How many classes, and so dictionaries, there are.
pub const CLASSES: usize = 2;
pub const TEXT: usize = 0;
pub const BINARY: usize = 1;
pub const NAMES: [&str; CLASSES] = ["text", "binary"];

/// `TEXT` when at least 90 % of the page's bytes are printable ASCII or whitespace.
#[inline]
pub fn of(page: &[u8]) -> usize {
    // Counted in blocks of 128 bytes into a byte-wide counter, in a form the compiler turns
    // into vector compares and adds: about 0.2 us per 4 KiB, where `filter(..).count()` over
    // the two ranges took 3.3 us (a sixth of the zstd compression that follows).
    let is_printable =
        |b: u8| u8::from(b.wrapping_sub(b' ') < 95) | u8::from(b.wrapping_sub(b'\t') < 5);
    let blocks = page.chunks_exact(128);
    let mut printable = blocks
        .remainder()
        .iter()
        .map(|&b| usize::from(is_printable(b)))
        .sum::<usize>();
    for block in blocks {
        let mut n = 0u8;
        for &b in block {
            n += is_printable(b);
        }
        printable += usize::from(n);
    }
    if printable * 10 >= page.len() * 9 {
        TEXT
    } else {
        BINARY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_mostly_printable() {
        let line = b"2026-11-22 19:50:01 INFO served request 42 in 3.1 ms\n";
        let text: Vec<u8> = line.iter().copied().cycle().take(4096).collect();
        assert_eq!(of(&text), TEXT);
        // An ELF-like page: zeros and small integers between a few strings.
        let mut binary = vec![0u8; 4096];
        binary[..64].copy_from_slice(&text[..64]);
        binary[100..104].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(of(&binary), BINARY);
        // The boundary: 90 % printable is text, one byte fewer is not.
        let mut edge = vec![b'a'; 1000];
        edge[900..].fill(0);
        assert_eq!(of(&edge), TEXT);
        edge[899] = 0;
        assert_eq!(of(&edge), BINARY);
    }

    #[test]
    fn the_blocked_count_agrees_with_a_plain_one() {
        let mut rng = ftlab_core::rng::SplitMix64::new(9);
        for _ in 0..2000 {
            let len = rng.bounded(5000) as usize + 1;
            // Mostly printable bytes with a varying share of others, near the 90 % line.
            let other_pct = rng.bounded(25);
            let page: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.bounded(100) < other_pct {
                        rng.bounded(256) as u8
                    } else {
                        32 + rng.bounded(95) as u8
                    }
                })
                .collect();
            let printable = page
                .iter()
                .filter(|&&b| matches!(b, b'\t'..=b'\r' | b' '..=b'~'))
                .count();
            let want = if printable * 10 >= len * 9 {
                TEXT
            } else {
                BINARY
            };
            assert_eq!(of(&page), want, "len {len}, {printable} printable");
        }
    }
}
