//! `mapping_tables`' operations on a sparse device: their LPNs laid out in blocks far apart
//! (`oracle::SparseDevice`, its layout picked by the first byte), over several chunks of the
//! learned table's delta index and directory; every table but the flat array against a
//! HashMap oracle, the learned table's compressed layer read back after each merge.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ftlab_learned::oracle::SparseDevice::check_bytes(data);
});
