//! A sweep file of any bytes: expanded or refused with an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ftlab_sweep::Spec::parse(text, "fuzz.toml", std::path::Path::new("/tmp"));
    }
});
