use super::checkpoint::{encode_checkpoint, Checkpoint};
use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const PAGES: u64 = 64;
const PAGE: usize = 512;
const SEGMENT: usize = 4096;

fn options() -> DirOptions {
    DirOptions {
        segment_bytes: SEGMENT,
        ..DirOptions::new(PAGES, PAGE)
    }
}

fn open(dir: &Path) -> (DataDir, Opened) {
    DataDir::open(dir, &options()).unwrap()
}

fn page(tag: u64) -> Vec<u8> {
    // Compressible, distinct per tag.
    let mut p = vec![(tag % 251) as u8; PAGE];
    p[..8].copy_from_slice(&tag.to_le_bytes());
    p
}

fn read(d: &mut DataDir, volume: u16, lpn: u64) -> Vec<u8> {
    let mut out = vec![0u8; PAGE];
    if let Some(l) = d.locate(volume, lpn).unwrap() {
        l.read_page(&mut out).unwrap();
    }
    out
}

/// Everything each volume holds, as the oracle says it should.
fn assert_matches(d: &mut DataDir, oracle: &HashMap<String, HashMap<u64, Vec<u8>>>) {
    for (name, pages) in oracle {
        let id = if name.is_empty() {
            0
        } else {
            d.volume_named(name)
                .unwrap_or_else(|| panic!("`{name}` lost"))
                .0
        };
        for lpn in 0..PAGES {
            let want = pages.get(&lpn).cloned().unwrap_or_else(|| vec![0u8; PAGE]);
            assert_eq!(read(d, id, lpn), want, "`{name}` page {lpn}");
        }
    }
    assert_eq!(d.volumes().len(), oracle.len());
}

#[derive(Clone, Debug)]
enum Op {
    Write { volume: usize, lpn: u64 },
    Trim { volume: usize, lpn: u64, pages: u64 },
    Snapshot { of: usize },
    Clone { of: usize },
    Delete { volume: usize },
    Checkpoint,
    Clean,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..4usize, 0..PAGES).prop_map(|(volume, lpn)| Op::Write { volume, lpn }),
        1 => (0..4usize, 0..PAGES, 1..8u64).prop_map(|(volume, lpn, pages)| Op::Trim { volume, lpn, pages }),
        1 => (0..4usize).prop_map(|of| Op::Snapshot { of }),
        1 => (0..4usize).prop_map(|of| Op::Clone { of }),
        1 => (1..5usize).prop_map(|volume| Op::Delete { volume }),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Clean),
        1 => Just(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every volume reads what an oracle of every version says, through writes, snapshots,
    /// clones, deletions in any order, checkpoints, cleaning and crashes (reopening without
    /// a checkpoint). Snapshots never change. When every snapshot and clone is gone and
    /// the cleaner has run, the live bytes are exactly the device's records.
    #[test]
    fn volumes_match_an_oracle_of_every_version(ops in proptest::collection::vec(op(), 1..120)) {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, _) = open(dir.path());
        let mut oracle: HashMap<String, HashMap<u64, Vec<u8>>> = HashMap::new();
        oracle.insert(String::new(), HashMap::new());
        let mut names: Vec<String> = vec![String::new()];
        let mut writable: HashMap<String, bool> = HashMap::from([(String::new(), true)]);
        let mut tag = 0u64;
        let mut made = 0;
        for op in ops {
            match op {
                Op::Write { volume, lpn } | Op::Trim { volume, lpn, .. } if volume < names.len() && writable[&names[volume]] => {
                    let name = names[volume].clone();
                    let id = if name.is_empty() { 0 } else { d.volume_named(&name).unwrap().0 };
                    if let Op::Trim { pages, .. } = op {
                        let pages = pages.min(PAGES - lpn);
                        d.trim(id, lpn, pages).unwrap();
                        for l in lpn..lpn + pages {
                            oracle.get_mut(&name).unwrap().remove(&l);
                        }
                    } else {
                        tag += 1;
                        d.write_page(id, lpn, &page(tag)).unwrap();
                        oracle.get_mut(&name).unwrap().insert(lpn, page(tag));
                    }
                }
                Op::Snapshot { of } | Op::Clone { of } if of < names.len() => {
                    made += 1;
                    let clone = matches!(op, Op::Clone { .. });
                    let name = format!("v{made}");
                    let parent = (!names[of].is_empty()).then(|| names[of].as_str());
                    let kind = if clone { VolumeKind::Clone } else { VolumeKind::Snapshot };
                    d.create_volume(parent, &name, kind).unwrap();
                    let copy = oracle[&names[of]].clone();
                    oracle.insert(name.clone(), copy);
                    writable.insert(name.clone(), clone);
                    names.push(name);
                }
                Op::Delete { volume } if volume < names.len() => {
                    let name = names.remove(volume);
                    d.delete_volume(&name).unwrap();
                    oracle.remove(&name);
                }
                Op::Checkpoint => d.checkpoint().unwrap(),
                Op::Clean => {
                    d.checkpoint().unwrap();
                    d.clean(0.9).unwrap();
                }
                Op::Crash => {
                    drop(d);
                    d = open(dir.path()).0;
                }
                _ => {}
            }
            assert_matches(&mut d, &oracle);
        }
        // Every snapshot and clone deleted, in the order made, then cleaned.
        for name in names.iter().skip(1) {
            d.delete_volume(name).unwrap();
            oracle.remove(name);
        }
        d.checkpoint().unwrap();
        d.clean(1.0).unwrap();
        d.checkpoint().unwrap();
        d.clean(1.0).unwrap();
        assert_matches(&mut d, &oracle);
        let device: u64 = d.device_pages().iter().map(|(l, _)| l.bytes() as u64).sum();
        prop_assert_eq!(d.disk_stats().live_bytes, device);
        // Reopened from the checkpoint alone, the same.
        drop(d);
        let (mut d, _) = open(dir.path());
        assert_matches(&mut d, &oracle);
        prop_assert_eq!(d.verify().unwrap().pages, oracle[""].len() as u64);
    }
}

