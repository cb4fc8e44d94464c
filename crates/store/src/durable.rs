//! A durable device directory: the device log (`log.rs`) plus what makes it a device. Owns the
//! volumes (the device, its snapshots and clones: each a map from LPN to the log record holding
//! its page), checkpoints of those maps, the archive of the FTL model's requests, and the
//! cleaner that copies live records out of mostly dead segments. Does not know: the FTL, the
//! page store, or protocols (the server feeds it pages and requests and replays what it returns).
//!
//! Files in the directory:
//!
//! - `seg-N.log`: the log (every page write, trim, request of the model, volume change, commit).
//! - `checkpoint`: the volumes' maps as of a log position, replaced atomically (written beside,
//!   synced, renamed, the directory synced). Recovery starts from it and replays the log after
//!   it; without one, from the log's start.
//! - `model.log`: the FTL model's requests up to the checkpoint (appended before the checkpoint
//!   is replaced), so that the model is rebuilt by replaying every request it ever saw, in order,
//!   with its arrival time: the same report as without a crash. The model's own state is not
//!   checkpointed (see docs/serve.md).
//!
//! Snapshots share records with their parent: a snapshot is a copy of a map whose chunks are
//! shared until written (`LocMap`), so creating one copies no data and a pointer per 1024 pages.
//! A record is live while any volume maps its LPN to it; the cleaner never frees a live record,
//! and a segment is deleted only after a checkpoint that no longer references it is durable.

use crate::log::{
    self, recover_from, scan_segment_from, segment_indices, segment_path, sync_dir, Kind, Loc,
    LogError, LogWriter, Position, Record,
};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const CHECKPOINT_FILE: &str = "checkpoint";
pub const MODEL_FILE: &str = "model.log";
const CHECKPOINT_MAGIC: &[u8; 8] = b"FTLABCKP";
const CHECKPOINT_VERSION: u32 = 1;
/// Pages per chunk of a volume's map: the unit shared between a snapshot and its parent.
const CHUNK_PAGES: usize = 1024;
/// The device itself: volume 0.
pub const DEVICE_VOLUME: u16 = 0;
/// Volumes at most, the device included: a checkpoint's reader allocates a map per volume.
pub const MAX_VOLUMES: usize = 1024;

/// A volume's map from LPN to record, in chunks shared copy-on-write with its snapshots.
#[derive(Clone, Debug)]
pub struct LocMap {
    pages: u64,
    /// None: every page of the chunk unmapped.
    chunks: Vec<Option<Arc<Vec<Loc>>>>,
}

