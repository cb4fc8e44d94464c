//! Arbitrary bytes through the fio line parser and the file reader: errors are fine, panics
//! are bugs.
#![no_main]
use ftlab_sim::trace::TraceFormat;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ftlab_sim::trace::fuzz_one(TraceFormat::Fio, data);
});