/// The model's `i`th request of a test: distinct in every field.
fn model_request(i: u64) -> ModelRequest {
    ModelRequest {
        op: (i % 4) as u8,
        offset_bytes: i * 4096,
        length_bytes: 4096,
        arrival_ns: i * 1000,
        reclaim_group: 0,
        handle: (i % 3) as u8,
    }
}

/// The model's requests come back in order after a checkpoint and a crash: archived ones
/// from `model.log`, later ones from the log.
#[test]
fn the_models_requests_survive_checkpoints_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = open(dir.path());
    let req = model_request;
    for i in 0..10 {
        d.request(req(i)).unwrap();
    }
    d.checkpoint().unwrap();
    for i in 10..25 {
        d.request(req(i)).unwrap();
    }
    d.checkpoint().unwrap();
    for i in 25..30 {
        d.request(req(i)).unwrap();
    }
    d.commit().unwrap();
    drop(d);
    let (mut d, o) = open(dir.path());
    assert_eq!(o.requests, (0..30).map(req).collect::<Vec<_>>());
    // A crash between the archive's append and the checkpoint's rename leaves the archive
    // longer than the checkpoint counts: the extra entries are ignored, then replaced.
    d.request(req(30)).unwrap();
    d.checkpoint().unwrap();
    drop(d);
    let (_, o) = open(dir.path());
    assert_eq!(o.requests, (0..31).map(req).collect::<Vec<_>>());
}

