//! Arbitrary bytes as a durable device's checkpoint (half the inputs behind the checkpoint
//! magic and a valid checksum, so the decoder's fields are reached): decoding never panics,
//! and what it accepts names a position inside a segment and the device volume first.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if data.first().is_some_and(|b| b & 1 == 1) {
        // The magic, the body, then a checksum that matches it.
        bytes = b"FTLABCKP".iter().chain(&data[1..]).copied().collect();
        let sum = twox_hash::XxHash3_64::oneshot(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
    }
    if let Ok((at, _, volumes)) = ftlab_store::durable::decode_checkpoint_bytes(&bytes, 64, 512) {
        assert!(at.offset < ftlab_store::log::MAX_SEGMENT_BYTES && at.seq > 0);
        assert_eq!(volumes.first().map(|v| v.id), Some(0));
    }
});
