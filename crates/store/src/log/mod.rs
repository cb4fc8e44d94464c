//! The device log: the on-disk form a durable device appends every change to, and the scan that
//! recovers it after a crash. `durable/` builds the device directory (checkpoints, volumes,
//! the cleaner) on it.
//!
//! Owns: the record and segment formats, appending with `fdatasync` at commits, and deciding
//! what a directory of segments holds after a crash. Does not know: pages' meaning, the FTL,
//! or protocols.
//!
//! A directory holds segment files `seg-NNNNNNNNNNNNNNNN.log` (16 hex digits, consecutive from
//! 0). Each starts with a 24-byte header (`SEGMENT_MAGIC`, version, its index, an xxh3 of those)
//! and then records, each 8-byte aligned:
//!
//! ```text
//! offset size
//!  0     4    RECORD_MAGIC
//!  4     1    kind: 1 page, 2 trim, 3 commit
//!  5     1    codec (page records: the payload's encoding; request records: the op)
//!  6     2    volume (page, trim: 0 the device, else a clone; volume records: the new one)
//!  8     8    lpn (page, trim: the first page; request: the byte offset; volume: the parent)
//! 16     8    seq: 1, 2, 3, ... over the whole log
//! 24     4    payload bytes (page: the stored bytes; 0 otherwise)
//! 28     4    pages (trim: how many; request: the length in bytes; 0 otherwise)
//! 32     8    xxh3-64 of bytes 0..32 and the payload
//! 40     ...  payload, then zeros to the next multiple of 8
//! ```
//!
//! A commit record is appended, then the segment is `fdatasync`ed, when a client's FLUSH (or FUA)
//! must be durable: every record before the last valid commit was acknowledged. At recovery a
//! record that fails (torn, bad checksum, wrong sequence) after the last commit ends the log
//! there (the dropped bytes were never acknowledged by a FLUSH); one before it is corruption of
//! acknowledged data, and recovery refuses rather than serve a device missing it. Past a bad
//! record the scan looks for the next record magic at each 8-byte boundary to learn whether a
//! valid commit follows.

mod recovery;
mod writer;

pub use recovery::*;
pub use writer::*;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"FTLABSEG");
pub const SEGMENT_VERSION: u32 = 1;
pub const SEGMENT_HEADER_BYTES: usize = 24;
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"FTLR");
pub const RECORD_HEADER_BYTES: usize = 40;
/// A page record's payload is at most this (larger pages are not a store's).
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// A page record's payload is the page itself.
pub const CODEC_RAW: u8 = 0;
/// A page record's payload is an LZ4 block of the page.
pub const CODEC_LZ4: u8 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Page = 1,
    Trim = 2,
    Commit = 3,
    /// A request the FTL model saw: payload arrival ns (8), reclaim group (1), handle (1).
    Request = 4,
    /// A snapshot (codec 0) or clone (codec 1) of volume `lpn` created as `volume`; payload
    /// its name.
    Volume = 5,
    /// Volume `volume` deleted.
    Unvolume = 6,
}

/// Where a record is: its segment, its offset in it, and its padded size, in one word (0: no
/// record; offset 0 of a segment is its header). Segments are at most `MAX_SEGMENT_BYTES`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc(pub u64);

/// Segment files end before this (an offset in a `Loc` has 23 bits of 8-byte units).
pub const MAX_SEGMENT_BYTES: usize = 64 << 20;

impl Loc {
    pub const NONE: Loc = Loc(0);

    pub fn new(segment: u64, offset: usize, bytes: usize) -> Loc {
        assert!(
            segment < 1 << 20,
            "segment {segment}: at most 2^20 segments"
        );
        assert!(offset.is_multiple_of(8) && offset < MAX_SEGMENT_BYTES && offset > 0);
        assert!(bytes.is_multiple_of(8) && bytes / 8 < 1 << 21);
        Loc((segment << 44) | ((offset as u64 / 8) << 21) | (bytes as u64 / 8))
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }

    pub fn segment(self) -> u64 {
        self.0 >> 44
    }