/// A saved model state covers the requests counted when it was taken: those logged after
/// (while it was compressed) are archived after it and replayed; a state a plain checkpoint
/// overtook is not saved (the archive already holds what it covers), and the next is.
#[test]
fn a_saved_state_and_the_requests_after_it_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = open(dir.path());
    let req = model_request;
    for i in 0..10 {
        d.request(req(i)).unwrap();
    }
    let covered = d.model_requests();
    let state = PackedModel::pack(b"the state after ten");
    for i in 10..14 {
        d.request(req(i)).unwrap();
    }
    assert!(d.checkpoint_with_model(&state, covered).unwrap());
    for i in 14..16 {
        d.request(req(i)).unwrap();
    }
    d.commit().unwrap();
    drop(d);
    let (mut d, o) = open(dir.path());
    assert_eq!(o.model_state.as_deref(), Some(&b"the state after ten"[..]));
    assert_eq!(o.requests, (10..16).map(req).collect::<Vec<_>>());
    assert_eq!(o.model_damage, None);

    let covered = d.model_requests();
    d.request(req(16)).unwrap();
    d.checkpoint().unwrap();
    let stale = PackedModel::pack(b"overtaken");
    assert!(!d.checkpoint_with_model(&stale, covered).unwrap());
    drop(d);
    let (mut d, o) = open(dir.path());
    assert_eq!(o.model_state.as_deref(), Some(&b"the state after ten"[..]));
    assert_eq!(o.requests, (10..17).map(req).collect::<Vec<_>>());
    let covered = d.model_requests();
    assert!(d
        .checkpoint_with_model(&PackedModel::pack(b"after seventeen"), covered)
        .unwrap());
    drop(d);
    let (_, o) = open(dir.path());
    assert_eq!(o.model_state.as_deref(), Some(&b"after seventeen"[..]));
    assert!(o.requests.is_empty());
}

/// A damaged model archive (deleted, cut, a byte flipped) never stops the data being read:
/// the directory opens, read-only too, saying what was wrong; the requests before the damage
/// and those after the checkpoint come back; a writable open writes the archive anew (its
/// damaged copy kept) so the next open finds it whole.
#[test]
fn a_damaged_model_archive_costs_the_model_not_the_data() {
    let req = |i: u64| ModelRequest {
        op: model_op::WRITE,
        offset_bytes: i * 4096,
        length_bytes: 4096,
        arrival_ns: i * 1000,
        reclaim_group: 0,
        handle: 0,
    };
    type Damage = fn(&Path);
    let damages: [(&str, Damage, usize); 3] = [
        ("deleted", |p| std::fs::remove_file(p).unwrap(), 0),
        (
            "cut",
            |p| {
                let f = OpenOptions::new().write(true).open(p).unwrap();
                let len = f.metadata().unwrap().len();
                f.set_len(len - 10).unwrap();
            },
            19,
        ),
        (
            "flipped",
            |p| {
                let mut b = std::fs::read(p).unwrap();
                // A byte of the tenth request's sequence number.
                let at = log::scan_segment(&b, 0, 1).unwrap().records[9].offset + 17;
                b[at] ^= 0x40;
                std::fs::write(p, b).unwrap();
            },
            9,
        ),
    ];
    for (what, damage, kept) in damages {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, _) = open(dir.path());
        for i in 0..20 {
            d.write_page(0, i, &page(i)).unwrap();
            d.request(req(i)).unwrap();
        }
        d.checkpoint().unwrap();
        for i in 20..25 {
            d.request(req(i)).unwrap();
        }
        d.commit().unwrap();
        drop(d);
        let model = dir.path().join(MODEL_FILE);
        damage(&model);
        let want: Vec<ModelRequest> = (0..kept as u64).chain(20..25).map(req).collect();
        let (mut ro, o) = DataDir::open(dir.path(), &options().read_only()).unwrap();
        let why = o
            .model_damage
            .unwrap_or_else(|| panic!("{what}: no damage said"));
        assert!(why.contains("model.log"), "{what}: {why}");
        assert_eq!(o.requests, want, "{what}");
        for i in 0..20 {
            assert_eq!(read(&mut ro, 0, i), page(i), "{what}: page {i} read-only");
        }
        drop(ro);
        let (mut d, o) = open(dir.path());
        assert!(o.model_damage.is_some(), "{what}");
        assert_eq!(o.requests, want, "{what}");
        assert_eq!(read(&mut d, 0, 7), page(7), "{what}");
        d.request(req(25)).unwrap();
        d.commit().unwrap();
        drop(d);
        let (_, o) = open(dir.path());
        assert_eq!(o.model_damage, None, "{what}: written anew");
        let mut again = want.clone();
        again.push(req(25));
        assert_eq!(o.requests, again, "{what}");
        assert_eq!(
            dir.path().join("model.log.damaged").exists(),
            what != "deleted",
            "{what}: the damaged copy"
        );
    }
}

