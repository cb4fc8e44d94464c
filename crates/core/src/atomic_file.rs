//! The one way ftlab replaces a file: written whole beside it, then renamed over it.
//!
//! **The fsync rule.** The new contents are synced (`fsync`) before the rename, and the
//! directory after it. So at every moment, a crash included, the path holds either its old
//! contents whole or its new contents whole, never an empty or a torn file (a rename without
//! the first sync may reach the disk before the data), and once [`AtomicFile::commit`] returns
//! the new contents survive a crash (without the second sync the rename itself may be lost).
//! Every file ftlab replaces (reports, `--stats`, `--pidfile`, `--image`, exported images, the
//! durable store's checkpoint and device file, sweep reports and tables) goes through here, so
//! there is one rule to reason about; its price, two syncs per replacement, is paid only by
//! files written once per run or per checkpoint, never per request.
//!
//! The file beside is `PATH.tmp` (`disk.img` -> `disk.img.tmp`: it never touches another of the
//! user's files), or with [`AtomicFile::create_unique`] `PATH.PID.N.tmp`, for paths that several
//! writers may replace at once (a sweep's workers). A replacement dropped before its commit
//! removes the file beside; the path keeps what it held. A rename that fails leaves the new
//! contents, whole and synced, beside.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A step of a replacement that failed, naming the file it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}: {cause}", path.display())]
pub struct AtomicFileError {
    /// What was being done: "creating", "writing", "syncing", "renaming to" or "syncing the
    /// directory".
    pub action: &'static str,
    /// The file the step failed on (the file beside for the writes, the path for the rename).
    pub path: PathBuf,
    pub cause: std::io::Error,
}

/// A replacement of `path` in progress: write into [`file`](Self::file), then
/// [`commit`](Self::commit).
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

/// Where a replacement of `path` writes first: `path` plus `.tmp`.
pub fn tmp_path_beside(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    name.into()
}

impl AtomicFile {
    /// Starts replacing `path`, creating (or truncating) `PATH.tmp`.
    pub fn create(path: &Path) -> Result<Self, AtomicFileError> {
        Self::create_at(path, tmp_path_beside(path))
    }

    /// Starts replacing `path` through a file beside named for this process and replacement
    /// (`PATH.PID.N.tmp`), for paths that other writers may replace at the same time.
    pub fn create_unique(path: &Path) -> Result<Self, AtomicFileError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut name = path.as_os_str().to_owned();
        name.push(format!(
            ".{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        Self::create_at(path, name.into())
    }

    fn create_at(path: &Path, tmp: PathBuf) -> Result<Self, AtomicFileError> {
        let file = File::create(&tmp).map_err(|cause| AtomicFileError {
            action: "creating",
            path: tmp.clone(),
            cause,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            file: Some(file),
        })
    }

    /// The file beside, to write the new contents into (sequentially or at offsets).
    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("a file until its commit")
    }

    /// Where the new contents are written until the commit.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Appends `bytes` to the new contents; an error names the file beside.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), AtomicFileError> {
        let tmp = self.tmp.clone();
        self.file()
            .write_all(bytes)
            .map_err(|cause| AtomicFileError {
                action: "writing",
                path: tmp,
                cause,
            })
    }

    /// Makes the new contents the path's, by the module's fsync rule: the file synced, renamed
    /// over the path, the directory synced.
    pub fn commit(mut self) -> Result<(), AtomicFileError> {
        let file = self.file.take().expect("committed once");
        file.sync_all().map_err(|cause| AtomicFileError {
            action: "syncing",
            path: self.tmp.clone(),
            cause,
        })?;
        drop(file);
        if let Err(cause) = std::fs::rename(&self.tmp, &self.path) {
            // The new contents, whole and synced, may be the only copy of them (an image saved
            // from memory): they stay beside.
            self.tmp = PathBuf::new();
            return Err(AtomicFileError {
                action: "renaming to",
                path: self.path.clone(),
                cause,
            });
        }
        // Renamed: nothing beside is left to remove.
        self.tmp = PathBuf::new();
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        sync_dir(dir).map_err(|cause| AtomicFileError {
            action: "syncing the directory",
            path: dir.to_path_buf(),
            cause,
        })
    }
}

impl AtomicFile {
    /// Gives the replacement up but keeps the file beside (what could be saved of an image
    /// with unreadable pages, for the user to look at): the path keeps what it held.
    pub fn keep_beside(mut self) -> PathBuf {
        self.file.take();
        std::mem::take(&mut self.tmp)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // Not committed (an error, or a caller giving up): the path keeps what it held.
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Replaces `path` with `bytes`, by the module's fsync rule.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), AtomicFileError> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)?;
    file.commit()
}

/// Syncs a directory, so that the names created, renamed or removed in it survive a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_replaces_the_file_and_leaves_nothing_beside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        std::fs::write(&path, "old").unwrap();
        write_atomically(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only the file itself: {names:?}");
    }

    #[test]
    fn a_replacement_dropped_before_its_commit_keeps_the_old_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, "old").unwrap();
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"half of the new").unwrap();
        assert_eq!(file.tmp_path(), dir.path().join("disk.img.tmp"));
        assert!(file.tmp_path().exists());
        drop(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert!(!dir.path().join("disk.img.tmp").exists());
    }

    #[test]
    fn unique_replacements_of_one_path_do_not_share_a_file_beside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("point.json");
        let mut a = AtomicFile::create_unique(&path).unwrap();
        let mut b = AtomicFile::create_unique(&path).unwrap();
        assert_ne!(a.tmp_path(), b.tmp_path());
        a.write_all(b"a").unwrap();
        b.write_all(b"b").unwrap();
        a.commit().unwrap();
        b.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b");
    }

    #[test]
    fn a_failed_step_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("stats.json");
        let e = write_atomically(&path, b"x").unwrap_err();
        assert_eq!(e.action, "creating");
        assert!(e.to_string().contains("stats.json.tmp"), "{e}");
    }
}
