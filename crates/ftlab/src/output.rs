//! Files named on the command line for results (`--json`, `--csv`): opened before the work
//! that fills them, so that a path that cannot be written fails in the first second, not after
//! a run of minutes. An existing file is replaced only when its new contents are ready: a run
//! that fails leaves the old report as it was (and removes a file it created).

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct Output {
    path: PathBuf,
    file: std::fs::File,
    /// This run created the file, which holds nothing yet.
    created_empty: bool,
}

impl Output {
    /// Opens `path` for writing, without truncating it; `what` names it in errors ("the JSON
    /// report").
    pub fn open(path: &Path, what: &str) -> Result<Output> {
        let existed = path.exists();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("cannot write {what} to {}", path.display()))?;
        Ok(Output {
            path: path.to_path_buf(),
            file,
            created_empty: !existed,
        })
    }

    /// Opens it when given.
    pub fn open_some(path: Option<&Path>, what: &str) -> Result<Option<Output>> {
        path.map(|p| Output::open(p, what)).transpose()
    }

    /// Replaces the file's contents with `bytes`.
    pub fn write(mut self, bytes: &[u8]) -> Result<()> {
        let context = || format!("writing {}", self.path.display());
        self.file.set_len(0).with_context(context)?;
        self.file.write_all(bytes).with_context(context)?;
        self.created_empty = false;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.created_empty {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