/// One flipped byte in a checkpointed segment costs its page only: `verify` names the page,
/// its volume, the file and the byte, and reads every other page; an export that skips damage
/// writes the rest; a repair zeroes the page (a snapshot sharing the record included) and the
/// directory verifies whole afterwards.
#[test]
fn a_flipped_byte_costs_one_page_named_and_zeroed_by_a_repair() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = open(dir.path());
    for lpn in 0..PAGES {
        d.write_page(0, lpn, &page(lpn)).unwrap();
    }
    d.create_volume(None, "snap", VolumeKind::Snapshot).unwrap();
    d.checkpoint().unwrap();
    let victim = 37;
    let loc = d.volumes.get(0).unwrap().map.get(victim);
    drop(d);
    let path = segment_path(dir.path(), loc.segment());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[loc.offset() + loc.bytes() / 2] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();

    let (mut d, _) = open(dir.path());
    let mut out = vec![0u8; PAGE];
    assert!(d
        .locate(0, victim)
        .unwrap()
        .unwrap()
        .read_page(&mut out)
        .is_err());
    let v = d.verify().unwrap();
    assert_eq!(
        v.pages,
        2 * (PAGES - 1),
        "every other page of both volumes reads"
    );
    let named: Vec<(String, u64)> = v
        .damaged
        .iter()
        .map(|p| (p.volume_name.clone(), p.lpn))
        .collect();
    assert_eq!(named, [(String::new(), victim), ("snap".into(), victim)]);
    let said = v.damaged[1].to_string();
    assert!(
        said.contains("page 37 of `snap`")
            && said.contains(&path.display().to_string())
            && said.contains(&format!("byte {}", loc.offset())),
        "{said}"
    );
    // Without skipping, the first damaged page stops the load, naming it.
    let mut pages: Vec<(Loc, u64)> = d.volume_pages(0);
    pages.sort_unstable();
    let err = d
        .load_pages(0, &pages, &mut |_, _| Ok(()), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("page 37 of the device"), "{err}");
    let mut seen = 0;
    let mut skipped = Vec::new();
    d.load_pages(
        0,
        &pages,
        &mut |_, _| {
            seen += 1;
            Ok(())
        },
        Some(&mut skipped),
    )
    .unwrap();
    assert_eq!((seen, skipped.len()), (PAGES - 1, 1));

    assert_eq!(d.zero_damaged(&v.damaged).unwrap(), 2);
    drop(d);
    let (mut d, _) = open(dir.path());
    let v = d.verify().unwrap();
    assert!(v.damaged.is_empty(), "{:?}", v.damaged);
    assert_eq!(read(&mut d, 0, victim), vec![0u8; PAGE]);
    let snap = d.volume_named("snap").unwrap().0;
    assert_eq!(read(&mut d, snap, victim), vec![0u8; PAGE]);
    assert_eq!(read(&mut d, snap, victim + 1), page(victim + 1));
}

/// A checkpoint copied from a later state onto an earlier log is refused, naming the
/// segment; a corrupt checkpoint is refused naming itself; a missing referenced segment
/// is refused.
#[test]
fn a_checkpoint_from_the_future_or_damaged_is_refused() {
    let early = tempfile::tempdir().unwrap();
    let later = tempfile::tempdir().unwrap();
    for (dir, n) in [(early.path(), 3u64), (later.path(), 40)] {
        let (mut d, _) = open(dir);
        for i in 0..n {
            d.write_page(0, i % PAGES, &page(i)).unwrap();
        }
        d.checkpoint().unwrap();
    }
    std::fs::copy(
        later.path().join(CHECKPOINT_FILE),
        early.path().join(CHECKPOINT_FILE),
    )
    .unwrap();
    let e = DataDir::open(early.path(), &options().read_only())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("seg-") && (e.contains("from the future") || e.contains("missing")),
        "{e}"
    );

    let path = later.path().join(CHECKPOINT_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let e = DataDir::open(later.path(), &options().read_only())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("checkpoint") && e.contains("checksum"), "{e}");
    bytes[40] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    std::fs::remove_file(log::segment_path(later.path(), 0)).unwrap();
    let e = DataDir::open(later.path(), &options().read_only())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("seg-0000000000000000.log") && e.contains("missing"),
        "{e}"
    );
}