impl LocMap {
    pub fn new(pages: u64) -> LocMap {
        LocMap {
            pages,
            chunks: vec![None; (pages as usize).div_ceil(CHUNK_PAGES)],
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    pub fn get(&self, lpn: u64) -> Loc {
        match &self.chunks[lpn as usize / CHUNK_PAGES] {
            Some(c) => c[lpn as usize % CHUNK_PAGES],
            None => Loc::NONE,
        }
    }

    /// Maps `lpn` to `loc`; returns what it mapped to.
    pub fn set(&mut self, lpn: u64, loc: Loc) -> Loc {
        let chunk = &mut self.chunks[lpn as usize / CHUNK_PAGES];
        if chunk.is_none() && loc.is_none() {
            return Loc::NONE;
        }
        let c = Arc::make_mut(chunk.get_or_insert_with(|| Arc::new(vec![Loc::NONE; CHUNK_PAGES])));
        std::mem::replace(&mut c[lpn as usize % CHUNK_PAGES], loc)
    }

    /// Every mapped page: (lpn, loc).
    pub fn mapped(&self) -> impl Iterator<Item = (u64, Loc)> + '_ {
        self.chunks.iter().enumerate().flat_map(|(k, c)| {
            c.iter().flat_map(move |c| {
                c.iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_none())
                    .map(move |(i, &l)| ((k * CHUNK_PAGES + i) as u64, l))
            })
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    /// The device itself (volume 0), served as the exports.
    Device,
    /// Read-only, frozen when made.
    Snapshot,
    /// Writable, sharing unchanged pages with what it was made from.
    Clone,
}

#[derive(Clone, Debug)]
pub struct Volume {
    pub id: u16,
    pub name: String,
    pub kind: VolumeKind,
    /// The volume it was made from (the device's is itself).
    pub parent: u16,
    /// The log record that made it.
    pub created_seq: u64,
    pub map: LocMap,
}

/// What `DataDir::volumes` lists.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    pub id: u16,
    pub name: String,
    pub kind: VolumeKind,
    pub parent: String,
    pub mapped_pages: u64,
}

/// The device and its snapshots and clones, and the bytes of live records per segment.
#[derive(Clone, Debug)]
pub struct Volumes {
    pages: u64,
    list: Vec<Volume>,
    next_id: u16,
    /// Segment -> bytes of records some volume maps.
    live_bytes: BTreeMap<u64, u64>,
}

impl Volumes {
    fn new(pages: u64) -> Volumes {
        Volumes {
            pages,
            list: vec![Volume {
                id: DEVICE_VOLUME,
                name: String::new(),
                kind: VolumeKind::Device,
                parent: DEVICE_VOLUME,
                created_seq: 0,
                map: LocMap::new(pages),
            }],
            next_id: 1,
            live_bytes: BTreeMap::new(),
        }
    }

    fn index(&self, id: u16) -> Option<usize> {
        self.list.iter().position(|v| v.id == id)
    }

    pub fn by_name(&self, name: &str) -> Option<&Volume> {
        self.list
            .iter()
            .find(|v| v.kind != VolumeKind::Device && v.name == name)
    }

    pub fn get(&self, id: u16) -> Option<&Volume> {
        self.index(id).map(|i| &self.list[i])
    }

    /// Maps `lpn` of volume `at` (an index) to `loc`, keeping the live bytes: the old record
    /// dies unless another volume maps the same LPN to it (records are shared only so).
    fn set(&mut self, at: usize, lpn: u64, loc: Loc) {
        let old = self.list[at].map.set(lpn, loc);
        if old == loc {
            return;
        }
        if !old.is_none() && !self.shared(at, lpn, old) {
            let live = self.live_bytes.entry(old.segment()).or_default();
            *live -= old.bytes() as u64;
        }
        if !loc.is_none() && !self.shared(at, lpn, loc) {
            *self.live_bytes.entry(loc.segment()).or_default() += loc.bytes() as u64;
        }
    }

    fn shared(&self, except: usize, lpn: u64, loc: Loc) -> bool {
        self.list
            .iter()
            .enumerate()
            .any(|(i, v)| i != except && v.map.get(lpn) == loc)
    }

    /// Applies a replayed or just appended record at `segment`.
    fn apply(&mut self, r: &Record, segment: u64) -> Result<(), String> {
        let at = || {
            self.index(r.volume)
                .ok_or_else(|| format!("volume {} does not exist", r.volume))
        };
        match r.kind {
            Kind::Page => {
                let at = at()?;
                if r.lpn >= self.pages {
                    return Err(format!(
                        "page {} is beyond this device's {} pages (another --set capacity?)",
                        r.lpn, self.pages
                    ));
                }
                self.set(at, r.lpn, Loc::new(segment, r.offset, r.bytes));
            }
            Kind::Trim => {
                let at = at()?;
                let end = r
                    .lpn
                    .checked_add(u64::from(r.pages))
                    .filter(|&e| e <= self.pages)
                    .ok_or_else(|| format!("trim beyond this device's {} pages", self.pages))?;
                for lpn in r.lpn..end {
                    self.set(at, lpn, Loc::NONE);
                }
            }
            Kind::Volume => {
                let parent = u16::try_from(r.lpn)
                    .ok()
                    .and_then(|p| self.index(p))
                    .ok_or_else(|| format!("parent volume {} does not exist", r.lpn))?;
                let name = String::from_utf8(r.payload.clone())
                    .map_err(|_| "a volume name that is not UTF-8".to_string())?;
                if self.index(r.volume).is_some() || self.by_name(&name).is_some() {
                    return Err(format!("volume {} (`{name}`) exists already", r.volume));
                }
                if self.list.len() >= MAX_VOLUMES {
                    return Err(format!("more than {MAX_VOLUMES} volumes"));
                }
                let kind = if r.codec == 1 {
                    VolumeKind::Clone
                } else {
                    VolumeKind::Snapshot
                };
                let map = self.list[parent].map.clone();
                self.list.push(Volume {
                    id: r.volume,
                    name,
                    kind,
                    parent: self.list[parent].id,
                    created_seq: r.seq,
                    map,
                });
                self.next_id = self.next_id.max(r.volume.saturating_add(1));
            }
            Kind::Unvolume => {
                let at = at()?;
                if at == 0 {
                    return Err("the device's own volume cannot be deleted".into());
                }
                for lpn in 0..self.pages {
                    self.set(at, lpn, Loc::NONE);
                }
                self.list.remove(at);
            }
            Kind::Commit | Kind::Request => {}
        }
        Ok(())
    }

    pub fn infos(&self) -> Vec<VolumeInfo> {
        self.list
            .iter()
            .map(|v| VolumeInfo {
                id: v.id,
                name: v.name.clone(),
                kind: v.kind,
                parent: self
                    .get(v.parent)
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                mapped_pages: v.map.mapped().count() as u64,
            })
            .collect()
    }
}

/// `ModelRequest::op` codes (the server maps its ops to these and back).
pub mod model_op {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const TRIM: u8 = 2;
    pub const FLUSH: u8 = 3;
    /// The write buffer drained at a clean shutdown.
    pub const DRAIN: u8 = 255;
}

/// A request the FTL model saw, as logged: the server maps `op` to its own and back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelRequest {
    pub op: u8,
    pub offset_bytes: u64,
    pub length_bytes: u32,
    pub arrival_ns: u64,
    pub reclaim_group: u8,
    pub handle: u8,
}

impl ModelRequest {
    fn payload(&self) -> [u8; 10] {
        let mut p = [0u8; 10];
        p[..8].copy_from_slice(&self.arrival_ns.to_le_bytes());
        p[8] = self.reclaim_group;
        p[9] = self.handle;
        p
    }

    fn of(r: &Record) -> Result<ModelRequest, String> {
        if r.payload.len() != 10 {
            return Err(format!("a request record of {} bytes", r.payload.len()));
        }
        Ok(ModelRequest {
            op: r.codec,
            offset_bytes: r.lpn,
            length_bytes: r.pages,
            arrival_ns: u64::from_le_bytes(r.payload[..8].try_into().expect("8 bytes")),
            reclaim_group: r.payload[8],
            handle: r.payload[9],
        })
    }
}

/// The host disk's account of a durable device, for `--stats`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DiskStats {
    pub segments: u64,
    /// Bytes of the directory's files: segments, checkpoint, model archive.
    pub disk_bytes: u64,
    /// Bytes of records some volume maps.
    pub live_bytes: u64,
    /// Page bytes clients wrote (before the log's compression).
    pub client_bytes: u64,
    /// Bytes appended to the log since start (cleaner copies included), checkpoints and model
    /// archive written.
    pub log_bytes: u64,
    pub cleaner_copied_bytes: u64,
    pub checkpoint_bytes: u64,
    pub model_bytes: u64,
    pub checkpoints: u64,
    pub cleaned_segments: u64,
    /// Host-disk write amplification: everything written / client page bytes.
    pub host_waf: f64,
}

