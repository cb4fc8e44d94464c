//! A durable device directory: the device log (`log/`) plus what makes it a device. Owns the
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
//! - `model.state`: the FTL model's whole state, saved with a checkpoint (`model_log.rs`).
//! - `model.log`: the FTL model's requests after that state, up to the checkpoint (appended
//!   before the checkpoint is replaced), so that the model is rebuilt exactly: the state
//!   restored, then every later request replayed in order with its arrival time: the same
//!   report as without a crash. A damaged state or archive costs the model's exactness, never
//!   the data: the model is rebuilt from what verifies (`Opened::model_damage`).
//!
//! Snapshots share records with their parent: a snapshot is a copy of a map whose chunks are
//! shared until written (`LocMap`), so creating one copies no data and a pointer per 1024 pages.
//! A record is live while any volume maps its LPN to it; the cleaner never frees a live record,
//! and a segment is deleted only after a checkpoint that no longer references it is durable.

use crate::log::{
    self, recover_from, scan_segment_from, segment_indices, segment_path, sync_dir, Kind, Loc,
    LogError, LogWriter, Position, Record,
};
use ftlab_core::atomic_file::{write_atomically, AtomicFileError};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub const CHECKPOINT_FILE: &str = "checkpoint";
pub const MODEL_FILE: &str = "model.log";
const CHECKPOINT_MAGIC: &[u8; 8] = b"FTLABCKP";
/// Written; version 1 (every volume's whole map) is still read.
const CHECKPOINT_VERSION: u32 = 2;
/// Pages per chunk of a volume's map: the unit shared between a snapshot and its parent.
const CHUNK_PAGES: usize = 1024;
/// The device itself: volume 0.
pub const DEVICE_VOLUME: u16 = 0;
/// Volumes at most, the device included: a checkpoint's reader allocates a map per volume.
pub const MAX_VOLUMES: usize = 1024;

mod checkpoint;
mod cleaner;
mod error;
mod loc_map;
mod model_log;
pub mod offline;
mod salvage;
mod space;
mod volumes;

use checkpoint::decode_checkpoint;

pub use checkpoint::decode_checkpoint_bytes;
pub use error::{CheckpointDamage, DurableError, ReplayError};
pub use loc_map::LocMap;
pub use model_log::{model_op, ModelRequest, PackedModel, MODEL_STATE_FILE};
pub use salvage::{DamagedPage, Verified};
pub use volumes::{check_volume_name, Volume, VolumeInfo, VolumeKind, Volumes, NAME_RULE};

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
    /// The FTL model's saved state (`checkpoint_with_model`), when there is one: restore it,
    /// then replay `requests`.
    pub model_state: Option<Vec<u8>>,
    /// Every request the FTL model saw after its saved state (all of them without one), in
    /// order: replay them to rebuild it.
    pub requests: Vec<ModelRequest>,
    /// Log records read after the checkpoint.
    pub replayed_records: u64,
    /// The checkpoint's sequence number (0: none).
    pub checkpoint_seq: u64,
    pub dropped_bytes: u64,
    pub dropped_why: Option<String>,
    /// Why the model's archive (`model.log`) was not whole: the model is rebuilt from the
    /// requests that verify and those logged after the checkpoint (`requests`), so its report
    /// differs from an uninterrupted run's; the data is served all the same. A writable open
    /// writes the archive anew.
    pub model_damage: Option<String>,
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
    /// The record's bytes, when it is still pending because the disk is full: reads go on.
    pending: Option<Vec<u8>>,
}

impl Located {
    /// Where the record is: records never change once written, so this names its bytes.
    pub fn loc(&self) -> Loc {
        self.loc
    }

    /// Reads and verifies the record, and decodes its page into `out`.
    pub fn read_page(&self, out: &mut [u8]) -> Result<(), LogError> {
        let bad = |why: &dyn std::fmt::Display| LogError::BadSegment {
            path: self.path.clone(),
            why: format!("the record at byte {}: {why}", self.loc.offset()),
        };
        let bytes = match &self.pending {
            Some(b) => b.clone(),
            None => {
                let mut bytes = vec![0u8; self.loc.bytes()];
                self.file
                    .read_exact_at(&mut bytes, self.loc.offset() as u64)
                    .map_err(|cause| LogError::Io {
                        path: self.path.clone(),
                        cause,
                    })?;
                bytes
            }
        };
        let r = log::decode_any(&bytes).map_err(|why| bad(&why))?;
        let page = r
            .page(out.len())
            .ok_or_else(|| bad(&"does not decode to a page"))?;
        out.copy_from_slice(&page);
        Ok(())
    }
}

/// Called with each page loaded (its LPN and bytes); its error (writing the page out) ends the
/// load as `LogError::Visit`.
pub type PageVisitor<'a> = dyn FnMut(u64, &[u8]) -> std::io::Result<()> + 'a;