/// A checkpoint whose checksum holds but whose map length is absurd is refused, not a
/// panic (the `checkpoint` fuzz target found an overflow there).
#[test]
fn a_checkpoint_with_an_absurd_length_is_refused() {
    let mut volumes = Volumes::new(PAGES);
    volumes.set(0, 3, Loc::new(0, 64, 40));
    let c = Checkpoint {
        at: Position::START,
        model_base: 0,
        model_entries: 0,
        volumes,
    };
    let mut bytes = encode_checkpoint(&c, PAGE);
    assert!(decode_checkpoint(&bytes, PAGES, PAGE).is_ok());
    // The first chunk's packed length: after the 76-byte header and the count of chunks.
    let at = 76 + 4;
    bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let n = bytes.len() - 8;
    let sum = twox_hash::XxHash3_64::oneshot(&bytes[..n]);
    bytes[n..].copy_from_slice(&sum.to_le_bytes());
    let e = decode_checkpoint(&bytes, PAGES, PAGE).err().unwrap();
    assert!(e.to_string().contains("inside a field"), "{e}");
}

/// A version 1 checkpoint (every volume's whole map, as ftlab wrote before version 2): the
/// layout as it was, for the test only.
fn encode_v1(c: &Checkpoint, page_bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [
        c.at.segment,
        c.at.offset as u64,
        c.at.seq,
        c.model_entries,
        c.volumes.pages,
        page_bytes as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&c.volumes.next_id.to_le_bytes());
    out.extend_from_slice(&(c.volumes.list.len() as u16).to_le_bytes());
    for v in &c.volumes.list {
        out.extend_from_slice(&v.id.to_le_bytes());
        out.push(v.kind as u8);
        out.extend_from_slice(&v.parent.to_le_bytes());
        out.extend_from_slice(&(v.name.len() as u16).to_le_bytes());
        out.extend_from_slice(v.name.as_bytes());
        out.extend_from_slice(&v.created_seq.to_le_bytes());
        let raw: Vec<u8> = (0..v.map.pages)
            .flat_map(|lpn| v.map.get(lpn).0.to_le_bytes())
            .collect();
        let packed = lz4_flex::block::compress(&raw);
        out.extend_from_slice(&(packed.len() as u64).to_le_bytes());
        out.extend_from_slice(&packed);
    }
    let sum = twox_hash::XxHash3_64::oneshot(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Many snapshots share their chunks: the checkpoint holds each distinct chunk once (its size
/// grows by a few bytes a snapshot, not by a map), decodes to the same maps and live bytes
/// with the chunks shared again, and a version 1 checkpoint of the same reads the same. Ids
/// are reused once free: creating and deleting goes on past 65,534 creations.
#[test]
fn snapshots_share_their_chunks_in_the_checkpoint_and_ids_are_reused() {
    const BIG: u64 = 5000;
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = DataDir::open(
        dir.path(),
        &DirOptions {
            segment_bytes: 1 << 20,
            ..DirOptions::new(BIG, PAGE)
        },
    )
    .unwrap();
    for lpn in 0..BIG {
        d.write_page(0, lpn, &page(lpn)).unwrap();
    }
    for k in 0..100 {
        d.create_volume(None, &format!("s{k}"), VolumeKind::Snapshot)
            .unwrap();
        // Each snapshot differs from the next by one page of the device.
        d.write_page(0, k * 40, &page(BIG + k)).unwrap();
    }
    d.checkpoint().unwrap();
    let bytes = std::fs::read(dir.path().join(CHECKPOINT_FILE)).unwrap();
    let c = decode_checkpoint(&bytes, BIG, PAGE).unwrap();
    assert_eq!(c.volumes.live_bytes, d.volumes.live_bytes);
    // 105 distinct chunks (the device's 5, and the one each write copied) where version 1
    // wrote 101 maps of 5.
    let v1_bytes = encode_v1(&c, PAGE);
    assert!(
        bytes.len() * 3 < v1_bytes.len(),
        "{} bytes, {} in version 1",
        bytes.len(),
        v1_bytes.len()
    );
    let v1 = decode_checkpoint(&v1_bytes, BIG, PAGE).unwrap();
    assert_eq!(v1.volumes.live_bytes, d.volumes.live_bytes);
    for (a, b) in c.volumes.list.iter().zip(&v1.volumes.list) {
        assert_eq!((a.id, &a.name, a.parent), (b.id, &b.name, b.parent));
        assert!((0..BIG).all(|lpn| a.map.get(lpn) == b.map.get(lpn)));
    }
    // Shared again: the last snapshot and the device share every chunk but the one written.
    let (dev, last) = (&c.volumes.list[0], &c.volumes.list[100]);
    let shared = (0..dev.map.chunks.len())
        .filter(|&k| match (&dev.map.chunks[k], &last.map.chunks[k]) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        })
        .count();
    assert!(shared + 1 >= dev.map.chunks.len(), "{shared} chunks shared");
    // Ids: handed out in turn up to the last, then the free ones from the first (the old
    // rule ended creation for good at 65,534 made); a replay hands out the same.
    let options = DirOptions {
        segment_bytes: 1 << 20,
        ..DirOptions::new(BIG, PAGE)
    };
    d.volumes.next_id = u16::MAX - 2;
    d.checkpoint().unwrap();
    let mut ids = Vec::new();
    for k in 0..4 {
        ids.push(
            d.create_volume(None, &format!("t{k}"), VolumeKind::Snapshot)
                .unwrap(),
        );
        d.delete_volume("s0").ok();
    }
    // s1..s99 hold 2..=100: after u16::MAX - 1 come 1 (s0's, freed) and 101.
    assert_eq!(ids, [u16::MAX - 2, u16::MAX - 1, 1, 101]);
    let next = d.volumes.free_id();
    drop(d);
    let (d, _) = DataDir::open(dir.path(), &options).unwrap();
    assert_eq!(d.volumes().len(), 104);
    assert_eq!(d.volumes.free_id(), next);
}

/// Cleaning deletes dead segments and keeps the device's data: the directory shrinks to
/// about the live data, and the host-disk WAF counts the copies.
#[test]
fn the_cleaner_frees_space_and_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = open(dir.path());
    let mut oracle = HashMap::new();
    // Cold pages first, written once, then hot ones over and over: the cold ones are all
    // that lives in the early segments.
    for lpn in 16..32u64 {
        d.write_page(0, lpn, &page(lpn << 20)).unwrap();
        oracle.insert(lpn, page(lpn << 20));
    }
    for i in 0..2000u64 {
        let lpn = (i * 7) % 16;
        d.write_page(0, lpn, &page(i)).unwrap();
        oracle.insert(lpn, page(i));
    }
    d.checkpoint().unwrap();
    let before = d.disk_stats();
    let deleted = d.clean(0.5).unwrap();
    let after = d.disk_stats();
    assert!(deleted > 10, "{deleted}");
    assert!(
        after.disk_bytes < before.disk_bytes / 4,
        "{before:?} {after:?}"
    );
    assert!(after.cleaner_copied_bytes > 0 && after.host_waf > 0.0);
    let all = HashMap::from([(String::new(), oracle)]);
    assert_matches(&mut d, &all);
    drop(d);
    assert_matches(&mut open(dir.path()).0, &all);
    // Without its checkpoint, a cleaned log cannot be rebuilt: said as that, naming the
    // checkpoint (it was "segment 0 is missing between 0 and ...").
    std::fs::remove_file(dir.path().join(CHECKPOINT_FILE)).unwrap();
    let e = DataDir::open(dir.path(), &options())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("checkpoint: missing, and the log starts at segment"),
        "{e}"
    );
}

