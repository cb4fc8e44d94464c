//! The archive of the FTL model's requests: each as the model took it, so that a replay
//! rebuilds the model exactly.

use super::*;

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
    pub(super) fn payload(&self) -> [u8; 10] {
        let mut p = [0u8; 10];
        p[..8].copy_from_slice(&self.arrival_ns.to_le_bytes());
        p[8] = self.reclaim_group;
        p[9] = self.handle;
        p
    }

    pub(super) fn of(r: &Record) -> Result<ModelRequest, ReplayError> {
        if r.payload.len() != 10 {
            return Err(ReplayError::RequestBytes(r.payload.len()));
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

/// The model's archive as read at open: the requests that verify, up to what the checkpoint
/// counts, and what was wrong with it.
pub(super) struct Archive {
    pub(super) requests: Vec<ModelRequest>,
    /// The byte the last request kept ends at (the next checkpoint appends there).
    pub(super) len_bytes: u64,
    /// Why fewer requests than the checkpoint counts were read: the model is rebuilt from those
    /// that verify and what the log holds after the checkpoint, and differs from an
    /// uninterrupted run's. The data does not depend on it: it is served whatever this says.
    pub(super) damage: Option<String>,
}

/// Reads `path` (`model.log`) up to the `counted` requests the checkpoint counts. Never fails
/// on what the file holds: a missing, short or damaged archive keeps the requests before the
/// damage and says why in `damage` (it only decides the model's report, never the data's).
pub(super) fn read_archive(path: &Path, counted: u64) -> Archive {
    let header = log::SEGMENT_HEADER_BYTES as u64;
    let mut archive = Archive {
        requests: Vec::new(),
        len_bytes: header,
        damage: None,
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && counted == 0 => return archive,
        Err(e) => {
            archive.damage = Some(format!("{}: {e}", path.display()));
            return archive;
        }
    };
    let scan = match log::scan_segment(&bytes, 0, 1) {
        Ok(s) => s,
        Err(why) => {
            // Not even its header: nothing of it is kept, and the next checkpoint writes it anew.
            if counted > 0 || !bytes.is_empty() {
                archive.damage = Some(format!("{}: {why}", path.display()));
            }
            return archive;
        }
    };
    for r in scan.records.iter().take(counted as usize) {
        match ModelRequest::of(r) {
            Ok(m) => {
                archive.requests.push(m);
                archive.len_bytes = (r.offset + r.bytes) as u64;
            }
            Err(why) => {
                archive.damage = Some(format!(
                    "{}: request {} at byte {}: {why}",
                    path.display(),
                    archive.requests.len() + 1,
                    r.offset
                ));
                return archive;
            }
        }
    }
    let kept = archive.requests.len() as u64;
    if kept < counted {
        let why = match &scan.stopped {
            Some((at, why)) => format!(" (the record at byte {at}: {why})"),
            None => " (the file ends there)".to_string(),
        };
        archive.damage = Some(format!(
            "{}: {kept} requests verify where the checkpoint counts {counted}{why}",
            path.display()
        ));
    }
    archive
}
