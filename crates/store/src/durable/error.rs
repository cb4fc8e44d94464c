//! What can go wrong on a durable device's directory, typed: what a record replayed or a
//! checkpoint read says that the directory cannot take, and why a volume was not made or
//! deleted. Each variant's message is the one a person reads, naming the value at fault; the
//! file is named by the `LogError` that carries it.

use super::MAX_VOLUMES;
use crate::log::LogError;

/// A valid record whose content the directory cannot apply (damage, or a directory made for
/// another device).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("volume {0} does not exist")]
    NoVolume(u16),
    #[error("page {lpn} is beyond this device's {pages} pages (another --set capacity?)")]
    PageBeyond { lpn: u64, pages: u64 },
    #[error("trim beyond this device's {pages} pages")]
    TrimBeyond { pages: u64 },
    #[error("parent volume {0} does not exist")]
    NoParent(u64),
    #[error("a volume name that is not UTF-8")]
    NameNotUtf8,
    #[error("volume {id} (`{name}`) exists already")]
    VolumeExists { id: u16, name: String },
    #[error("more than {MAX_VOLUMES} volumes")]
    TooManyVolumes,
    #[error("the device's own volume cannot be deleted")]
    DeviceVolumeDeleted,
    #[error("a request record of {0} bytes")]
    RequestBytes(usize),
}

/// Why a checkpoint's bytes are not a checkpoint of this device.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointDamage {
    #[error("not an ftlab checkpoint")]
    NotACheckpoint,
    #[error("checksum mismatch")]
    Checksum,
    #[error("ends at byte {body} inside a field of {field} bytes")]
    Truncated { body: usize, field: usize },
    #[error("version {found} (this ftlab reads {reads})")]
    Version { found: u32, reads: u32 },
    #[error(
        "a device of {pages} pages of {page_bytes} bytes, not {want_pages} of {want_page_bytes} \
         (another --set capacity or flash.page_size_bytes?)"
    )]
    OtherDevice {
        pages: u64,
        page_bytes: u64,
        want_pages: u64,
        want_page_bytes: usize,
    },
    #[error("a position of byte {offset}, sequence {seq}")]
    Position { offset: u64, seq: u64 },
    #[error("{0} volumes (at most {MAX_VOLUMES})")]
    TooManyVolumes(u16),
    #[error("volume {id}: kind {kind}")]
    VolumeKind { id: u16, kind: u8 },
    #[error("volume {0}: a name that is not UTF-8")]
    NameNotUtf8(u16),
    #[error("volume {id}: its map does not decompress ({why})")]
    MapCompression { id: u16, why: String },
    #[error("volume {id}: a map of {bytes} bytes")]
    MapBytes { id: u16, bytes: usize },
    #[error("volume {id}: page {lpn} maps to no record")]
    NoRecord { id: u16, lpn: usize },
    #[error("the device's volume is not first")]
    DeviceNotFirst,
    #[error("{0} distinct map chunks (more than every volume's maps hold)")]
    Chunks(usize),
    #[error("map chunk {chunk}: does not decompress ({why})")]
    ChunkCompression { chunk: usize, why: String },
    #[error("volume {id}: map chunk {chunk} does not exist")]
    NoChunk { id: u16, chunk: u32 },
}

/// Why a snapshot or clone was not made or deleted.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("`{name:?}`: a snapshot or clone name is {rule}", name = .0, rule = super::volumes::NAME_RULE)]
    BadName(String),
    #[error("`{0}` exists already")]
    Exists(String),
    #[error("no snapshot or clone `{0}`")]
    NoSuch(String),
    #[error("a device is not made")]
    DeviceNotMade,
    #[error("{existing} snapshots and clones exist, the most a device keeps ({max}): delete some first", max = MAX_VOLUMES - 1)]
    Full { existing: usize },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Replay(#[from] ReplayError),
}