    pub fn offset(self) -> usize {
        ((self.0 >> 21) & ((1 << 23) - 1)) as usize * 8
    }

    /// The record's bytes, padding included.
    pub fn bytes(self) -> usize {
        (self.0 & ((1 << 21) - 1)) as usize * 8
    }
}

/// A place in the log: a segment, an offset in it, and the sequence number of the record due
/// there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    pub segment: u64,
    pub offset: usize,
    pub seq: u64,
}

impl Position {
    /// The start of an empty log.
    pub const START: Position = Position {
        segment: 0,
        offset: SEGMENT_HEADER_BYTES,
        seq: 1,
    };
}

/// One record as recovered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub codec: u8,
    pub volume: u16,
    pub lpn: u64,
    pub seq: u64,
    pub pages: u32,
    pub payload: Vec<u8>,
    /// Where it was: its segment, its offset in it and its padded size.
    pub segment: u64,
    pub offset: usize,
    pub bytes: usize,
}

impl Record {
    /// A page record's page of `page_bytes` bytes, decoded; None when its payload does not
    /// decode to exactly a page (the checksum held, so the writer wrote it so: refuse it).
    pub fn page(&self, page_bytes: usize) -> Option<Vec<u8>> {
        match self.codec {
            CODEC_RAW if self.payload.len() == page_bytes => Some(self.payload.clone()),
            CODEC_LZ4 => {
                let mut out = vec![0u8; page_bytes];
                match lz4_flex::block::decompress_into(&self.payload, &mut out) {
                    Ok(n) if n == page_bytes => Some(out),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path}: not a segment of an ftlab device log ({why})")]
    BadSegment { path: PathBuf, why: String },
    /// A file of a device directory (checkpoint, model archive, device file) or the directory
    /// itself is not what it must be.
    #[error("{path}: {why}")]
    Damaged { path: PathBuf, why: String },
    /// A caller's visitor of loaded pages failed (writing the page out).
    #[error("page {lpn}: {cause}")]
    Visit { lpn: u64, cause: std::io::Error },
    #[error("{dir}: segment {missing:016x} is missing between {before:016x} and {after:016x}: records after the gap cannot be trusted")]
    MissingSegment {
        dir: PathBuf,
        missing: u64,
        before: u64,
        after: u64,
    },
    #[error("{path}: the record at byte {offset} is corrupt ({why}) and {after}: acknowledged data is damaged; `ftlab check --repair` salvages what verifies")]
    CorruptBeforeCommit {
        path: PathBuf,
        offset: usize,
        why: String,
        /// What shows the damage was acknowledged: a commit after it, or a later segment.
        after: String,
    },
    /// The writer could not cut a failed write back off its segment: it takes nothing more.
    #[error("{path}: a failed write could not be cut back ({cause}); the log takes no more records until the server restarts")]
    Broken {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// `fdatasync` failed. Linux may have dropped the written pages it could not write back
    /// and marked them clean, so a later sync would succeed without them: the writer takes
    /// nothing more, and a restart recovers what is on the disk.
    #[error("{path}: fsync failed ({cause}): written records may be lost, so the log takes no more; restart to recover what is on the disk")]
    SyncFailed {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The disk's free space fell under what a checkpoint and the cleaner need: changes wait
    /// for them (or the operator) to make room.
    #[error("{dir}: the disk has {free_bytes} bytes free, under the {reserve_bytes} kept for checkpoints and the cleaner")]
    Reserve {
        dir: PathBuf,
        free_bytes: u64,
        reserve_bytes: u64,
    },
}

impl LogError {
    /// The file system is full (or the user's quota, or the file-size limit, is reached): the
    /// client's `ENOSPC`, not an I/O error.
    pub fn is_no_space(&self) -> bool {
        let cause = match self {
            LogError::Io { cause, .. } => cause,
            LogError::Reserve { .. } => return true,
            _ => return false,
        };
        matches!(
            cause.raw_os_error(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
        ) || cause.kind() == std::io::ErrorKind::StorageFull
    }

    /// The writer takes no more records (a failed cut or sync): only a restart helps.
    pub fn is_broken(&self) -> bool {
        matches!(self, LogError::Broken { .. } | LogError::SyncFailed { .. })
    }
}

fn checksum(header: &[u8], payload: &[u8]) -> u64 {
    let mut h = twox_hash::XxHash3_64::new();
    std::hash::Hasher::write(&mut h, header);
    std::hash::Hasher::write(&mut h, payload);
    std::hash::Hasher::finish(&h)
}

fn padded(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// A record's bytes, padded.
pub fn encode(kind: Kind, codec: u8, lpn: u64, seq: u64, pages: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(padded(RECORD_HEADER_BYTES + payload.len()));
    encode_into(&mut out, kind, codec, 0, lpn, seq, pages, payload);
    out
}

/// Appends a record's bytes, padded, to `out`.
#[allow(clippy::too_many_arguments)]
fn encode_into(
    out: &mut Vec<u8>,
    kind: Kind,
    codec: u8,
    volume: u16,
    lpn: u64,
    seq: u64,
    pages: u32,
    payload: &[u8],
) {
    debug_assert!(payload.len() <= MAX_PAYLOAD_BYTES);
    let start = out.len();
    out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
    out.push(kind as u8);
    out.push(codec);
    out.extend_from_slice(&volume.to_le_bytes());
    out.extend_from_slice(&lpn.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&pages.to_le_bytes());
    let sum = checksum(&out[start..start + 32], payload);
    out.extend_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(start + padded(out.len() - start), 0);
}

/// A page as a page record's payload: LZ4-compressed when that saves at least a sixteenth
/// (codec 1), raw otherwise (codec 0): a page that barely compresses costs a decompression at
/// every read for nothing. Callers compress before taking the log's lock.
pub fn pack_page(page: &[u8]) -> (u8, std::borrow::Cow<'_, [u8]>) {
    use std::borrow::Cow;
    thread_local! {
        /// Pages in a row this thread found incompressible.
        static RAW_STREAK: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    const PROBE_BYTES: usize = 512;
    let streak = RAW_STREAK.get();
    // In a stream of incompressible pages (encrypted or compressed data), a probe of the first
    // 512 bytes decides, at an eighth of the cost of trying the page.
    if streak >= 8 && page.len() > PROBE_BYTES {
        let probe = lz4_flex::block::compress(&page[..PROBE_BYTES]);
        if probe.len() > PROBE_BYTES - PROBE_BYTES / 16 {
            RAW_STREAK.set(streak.saturating_add(1));
            return (CODEC_RAW, Cow::Borrowed(page));
        }
    }
    let packed = lz4_flex::block::compress(page);
    if packed.len() <= page.len() - page.len() / 16 {
        RAW_STREAK.set(0);
        (CODEC_LZ4, Cow::Owned(packed))
    } else {
        RAW_STREAK.set(streak.saturating_add(1));
        (CODEC_RAW, Cow::Borrowed(page))
    }
}

/// A segment's header.
pub fn segment_header(index: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h[..8].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(index as u32).to_le_bytes());
    // The index's high half and a checksum of the first 16 bytes.
    let sum = twox_hash::XxHash3_64::oneshot(&h[..16]) ^ (index >> 32);
    h[16..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Why the bytes at some offset are not a record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordDamage {
    #[error("torn: {have} of {RECORD_HEADER_BYTES} header bytes")]
    TornHeader { have: usize },
    #[error("no record magic")]
    NoMagic,
    #[error("payload of {0} bytes")]
    PayloadTooLong(usize),
    #[error("torn: {have} of {need} bytes")]
    Torn { have: usize, need: usize },
    #[error("checksum mismatch")]
    Checksum,
    #[error("unknown kind {0}")]
    UnknownKind(u8),
    #[error("sequence {seq} where {expected} was due")]
    Sequence { seq: u64, expected: u64 },
}

/// Why a segment's bytes cannot be scanned at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SegmentDamage {
    #[error("{0} bytes, shorter than a segment header")]
    Short(usize),
    #[error("the header does not say segment {0:016x}")]
    WrongIndex(u64),
    #[error("{bytes} bytes: no record can start at byte {start}")]
    BadStart { bytes: usize, start: usize },
}

/// The record at the start of `bytes`, if it is one with sequence number `expected_seq`, and
/// the bytes it takes.
fn decode(bytes: &[u8], expected_seq: u64) -> Result<(Record, usize), RecordDamage> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return Err(RecordDamage::TornHeader { have: bytes.len() });
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    if u32_at(0) != RECORD_MAGIC {
        return Err(RecordDamage::NoMagic);
    }
    let len = u32_at(24) as usize;
    if len > MAX_PAYLOAD_BYTES {
        return Err(RecordDamage::PayloadTooLong(len));
    }
    let end = RECORD_HEADER_BYTES + len;
    if bytes.len() < end {
        return Err(RecordDamage::Torn {
            have: bytes.len(),
            need: end,
        });
    }
    if checksum(&bytes[..32], &bytes[RECORD_HEADER_BYTES..end]) != u64_at(32) {
        return Err(RecordDamage::Checksum);
    }
    let kind = match bytes[4] {
        1 => Kind::Page,
        2 => Kind::Trim,
        3 => Kind::Commit,
        4 => Kind::Request,
        5 => Kind::Volume,
        6 => Kind::Unvolume,
        k => return Err(RecordDamage::UnknownKind(k)),
    };
    let seq = u64_at(16);
    if seq != expected_seq {
        return Err(RecordDamage::Sequence {
            seq,
            expected: expected_seq,
        });
    }
    let used = padded(end).min(bytes.len());
    let record = Record {
        kind,
        codec: bytes[5],
        volume: u16::from_le_bytes([bytes[6], bytes[7]]),
        lpn: u64_at(8),
        seq,
        pages: u32_at(28),
        payload: bytes[RECORD_HEADER_BYTES..end].to_vec(),
        segment: 0,
        offset: 0,
        bytes: padded(end),
    };
    Ok((record, used))
}

/// The record at the start of `bytes`, whatever its sequence number: for reading a record a
/// map points at.
pub fn decode_any(bytes: &[u8]) -> Result<Record, RecordDamage> {
    let seq = bytes
        .get(16..24)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().expect("8 bytes")));
    decode(bytes, seq).map(|(r, _)| r)
}

/// What a segment's bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Scan {
    /// The valid records, in order.
    pub records: Vec<Record>,
    /// Bytes of the valid prefix (header included).
    pub valid_bytes: usize,
    /// The first bad record: its offset and why, when the segment did not end cleanly.
    pub stopped: Option<(usize, RecordDamage)>,
    /// A valid commit record found past `stopped` (its offset): acknowledged data is damaged.
    pub commit_after_stop: Option<usize>,
}

/// Scans one segment's bytes whose first record is `first_seq`. Never panics, whatever the
/// bytes (a fuzz target feeds it arbitrary ones).
pub fn scan_segment(bytes: &[u8], index: u64, first_seq: u64) -> Result<Scan, SegmentDamage> {
    scan_segment_from(bytes, index, SEGMENT_HEADER_BYTES, Some(first_seq))
}

/// As `scan_segment`, from byte `start` (a record boundary), whose record is `first_seq`, or
/// whatever sequence number it carries when None (the cleaner reads old segments so).
pub fn scan_segment_from(
    bytes: &[u8],
    index: u64,
    start: usize,
    first_seq: Option<u64>,
) -> Result<Scan, SegmentDamage> {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return Err(SegmentDamage::Short(bytes.len()));
    }
    if bytes[..SEGMENT_HEADER_BYTES] != segment_header(index) {
        return Err(SegmentDamage::WrongIndex(index));
    }
    if start < SEGMENT_HEADER_BYTES || start > bytes.len() || !start.is_multiple_of(8) {
        return Err(SegmentDamage::BadStart {
            bytes: bytes.len(),
            start,
        });
    }
    let mut at = start;
    let mut seq = match first_seq {
        Some(s) => s,
        None if bytes.len() >= start + 24 => {
            u64::from_le_bytes(bytes[start + 16..start + 24].try_into().expect("8 bytes"))
        }
        None => 0,
    };
    let mut records = Vec::new();
    let mut stopped = None;
    while at < bytes.len() {
        // Zeros where a record would start: the unwritten rest of a preallocated or torn file.
        match decode(&bytes[at..], seq) {
            Ok((mut record, used)) => {
                record.offset = at;
                record.segment = index;
                records.push(record);
                seq += 1;
                at += used;
            }
            Err(why) => {
                stopped = Some((at, why));
                break;
            }
        }
    }
    let valid_bytes = at;
    // Past a bad record: is any valid commit further on? Any record there has an unknown
    // sequence number, so only its own checksum is checked.
    let mut commit_after_stop = None;
    if stopped.is_some() {
        let mut probe = padded(at + 1);
        while probe + RECORD_HEADER_BYTES <= bytes.len() {
            if bytes[probe..probe + 4] == RECORD_MAGIC.to_le_bytes() && bytes[probe + 4] == 3 {
                let claimed = u64::from_le_bytes(bytes[probe + 16..probe + 24].try_into().unwrap());
                if decode(&bytes[probe..], claimed).is_ok() {
                    commit_after_stop = Some(probe);
                    break;
                }
            }
            probe += 8;
        }
    }
    Ok(Scan {
        records,
        valid_bytes,
        stopped,
        commit_after_stop,
    })
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `pages` page records (a commit after each `commit_every`), returns the dir.
    fn log_with(pages: u64, commit_every: u64, segment_bytes: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, r) = LogWriter::open(dir.path(), segment_bytes).unwrap();
        assert_eq!((r.segments, r.records.len(), r.next_seq), (0, 0, 1));
        for lpn in 0..pages {
            let payload = vec![lpn as u8; 100 + lpn as usize % 50];
            w.append(Kind::Page, 1, lpn, 0, &payload).unwrap();
            if (lpn + 1) % commit_every == 0 {
                w.commit().unwrap();
            }
        }
        dir
    }

    #[test]
    fn records_round_trip_across_segments_and_reopen_appends_after_them() {
        let dir = log_with(100, 10, 2048);
        let r = recover(dir.path()).unwrap();
        assert!(r.segments > 3, "{}", r.segments);
        assert_eq!(r.records.len(), 110);
        assert_eq!(r.committed, 110);
        assert_eq!(r.dropped_bytes, 0);
        let pages: Vec<&Record> = r.records.iter().filter(|r| r.kind == Kind::Page).collect();
        for (lpn, rec) in pages.iter().enumerate() {
            assert_eq!(rec.lpn, lpn as u64);
            assert_eq!(rec.payload, vec![lpn as u8; 100 + lpn % 50]);
        }
        // Reopened: the sequence continues.
        let (mut w, _) = LogWriter::open(dir.path(), 2048).unwrap();
        w.append(Kind::Trim, 0, 5, 3, &[]).unwrap();
        w.commit().unwrap();
        let r = recover(dir.path()).unwrap();
        assert_eq!(r.records.len(), 112);
        assert_eq!((r.records[110].kind, r.records[110].pages), (Kind::Trim, 3));
    }

    /// The last record cut at every byte: recovery keeps what precedes it, drops the rest, and
    /// says how much; every committed record survives.
    #[test]
    fn a_torn_last_record_is_dropped_at_every_byte_offset() {
        let dir = log_with(20, 5, 1 << 20);
        // One uncommitted record at the end.
        let (mut w, _) = LogWriter::open(dir.path(), 1 << 20).unwrap();
        w.append(Kind::Page, 1, 99, 0, &[7u8; 300]).unwrap();
        drop(w);
        let path = segment_path(dir.path(), 0);
        let whole = std::fs::read(&path).unwrap();
        let record = padded(RECORD_HEADER_BYTES + 300);
        let start = whole.len() - record;
        for cut in start..whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let r = recover(dir.path()).unwrap();
            assert_eq!(r.committed, 24);
            if cut < start + RECORD_HEADER_BYTES + 300 {
                assert_eq!(r.records.len(), 24, "cut at {cut}");
                assert_eq!(r.dropped_bytes, (cut - start) as u64, "cut at {cut}");
            } else {
                // Only padding is missing: the record is whole.
                assert_eq!((r.records.len(), r.dropped_bytes), (25, 0), "cut at {cut}");
            }
        }
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(recover(dir.path()).unwrap().records.len(), 25);
    }

    /// A flipped byte after the last commit drops the tail from that record; one before a
    /// commit refuses, naming the file and offset; a missing segment refuses; a segment whose
    /// header names another index refuses.
    #[test]
    fn corruption_is_dropped_in_the_tail_and_refused_before_a_commit() {
        let dir = log_with(40, 10, 1 << 20);
        let (mut w, _) = LogWriter::open(dir.path(), 1 << 20).unwrap();
        for lpn in 0..3 {
            w.append(Kind::Page, 1, lpn, 0, &[1u8; 200]).unwrap();
        }
        drop(w);
        let path = segment_path(dir.path(), 0);
        let whole = std::fs::read(&path).unwrap();
        let tail_record = whole.len() - 2 * padded(RECORD_HEADER_BYTES + 200);
        let mut bad = whole.clone();
        bad[tail_record + 50] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let r = recover(dir.path()).unwrap();
        assert_eq!(r.records.len(), 44 + 1);
        assert!(r.dropped_why.unwrap().contains("checksum"));
        // In the middle, before commits: refused.
        let mut bad = whole.clone();
        bad[SEGMENT_HEADER_BYTES + 45] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let e = recover(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("seg-0000000000000000.log") && e.contains("a commit follows"),
            "{e}"
        );
        std::fs::write(&path, &whole).unwrap();

        let dir = log_with(100, 10, 2048);
        std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
        let e = recover(dir.path()).unwrap_err().to_string();
        assert!(e.contains("segment 0000000000000001 is missing"), "{e}");
        let dir = log_with(100, 10, 2048);
        std::fs::copy(segment_path(dir.path(), 0), segment_path(dir.path(), 1)).unwrap();
        let e = recover(dir.path()).unwrap_err().to_string();
        assert!(e.contains("does not say segment 0000000000000001"), "{e}");
    }

    /// Random flips anywhere never panic, and never yield a record that was not written.
    #[test]
    fn random_flips_never_panic_or_invent_records() {
        let dir = log_with(30, 7, 1 << 20);
        let path = segment_path(dir.path(), 0);
        let whole = std::fs::read(&path).unwrap();
        let good = recover(dir.path()).unwrap().records;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..300 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut bad = whole.clone();
            let at = (rng % whole.len() as u64) as usize;
            bad[at] ^= 1 << ((rng >> 60) as u8 % 8);
            std::fs::write(&path, &bad).unwrap();
            if let Ok(r) = recover(dir.path()) {
                assert!(r.records.len() <= good.len());
                assert_eq!(r.records[..], good[..r.records.len()]);
            }
        }
    }

