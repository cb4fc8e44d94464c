//! The writer: records appended to the last segment (buffered, one write(2) a MiB), a commit
//! and `fdatasync` when a FLUSH must be durable, a new segment past the segment size; a failed
//! write cut back to the last whole record, a failed sync the end of appending.

use super::*;
use std::fs::OpenOptions;
use std::sync::Arc;

/// Appends records to the last segment of a directory, starting a new segment past
/// `segment_bytes`.
pub struct LogWriter {
    dir: PathBuf,
    /// Shared with a [`SyncTicket`], which syncs it outside the caller's lock.
    file: Arc<File>,
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
            file: Arc::new(file),
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
        if let Err(cause) = (&*self.file).write_all(&self.pending) {
            self.stalled = true;
            use std::io::Seek;
            let cut = self.file.set_len(start).and_then(|()| {
                (&*self.file)
                    .seek(std::io::SeekFrom::Start(start))
                    .map(drop)
            });
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

    /// A commit in two halves, for a caller whose lock guards this writer: here (under the
    /// lock) the commit record is appended and everything written to the file; the ticket's
    /// `sync` (outside it, while other records go on being appended) is the `fdatasync`; then
    /// [`LogWriter::commit_end`] (under the lock again) says whether the commit holds. One
    /// ticket at a time: a caller serialises its syncs (see `commit_end` for why).
    pub fn commit_begin(&mut self) -> Result<(u64, SyncTicket), LogError> {
        let seq = self.append(Kind::Commit, 0, 0, 0, &[])?;
        self.flush()?;
        let ticket = SyncTicket {
            file: Arc::clone(&self.file),
            #[cfg(test)]
            fail: std::mem::take(&mut self.fail_next_sync),
        };
        Ok((seq, ticket))
    }

    /// The end of a commit begun by `commit_begin`, with its ticket's `sync` result. A failed
    /// sync breaks the writer, as in `commit`. A successful one holds only if no other sync of
    /// this writer failed meanwhile (a segment's roll syncs the same file): Linux reports a
    /// write-back error to one sync of a file, so the other may return success over pages
    /// the kernel dropped; the writer broken by that one says so here.
    pub fn commit_end(&mut self, synced: std::io::Result<()>) -> Result<(), LogError> {
        match synced {
            Err(cause) => {
                self.broken = true;
                Err(LogError::SyncFailed {
                    path: segment_path(&self.dir, self.index),
                    cause,
                })
            }
            Ok(()) if self.broken => Err(self.broken_error()),
            Ok(()) => Ok(()),
        }
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
        self.file = Arc::new(file);
        self.index = index;
        self.bytes = SEGMENT_HEADER_BYTES;
        self.appended_bytes += SEGMENT_HEADER_BYTES as u64;
        Ok(())
    }
}

/// The `fdatasync` half of a commit (`LogWriter::commit_begin`), to run outside the lock that
/// guards the writer.
pub struct SyncTicket {
    file: Arc<File>,
    #[cfg(test)]
    fail: bool,
}

impl SyncTicket {
    /// `fdatasync` of the segment the commit record went to: durable then are the commit and
    /// everything before it (earlier segments were synced when they were closed).
    pub fn sync(&self) -> std::io::Result<()> {
        #[cfg(test)]
        if self.fail {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.sync_data()
    }
}

/// Makes a directory's entries (a new segment) durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    ftlab_core::atomic_file::sync_dir(dir).map_err(|cause| LogError::Io {
        path: dir.to_path_buf(),
        cause,
    })
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
