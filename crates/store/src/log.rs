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

/// Bytes an unprivileged writer may still use on the file system holding `file`; None where
/// that cannot be asked.
pub fn free_bytes(file: &File) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: fstatvfs(2) fills the struct it is given for an open descriptor and reads
        // nothing else.
        let r = unsafe { libc::fstatvfs(file.as_raw_fd(), s.as_mut_ptr()) };
        if r != 0 {
            return None;
        }
        // SAFETY: a zeroed statvfs is a valid value, and fstatvfs succeeded.
        let s = unsafe { s.assume_init() };
        #[allow(clippy::unnecessary_cast)] // u64 on 64-bit Linux, u32 on some targets.
        Some(s.f_bavail as u64 * s.f_frsize as u64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
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

/// What recovery found in a directory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Collected by `recover` only.
    pub records: Vec<Record>,
    /// Segments read, in order.
    pub segments: u64,
    /// Records read up to and including the last commit (everything a FLUSH acknowledged).
    pub committed: usize,
    /// Bytes dropped from the end of the last segment (a torn or corrupt tail, never
    /// acknowledged by a FLUSH), and why the first of them was refused.
    pub dropped_bytes: u64,
    pub dropped_why: Option<String>,
    /// Where appending resumes: the last segment and its valid length.
    pub tail: Option<(u64, usize)>,
    /// The sequence number of the next record.
    pub next_seq: u64,
    /// Records read (from the position recovery started at).
    pub replayed: u64,
}

pub fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("seg-{index:016x}.log"))
}

/// The segment indices in `dir`, sorted; other files are ignored.
pub fn segment_indices(dir: &Path) -> Result<Vec<u64>, LogError> {
    let io = |cause| LogError::Io {
        path: dir.to_path_buf(),
        cause,
    };
    let mut indices = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let name = entry.map_err(io)?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(hex) = name
            .strip_prefix("seg-")
            .and_then(|n| n.strip_suffix(".log"))
        {
            if let (16, Ok(i)) = (hex.len(), u64::from_str_radix(hex, 16)) {
                indices.push(i);
            }
        }
    }
    indices.sort_unstable();
    Ok(indices)
}

/// Reads every segment of `dir` in order and decides what the device holds: the records up to
/// the first bad one, when nothing acknowledged lies beyond it; an error naming the damage
/// otherwise.
pub fn recover(dir: &Path) -> Result<Recovered, LogError> {
    let mut records = Vec::new();
    let mut out = recover_from(dir, Position::START, &mut |r| {
        records.push(r.clone());
        Ok::<(), std::convert::Infallible>(())
    })?;
    out.records = records;
    Ok(out)
}

/// Where appending resumes after `recover_from`.
pub fn tail_position(r: &Recovered) -> Position {
    match r.tail {
        Some((segment, offset)) => Position {
            segment,
            offset,
            seq: r.next_seq,
        },
        None => Position::START,
    }
}

