//! One group of the learned table, built from arbitrary operations, in the encoding the encoder
//! chooses and in bitmap words: every lookup, the decoded runs and updates in place checked
//! against the dense array it was made from.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (dense, updates) = ftlab_learned::oracle::group_from_bytes(data);
    ftlab_learned::group::check_encodings(&dense, &updates);
});
