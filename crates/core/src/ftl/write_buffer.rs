//! The device write buffer: host writes are acknowledged once buffered; a buffered page that is
//! written again is updated in place (coalesced) and costs no flash program.
//!
//! Owns: which logical pages are buffered, and in what order they leave.
//! Does not know: flash addresses or timing. The FTL evicts with [`WriteBuffer::pop_next`] when
//! the buffer is full, on a host flush, and at the end of a run; the eviction order is the
//! [`BufferPolicy`], matched in that one place.

use crate::addr::Lpn;

/// No slot: the page is not buffered.
const NO_SLOT: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferPolicy {
    /// Pages leave in the order they first entered.
    Fifo,
}

#[derive(Clone, Debug)]
pub struct WriteBuffer {
    policy: BufferPolicy,
    capacity_pages: u32,
    /// Ring of buffered LPNs, oldest at `head`; `Lpn::NONE` marks a trimmed entry (a tombstone).
    ring_lpn: Vec<Lpn>,
    ring_stream: Vec<u8>,
    head: u32,
    len: u32,
    /// Slot of each buffered LPN, `NO_SLOT` otherwise; empty when the buffer is disabled.
    slot_of_lpn: Vec<u32>,
}

impl WriteBuffer {
    pub fn new(capacity_pages: u32, logical_pages: u64, policy: BufferPolicy) -> Self {
        let lpn_slots = if capacity_pages == 0 {
            0
        } else {
            logical_pages as usize
        };
        Self {
            policy,
            capacity_pages,
            ring_lpn: vec![Lpn::NONE; capacity_pages as usize],
            ring_stream: vec![0; capacity_pages as usize],
            head: 0,
            len: 0,
            slot_of_lpn: crate::table::filled(lpn_slots, NO_SLOT),
        }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.capacity_pages > 0
    }

    #[inline]
    pub fn contains(&self, lpn: Lpn) -> bool {
        self.enabled() && self.slot_of_lpn[lpn.index()] != NO_SLOT
    }

    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == self.capacity_pages
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a page that is not buffered yet; the caller made room first.
    #[inline]
    pub fn push(&mut self, lpn: Lpn, stream: u8) {
        debug_assert!(!self.is_full() && !self.contains(lpn));
        let slot = (self.head + self.len) % self.capacity_pages;
        self.ring_lpn[slot as usize] = lpn;
        self.ring_stream[slot as usize] = stream;
        self.slot_of_lpn[lpn.index()] = slot;
        self.len += 1;
    }

    /// The next page to write to flash, by policy; `Some((Lpn::NONE, _))` is a trimmed entry
    /// whose slot is simply freed.
    #[inline]
    pub fn pop_next(&mut self) -> Option<(Lpn, u8)> {
        if self.len == 0 {
            return None;
        }
        match self.policy {
            BufferPolicy::Fifo => {
                let slot = self.head as usize;
                let lpn = self.ring_lpn[slot];
                let stream = self.ring_stream[slot];
                self.ring_lpn[slot] = Lpn::NONE;
                self.head = (self.head + 1) % self.capacity_pages;
                self.len -= 1;
                if !lpn.is_none() {
                    self.slot_of_lpn[lpn.index()] = NO_SLOT;
                }
                Some((lpn, stream))
            }
        }
    }

    /// TRIM of a buffered page: its data must never reach flash.
    #[inline]
    pub fn discard(&mut self, lpn: Lpn) {
        if !self.enabled() {
            return;
        }
        let slot = std::mem::replace(&mut self.slot_of_lpn[lpn.index()], NO_SLOT);
        if slot != NO_SLOT {
            self.ring_lpn[slot as usize] = Lpn::NONE;
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.ring_lpn.len() * 5 + self.slot_of_lpn.len() * 4
    }
}