/// What opening a directory found.
#[derive(Debug, Default)]
pub struct Opened {
    /// Every request the FTL model saw, in order: replay them to rebuild it.
    pub requests: Vec<ModelRequest>,
    /// Log records read after the checkpoint.
    pub replayed_records: u64,
    /// The checkpoint's sequence number (0: none).
    pub checkpoint_seq: u64,
    pub dropped_bytes: u64,
    pub dropped_why: Option<String>,
}

/// Open segment files, shared with readers outside the directory's lock: a reader holding a
/// file keeps reading it after the cleaner unlinks it.
#[derive(Default, Debug)]
pub struct SegmentFiles {
    dir: PathBuf,
    open: Mutex<HashMap<u64, Arc<File>>>,
}

impl SegmentFiles {
    fn file(&self, segment: u64) -> Result<Arc<File>, LogError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = open.get(&segment) {
            return Ok(f.clone());
        }
        let path = segment_path(&self.dir, segment);
        let f = Arc::new(File::open(&path).map_err(|cause| LogError::Io { path, cause })?);
        open.insert(segment, f.clone());
        Ok(f)
    }

    fn forget(&self, segment: u64) {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&segment);
    }
}

/// A record located for reading: read it with `read_page` outside the directory's lock.
pub struct Located {
    file: Arc<File>,
    loc: Loc,
    path: PathBuf,
}

impl Located {
    /// Where the record is: records never change once written, so this names its bytes.
    pub fn loc(&self) -> Loc {
        self.loc
    }

    /// Reads and verifies the record, and decodes its page into `out`.
    pub fn read_page(&self, out: &mut [u8]) -> Result<(), LogError> {
        let mut bytes = vec![0u8; self.loc.bytes()];
        let bad = |why: String| LogError::BadSegment {
            path: self.path.clone(),
            why: format!("the record at byte {}: {why}", self.loc.offset()),
        };
        self.file
            .read_exact_at(&mut bytes, self.loc.offset() as u64)
            .map_err(|cause| LogError::Io {
                path: self.path.clone(),
                cause,
            })?;
        let r = log::decode_any(&bytes).map_err(bad)?;
        let page = r
            .page(out.len())
            .ok_or_else(|| bad("does not decode to a page".into()))?;
        out.copy_from_slice(&page);
        Ok(())
    }
}

/// Called with each page loaded (its LPN and bytes); an error names what went wrong.
pub type PageVisitor<'a> = dyn FnMut(u64, &[u8]) -> Result<(), String> + 'a;