/// As `recover`, from `from` (a checkpoint's position): segments before it are not read, and
/// those from it on must be consecutive. Each valid record is handed to `visit` (its `offset`
/// set) instead of collected; `visit` refusing one ends recovery with its reason. A log that
/// ends before `from` (a checkpoint from the future: records it counted are gone) is refused.
pub fn recover_from<E: std::fmt::Display>(
    dir: &Path,
    from: Position,
    visit: &mut dyn FnMut(&Record) -> Result<(), E>,
) -> Result<Recovered, LogError> {
    let indices: Vec<u64> = segment_indices(dir)?
        .into_iter()
        .filter(|&i| i >= from.segment)
        .collect();
    let mut out = Recovered {
        segments: indices.len() as u64,
        next_seq: from.seq,
        ..Default::default()
    };
    let future = |why: String| LogError::Damaged {
        path: segment_path(dir, from.segment),
        why: format!(
            "the checkpoint counts records up to byte {} (sequence {}) but {why}: records a \
             checkpoint covered are gone (a checkpoint from the future, or a lost segment)",
            from.offset, from.seq
        ),
    };
    if indices.first() != Some(&from.segment) && from != Position::START {
        return Err(future("the segment is missing".into()));
    }
    let mut since_commit = 0usize;
    for (k, &index) in indices.iter().enumerate() {
        if index != from.segment + k as u64 {
            return Err(LogError::MissingSegment {
                dir: dir.to_path_buf(),
                missing: from.segment + k as u64,
                before: k.checked_sub(1).map_or(0, |p| indices[p]),
                after: index,
            });
        }
        let path = segment_path(dir, index);
        let bytes = std::fs::read(&path).map_err(|cause| LogError::Io {
            path: path.clone(),
            cause,
        })?;
        let start = if k == 0 {
            from.offset
        } else {
            SEGMENT_HEADER_BYTES
        };
        if bytes.len() < start {
            return Err(future(format!("it holds {} bytes", bytes.len())));
        }
        let scan = scan_segment_from(&bytes, index, start, Some(out.next_seq)).map_err(|why| {
            LogError::BadSegment {
                path: path.clone(),
                why: why.to_string(),
            }
        })?;
        let last = k + 1 == indices.len();
        for r in &scan.records {
            visit(r).map_err(|why| LogError::Damaged {
                path: path.clone(),
                why: format!("record {} at byte {}: {why}", r.seq, r.offset),
            })?;
            out.next_seq += 1;
            since_commit += 1;
            if r.kind == Kind::Commit {
                out.committed += since_commit;
                since_commit = 0;
            }
        }
        out.replayed += scan.records.len() as u64;
        if let Some((offset, why)) = scan.stopped {
            // Damage with a commit after it, or in any segment but the last (whose successors
            // were written after it was complete), lost acknowledged data.
            let after = match scan.commit_after_stop {
                Some(c) => Some(format!("a commit follows it at byte {c}")),
                None if !last => Some("later segments follow it".to_string()),
                None => None,
            };
            if let Some(after) = after {
                return Err(LogError::CorruptBeforeCommit {
                    path,
                    offset,
                    why: why.to_string(),
                    after,
                });
            }
            out.dropped_bytes = (bytes.len() - scan.valid_bytes) as u64;
            out.dropped_why = Some(format!("{}: byte {offset}: {why}", path.display()));
        }
        if last {
            out.tail = Some((index, scan.valid_bytes));
        }
    }
    // Records after the last commit were not acknowledged as durable; they are kept (a write
    // is acknowledged before its FLUSH), but nothing promised them.
    Ok(out)
}

/// What `repair` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Records that verify and are kept.
    pub kept_records: u64,
    /// Files set aside (renamed to `NAME.damaged`, never deleted): the damaged segment's
    /// original and every segment after it.
    pub set_aside: Vec<PathBuf>,
    /// Bytes cut from the damaged segment (its copy is among `set_aside`).
    pub cut_bytes: u64,
}

/// Salvages what verifies: the records before the first damage (a bad record, a missing or
/// misnamed segment). The damaged segment is copied to `NAME.damaged` and cut at its last good
/// record; every later segment is renamed to `NAME.damaged`. Nothing is deleted. Afterwards
/// `recover` succeeds.
pub fn repair(dir: &Path) -> Result<Repaired, LogError> {
    repair_from(dir, Position::START)
}

/// As `repair`, for the log from `from` (a checkpoint's position) on; earlier segments are
/// left alone.
pub fn repair_from(dir: &Path, from: Position) -> Result<Repaired, LogError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| LogError::Io { path, cause }
    };
    let indices: Vec<u64> = segment_indices(dir)?
        .into_iter()
        .filter(|&i| i >= from.segment)
        .collect();
    let mut out = Repaired::default();
    let mut damaged_from = None;
    let mut first_seq = from.seq;
    for (k, &index) in indices.iter().enumerate() {
        let path = segment_path(dir, index);
        if index != from.segment + k as u64 {
            damaged_from = Some(k);
            break;
        }
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let start = if k == 0 {
            from.offset
        } else {
            SEGMENT_HEADER_BYTES
        };
        match scan_segment_from(&bytes, index, start, Some(first_seq)) {
            Err(_) => {
                damaged_from = Some(k);
                break;
            }
            Ok(scan) => {
                out.kept_records += scan.records.len() as u64;
                first_seq += scan.records.len() as u64;
                if scan.stopped.is_some() {
                    let aside = aside_path(&path);
                    std::fs::copy(&path, &aside).map_err(io(&aside))?;
                    out.set_aside.push(aside);
                    let file = OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(io(&path))?;
                    file.set_len(scan.valid_bytes as u64).map_err(io(&path))?;
                    file.sync_all().map_err(io(&path))?;
                    out.cut_bytes = (bytes.len() - scan.valid_bytes) as u64;
                    damaged_from = Some(k + 1);
                    break;
                }
            }
        }
    }
    if let Some(from) = damaged_from {
        for &index in &indices[from..] {
            let path = segment_path(dir, index);
            let aside = aside_path(&path);
            std::fs::rename(&path, &aside).map_err(io(&path))?;
            out.set_aside.push(aside);
        }
        sync_dir(dir)?;
    }
    Ok(out)
}