/// The directory itself is locked: removing every file but the log's (the old `lock` file
/// included) lets no second writer in, and a reader is refused while a writer holds it.
#[test]
fn no_file_removed_lets_a_second_writer_or_a_reader_in() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, _) = open(dir.path());
    first.write_page(0, 0, &page(1)).unwrap();
    first.commit().unwrap();
    let device_file = std::fs::read(dir.path().join(DEVICE_FILE)).unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if !path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("seg-")
        {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let e = DataDir::open(dir.path(), &options())
        .err()
        .expect("a second writer");
    assert!(e.to_string().contains("in use by another ftlab"), "{e}");
    let reader = DirOptions {
        read_only: true,
        ..options()
    };
    let e = DataDir::open(dir.path(), &reader)
        .err()
        .expect("a reader beside a writer");
    assert!(e.to_string().contains("in use by a writer"), "{e}");
    drop(first);
    // Without its device file (and no checkpoint), nothing says which device the log holds:
    // refused, naming it, and not written anew with a guess.
    let e = DataDir::open(dir.path(), &options())
        .err()
        .expect("no device file");
    assert!(e.to_string().contains("device: missing"), "{e}");
    assert!(!dir.path().join(DEVICE_FILE).exists());
    std::fs::write(dir.path().join(DEVICE_FILE), device_file).unwrap();
    let (mut again, _) = open(dir.path());
    assert_eq!(read(&mut again, 0, 0), page(1));
}

