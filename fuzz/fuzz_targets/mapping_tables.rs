//! Arbitrary operation sequences on every mapping table against a HashMap oracle; the learned
//! table merges once its buffer holds more than 32 entries and a sixteenth of the live
//! mappings, and its compressed layer is read back after each merge.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Two whole groups and a partial third: group boundaries are always near.
    let lpns = 2 * ftlab_learned::GROUP_LPNS as u32 + 77;
    let ops = ftlab_learned::oracle::ops_from_bytes(data, lpns);
    let divisor = ftlab_learned::BUFFER_LIVE_DIVISOR;
    ftlab_learned::oracle::check_all(&ops, lpns, 32, divisor);
});
