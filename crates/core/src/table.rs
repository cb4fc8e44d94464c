//! Large flat tables (mapping, reverse map, bitmaps), allocated once at start, on transparent
//! huge pages where the kernel offers them: on the per-page path every lookup is a random access
//! into tens of MiB, and with 4 KiB pages each one would also miss the TLB.

/// A `Vec` of `len` copies of `value`, backed by huge pages when possible.
pub fn filled<T: Copy>(len: usize, value: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_huge_pages(v.as_ptr() as usize, len * std::mem::size_of::<T>());
    v.resize(len, value);
    v
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(addr: usize, bytes: usize) {
    const HUGE: usize = 2 << 20;
    if bytes < 4 * HUGE {
        return;
    }
    // Only whole 2 MiB pages inside the allocation; the memory is not touched yet, so the first
    // writes (in `resize`) fault in huge pages.
    let start = addr.div_ceil(HUGE) * HUGE;
    let end = (addr + bytes) / HUGE * HUGE;
    if end > start {
        // SAFETY: the range lies inside an allocation this process owns; MADV_HUGEPAGE only
        // changes how the kernel backs it and cannot invalidate memory. Failure is harmless.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_addr: usize, _bytes: usize) {}
