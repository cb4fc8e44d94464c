//! Plain database names when ftlab is the default VFS with a device root
//! ([`crate::PlainNames::Under`]): a program that opens `app.db` expects a file there, one that
//! deleting removes, one that cannot be made in a missing directory or over a directory, and
//! one that a read-only open does not create. So the name gets a small marker file at its path,
//! made by ftlab, naming a generation; the database itself lives on the device directory
//! `ROOT/<name escaped>/<generation>`. A program that deletes `app.db` and opens it again gets
//! a new marker, so a new generation: an empty database, as on a file system (the old
//! generation's directory is removed then, being ftlab's own under the root).

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The marker's first line; its second is the generation (hex digits).
const MARKER: &str = "ftlab-sqlite device marker 1";
/// More than a marker ever holds: a longer file is not one.
const MARKER_MAX_BYTES: u64 = 256;

#[derive(Debug, thiserror::Error)]
pub(crate) enum PlainError {
    /// No file by that name, and the open may not create one (SQLite's CANTOPEN, quietly: a
    /// program may look before it leaps).
    #[error("no such database")]
    Missing,
    #[error("a directory")]
    IsDirectory,
    #[error(
        "holds a file ftlab did not make (a database on the host's file system? open it with \
         vfs=unix); left alone"
    )]
    NotOurs,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PlainError + '_ {
    move |source| PlainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The device directory for the database at `path` (absolute, as `xFullPathname` made it; its
/// bytes as SQLite gave them, UTF-8 or not), making its marker when `create` and none is there.
pub(crate) fn device_dir(root: &Path, path: &Path, create: bool) -> Result<PathBuf, PlainError> {
    let generation = match read_marker(path)? {
        Some(g) => g,
        None if !create => return Err(PlainError::Missing),
        None => match make_marker(path) {
            Ok(g) => g,
            // Another process made it first: theirs holds.
            Err(PlainError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                read_marker(path)?.ok_or(PlainError::Missing)?
            }
            Err(e) => return Err(e),
        },
    };
    let parent = crate::device_dir_for_bytes(root, path.as_os_str().as_bytes());
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    // Earlier generations (the file was deleted and made again since) are gone for the
    // program: their devices go too. Only names a generation could have are touched.
    for entry in std::fs::read_dir(&parent).map_err(io(&parent))? {
        let entry = entry.map_err(io(&parent))?;
        let old = entry.file_name();
        let is_generation = old.to_str().is_some_and(is_generation_name);
        if is_generation && old.to_str() != Some(generation.as_str()) {
            // Failing to remove an old device costs disk space, never the new database.
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                eprintln!("ftlab sqlite: {}: {e}", entry.path().display());
            }
        }
    }
    Ok(parent.join(generation))
}

fn is_generation_name(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The marker's generation, `None` if there is no file at `path`.
fn read_marker(path: &Path) -> Result<Option<String>, PlainError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    if meta.is_dir() {
        return Err(PlainError::IsDirectory);
    }
    if !meta.is_file() || meta.len() > MARKER_MAX_BYTES {
        return Err(PlainError::NotOurs);
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MARKER_MAX_BYTES).read_to_string(&mut text))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => PlainError::NotOurs,
            _ => io(path)(e),
        })?;
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(MARKER), Some(g)) if is_generation_name(g) => Ok(Some(g.to_string())),
        _ => Err(PlainError::NotOurs),
    }
}

/// Makes the marker (never over an existing file), durable with its directory entry before
/// the database it names can hold anything.
fn make_marker(path: &Path) -> Result<String, PlainError> {
    let generation = new_generation();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io(path))?;
    let written = f
        .write_all(format!("{MARKER}\n{generation}\n").as_bytes())
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(path);
        return Err(io(path)(e));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    ftlab_core::atomic_file::sync_dir(dir).map_err(io(dir))?;
    Ok(generation)
}

/// 128 bits no other marker has: the time, the process, a counter, mixed (SplitMix64's
/// finaliser), so two markers made by one process in one nanosecond still differ.
fn new_generation() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let a = mix(nanos ^ (u64::from(std::process::id()) << 40));
    let b = mix(a ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ nanos.rotate_left(17));
    format!("{a:016x}{b:016x}")
}
