//! Little-endian fields of a blob: unaligned loads of u16s and u64s, bit-packed fields read and
//! overwritten in place, and a writer appending bit fields. Every encoding (`segments.rs`,
//! `run_list.rs`, `words.rs`, `patches.rs`, `elias_fano.rs`) reads its blobs through these.

// Blobs are only ever made by `group::encode_runs`, whose layouts keep every read below in
// bounds (the `group::TAIL_PAD` bytes the caller keeps after a blob cover the 8-byte loads);
// lookups are the hot path, so reads skip the bounds checks that debug builds (and the test
// profile) still make.

/// The u16 at `at`, little endian.
#[inline]
pub(super) fn rd16(b: &[u8], at: usize) -> u32 {
    debug_assert!(at + 2 <= b.len());
    // SAFETY: in bounds by construction (see above).
    u32::from(u16::from_le(unsafe {
        std::ptr::read_unaligned(b.as_ptr().add(at) as *const u16)
    }))
}

/// The 8 bytes at `at`, little endian.
#[inline]
pub(super) fn rd64(b: &[u8], at: usize) -> u64 {
    debug_assert!(at + 8 <= b.len());
    // SAFETY: in bounds by construction (see above).
    u64::from_le(unsafe { std::ptr::read_unaligned(b.as_ptr().add(at) as *const u64) })
}

/// `width` (<= 56) bits starting `bit` bits after byte `at`.
#[inline]
pub(super) fn rd_bits(b: &[u8], at: usize, bit: u64, width: u32) -> u64 {
    let p = at + (bit / 8) as usize;
    debug_assert!(p + 8 <= b.len());
    // SAFETY: in bounds by construction (see above).
    let word = u64::from_le(unsafe { std::ptr::read_unaligned(b.as_ptr().add(p) as *const u64) });
    (word >> (bit % 8)) & ((1u64 << width) - 1)
}

/// Overwrites the `width` (<= 56) bits starting `bit` bits after byte `at` with `value`.
#[inline]
pub(super) fn wr_bits(b: &mut [u8], at: usize, bit: u64, width: u32, value: u64) {
    let p = at + (bit / 8) as usize;
    let word: &mut [u8; 8] = (&mut b[p..p + 8]).try_into().expect("8 bytes");
    let mask = ((1u64 << width) - 1) << (bit % 8);
    let old = u64::from_le_bytes(*word);
    *word = ((old & !mask) | ((value << (bit % 8)) & mask)).to_le_bytes();
}

/// Appends little-endian bit fields to a byte vector.
pub(super) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    pub(super) fn new(out: &'a mut Vec<u8>) -> Self {
        Self { out, acc: 0, n: 0 }
    }
    pub(super) fn put(&mut self, value: u64, width: u32) {
        debug_assert!(width <= 56 && (width == 56 || value < (1u64 << width)));
        if width == 0 {
            return;
        }
        self.acc |= value << self.n;
        self.n += width;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    pub(super) fn finish(self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
    }
}
