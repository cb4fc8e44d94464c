//! A durable device (`--data DIR`) under damage it did not cause: a flipped byte in a page's
//! record, a damaged FTL model archive. What is intact stays served and exported; what is
//! damaged is named, counted and salvageable.

use crate::support::{config, ftlab, temp_dir};
use ftlab_device::{Device, DeviceOptions, IoError, Latency, LocalCommand};
use ftlab_store::codec::Codec;
use std::path::Path;

const SIZE: u64 = 64 << 20;
const PAGES: u64 = 256;

fn device(data: &Path) -> Device {
    let c = config(
        "femu",
        &[
            "flash.blocks_per_die=4",
            "flash.superblock_dies=1",
            "capacity.logical_bytes=67108864",
        ],
    );
    Device::new(&c, options_like(data)).unwrap()
}

fn page(lpn: u64) -> Vec<u8> {
    (0..4096u64).map(|i| (lpn * 31 + i / 64) as u8).collect()
}

fn read(d: &Device, lpn: u64) -> Result<Vec<u8>, IoError> {
    let mut out = Vec::new();
    d.local(LocalCommand::Read, lpn * 4096, &[], 4096, &mut out)?;
    Ok(out)
}

/// A device of `PAGES` written pages, shut down cleanly (checkpointed).
fn written(data: &Path) {
    let d = device(data);
    let mut none = Vec::new();
    for lpn in 0..PAGES {
        d.local(LocalCommand::Write, lpn * 4096, &page(lpn), 0, &mut none)
            .unwrap();
    }
    d.finish().unwrap();
}

/// One flipped byte in a checkpointed segment: the page reads EIO and is counted and listed in
/// the statistics (and the metrics); `check` names the page and exits 1; `image export` stops
/// naming it, `--skip-damaged` writes every other page; `check --repair` zeroes it, after which
/// the directory checks clean and exports whole.
#[test]
fn a_flipped_byte_is_named_counted_and_salvaged() {
    let dir = temp_dir("flipped");
    let data = dir.join("data");
    written(&data);
    let victim = 97u64;
    let loc = {
        let d = ftlab_store::durable::offline::open_offline(&data, true).unwrap();
        d.volume_pages(0)
            .into_iter()
            .find(|&(_, lpn)| lpn == victim)
            .unwrap()
            .0
    };
    let segment = ftlab_store::log::segment_path(&data, loc.segment());
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[loc.offset() + loc.bytes() / 2] ^= 0x04;
    std::fs::write(&segment, &bytes).unwrap();

    let d = device(&data);
    assert_eq!(read(&d, victim), Err(IoError::Io));
    assert_eq!(read(&d, victim), Err(IoError::Io));
    assert_eq!(read(&d, victim + 1).unwrap(), page(victim + 1));
    let stats = d.stats_json();
    assert_eq!(stats["durable"]["damaged_reads"], 2, "{}", stats["durable"]);
    assert_eq!(
        stats["durable"]["damaged_pages"],
        serde_json::json!([{"volume": 0, "lpn": victim}])
    );
    let metrics = ftlab_nbd::metrics::exposition(
        &stats,
        &d.client_latency_histograms(),
        ftlab_nbd::metrics::Counts {
            connections_total: 0,
            connections_open: 0,
            denied_total: 0,
        },
    );
    assert!(
        metrics.contains("ftlab_durable_damaged_reads_total 2\n")
            && !metrics.contains("ftlab_store_orig_data_size"),
        "{metrics}"
    );
    drop(d);

    let data_s = data.to_str().unwrap();
    let (ok, out, err) = ftlab(&["check", data_s]);
    assert!(
        !ok && out.contains(&format!("page {victim} of the device"))
            && out.contains(&format!("byte {}", loc.offset())),
        "{out}{err}"
    );
    let image = dir.join("image.raw");
    let image_s = image.to_str().unwrap();
    let (ok, out, err) = ftlab(&["image", "export", data_s, image_s]);
    assert!(
        !ok && err.contains(&format!("page {victim} of the device")) && !image.exists(),
        "{out}{err}"
    );
    let (ok, out, err) = ftlab(&["image", "export", "--skip-damaged", data_s, image_s]);
    assert!(ok && out.contains("1 damaged page(s)"), "{out}{err}");
    let exported = std::fs::read(&image).unwrap();
    assert_eq!(exported.len() as u64, SIZE);
    for lpn in 0..PAGES {
        let got = &exported[(lpn * 4096) as usize..][..4096];
        if lpn == victim {
            assert!(got.iter().all(|&b| b == 0), "the damaged page as zeros");
        } else {
            assert_eq!(got, page(lpn), "page {lpn}");
        }
    }
    let (ok, out, err) = ftlab(&["check", "--repair", data_s]);
    assert!(ok && out.contains("repaired: zeroed page 97"), "{out}{err}");
    let (ok, out, err) = ftlab(&["check", data_s]);
    assert!(ok, "{out}{err}");
    let d = device(&data);
    assert_eq!(read(&d, victim).unwrap(), vec![0u8; 4096]);
    assert_eq!(d.stats_json()["durable"]["damaged_reads"], 0);
}

