//! Arbitrary bytes as everything a client sends, through the whole NBD connection state machine
//! (handshake, options, requests): errors close the connection, panics are bugs. The server
//! catches a panic while a request executes (the device then fails, rather than hang its
//! client), but libfuzzer-sys's panic hook aborts first, so such a panic is still reported.
#![no_main]
use ftlab_device::{Device, DeviceOptions, Latency};
use ftlab_nbd::{serve_connection, NbdOptions};
use ftlab_store::codec::Codec;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn device() -> &'static Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE.get_or_init(|| {
        let mut b = ftlab_core::ConfigBuilder::from_preset("femu").unwrap();
        for s in ["flash.blocks_per_die=4", "flash.superblock_dies=1", "capacity.logical_bytes=67108864"] {
            b.set(s).unwrap();
        }
        Device::new(
            &b.build().unwrap(),
            DeviceOptions { export_name: "ftlab".into(), exports: Vec::new(), latency: Latency::None, codec: Codec::Lz4, record: None, record_format: ftlab_device::RecordFormat::Nbdkit, mem_limit_bytes: None, max_inflight_bytes: ftlab_device::DEFAULT_MAX_INFLIGHT_BYTES, read_only: false, data: None, durability: Default::default(), checkpoint_every_bytes: 256 << 20, cache_bytes: 1 << 20, cache_policy: Default::default() },
        )
        .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = serve_connection(device(), &NbdOptions::default(), std::io::Cursor::new(data), std::io::sink());
});
