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

/// The FTL model's saved state: the owner's bytes (`DataDir::checkpoint_with_model`) and the
/// count of model requests it covers, checksummed. The bytes are zstd-compressed (level 1): a
/// model's reverse map of mostly unwritten flash shrinks some fortyfold.
pub const MODEL_STATE_FILE: &str = "model.state";
const MODEL_STATE_MAGIC: &[u8; 8] = b"FTLABMST";
/// The header: magic, version, codec (0 raw, 1 zstd), requests covered, payload length.
const MODEL_STATE_HEADER_BYTES: usize = 32;
const CODEC_RAW: u32 = 0;
const CODEC_ZSTD: u32 = 1;

/// A model's saved state compressed (`PackedModel::pack`), which an owner makes before it
/// takes the directory's lock.
pub struct PackedModel {
    raw_len: u64,
    frame: Vec<u8>,
}

impl PackedModel {
    pub fn pack(state: &[u8]) -> PackedModel {
        PackedModel {
            raw_len: state.len() as u64,
            frame: zstd::bulk::compress(state, 1).expect("zstd compresses any bytes in memory"),
        }
    }
}

pub(super) fn encode_model_state(covered: u64, state: &PackedModel) -> Vec<u8> {
    // The raw length first, then the frame: what a reader may allocate is known before it
    // decompresses.
    let payload_len = 8 + state.frame.len();
    let mut out = Vec::with_capacity(payload_len + MODEL_STATE_HEADER_BYTES + 8);
    out.extend_from_slice(MODEL_STATE_MAGIC);
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&CODEC_ZSTD.to_le_bytes());
    out.extend_from_slice(&covered.to_le_bytes());
    out.extend_from_slice(&(payload_len as u64).to_le_bytes());
    out.extend_from_slice(&state.raw_len.to_le_bytes());
    out.extend_from_slice(&state.frame);
    let sum = twox_hash::XxHash3_64::oneshot(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// `model.state` read back: (requests covered, the owner's bytes), or why not. Never panics.
pub(super) fn read_model_state(path: &Path) -> Result<Option<(u64, Vec<u8>)>, String> {
    let mut bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let bad = |why: &str| Err(format!("{}: {why}", path.display()));
    if bytes.len() < MODEL_STATE_HEADER_BYTES + 8 || &bytes[..8] != MODEL_STATE_MAGIC {
        return bad("not an ftlab model state");
    }
    let n = bytes.len() - 8;
    if twox_hash::XxHash3_64::oneshot(&bytes[..n]).to_le_bytes() != bytes[n..] {
        return bad("checksum mismatch");
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if u32_at(8) != 1 {
        return bad("a version this ftlab does not read");
    }
    let codec = u32_at(12);
    let covered = u64_at(16);
    let len = u64_at(24);
    if len != (n - MODEL_STATE_HEADER_BYTES) as u64 {
        return bad("a length that is not the file's");
    }
    bytes.truncate(n);
    let payload = bytes.split_off(MODEL_STATE_HEADER_BYTES);
    match codec {
        CODEC_RAW => Ok(Some((covered, payload))),
        CODEC_ZSTD if payload.len() >= 8 => {
            let raw_len = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
            // Read as it decompresses, never past the length written: a damaged length costs
            // no more memory than the frame really holds.
            let mut state = Vec::new();
            let decoder = zstd::stream::read::Decoder::new(&payload[8..])
                .map_err(|e| format!("{}: {e}", path.display()))?;
            std::io::Read::read_to_end(&mut std::io::Read::take(decoder, raw_len + 1), &mut state)
                .map_err(|e| format!("{}: not a whole zstd frame: {e}", path.display()))?;
            if state.len() as u64 != raw_len {
                return bad("a decompressed length that is not the one written");
            }
            Ok(Some((covered, state)))
        }
        _ => bad("a codec this ftlab does not read"),
    }
}

/// What the model is rebuilt from, and where the archive stands (`DataDir::open`).
pub(super) struct Chosen {
    pub(super) state: Option<Vec<u8>>,
    /// The requests to replay after `state` (all, without one).
    pub(super) requests: Vec<ModelRequest>,
    pub(super) damage: Option<String>,
    /// The directory's account: requests logged since the checkpoint still to archive, the
    /// requests before `model.log`'s first, those in it and the byte they end at.
    pub(super) pending: Vec<ModelRequest>,
    pub(super) base: u64,
    pub(super) entries: u64,
    pub(super) len_bytes: u64,
}

/// Chooses how the model is rebuilt: from its saved state `state` (covering that many requests)
/// and the requests after it, when they are all known; else from every request known. Requests
/// are numbered from the first the model ever took: `model.log` holds `counted` of them from
/// `base` (`archive`, what of them verifies), the log after the checkpoint `tail` from
/// `base + counted`.
pub(super) fn choose(
    state: Result<Option<(u64, Vec<u8>)>, String>,
    base: u64,
    counted: u64,
    archive: Archive,
    tail: Vec<ModelRequest>,
) -> Chosen {
    let header = log::SEGMENT_HEADER_BYTES as u64;
    let kept = archive.requests.len() as u64;
    let tail_base = base + counted;
    let tail_end = tail_base + tail.len() as u64;
    let mut note = None;
    match state {
        // It covers the archive and part of the tail (a crash came between the state and the
        // checkpoint after it, or none did): `model.log` is not needed.
        Ok(Some((n, bytes))) if (tail_base..=tail_end).contains(&n) => {
            let after = tail[(n - tail_base) as usize..].to_vec();
            return Chosen {
                state: Some(bytes),
                requests: after.clone(),
                damage: None,
                pending: after,
                base: n,
                entries: 0,
                len_bytes: header,
            };
        }
        // It covers part of the archive: the rest of it and the tail follow.
        Ok(Some((n, bytes))) if n >= base && n - base <= kept => {
            let mut requests = archive.requests[(n - base) as usize..].to_vec();
            requests.extend_from_slice(&tail);
            return Chosen {
                state: Some(bytes),
                requests,
                damage: archive.damage,
                pending: tail,
                base,
                entries: kept,
                len_bytes: archive.len_bytes,
            };
        }
        Ok(Some((n, _))) => {
            note = Some(format!(
                "covers {n} requests where the archive and the log hold {base}..{tail_end}"
            ))
        }
        Ok(None) => {}
        Err(why) => note = Some(why),
    }
    let mut damage = archive.damage;
    if base > 0 {
        let lost = format!(
            "the model's saved state ({MODEL_STATE_FILE}) {}: the {base} requests before \
             model.log's first are known only to it",
            note.as_deref().unwrap_or("is missing")
        );
        damage = Some(match damage {
            Some(d) => format!("{lost}; {d}"),
            None => lost,
        });
    }
    let mut requests = archive.requests;
    requests.extend_from_slice(&tail);
    Chosen {
        state: None,
        requests,
        damage,
        pending: tail,
        base,
        entries: kept,
        len_bytes: archive.len_bytes,
    }
}
