//! Heap accounting of hash tables, shared by the mapping tables and the page store (which
//! report their own memory and check it against the allocator's statistics).

/// Bytes hashbrown allocates for a table of this `capacity()` with entries of `entry_bytes`
/// (key and value): one entry and one control byte per bucket, plus a group of trailing control
/// bytes. Derived from the layout (buckets = capacity * 8 / 7, a power of two); `ftlab mapbench`
/// and the store's memory test cross-check it against the allocator's own statistics.
pub fn hashbrown_bytes(capacity: usize, entry_bytes: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        if capacity < 4 {
            4
        } else {
            8
        }
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    const GROUP_WIDTH: usize = 16;
    let data = (buckets * entry_bytes).next_multiple_of(GROUP_WIDTH);
    data + buckets + GROUP_WIDTH
}
