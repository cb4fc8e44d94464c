//! Files named on the command line for results (`--json`, `--csv`): opened before the work
//! that fills them, so that a path that cannot be written fails in the first second, not after
//! a run of minutes. An existing file is replaced only when its new contents are ready: a run
//! that fails leaves the old report as it was (and creates none), and the new contents are
//! written to `PATH.tmp` and renamed over `PATH`, so that a crash or a full disk while writing
//! never leaves a short report where a whole one was. A path that is not a regular file
//! (`/dev/stdout`, a FIFO) is written in place: renaming over it would replace the device.

use anyhow::{Context, Result};
use ftlab_core::atomic_file::AtomicFile;
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct Output {
    /// What the contents are written to.
    target: Target,
    /// Appended bytes not yet written.
    pending: Vec<u8>,
}

enum Target {
    /// A regular file (or none yet), replaced by `ftlab_core::atomic_file`'s rule once the
    /// contents are whole; dropped uncommitted, it removes its `PATH.tmp`.
    Replace(AtomicFile),
    /// A path that is not a regular file, written in place.
    InPlace { path: PathBuf, file: std::fs::File },
}

impl Output {
    /// Checks that `path` can be written and opens what the contents will go to; `what` names
    /// it in errors ("the JSON report").
    pub fn open(path: &Path, what: &str) -> Result<Output> {
        let cannot = || format!("cannot write {what} to {}", path.display());
        let mut permissions = None;
        // Where the contents end up: a symbolic link's target, so that the link stays.
        let path = match std::fs::metadata(path) {
            Ok(m) => {
                // Written into (or, when regular, replaced): either way it must be writable now.
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .with_context(cannot)?;
                if !m.file_type().is_file() {
                    return Ok(Output {
                        target: Target::InPlace {
                            path: path.to_path_buf(),
                            file,
                        },
                        pending: Vec::new(),
                    });
                }
                permissions = Some(m.permissions());
                std::fs::canonicalize(path).with_context(cannot)?
            }
            Err(_) => path.to_path_buf(),
        };
        let replacement = AtomicFile::create(&path).with_context(cannot)?;
        // The replacement keeps the replaced file's mode (a report kept private stays so); made
        // first so that its drop removes the `.tmp` if that fails.
        if let Some(p) = permissions {
            std::fs::set_permissions(replacement.tmp_path(), p).with_context(cannot)?;
        }
        Ok(Output {
            target: Target::Replace(replacement),
            pending: Vec::new(),
        })
    }

    /// Opens it when given.
    pub fn open_some(path: Option<&Path>, what: &str) -> Result<Option<Output>> {
        path.map(|p| Output::open(p, what)).transpose()
    }

    /// Adds `bytes` to the contents being written (a stream, as `--record` writes one);
    /// [`write`](Self::write) then adds the last and makes them the file's.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() >= 1 << 20 {
            self.drain()?;
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        match &mut self.target {
            Target::Replace(file) => file.write_all(&self.pending)?,
            Target::InPlace { path, file } => file
                .write_all(&self.pending)
                .with_context(|| format!("writing {}", path.display()))?,
        }
        self.pending.clear();
        Ok(())
    }

    /// Makes what was appended, then `bytes`, the file's contents.
    pub fn write(mut self, bytes: &[u8]) -> Result<()> {
        self.pending.extend_from_slice(bytes);
        self.drain()?;
        if let Target::Replace(file) = self.target {
            file.commit()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed when the test ends.
    fn dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("ftlab-output-{name}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn the_old_contents_stay_until_the_new_are_whole_and_no_tmp_is_left() {
        let t = dir("replace");
        let d = t.path();
        let path = d.join("r.json");
        std::fs::write(&path, "old").unwrap();
        let out = Output::open(&path, "the report").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        out.write(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["r.json"]);
        // Not written (the run failed): old contents kept, nothing created.
        drop(Output::open(&path, "the report").unwrap());
        drop(Output::open(&d.join("fresh.csv"), "the series").unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 1);
    }

    #[test]
    fn the_replacement_keeps_the_mode_of_the_replaced_file() {
        use std::os::unix::fs::PermissionsExt;
        let t = dir("mode");
        let d = t.path();
        let path = d.join("r.json");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Output::open(&path, "the report")
            .unwrap()
            .write(b"new")
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_symbolic_link_stays_a_link_and_its_target_gets_the_contents() {
        let t = dir("link");
        let d = t.path();
        let target = d.join("target.json");
        std::fs::write(&target, "old").unwrap();
        let link = d.join("link.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        Output::open(&link, "the report")
            .unwrap()
            .write(b"new")
            .unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
    }

    #[test]
    fn a_fifo_is_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let t = dir("fifo");
        let d = t.path();
        let fifo = d.join("out");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(fifo).unwrap())
        };
        Output::open(&fifo, "the report")
            .unwrap()
            .write(b"through")
            .unwrap();
        assert_eq!(reader.join().unwrap(), b"through");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }

    #[test]
    fn an_output_that_cannot_be_written_is_refused_at_open_and_leaves_nothing() {
        let t = dir("refused");
        let d = t.path();
        // Below a regular file: no `.tmp` can be made there, for root either.
        let not_a_dir = d.join("r.json");
        std::fs::write(&not_a_dir, "old").unwrap();
        let err = Output::open(&not_a_dir.join("x.json"), "the report").err();
        assert!(
            err.is_some_and(|e| e.to_string().contains("r.json/x.json")),
            "refused, naming the path"
        );
        // A read-only report (root may write anything, so only others are refused).
        let mut perms = std::fs::metadata(&not_a_dir).unwrap().permissions();
        perms.set_readonly(true);
        std::fs::set_permissions(&not_a_dir, perms).unwrap();
        // SAFETY: geteuid(2) has no preconditions.
        let is_root = unsafe { libc::geteuid() } == 0;
        assert_eq!(Output::open(&not_a_dir, "the report").is_ok(), is_root);
        assert_eq!(std::fs::read_to_string(&not_a_dir).unwrap(), "old");
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 1);
    }
}