/// A damaged saved FTL model (`model.state` deleted, cut short, a byte flipped; a clean close
/// saves the model with its checkpoint, so the archive `model.log` is empty and the requests
/// before are known only to it) never stops the data being served or exported: the device
/// opens with the model started anew from what follows, says so in its recovery line and
/// statistics, and the next start is clean; `check` says so (exit 1) until then. (A damaged
/// `model.log` is the store's test, `a_damaged_model_archive_costs_the_model_not_the_data`.)
#[test]
fn a_damaged_saved_model_never_stops_the_data() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 3] = [
        ("deleted", |p| std::fs::remove_file(p).unwrap()),
        ("cut", |p| {
            let len = std::fs::metadata(p).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(len / 2)
                .unwrap()
        }),
        ("flipped", |p| {
            let mut b = std::fs::read(p).unwrap();
            let at = b.len() / 3;
            b[at] ^= 0x80;
            std::fs::write(p, b).unwrap();
        }),
    ];
    for (what, damage) in damages {
        let dir = temp_dir("model");
        let data = dir.join("data");
        written(&data);
        damage(&data.join("model.state"));
        let data_s = data.to_str().unwrap();
        let (ok, out, err) = ftlab(&["check", data_s]);
        assert!(
            !ok && out.contains("the FTL model's saved requests are damaged")
                && out.contains("model.state"),
            "{what}: {out}{err}"
        );
        let image = dir.join("image.raw");
        let (ok, out, err) = ftlab(&["image", "export", data_s, image.to_str().unwrap()]);
        assert!(ok, "{what}: {out}{err}");
        assert_eq!(
            std::fs::read(&image).unwrap()[..4096 * 3],
            [page(0), page(1), page(2)].concat()
        );
        let d = device(&data);
        let summary = d.recovery_summary().unwrap();
        assert!(summary.contains("WARNING"), "{what}: {summary}");
        assert!(d.stats_json()["durable"]["model_damage"].is_string());
        for lpn in [0, 100, PAGES - 1] {
            assert_eq!(read(&d, lpn).unwrap(), page(lpn), "{what}: page {lpn}");
        }
        d.finish().unwrap();
        drop(d);
        let (ok, out, err) = ftlab(&["check", data_s]);
        assert!(ok && !out.contains("damaged"), "{what}: {out}{err}");
        let d = device(&data);
        assert!(
            d.stats_json()["durable"]["model_damage"].is_null(),
            "{what}"
        );
        assert!(d.recovery_summary().unwrap().contains("restored"), "{what}");
    }
}

/// With `device` deleted, a start with the wrong size is refused by the checkpoint and leaves
/// no device file naming the wrong geometry (it was rewritten with it, after which both sizes
/// were refused); the right size starts and writes it back.
#[test]
fn a_refused_start_leaves_the_device_file_alone() {
    let dir = temp_dir("geometry");
    let data = dir.join("data");
    written(&data);
    std::fs::remove_file(data.join("device")).unwrap();
    let wrong = config(
        "femu",
        &[
            "flash.blocks_per_die=4",
            "flash.superblock_dies=1",
            "capacity.logical_bytes=33554432",
        ],
    );
    let e = Device::new(&wrong, options_like(&data))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("checkpoint"), "{e}");
    assert!(
        !data.join("device").exists(),
        "written with the refused geometry"
    );
    let d = device(&data);
    assert_eq!(read(&d, 5).unwrap(), page(5));
    assert!(data.join("device").exists());
}

/// The options `device` uses, for a test that changes the configuration.
fn options_like(data: &Path) -> DeviceOptions {
    DeviceOptions {
        export_name: "ftlab".into(),
        exports: Vec::new(),
        latency: Latency::None,
        codec: Codec::Lz4,
        record: None,
        record_format: ftlab_device::RecordFormat::Nbdkit,
        mem_limit_bytes: None,
        max_inflight_bytes: ftlab_device::DEFAULT_MAX_INFLIGHT_BYTES,
        read_only: false,
        data: Some(data.to_path_buf()),
        durability: Default::default(),
        checkpoint_every_bytes: Some(256 << 20),
        maintenance: Default::default(),
        cache_bytes: 0,
        cache_policy: Default::default(),
    }
}

/// A snapshot a connection serves is not deleted under it (its later reads failed, and its id,
/// reused, could have become another volume's): the delete says by how many connections, and
/// succeeds once they are gone.
#[test]
fn a_snapshot_in_use_is_not_deleted() {
    let dir = temp_dir("in-use");
    let data = dir.join("data");
    written(&data);
    let d = device(&data);
    d.create_volume(None, "snap", false).unwrap();
    let target = d.export_named("ftlab@snap").unwrap();
    let first = d.use_target(target).unwrap();
    let second = d.use_target(target).unwrap();
    let e = d.delete_volume("snap").unwrap_err().to_string();
    assert!(e.contains("in use by 2 connection(s)"), "{e}");
    drop(first);
    assert!(d
        .delete_volume("snap")
        .unwrap_err()
        .to_string()
        .contains("by 1"));
    drop(second);
    d.delete_volume("snap").unwrap();
    assert!(
        d.use_target(target).is_none(),
        "a deleted volume is not served"
    );
}