/// `PATH.damaged`, or `PATH.damaged.N` for the first N free: an earlier repair's copy is kept.
fn aside_path(path: &Path) -> PathBuf {
    let base = path.with_extension("log.damaged");
    (1..)
        .map(|n| match n {
            1 => base.clone(),
            n => PathBuf::from(format!("{}.{n}", base.display())),
        })
        .find(|p| !p.exists())
        .expect("some name is free")
}

/// Appends records to the last segment of a directory, starting a new segment past
/// `segment_bytes`.
pub struct LogWriter {
    dir: PathBuf,
    file: File,
    index: u64,
    bytes: usize,
    segment_bytes: usize,
    next_seq: u64,
    /// Bytes appended by this writer (headers of new segments included).
    appended_bytes: u64,
    /// Records appended but not yet written to the file: one write(2) for many records. A
    /// commit, a segment's end, `flush` and drop write them.
    pending: Vec<u8>,
    /// The last write of `pending` failed (a full disk): the file was cut back to its last
    /// whole record and `pending` kept whole, to be written where it belongs once space returns.
    /// Until then records are refused (`STALLED_PENDING_BYTES`).
    stalled: bool,
    /// The cut after a failed write failed too, or a sync failed: nothing more is appended.
    broken: bool,
    /// Tests: the next sync fails as a disk's write-back error would.
    #[cfg(test)]
    pub(crate) fail_next_sync: bool,
}

/// Pending records are written to the file once they reach this.
pub const PENDING_BYTES: usize = 1 << 20;

/// While the disk is full, pages and trims are refused at once, but the small records a read
/// or a FLUSH adds (the FTL model's request, a commit) are kept in memory up to this much, so
/// that reads go on being served.
const STALLED_PENDING_BYTES: usize = 16 << 20;

impl Drop for LogWriter {
    fn drop(&mut self) {
        // Best effort: what a dying process had not written is what a crash loses anyway.
        let _ = self.flush();
    }
}

impl LogWriter {
    /// Recovers `dir` (created if absent) and opens it for appending after what verified:
    /// a dropped tail is cut off the file first.
    pub fn open(dir: &Path, segment_bytes: usize) -> Result<(LogWriter, Recovered), LogError> {
        std::fs::create_dir_all(dir).map_err(|cause| LogError::Io {
            path: dir.to_path_buf(),
            cause,
        })?;
        let recovered = recover(dir)?;
        let writer = LogWriter::resume(dir, tail_position(&recovered), segment_bytes)?;
        Ok((writer, recovered))
    }

    /// Opens `dir` for appending at `tail` (where recovery ended): a dropped tail is cut off
    /// the file first; a segment is created when none is there.
    pub fn resume(dir: &Path, tail: Position, segment_bytes: usize) -> Result<LogWriter, LogError> {
        assert!(segment_bytes + MAX_PAYLOAD_BYTES + 4096 < MAX_SEGMENT_BYTES);
        let (index, valid) = (tail.segment, tail.offset);
        let path = segment_path(dir, index);
        let fresh = !path.exists();
        let io = |cause| LogError::Io {
            path: path.clone(),
            cause,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let bytes = if fresh {
            file.write_all(&segment_header(index)).map_err(io)?;
            file.sync_all().map_err(io)?;
            sync_dir(dir)?;
            SEGMENT_HEADER_BYTES
        } else {
            // A record whose padding was torn off is whole; the padding is restored so that
            // every record starts on an 8-byte boundary (where recovery probes past damage).
            file.set_len(padded(valid) as u64).map_err(io)?;
            padded(valid)
        };
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(bytes as u64))
            .map_err(io)?;
        Ok(LogWriter {
            dir: dir.to_path_buf(),
            file,
            index,
            bytes,
            segment_bytes: segment_bytes.max(SEGMENT_HEADER_BYTES + 1),
            next_seq: tail.seq,
            appended_bytes: 0,
            pending: Vec::with_capacity(PENDING_BYTES + MAX_PAYLOAD_BYTES),
            stalled: false,
            broken: false,
            #[cfg(test)]
            fail_next_sync: false,
        })
    }

