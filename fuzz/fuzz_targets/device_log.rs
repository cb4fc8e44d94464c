//! Arbitrary bytes as a device log segment (half the inputs behind a valid header, so the
//! record parser is reached): the scan never panics, keeps records in sequence from 1, and its
//! valid prefix and probe stay inside the bytes.
#![no_main]
use ftlab_store::log::{scan_segment, segment_header, SEGMENT_HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes: Vec<u8> = match data.first() {
        Some(b) if b & 1 == 1 => segment_header(0).iter().chain(&data[1..]).copied().collect(),
        _ => data.to_vec(),
    };
    if let Ok(scan) = scan_segment(&bytes, 0, 1) {
        assert!(scan.valid_bytes >= SEGMENT_HEADER_BYTES && scan.valid_bytes <= bytes.len());
        for (i, r) in scan.records.iter().enumerate() {
            assert_eq!(r.seq, i as u64 + 1);
        }
        assert_eq!(scan.stopped.is_none(), scan.valid_bytes == bytes.len());
        if let Some(c) = scan.commit_after_stop {
            assert!(c > scan.valid_bytes && c < bytes.len());
        }
    }
});