    #[test]
    fn pages_are_compressed_when_that_pays_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = LogWriter::open(dir.path(), 1 << 20).unwrap();
        let text = b"ftlab ".repeat(700)[..4096].to_vec();
        let mut noise = vec![0u8; 4096];
        let mut x = 1u64;
        for b in &mut noise {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (x >> 56) as u8;
        }
        w.append_page(1, &text).unwrap();
        w.append_page(2, &noise).unwrap();
        w.commit().unwrap();
        let r = recover(dir.path()).unwrap();
        assert_eq!(
            (r.records[0].codec, r.records[1].codec),
            (CODEC_LZ4, CODEC_RAW)
        );
        assert!(r.records[0].payload.len() < 200);
        assert_eq!(r.records[0].page(4096).unwrap(), text);
        assert_eq!(r.records[1].page(4096).unwrap(), noise);
        assert_eq!(r.records[1].page(8192), None);
    }

    /// Repair keeps the records before the damage, sets the rest aside (nothing deleted), and
    /// the directory then recovers.
    #[test]
    fn repair_salvages_what_verifies_and_deletes_nothing() {
        let dir = log_with(100, 10, 2048);
        let segments = recover(dir.path()).unwrap().segments;
        let path = segment_path(dir.path(), 1);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[SEGMENT_HEADER_BYTES + 10] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        assert!(recover(dir.path()).is_err());
        let r = repair(dir.path()).unwrap();
        let kept = recover(dir.path()).unwrap();
        assert_eq!(kept.records.len() as u64, r.kept_records);
        assert!(r.kept_records > 0);
        // The damaged segment's copy and every later segment, set aside.
        assert_eq!(r.set_aside.len() as u64, 1 + segments - 2);
        for p in &r.set_aside {
            assert!(p.exists(), "{}", p.display());
        }
        assert_eq!(repair(dir.path()).unwrap().set_aside.len(), 0);
    }

    /// A failed fsync breaks the writer for good: Linux reports a write-back error once and
    /// marks the pages clean, so a later sync that succeeded would acknowledge records the
    /// disk may never have got. A restart recovers what the disk holds.
    #[test]
    fn a_failed_sync_is_never_followed_by_a_successful_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = LogWriter::open(dir.path(), 1 << 20).unwrap();
        w.append_page(1, &[1u8; 4096]).unwrap();
        let durable = w.commit().unwrap();
        w.append_page(2, &[2u8; 4096]).unwrap();
        w.fail_next_sync = true;
        let e = w.commit().unwrap_err();
        assert!(e.is_broken() && !e.is_no_space(), "{e}");
        assert!(e.to_string().contains("fsync failed"), "{e}");
        // Nothing more is taken, and no later commit claims what the failed one did not.
        assert!(w.append_page(3, &[3u8; 4096]).unwrap_err().is_broken());
        assert!(w.commit().unwrap_err().is_broken());
        drop(w);
        let r = recover(dir.path()).unwrap();
        let pages: Vec<u64> = r
            .records
            .iter()
            .filter(|r| r.kind == Kind::Page)
            .map(|r| r.lpn)
            .collect();
        // What the first commit covered survives; the rest is what the disk happened to keep.
        assert!(r.records.iter().any(|r| r.seq == durable));
        assert!(pages.starts_with(&[1]) && !pages.contains(&3), "{pages:?}");
    }
    /// A commit in halves (its fdatasync outside the caller's lock) holds as `commit` does: a
    /// failed sync breaks the writer, and a sync that succeeded after another of the writer's
    /// syncs failed meanwhile is refused too (Linux tells one sync of a file its error).
    #[test]
    fn a_commit_in_halves_is_refused_after_any_failed_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = LogWriter::open(dir.path(), 1 << 20).unwrap();
        w.append_page(1, &[1u8; 4096]).unwrap();
        let (seq, ticket) = w.commit_begin().unwrap();
        // Records go on being appended while the ticket syncs.
        w.append_page(2, &[2u8; 4096]).unwrap();
        ticket.sync().unwrap();
        w.commit_end(Ok(())).unwrap();
        let r = recover(dir.path()).unwrap();
        assert!(r
            .records
            .iter()
            .any(|r| r.seq == seq && r.kind == Kind::Commit));

        let (_, ticket) = w.commit_begin().unwrap();
        // Another sync of the writer (a full commit) fails while the ticket is out.
        w.fail_next_sync = true;
        assert!(w.commit().unwrap_err().is_broken());
        assert!(ticket.sync().is_ok());
        assert!(w.commit_end(Ok(())).unwrap_err().is_broken());

        let dir = tempfile::tempdir().unwrap();
        let (mut w, _) = LogWriter::open(dir.path(), 1 << 20).unwrap();
        w.append_page(1, &[1u8; 4096]).unwrap();
        w.fail_next_sync = true;
        let (_, ticket) = w.commit_begin().unwrap();
        let e = w.commit_end(ticket.sync()).unwrap_err();
        assert!(e.to_string().contains("fsync failed"), "{e}");
        assert!(w.commit().unwrap_err().is_broken());
    }
}