/// How a directory is opened: the device it holds, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirOptions {
    /// The device's logical pages and their size (a directory made for another is refused).
    pub pages: u64,
    pub page_bytes: usize,
    /// Nothing is written, not even a torn tail cut; the lock is shared.
    pub read_only: bool,
    /// A segment is closed and the next begun past this size.
    pub segment_bytes: usize,
}

impl DirOptions {
    /// Writable, with 32 MiB segments.
    pub fn new(pages: u64, page_bytes: usize) -> Self {
        Self {
            pages,
            page_bytes,
            read_only: false,
            segment_bytes: 32 << 20,
        }
    }

    /// The same, read-only.
    pub fn read_only(self) -> Self {
        Self {
            read_only: true,
            ..self
        }
    }
}

/// A durable device's directory, open.
pub struct DataDir {
    dir: PathBuf,
    page_bytes: usize,
    /// None: opened read-only (nothing is written, not even a torn tail cut).
    writer: Option<LogWriter>,
    volumes: Volumes,
    /// Requests since the checkpoint, archived in `model.log` at the next.
    pending: Vec<ModelRequest>,
    /// The model's requests before `model.log`'s first: those `model.state` covers.
    model_base: u64,
    /// Requests in `model.log` the checkpoint counts, and the bytes they end at.
    model_entries: u64,
    model_len: u64,
    checkpoint_at: Position,
    files: Arc<SegmentFiles>,
    stats: DiskStats,
    /// The disk's free space as last seen (`space.rs`).
    space: space::Space,
    /// The directory itself, locked (exclusively when writable, shared when read-only) while
    /// open (`lock_dir`): two processes never write one directory.
    _lock: File,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> LogError + '_ {
    move |cause| LogError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// A replacement (the checkpoint, the device file) that failed, naming its file.
fn atomic(e: AtomicFileError) -> LogError {
    LogError::Io {
        path: e.path,
        cause: e.cause,
    }
}

fn damaged(path: &Path, why: impl std::fmt::Display) -> LogError {
    LogError::Damaged {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Locks `dir` itself (its own inode, through a descriptor of the directory): exclusively for a
/// writer, shared for a reader. A lock file beside the data (as `DIR/lock` was) is undone by an
/// `rm`, after which a second server opened the log and overwrote the first one's records; a
/// directory cannot be unlinked while it holds files, and one made anew is another inode with
/// another log. flock(2) (std's `File::try_lock`) is released when the process dies, so a crash
/// leaves nothing to clean up.
fn lock_dir(dir: &Path, read_only: bool) -> Result<File, LogError> {
    let f = File::open(dir).map_err(io(dir))?;
    let locked = if read_only {
        f.try_lock_shared()
    } else {
        f.try_lock()
    };
    match locked {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(damaged(
            dir,
            if read_only {
                "in use by a writer (a running `serve --data`? snapshots go through its control \
                 socket; stop it to check or export offline)"
            } else {
                "in use by another ftlab (a running `serve --data`? snapshots go through its \
                 control socket)"
            },
        )),
        Err(std::fs::TryLockError::Error(cause)) => Err(LogError::Io {
            path: dir.to_path_buf(),
            cause,
        }),
    }
}

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
    /// before it, damage before a commit. A damaged model archive is not among them: it is
    /// `Opened::model_damage`.
    pub fn open(dir: &Path, options: &DirOptions) -> Result<(DataDir, Opened), LogError> {
        let DirOptions {
            pages,
            page_bytes,
            read_only,
            segment_bytes,
        } = *options;
        if !read_only {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let lock = lock_dir(dir, read_only)?;
        let made = device_geometry(dir)?;
        match made {
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
            // Written below, once the directory is known to hold this device: a refused start
            // must not leave a device file naming the geometry it was refused for.
            _ => {}
        }
        let present = segment_indices(dir).unwrap_or_default();
        let ck_path = dir.join(CHECKPOINT_FILE);
        let checkpoint = match std::fs::read(&ck_path) {
            Ok(bytes) => Some(
                decode_checkpoint(&bytes, pages, page_bytes)
                    .map_err(|why| damaged(&ck_path, why))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The cleaner deletes segments only after a checkpoint: a log that does not
                // start at its first segment had one, and cannot be rebuilt without it.
                if let Some(&first) = present.first().filter(|&&f| f > 0) {
                    return Err(damaged(
                        &ck_path,
                        format!(
                            "missing, and the log starts at segment {first:016x} (the earlier \
                             ones were cleaned after a checkpoint): the device cannot be \
                             rebuilt without it; restore it from a backup"
                        ),
                    ));
                }
                None
            }
            Err(cause) => {
                return Err(LogError::Io {
                    path: ck_path,
                    cause,
                })
            }
        };
        if made.is_none() && checkpoint.is_none() && !present.is_empty() {
            // A log with neither a device file nor a checkpoint: nothing says which device it
            // holds, and a wrong guess would misread every record.
            return Err(damaged(
                &dir.join(DEVICE_FILE),
                "missing, and the directory holds a log: nothing else records the device's \
                 geometry; write it back (`ftlab device`, `pages=N`, `page_bytes=N` lines) or \
                 restore it from a backup",
            ));
        }
        let (at, model_base, model_entries, mut volumes) = match checkpoint {
            Some(c) => (c.at, c.model_base, c.model_entries, c.volumes),
            None => (Position::START, 0, 0, Volumes::new(pages)),
        };
        // Every segment the checkpoint references must be there.
        for &segment in volumes.live_bytes.keys() {
            if segment < at.segment && present.binary_search(&segment).is_err() {
                return Err(damaged(
                    &segment_path(dir, segment),
                    "missing, and the checkpoint maps pages to it",
                ));
            }
        }
        // The model's archive, up to what the checkpoint counts; what of it is damaged costs
        // the model's exactness, never the data.
        let archive = model_log::read_archive(&dir.join(MODEL_FILE), model_entries);
        let mut tail_requests = Vec::new();
        let recovered = recover_from(dir, at, &mut |r: &Record| {
            if r.kind == Kind::Request {
                tail_requests.push(ModelRequest::of(r)?);
            }
            // The segment: where the scan is (records of a segment come together).
            volumes.apply(r, r.segment)
        })?;
        let model = model_log::choose(
            model_log::read_model_state(&dir.join(MODEL_STATE_FILE)),
            model_base,
            model_entries,
            archive,
            tail_requests,
        );
        // The directory holds this device (the checkpoint, if any, said the same geometry).
        if made.is_none() && !read_only {
            write_atomically(
                &dir.join(DEVICE_FILE),
                format!("ftlab device\npages={pages}\npage_bytes={page_bytes}\n").as_bytes(),
            )
            .map_err(atomic)?;
        }
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
            requests: model.requests,
            model_state: model.state,
            replayed_records: recovered.replayed,
            checkpoint_seq: at.seq - 1,
            dropped_bytes: recovered.dropped_bytes,
            dropped_why: recovered.dropped_why,
            model_damage: model.damage,
        };
        let mut data = DataDir {
            dir: dir.to_path_buf(),
            page_bytes,
            writer,
            volumes,
            pending: model.pending,
            model_base: model.base,
            model_entries: model.entries,
            model_len: model.len_bytes,
            checkpoint_at: at,
            files,
            stats: DiskStats::default(),
            space: space::Space::default(),
            _lock: lock,
        };
        // A damaged archive is written anew at once (what verified, then what the log holds
        // after the checkpoint), so the next start finds it whole.
        // The damaged file is copied to `model.log.damaged` first (nothing is deleted).
        let mut opened = opened;
        if let Some(why) = opened.model_damage.as_mut().filter(|_| !read_only) {
            let model = dir.join(MODEL_FILE);
            let aside = dir.join(format!("{MODEL_FILE}.damaged"));
            match std::fs::copy(&model, &aside) {
                Ok(_) => *why += &format!("; its copy is {}", aside.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => *why += &format!("; not copied aside ({e})"),
            }
            // From now on the archive is the model's whole history: a restart rebuilds from it
            // what this open did (an owner that has the model saves it at once, as the device
            // does). The saved state, damaged or not, is set aside.
            let state = dir.join(MODEL_STATE_FILE);
            let state_aside = dir.join(format!("{MODEL_STATE_FILE}.damaged"));
            if state.exists() {
                std::fs::rename(&state, &state_aside).map_err(io(&state))?;
            }
            data.model_base = 0;
            data.checkpoint()?;
        }
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

    /// Whether the log waits for disk space: the last write failed, changes are refused
    /// (`ENOSPC`) until one succeeds, reads go on.
    pub fn stalled(&self) -> bool {
        self.writer.as_ref().is_some_and(LogWriter::stalled)
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
        self.room_for_change()?;
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
        self.room_for_change()?;
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

    /// `commit` in halves (`LogWriter::commit_begin`): the `fdatasync` is the ticket's, run
    /// without this directory's lock, so that writes are not held up behind it.
    pub fn commit_begin(&mut self) -> Result<(u64, log::SyncTicket), LogError> {
        self.writer().commit_begin()
    }

    /// The end of `commit_begin`'s commit, with its ticket's sync result.
    pub fn commit_end(&mut self, synced: std::io::Result<()>) -> Result<(), LogError> {
        self.writer().commit_end(synced)
    }

    /// The last sequence number appended.
    pub fn last_seq(&self) -> u64 {
        self.writer
            .as_ref()
            .map_or(self.checkpoint_at.seq - 1, |w| w.last_seq())
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
        // The record may still be pending in the writer; if the disk is too full to write
        // it, it is read from memory.
        let mut pending = None;
        if let Some(w) = self.writer.as_mut().filter(|w| w.pending_at(loc)) {
            if w.flush().is_err() {
                pending = w.pending_record(loc).map(<[u8]>::to_vec);
            }
        }
        Ok(Some(Located {
            file: self.files.file(loc.segment())?,
            loc,
            path: segment_path(&self.dir, loc.segment()),
            pending,
        }))
    }
}

#[cfg(test)]
mod tests;