    fn io(&self, cause: std::io::Error) -> LogError {
        LogError::Io {
            path: segment_path(&self.dir, self.index),
            cause,
        }
    }

    /// Appends a record (written, not yet durable); returns its sequence number.
    pub fn append(
        &mut self,
        kind: Kind,
        codec: u8,
        lpn: u64,
        pages: u32,
        payload: &[u8],
    ) -> Result<u64, LogError> {
        self.append_volume(kind, codec, 0, lpn, pages, payload)
            .map(|(seq, _)| seq)
    }

    /// Appends a record of `volume`; returns its sequence number and where it is.
    pub fn append_volume(
        &mut self,
        kind: Kind,
        codec: u8,
        volume: u16,
        lpn: u64,
        pages: u32,
        payload: &[u8],
    ) -> Result<(u64, Loc), LogError> {
        if self.broken {
            return Err(self.broken_error());
        }
        if self.stalled {
            // The disk was full at the last write: try again; while it still is, refuse what
            // only a write can make room for.
            if let Err(e) = self.flush() {
                let small = matches!(kind, Kind::Request | Kind::Commit);
                if !small || self.pending.len() >= STALLED_PENDING_BYTES {
                    return Err(e);
                }
            }
        }
        if self.bytes >= self.segment_bytes {
            self.roll()?;
        }
        let seq = self.next_seq;
        let at = self.pending.len();
        encode_into(
            &mut self.pending,
            kind,
            codec,
            volume,
            lpn,
            seq,
            pages,
            payload,
        );
        let len = self.pending.len() - at;
        let loc = Loc::new(self.index, self.bytes, len);
        self.bytes += len;
        self.appended_bytes += len as u64;
        self.next_seq += 1;
        if self.pending.len() >= PENDING_BYTES && !self.stalled {
            // The record is appended either way: a failed write leaves it whole in `pending`
            // and stalls the writer, so that the next append tells the caller.
            let _ = self.flush();
        }
        Ok((seq, loc))
    }

    /// Whether the record at `loc` is still pending (not yet in the file).
    pub fn pending_at(&self, loc: Loc) -> bool {
        loc.segment() == self.index && loc.offset() + loc.bytes() > self.bytes - self.pending.len()
    }

    /// Writes the pending records to the file (not synced): readers of the file see them.
    ///
    /// A write that fails part way (a full disk) leaves part of a record in the file; were the
    /// next records appended after it, a commit would follow a torn record, which recovery
    /// must refuse as damage. So the file is cut back to where the pending records start, and
    /// they stay pending (whole, at the offsets their `Loc`s name) for the next try.
    pub fn flush(&mut self) -> Result<(), LogError> {
        if self.broken {
            return Err(self.broken_error());
        }
        if self.pending.is_empty() {
            self.stalled = false;
            return Ok(());
        }
        let start = (self.bytes - self.pending.len()) as u64;
        if let Err(cause) = self.file.write_all(&self.pending) {
            self.stalled = true;
            use std::io::Seek;
            let cut = self
                .file
                .set_len(start)
                .and_then(|()| self.file.seek(std::io::SeekFrom::Start(start)).map(drop));
            if let Err(e) = cut {
                self.broken = true;
                return Err(LogError::Broken {
                    path: segment_path(&self.dir, self.index),
                    cause: e,
                });
            }
            return Err(self.io(cause));
        }
        self.pending.clear();
        self.stalled = false;
        Ok(())
    }