/// A durable device's directory, open.
pub struct DataDir {
    dir: PathBuf,
    page_bytes: usize,
    /// None: opened read-only (nothing is written, not even a torn tail cut).
    writer: Option<LogWriter>,
    volumes: Volumes,
    /// Requests since the checkpoint, archived in `model.log` at the next.
    pending: Vec<ModelRequest>,
    /// Requests in `model.log` the checkpoint counts, and the bytes they end at.
    model_entries: u64,
    model_len: u64,
    checkpoint_at: Position,
    files: Arc<SegmentFiles>,
    stats: DiskStats,
    /// `DIR/lock`, locked (exclusively when writable, shared when read-only) while open:
    /// two processes never write one directory.
    _lock: Option<File>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> LogError + '_ {
    move |cause| LogError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

fn damaged(path: &Path, why: impl Into<String>) -> LogError {
    LogError::Damaged {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// What a checkpoint file holds.
struct Checkpoint {
    at: Position,
    model_entries: u64,
    volumes: Volumes,
}

fn encode_checkpoint(c: &Checkpoint, page_bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
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
        let mut raw = Vec::with_capacity(v.map.pages as usize * 8);
        for lpn in 0..v.map.pages {
            raw.extend_from_slice(&v.map.get(lpn).0.to_le_bytes());
        }
        // Its length is known (pages x 8): no size is stored, so a crafted file cannot make
        // the reader allocate more.
        let packed = lz4_flex::block::compress(&raw);
        out.extend_from_slice(&(packed.len() as u64).to_le_bytes());
        out.extend_from_slice(&packed);
    }
    let sum = twox_hash::XxHash3_64::oneshot(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Reads a checkpoint's bytes; never panics, whatever they are (a fuzz target feeds them).
pub fn decode_checkpoint_bytes(
    bytes: &[u8],
    pages: u64,
    page_bytes: usize,
) -> Result<(Position, u64, Vec<VolumeInfo>), String> {
    decode_checkpoint(bytes, pages, page_bytes).map(|c| (c.at, c.model_entries, c.volumes.infos()))
}

fn decode_checkpoint(bytes: &[u8], pages: u64, page_bytes: usize) -> Result<Checkpoint, String> {
    if bytes.len() < 8 + 8 + 48 + 4 + 8 || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err("not an ftlab checkpoint".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if twox_hash::XxHash3_64::oneshot(body).to_le_bytes() != sum {
        return Err("checksum mismatch".into());
    }
    let mut at = 8usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        // A length read from the file may be anything: checked, never added blindly (found by
        // the `checkpoint` fuzz target).
        let end = at
            .checked_add(n)
            .filter(|&end| end <= body.len())
            .ok_or_else(|| format!("ends at byte {} inside a field of {n} bytes", body.len()))?;
        let s = &body[at..end];
        at = end;
        Ok(s)
    };
    let u16_ = |s: &[u8]| u16::from_le_bytes(s.try_into().expect("2 bytes"));
    let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
    if version != CHECKPOINT_VERSION {
        return Err(format!(
            "version {version} (this ftlab reads {CHECKPOINT_VERSION})"
        ));
    }
    take(4)?;
    let mut h = [0u64; 6];
    for v in &mut h {
        *v = u64_(take(8)?);
    }
    let [segment, offset, seq, model_entries, ck_pages, ck_page_bytes] = h;
    if (ck_pages, ck_page_bytes) != (pages, page_bytes as u64) {
        return Err(format!(
            "a device of {ck_pages} pages of {ck_page_bytes} bytes, not {pages} of {page_bytes} \
             (another --set capacity or flash.page_size_bytes?)"
        ));
    }
    if offset as usize >= log::MAX_SEGMENT_BYTES || offset % 8 != 0 || seq == 0 {
        return Err(format!("a position of byte {offset}, sequence {seq}"));
    }
    let next_id = u16_(take(2)?);
    let count = u16_(take(2)?);
    if count as usize > MAX_VOLUMES {
        return Err(format!("{count} volumes (at most {MAX_VOLUMES})"));
    }
    let mut volumes = Volumes::new(pages);
    volumes.list.clear();
    volumes.next_id = next_id;
    for _ in 0..count {
        let id = u16_(take(2)?);
        let kind = match take(1)?[0] {
            0 => VolumeKind::Device,
            1 => VolumeKind::Snapshot,
            2 => VolumeKind::Clone,
            k => return Err(format!("volume {id}: kind {k}")),
        };
        let parent = u16_(take(2)?);
        let name_len = u16_(take(2)?) as usize;
        let name = String::from_utf8(take(name_len)?.to_vec())
            .map_err(|_| format!("volume {id}: a name that is not UTF-8"))?;
        let created_seq = u64_(take(8)?);
        let packed_len = u64_(take(8)?) as usize;
        let packed = take(packed_len)?;
        let raw = lz4_flex::block::decompress(packed, pages as usize * 8)
            .map_err(|e| format!("volume {id}: its map does not decompress ({e})"))?;
        if raw.len() as u64 != pages * 8 {
            return Err(format!("volume {id}: a map of {} bytes", raw.len()));
        }
        let mut map = LocMap::new(pages);
        for (lpn, w) in raw.chunks_exact(8).enumerate() {
            let loc = Loc(u64_(w));
            if !loc.is_none() && (loc.offset() == 0 || loc.bytes() == 0) {
                return Err(format!("volume {id}: page {lpn} maps to no record"));
            }
            map.set(lpn as u64, loc);
        }
        volumes.list.push(Volume {
            id,
            name,
            kind,
            parent,
            created_seq,
            map,
        });
    }
    if volumes.list.first().map(|v| (v.id, v.kind)) != Some((DEVICE_VOLUME, VolumeKind::Device)) {
        return Err("the device's volume is not first".into());
    }
    // Live bytes, each shared record once.
    for at in 0..volumes.list.len() {
        let mapped: Vec<(u64, Loc)> = volumes.list[at].map.mapped().collect();
        for (lpn, loc) in mapped {
            let first = volumes.list[..at].iter().all(|v| v.map.get(lpn) != loc);
            if first {
                *volumes.live_bytes.entry(loc.segment()).or_default() += loc.bytes() as u64;
            }
        }
    }
    Ok(Checkpoint {
        at: Position {
            segment,
            offset: offset as usize,
            seq,
        },
        model_entries,
        volumes,
    })
}

/// The file locked while a directory is open.
pub const LOCK_FILE: &str = "lock";

/// The file naming the device a directory was made for.
pub const DEVICE_FILE: &str = "device";

/// The (pages, page bytes) of the device `dir` was made for; None when it has no device file.
pub fn device_geometry(dir: &Path) -> Result<Option<(u64, usize)>, LogError> {
    let path = dir.join(DEVICE_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(cause) => return Err(LogError::Io { path, cause }),
    };
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| damaged(&path, format!("no `{key}=N` line")))
    };
    Ok(Some((field("pages")?, field("page_bytes")? as usize)))
}

/// The position of `dir`'s checkpoint when it verifies (`repair` starts there), else the log's
/// start.
pub fn checkpoint_position(dir: &Path) -> Position {
    let Ok(Some((pages, page_bytes))) = device_geometry(dir) else {
        return Position::START;
    };
    std::fs::read(dir.join(CHECKPOINT_FILE))
        .ok()
        .and_then(|b| decode_checkpoint(&b, pages, page_bytes).ok())
        .map_or(Position::START, |c| c.at)
}

impl DataDir {
    /// Opens `dir` (created when absent and not `read_only`): the checkpoint, the model
    /// archive it counts, then the log after it. Refuses, naming the file, whatever would
    /// serve wrong data: a damaged checkpoint, a missing segment it references, a log that ends
    /// before it, damage before a commit.
    pub fn open(
        dir: &Path,
        pages: u64,
        page_bytes: usize,
        read_only: bool,
        segment_bytes: usize,
    ) -> Result<(DataDir, Opened), LogError> {
        if !read_only {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock = if read_only {
            File::open(&lock_path).ok()
        } else {
            Some(
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&lock_path)
                    .map_err(io(&lock_path))?,
            )
        };
        if let Some(f) = &lock {
            let locked = if read_only {
                f.try_lock_shared()
            } else {
                f.try_lock()
            };
            if locked.is_err() {
                return Err(damaged(
                    dir,
                    "in use by another ftlab (a running `serve --data`? snapshots go through its \
                     control socket)",
                ));
            }
        }
        match device_geometry(dir)? {
            Some(made) if made != (pages, page_bytes) => {
                return Err(damaged(
                    &dir.join(DEVICE_FILE),
                    format!(
                        "the directory holds a device of {} pages of {} bytes \
                         (capacity.logical_bytes={}, flash.page_size_bytes={}), not {pages} of \
                         {page_bytes}: serve it with that configuration",
                        made.0,
                        made.1,
                        made.0 * made.1 as u64,
                        made.1
                    ),
                ))
            }
            Some(_) => {}
            None if read_only => {}
            None => {
                let path = dir.join(DEVICE_FILE);
                let tmp = dir.join(format!("{DEVICE_FILE}.tmp"));
                let mut f = File::create(&tmp).map_err(io(&tmp))?;
                write!(f, "ftlab device\npages={pages}\npage_bytes={page_bytes}\n")
                    .and_then(|_| f.sync_all())
                    .map_err(io(&tmp))?;
                std::fs::rename(&tmp, &path).map_err(io(&path))?;
                sync_dir(dir)?;
            }
        }
        let ck_path = dir.join(CHECKPOINT_FILE);
        let checkpoint = match std::fs::read(&ck_path) {
            Ok(bytes) => Some(
                decode_checkpoint(&bytes, pages, page_bytes)
                    .map_err(|why| damaged(&ck_path, why))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(cause) => {
                return Err(LogError::Io {
                    path: ck_path,
                    cause,
                })
            }
        };
        let (at, model_entries, mut volumes) = match checkpoint {
            Some(c) => (c.at, c.model_entries, c.volumes),
            None => (Position::START, 0, Volumes::new(pages)),
        };
        // Every segment the checkpoint references must be there.
        let present = segment_indices(dir).unwrap_or_default();
        for &segment in volumes.live_bytes.keys() {
            if segment < at.segment && present.binary_search(&segment).is_err() {
                return Err(damaged(
                    &segment_path(dir, segment),
                    "missing, and the checkpoint maps pages to it",
                ));
            }
        }
        // The model's archive, up to what the checkpoint counts.
        let model_path = dir.join(MODEL_FILE);
        let mut requests = Vec::new();
        let mut model_len = log::SEGMENT_HEADER_BYTES as u64;
        match std::fs::read(&model_path) {
            Ok(bytes) => {
                let scan =
                    log::scan_segment(&bytes, 0, 1).map_err(|why| damaged(&model_path, why))?;
                if (scan.records.len() as u64) < model_entries {
                    return Err(damaged(
                        &model_path,
                        format!(
                            "{} requests verify where the checkpoint counts {model_entries}",
                            scan.records.len()
                        ),
                    ));
                }
                for r in &scan.records[..model_entries as usize] {
                    requests.push(ModelRequest::of(r).map_err(|why| damaged(&model_path, why))?);
                    model_len = (r.offset + r.bytes) as u64;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && model_entries == 0 => {}
            Err(cause) => {
                return Err(LogError::Io {
                    path: model_path,
                    cause,
                })
            }
        }
        let archived = requests.len();
        let recovered = recover_from(dir, at, &mut |r: &Record| {
            if r.kind == Kind::Request {
                requests.push(ModelRequest::of(r)?);
            }
            // The segment: where the scan is (records of a segment come together).
            volumes.apply(r, r.segment)
        })?;
        let pending = requests[archived..].to_vec();
        let tail = log::tail_position(&recovered);
        let writer = if read_only {
            None
        } else {
            Some(LogWriter::resume(dir, tail, segment_bytes)?)
        };
        let files = Arc::new(SegmentFiles {
            dir: dir.to_path_buf(),
            open: Mutex::default(),
        });
        let opened = Opened {
            requests,
            replayed_records: recovered.replayed,
            checkpoint_seq: at.seq - 1,
            dropped_bytes: recovered.dropped_bytes,
            dropped_why: recovered.dropped_why,
        };
        let mut data = DataDir {
            dir: dir.to_path_buf(),
            page_bytes,
            writer,
            volumes,
            pending,
            model_entries,
            model_len,
            checkpoint_at: at,
            files,
            stats: DiskStats::default(),
            _lock: lock,
        };
        data.refresh_disk_stats();
        Ok((data, opened))
    }

    fn writer(&mut self) -> &mut LogWriter {
        self.writer
            .as_mut()
            .expect("a read-only directory is never written")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn read_only(&self) -> bool {
        self.writer.is_none()
    }

    /// Appends a page of `volume` (the device: 0).
    pub fn write_page(&mut self, volume: u16, lpn: u64, page: &[u8]) -> Result<(), LogError> {
        let (codec, payload) = log::pack_page(page);
        self.write_packed(volume, lpn, page.len(), codec, &payload)
    }

    /// As `write_page`, the page packed already (`log::pack_page`, outside the lock).
    pub fn write_packed(
        &mut self,
        volume: u16,
        lpn: u64,
        page_bytes: usize,
        codec: u8,
        payload: &[u8],
    ) -> Result<(), LogError> {
        let at = self
            .volumes
            .index(volume)
            .ok_or_else(|| damaged(&self.dir, format!("volume {volume} does not exist")))?;
        let (_, loc) = self
            .writer()
            .append_volume(Kind::Page, codec, volume, lpn, 0, payload)?;
        self.volumes.set(at, lpn, loc);
        self.stats.client_bytes += page_bytes as u64;
        Ok(())
    }

    /// Appends a trim of `pages` pages of `volume` from `lpn`.
    pub fn trim(&mut self, volume: u16, lpn: u64, pages: u64) -> Result<(), LogError> {
        let at = self
            .volumes
            .index(volume)
            .ok_or_else(|| damaged(&self.dir, format!("volume {volume} does not exist")))?;
        let end = lpn + pages;
        let mut first = lpn;
        // A trim record covers at most u32::MAX pages; longer trims take several.
        while first < end {
            let n = (end - first).min(u64::from(u32::MAX));
            self.writer()
                .append_volume(Kind::Trim, 0, volume, first, n as u32, &[])?;
            first += n;
        }
        for l in lpn..end {
            self.volumes.set(at, l, Loc::NONE);
        }
        Ok(())
    }

    /// Appends a request the FTL model saw.
    pub fn request(&mut self, r: ModelRequest) -> Result<(), LogError> {
        self.writer().append_volume(
            Kind::Request,
            r.op,
            0,
            r.offset_bytes,
            r.length_bytes,
            &r.payload(),
        )?;
        self.pending.push(r);
        Ok(())
    }

    /// Makes everything appended durable: a commit record and `fdatasync`. Returns the last
    /// sequence number it covers.
    pub fn commit(&mut self) -> Result<u64, LogError> {
        self.writer().commit()
    }

    /// The last sequence number appended.
    pub fn last_seq(&self) -> u64 {
        self.writer
            .as_ref()
            .map_or(self.checkpoint_at.seq - 1, |w| w.last_seq())
    }

    pub fn volumes(&self) -> Vec<VolumeInfo> {
        self.volumes.infos()
    }

    pub fn volume_named(&self, name: &str) -> Option<(u16, VolumeKind)> {
        self.volumes.by_name(name).map(|v| (v.id, v.kind))
    }

    /// The device's pages, each with where it is in the log, in log order (to load them
    /// segment by segment).
    pub fn device_pages(&self) -> Vec<(Loc, u64)> {
        self.volume_pages(DEVICE_VOLUME)
    }

    /// As `device_pages`, for volume `id` (none when it does not exist).
    pub fn volume_pages(&self, id: u16) -> Vec<(Loc, u64)> {
        let Some(v) = self.volumes.get(id) else {
            return Vec::new();
        };
        let mut pages: Vec<(Loc, u64)> = v.map.mapped().map(|(lpn, loc)| (loc, lpn)).collect();
        pages.sort_unstable();
        pages
    }

    /// Reads the records at `pages` (sorted by `Loc`), each segment read once, and hands each
    /// page to `visit`.
    pub fn load_pages(
        &self,
        pages: &[(Loc, u64)],
        visit: &mut PageVisitor,
    ) -> Result<(), LogError> {
        let mut page = vec![0u8; self.page_bytes];
        let mut k = 0;
        while k < pages.len() {
            let segment = pages[k].0.segment();
            let path = segment_path(&self.dir, segment);
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            while k < pages.len() && pages[k].0.segment() == segment {
                let (loc, lpn) = pages[k];
                let bad = |why: String| {
                    damaged(&path, format!("the record at byte {}: {why}", loc.offset()))
                };
                let r = bytes
                    .get(loc.offset()..loc.offset() + loc.bytes())
                    .ok_or_else(|| bad("beyond the end of the segment".into()))
                    .and_then(|b| log::decode_any(b).map_err(bad))?;
                if r.kind != Kind::Page || r.lpn != lpn {
                    return Err(bad(format!(
                        "a {:?} record of page {}, where page {lpn} was mapped",
                        r.kind, r.lpn
                    )));
                }
                let p = r
                    .page(self.page_bytes)
                    .ok_or_else(|| bad("does not decode to a page".into()))?;
                page.copy_from_slice(&p);
                visit(lpn, &page).map_err(bad)?;
                k += 1;
            }
        }
        Ok(())
    }

    /// Where `volume`'s page `lpn` is, to read outside the lock; None: unmapped (zeros).
    pub fn locate(&mut self, volume: u16, lpn: u64) -> Result<Option<Located>, LogError> {
        let v = self
            .volumes
            .get(volume)
            .ok_or_else(|| damaged(&self.dir, format!("volume {volume} does not exist")))?;
        let loc = v.map.get(lpn);
        if loc.is_none() {
            return Ok(None);
        }
        // The record may still be pending in the writer.
        if let Some(w) = self.writer.as_mut().filter(|w| w.pending_at(loc)) {
            w.flush()?;
        }
        Ok(Some(Located {
            file: self.files.file(loc.segment())?,
            loc,
            path: segment_path(&self.dir, loc.segment()),
        }))
    }

    /// Makes a snapshot (read-only) or clone (writable) of volume `parent` (None: the device)
    /// named `name`: a record and a commit, no data copied. Returns its id.
    pub fn create_volume(
        &mut self,
        parent: Option<&str>,
        name: &str,
        kind: VolumeKind,
    ) -> Result<u16, String> {
        if name.is_empty()
            || name.len() > 200
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "`{name}`: a snapshot name is 1 to 200 of A-Z a-z 0-9 - _ ."
            ));
        }
        if self.volumes.by_name(name).is_some() {
            return Err(format!("`{name}` exists already"));
        }
        let parent = match parent {
            None => DEVICE_VOLUME,
            Some(p) => {
                self.volumes
                    .by_name(p)
                    .ok_or_else(|| format!("no snapshot or clone `{p}`"))?
                    .id
            }
        };
        if kind == VolumeKind::Device {
            return Err("a device is not made".into());
        }
        let id = self.volumes.next_id;
        if id == u16::MAX || self.volumes.list.len() >= MAX_VOLUMES {
            return Err(format!(
                "{} snapshots and clones exist, or 65534 were ever made: delete some first",
                self.volumes.list.len() - 1
            ));
        }
        let codec = u8::from(kind == VolumeKind::Clone);
        let e = |e: LogError| e.to_string();
        let (seq, loc) = self
            .writer()
            .append_volume(
                Kind::Volume,
                codec,
                id,
                u64::from(parent),
                0,
                name.as_bytes(),
            )
            .map_err(e)?;
        let record = Record {
            kind: Kind::Volume,
            codec,
            volume: id,
            lpn: u64::from(parent),
            seq,
            pages: 0,
            payload: name.as_bytes().to_vec(),
            offset: loc.offset(),
            bytes: loc.bytes(),
            segment: loc.segment(),
        };
        self.volumes.apply(&record, loc.segment())?;
        self.commit().map_err(e)?;
        Ok(id)
    }

    /// Deletes a snapshot or clone: its records die unless another volume maps them.
    pub fn delete_volume(&mut self, name: &str) -> Result<(), String> {
        let id = self
            .volumes
            .by_name(name)
            .ok_or_else(|| format!("no snapshot or clone `{name}`"))?
            .id;
        // Its children share records by LPN, not through it: they keep theirs.
        let e = |e: LogError| e.to_string();
        let (seq, loc) = self
            .writer()
            .append_volume(Kind::Unvolume, 0, id, 0, 0, &[])
            .map_err(e)?;
        let record = Record {
            kind: Kind::Unvolume,
            codec: 0,
            volume: id,
            lpn: 0,
            seq,
            pages: 0,
            payload: Vec::new(),
            offset: loc.offset(),
            bytes: loc.bytes(),
            segment: loc.segment(),
        };
        self.volumes.apply(&record, loc.segment())?;
        self.commit().map_err(e)?;
        Ok(())
    }

    /// Writes a checkpoint: commits the log, archives the model's requests since the last one
    /// in `model.log` (synced), then replaces `checkpoint` atomically.
    pub fn checkpoint(&mut self) -> Result<(), LogError> {
        self.commit()?;
        let at = self.writer().position();
        // The model's archive: cut back to what the checkpoint on disk counts (a crash may have
        // left more), then append.
        let model_path = self.dir.join(MODEL_FILE);
        let model = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&model_path)
            .map_err(io(&model_path))?;
        let mut buf = Vec::new();
        if self.model_entries == 0 {
            buf.extend_from_slice(&log::segment_header(0));
        }
        model
            .set_len(if self.model_entries == 0 {
                0
            } else {
                self.model_len
            })
            .map_err(io(&model_path))?;
        for (k, r) in self.pending.iter().enumerate() {
            buf.extend_from_slice(&log::encode(
                Kind::Request,
                r.op,
                r.offset_bytes,
                self.model_entries + 1 + k as u64,
                r.length_bytes,
                &r.payload(),
            ));
        }
        let start = if self.model_entries == 0 {
            0
        } else {
            self.model_len
        };
        model
            .write_all_at(&buf, start)
            .and_then(|_| model.sync_data())
            .map_err(io(&model_path))?;
        let ck = Checkpoint {
            at,
            model_entries: self.model_entries + self.pending.len() as u64,
            volumes: self.volumes.clone(),
        };
        let bytes = encode_checkpoint(&ck, self.page_bytes);
        let tmp = self.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let path = self.dir.join(CHECKPOINT_FILE);
        {
            let mut f = File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(&bytes)
                .and_then(|_| f.sync_all())
                .map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        sync_dir(&self.dir)?;
        self.model_len = start + buf.len() as u64;
        self.model_entries = ck.model_entries;
        self.pending.clear();
        self.checkpoint_at = at;
        self.stats.checkpoints += 1;
        self.stats.checkpoint_bytes += bytes.len() as u64;
        self.stats.model_bytes += buf.len() as u64;
        Ok(())
    }

    /// Bytes appended to the log since the last checkpoint.
    pub fn since_checkpoint_bytes(&self) -> u64 {
        let w = self
            .writer
            .as_ref()
            .map_or(self.checkpoint_at, |w| w.position());
        let per = log::MAX_SEGMENT_BYTES as u64;
        (w.segment * per + w.offset as u64)
            .saturating_sub(self.checkpoint_at.segment * per + self.checkpoint_at.offset as u64)
    }

    /// Cleans: segments wholly before the checkpoint whose live records fill at most
    /// `max_live_fraction` of them have those records copied to the log's end; then a
    /// checkpoint, then every segment before it no volume maps is deleted. Returns the
    /// segments deleted.
    pub fn clean(&mut self, max_live_fraction: f64) -> Result<u64, LogError> {
        let candidates: Vec<u64> = segment_indices(&self.dir)?
            .into_iter()
            .filter(|&s| s < self.checkpoint_at.segment)
            .collect();
        let mut copied_any = false;
        for &segment in &candidates {
            let path = segment_path(&self.dir, segment);
            let len = std::fs::metadata(&path).map_err(io(&path))?.len();
            let live = self.volumes.live_bytes.get(&segment).copied().unwrap_or(0);
            if live == 0 || live as f64 > max_live_fraction * len as f64 {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let scan = scan_segment_from(&bytes, segment, log::SEGMENT_HEADER_BYTES, None)
                .map_err(|why| damaged(&path, why))?;
            for r in scan.records.iter().filter(|r| r.kind == Kind::Page) {
                let old = Loc::new(segment, r.offset, r.bytes);
                let holders: Vec<usize> = (0..self.volumes.list.len())
                    .filter(|&v| {
                        r.lpn < self.volumes.pages && self.volumes.list[v].map.get(r.lpn) == old
                    })
                    .collect();
                let Some(&first) = holders.first() else {
                    continue;
                };
                let volume = self.volumes.list[first].id;
                let (_, new) = self.writer().append_volume(
                    Kind::Page,
                    r.codec,
                    volume,
                    r.lpn,
                    0,
                    &r.payload,
                )?;
                self.stats.cleaner_copied_bytes += new.bytes() as u64;
                for v in holders {
                    self.volumes.set(v, r.lpn, new);
                }
                copied_any = true;
            }
        }
        let dead: Vec<u64> = candidates
            .iter()
            .copied()
            .filter(|s| self.volumes.live_bytes.get(s).copied().unwrap_or(0) == 0)
            .collect();
        if dead.is_empty() && !copied_any {
            return Ok(0);
        }
        // Durable before anything is deleted: no checkpoint on disk may reference a deleted
        // segment.
        self.checkpoint()?;
        for &segment in &dead {
            let path = segment_path(&self.dir, segment);
            std::fs::remove_file(&path).map_err(io(&path))?;
            self.files.forget(segment);
            self.volumes.live_bytes.remove(&segment);
        }
        sync_dir(&self.dir)?;
        self.stats.cleaned_segments += dead.len() as u64;
        Ok(dead.len() as u64)
    }

    fn refresh_disk_stats(&mut self) {
        let mut disk = 0;
        let mut segments = 0;
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("seg-") && name.ends_with(".log") {
                    segments += 1;
                }
                if name.starts_with("seg-") || name == CHECKPOINT_FILE || name == MODEL_FILE {
                    disk += e.metadata().map_or(0, |m| m.len());
                }
            }
        }
        self.stats.segments = segments;
        self.stats.disk_bytes = disk;
    }

    /// The host disk's account.
    pub fn disk_stats(&mut self) -> DiskStats {
        self.refresh_disk_stats();
        let mut s = self.stats.clone();
        s.live_bytes = self.volumes.live_bytes.values().sum();
        s.log_bytes = self.writer.as_ref().map_or(0, |w| w.appended_bytes());
        let written = s.log_bytes + s.checkpoint_bytes + s.model_bytes;
        s.host_waf = if s.client_bytes > 0 {
            written as f64 / s.client_bytes as f64
        } else {
            0.0
        };
        s
    }

    /// Checks every volume's map against the log: each mapped record reads back, verifies and
    /// is a page of its LPN. Returns the records checked.
    pub fn verify(&self) -> Result<u64, LogError> {
        let mut checked = 0;
        for v in &self.volumes.list {
            let mut pages: Vec<(Loc, u64)> = v.map.mapped().map(|(l, p)| (p, l)).collect();
            pages.sort_unstable();
            self.load_pages(&pages, &mut |_, _| {
                checked += 1;
                Ok(())
            })?;
        }
        Ok(checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const PAGES: u64 = 64;
    const PAGE: usize = 512;
    const SEGMENT: usize = 4096;

    fn open(dir: &Path) -> (DataDir, Opened) {
        DataDir::open(dir, PAGES, PAGE, false, SEGMENT).unwrap()
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
            prop_assert_eq!(d.verify().unwrap(), oracle[""].len() as u64);
        }
    }

    /// The model's requests come back in order after a checkpoint and a crash: archived ones
    /// from `model.log`, later ones from the log.
    #[test]
    fn the_models_requests_survive_checkpoints_and_crashes() {
        let dir = tempfile::tempdir().unwrap();
        let (mut d, _) = open(dir.path());
        let req = |i: u64| ModelRequest {
            op: (i % 4) as u8,
            offset_bytes: i * 4096,
            length_bytes: 4096,
            arrival_ns: i * 1000,
            reclaim_group: 0,
            handle: (i % 3) as u8,
        };
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
        let e = DataDir::open(early.path(), PAGES, PAGE, true, SEGMENT)
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
        let e = DataDir::open(later.path(), PAGES, PAGE, true, SEGMENT)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("checkpoint") && e.contains("checksum"), "{e}");
        bytes[40] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        std::fs::remove_file(log::segment_path(later.path(), 0)).unwrap();
        let e = DataDir::open(later.path(), PAGES, PAGE, true, SEGMENT)
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
        let c = Checkpoint {
            at: Position::START,
            model_entries: 0,
            volumes: Volumes::new(PAGES),
        };
        let mut bytes = encode_checkpoint(&c, PAGE);
        assert!(decode_checkpoint(&bytes, PAGES, PAGE).is_ok());
        // The device volume's packed map length: after the 68-byte header, id, kind, parent,
        // name length (no name) and created_seq.
        let at = 68 + 2 + 1 + 2 + 2 + 8;
        bytes[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let n = bytes.len() - 8;
        let sum = twox_hash::XxHash3_64::oneshot(&bytes[..n]);
        bytes[n..].copy_from_slice(&sum.to_le_bytes());
        let e = decode_checkpoint(&bytes, PAGES, PAGE).err().unwrap();
        assert!(e.contains("inside a field"), "{e}");
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
    }
}
