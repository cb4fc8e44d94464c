//! The process's memory as the allocator and the kernel count it: the cross-checks of a table's
//! own byte accounting.

/// Bytes glibc reports in use (small chunks plus mmapped ones); None on other platforms.
pub fn allocator_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// The process's peak resident set so far, in bytes.
pub fn peak_resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `rusage` is plain integers (all zeros is a valid value), and getrusage only
        // writes the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        // Linux counts `ru_maxrss` in KiB.
        (rc == 0).then(|| usage.ru_maxrss as u64 * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// What the allocator holds now beyond `before` (an `allocator_in_use()` reading).
pub(super) fn allocated_since(before: Option<u64>) -> Option<u64> {
    before
        .zip(allocator_in_use())
        .map(|(b, a)| a.saturating_sub(b))
}