    fn broken_error(&self) -> LogError {
        LogError::Broken {
            path: segment_path(&self.dir, self.index),
            cause: std::io::Error::other("an earlier cut or sync failed"),
        }
    }

    /// Whether a write of the pending records failed and waits for space.
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    /// The bytes of the record at `loc` while it is pending (not in the file yet).
    pub fn pending_record(&self, loc: Loc) -> Option<&[u8]> {
        if !self.pending_at(loc) {
            return None;
        }
        let start = loc.offset() - (self.bytes - self.pending.len());
        self.pending.get(start..start + loc.bytes())
    }

    /// Appends a page's bytes, LZ4-compressed when that shrinks them (codec 1), raw otherwise
    /// (codec 0); returns its sequence number.
    pub fn append_page(&mut self, lpn: u64, page: &[u8]) -> Result<u64, LogError> {
        self.append_page_of(0, lpn, page).map(|(seq, _)| seq)
    }

    /// As `append_page`, for `volume`, with where the record is.
    pub fn append_page_of(
        &mut self,
        volume: u16,
        lpn: u64,
        page: &[u8],
    ) -> Result<(u64, Loc), LogError> {
        let (codec, payload) = pack_page(page);
        self.append_volume(Kind::Page, codec, volume, lpn, 0, &payload)
    }

    /// Where the next record goes (a new segment may start first).
    pub fn position(&self) -> Position {
        Position {
            segment: self.index,
            offset: self.bytes,
            seq: self.next_seq,
        }
    }

    /// Bytes of records appended but not yet written to the file.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// A segment is closed and the next begun past this size.
    pub fn segment_bytes(&self) -> usize {
        self.segment_bytes
    }

    /// Bytes this writer appended.
    pub fn appended_bytes(&self) -> u64 {
        self.appended_bytes
    }

    /// The last sequence number appended (0: none).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Bytes of the segment being appended to.
    pub fn tail_bytes(&self) -> usize {
        self.bytes
    }

    /// The segment being appended to.
    pub fn tail_segment(&self) -> u64 {
        self.index
    }

    /// Makes everything appended so far durable: a commit record, then `fdatasync`.
    pub fn commit(&mut self) -> Result<u64, LogError> {
        let seq = self.append(Kind::Commit, 0, 0, 0, &[])?;
        self.flush()?;
        self.sync()?;
        Ok(seq)
    }

    /// `fdatasync` of the segment being appended to; a failure breaks the writer
    /// (`LogError::SyncFailed`): what the kernel failed to write back it may have dropped.
    fn sync(&mut self) -> Result<(), LogError> {
        #[cfg(test)]
        if self.fail_next_sync {
            self.fail_next_sync = false;
            self.broken = true;
            return Err(LogError::SyncFailed {
                path: segment_path(&self.dir, self.index),
                cause: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        self.file.sync_data().map_err(|cause| {
            self.broken = true;
            LogError::SyncFailed {
                path: segment_path(&self.dir, self.index),
                cause,
            }
        })
    }

    /// The file holding the segment being appended to (for its file system's free space).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Closes the current segment (durable) and starts the next.
    fn roll(&mut self) -> Result<(), LogError> {
        self.flush()?;
        self.sync()?;
        let index = self.index + 1;
        let path = segment_path(&self.dir, index);
        let io = |cause| LogError::Io {
            path: path.clone(),
            cause,
        };
        let mut file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(io)?;
        let made = file
            .write_all(&segment_header(index))
            .and_then(|()| file.sync_all());
        if let Err(cause) = made {
            // A full disk: the empty segment goes, so that the next roll can make it again.
            let _ = std::fs::remove_file(&path);
            return Err(io(cause));
        }
        sync_dir(&self.dir)?;
        self.file = file;
        self.index = index;
        self.bytes = SEGMENT_HEADER_BYTES;
        self.appended_bytes += SEGMENT_HEADER_BYTES as u64;
        Ok(())
    }
}

/// Makes a directory's entries (a new segment) durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    ftlab_core::atomic_file::sync_dir(dir).map_err(|cause| LogError::Io {
        path: dir.to_path_buf(),
        cause,
    })
}

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
}
