//! Copying a whole page into slab memory that is not in cache.
//!
//! A slot's memory was last touched when the page it held before was written, usually long ago,
//! so an ordinary copy first reads every destination line from DRAM (read for ownership) only to
//! overwrite it. Non-temporal stores skip that read. glibc's `memcpy` switches to them only
//! above about three quarters of the last-level cache, far above a page. Measured on this
//! machine (4 KiB into random places of a 1 GiB region): 560-650 ns a page with `memcpy`,
//! 290-305 ns streamed.
//!
//! Written by hand: neither std nor a well-kept crate offers a non-temporal copy.

/// Copies `src` into `dst` (same length), streaming when the destination is 16-byte aligned
/// and the length a multiple of 64 bytes (every raw page; a compressed one only by chance);
/// otherwise an ordinary copy.
#[inline]
pub fn copy(dst: &mut [std::mem::MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if (dst.as_ptr() as usize).is_multiple_of(16) && src.len().is_multiple_of(64) {
        // SAFETY: both slices are `src.len()` long and do not overlap (one is borrowed mutably);
        // the destination is 16-byte aligned, as `_mm_stream_si128` requires; SSE2 is part of
        // x86_64.
        unsafe { stream(dst.as_mut_ptr().cast(), src.as_ptr(), src.len()) };
        return;
    }
    // SAFETY: as above; MaybeUninit<u8> has u8's layout.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
}

/// # Safety
/// `dst` and `src` are valid for `len` bytes and do not overlap, `dst` is 16-byte aligned and
/// `len` a multiple of 64.
#[cfg(target_arch = "x86_64")]
unsafe fn stream(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let mut at = 0;
    while at < len {
        for lane in (0..64).step_by(16) {
            // SAFETY: `at + lane + 16 <= len` (len is a multiple of 64), both ranges are valid
            // for `len` bytes and `dst + at + lane` stays 16-byte aligned, as the caller promised.
            unsafe {
                let v = _mm_loadu_si128(src.add(at + lane).cast::<__m128i>());
                _mm_stream_si128(dst.add(at + lane).cast::<__m128i>(), v);
            }
        }
        at += 64;
    }
    // Streaming stores are weakly ordered: the fence makes them visible before the shard lock
    // that publishes the page is released.
    // SAFETY: SSE is part of x86_64's baseline; the fence has no other precondition.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    #[test]
    fn copies_every_byte_aligned_or_not() {
        let src: Vec<u8> = (0..4096 + 64).map(|i| (i * 31 + 7) as u8).collect();
        let mut buf = vec![MaybeUninit::new(0u8); 4096 + 128];
        for (skew, len) in [(0, 4096), (16, 4096), (1, 4096), (0, 4000), (32, 64)] {
            // Aligned to 16 in the first cases (Vec<MaybeUninit<u8>> from the system allocator
            // usually is; either path must copy the same bytes).
            let dst = &mut buf[skew..skew + len];
            copy(dst, &src[..len]);
            let got: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(got, &src[..len], "skew {skew} len {len}");
        }
    }
}