/// A full disk (here the file-size limit, `ulimit -f`, which fails a write part way as ENOSPC
/// does): the write that fails is cut back to the last whole record, later changes and FLUSH are
/// refused as no space, every page accepted still reads back, and once space returns writing
/// resumes and a reopen finds every page (a torn record followed by a commit made the directory
/// refuse to open).
#[test]
fn a_full_disk_refuses_changes_keeps_reads_and_resumes_when_space_returns() {
    if std::env::var_os("NEXTEST").is_none() {
        // The limit is the process's: only a process of its own (nextest's) may set it.
        eprintln!("SKIPPED: sets RLIMIT_FSIZE; run under cargo nextest");
        return;
    }
    // SAFETY: ignoring SIGXFSZ runs no code; setrlimit(2) only changes this process's limit.
    let set_limit = |bytes: u64| unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limit = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: libc::RLIM_INFINITY,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    };
    let dir = tempfile::tempdir().unwrap();
    let opts = DirOptions {
        segment_bytes: 1 << 20,
        ..DirOptions::new(PAGES, PAGE)
    };
    let (mut d, _) = DataDir::open(dir.path(), &opts).unwrap();
    let noise = |tag: u64| -> Vec<u8> {
        // Incompressible: each record about a page long.
        let mut x = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let segment = log::segment_path(dir.path(), 0);
    set_limit(std::fs::metadata(&segment).unwrap().len() + 10 * PAGE as u64 + 100);
    let mut written: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut full = None;
    for tag in 0..400 {
        let lpn = tag % PAGES;
        let p = noise(tag);
        match d.write_page(0, lpn, &p) {
            Ok(()) => {
                written.insert(lpn, p);
            }
            Err(e) => {
                full = Some(e);
                break;
            }
        }
        if tag % 4 == 3 {
            if let Err(e) = d.commit() {
                assert!(e.is_no_space(), "{e}");
            }
        }
    }
    let full = full.expect("the disk never filled: a failed write went unnoticed");
    assert!(full.is_no_space(), "{full}");
    assert!(d.stalled());
    assert!(d.commit().unwrap_err().is_no_space());
    for (lpn, p) in &written {
        assert_eq!(
            read(&mut d, 0, *lpn),
            *p,
            "page {lpn} while the disk is full"
        );
    }
    set_limit(libc::RLIM_INFINITY);
    d.write_page(0, 1, &noise(1000)).unwrap();
    written.insert(1, noise(1000));
    d.commit().unwrap();
    assert!(!d.stalled());
    drop(d);
    let (mut again, _) = DataDir::open(dir.path(), &opts).unwrap();
    for (lpn, p) in &written {
        assert_eq!(read(&mut again, 0, *lpn), *p, "page {lpn} after the reopen");
    }
}
