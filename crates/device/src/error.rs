//! Why a device could not start, load, save or finish.

use crate::budget;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Config(#[from] ftlab_core::config::ConfigError),
    #[error("{0}")]
    Export(String),
    #[error("device log: {0}")]
    Log(String),
    #[error(transparent)]
    Memory(#[from] ftlab_core::memory::MemoryError),
    #[error(transparent)]
    Store(#[from] ftlab_store::StoreError),
    #[error(transparent)]
    Ftl(#[from] ftlab_core::ftl::FtlError),
    #[error(
        "--max-inflight-bytes {0}: must be at least {min} bytes (33M): one request of the \
         largest size ({largest} bytes) must fit",
        min = budget::MIN_INFLIGHT_BYTES,
        largest = crate::MAX_REQUEST_BYTES
    )]
    InflightBudget(u64),
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    /// A file the device reads or writes (the image, the record file).
    #[error("{}: {cause}", path.display())]
    File {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "{}: {len} bytes, larger than the {export_bytes}-byte export (size the device with --set \
         capacity.logical_bytes={len})",
        path.display()
    )]
    ImageTooLarge {
        path: std::path::PathBuf,
        len: u64,
        export_bytes: u64,
    },
    #[error(
        "{}: {len} bytes, smaller than the {export_bytes}-byte export (a truncated image?); \
         give --grow-image to take it with the rest read as zeros{}",
        path.display(),
        if *len > 0 {
            format!(", or size the device with --set capacity.logical_bytes={len}")
        } else {
            String::new()
        }
    )]
    ImageTooSmall {
        path: std::path::PathBuf,
        len: u64,
        export_bytes: u64,
    },
    #[error("{}: {len} bytes, not a whole number of {page_bytes}-byte pages", path.display())]
    ImageNotWholePages {
        path: std::path::PathBuf,
        len: u64,
        page_bytes: usize,
    },
    #[error(
        "--image: this process may write files of at most {limit_bytes} bytes (ulimit -f), and \
         the image of this device takes {image_bytes} bytes"
    )]
    FileSizeLimit { limit_bytes: u64, image_bytes: u64 },
    #[error("--image: cannot create {}: {cause}", tmp.display())]
    CannotCreate {
        tmp: std::path::PathBuf,
        cause: std::io::Error,
    },
    /// The save could not write its temporary file: `path` keeps what it held.
    #[error(
        "{}: the device was not saved ({} left as it was{}): {what} {}: {cause}",
        path.display(),
        path.display(),
        if *removed { format!(", the incomplete {} removed", tmp.display()) } else { String::new() },
        tmp.display()
    )]
    NotSaved {
        path: std::path::PathBuf,
        tmp: std::path::PathBuf,
        /// "creating" or "writing".
        what: &'static str,
        /// The incomplete temporary file was removed.
        removed: bool,
        cause: std::io::Error,
    },
    /// Pages that failed their checksums are zeros in the image, left at `tmp`.
    #[error(
        "{}: {} page(s) could not be read and are zeros in the image saved as {} ({} left as it \
         was): {}",
        path.display(),
        unreadable.len(),
        tmp.display(),
        path.display(),
        name_some(unreadable)
    )]
    Unreadable {
        path: std::path::PathBuf,
        tmp: std::path::PathBuf,
        unreadable: Vec<ftlab_store::StoreError>,
    },
    #[error("record file: {0}")]
    Record(String),
    /// A request's execution panicked (a bug in ftlab): the model was left as it was.
    #[error("the device failed: {why}{}", record.as_ref().map(|e| format!("; {e}")).unwrap_or_default())]
    Failed {
        why: String,
        record: Option<Box<DeviceError>>,
    },
}

/// The first 16 errors, and how many more.
fn name_some(errors: &[ftlab_store::StoreError]) -> String {
    const NAMED: usize = 16;
    let mut named: Vec<String> = errors.iter().take(NAMED).map(|e| e.to_string()).collect();
    if errors.len() > NAMED {
        named.push(format!("and {} more", errors.len() - NAMED));
    }
    named.join("; ")
}

/// Why a snapshot or clone was not made or deleted.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("snapshots need a durable device (serve --data DIR)")]
    NotDurable,
    #[error("the device is read-only")]
    ReadOnly,
    #[error(
        "`{name}` is in use by {connections} connection(s): disconnect them first (deleting it \
         under them would fail their later requests)"
    )]
    InUse { name: String, connections: u32 },
    #[error(transparent)]
    Durable(#[from] ftlab_store::durable::DurableError),
}
