//! Arbitrary bytes as a placement range file: errors name a line within the text, a parsed
//! file's ranges are non-empty, and looking up any offset never panics and finds the first
//! range holding it.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match ftlab_sim::placement::PlacementRanges::parse(&text) {
        Err((line, _)) => assert!(line >= 1 && line as usize <= text.lines().count()),
        Ok(ranges) => {
            for r in ranges.ranges() {
                assert!(r.start_bytes < r.end_bytes);
            }
            for &offset in [0, 1, 4096, u64::MAX / 2, u64::MAX].iter().chain(
                ranges.ranges().iter().flat_map(|r| [r.start_bytes, r.end_bytes - 1, r.end_bytes]).collect::<Vec<_>>().iter(),
            ) {
                let expected = ranges
                    .ranges()
                    .iter()
                    .find(|r| r.start_bytes <= offset && offset < r.end_bytes)
                    .map_or(Default::default(), |r| r.placement);
                assert_eq!(ranges.placement_of(offset), expected);
            }
        }
    }
});
