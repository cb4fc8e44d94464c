//! Raw images: loaded into the store and the model at start (`--image`), saved at the end,
//! written beside and renamed so that a failed save leaves the old image whole.

use crate::{Device, DeviceError};
use ftlab_core::atomic_file::{tmp_path_beside, AtomicFile};
use ftlab_core::request::{Op, Request as FtlRequest};
use std::io::{Read, Write};

impl Device {
    /// Loads a raw image (as `save_image` writes it) into the store, and into the FTL model as
    /// writes whose counters are then cleared: the session's figures cover client I/O only.
    /// All-zero pages are not stored. Returns the pages loaded.
    ///
    /// The image must be the export's size; with `grow` a smaller one (an empty file included)
    /// is taken and the pages past its end read as zeros. A truncated image is otherwise
    /// refused: its missing part would read as zeros and the next save would make that loss
    /// permanent.
    pub fn load_image(&self, path: &std::path::Path, grow: bool) -> Result<u64, DeviceError> {
        let in_file = |cause| DeviceError::File {
            path: path.to_path_buf(),
            cause,
        };
        let mut file = std::fs::File::open(path).map_err(in_file)?;
        let len = file.metadata().map_err(in_file)?.len();
        let path = path.to_path_buf();
        let export_bytes = self.size_bytes;
        if len > export_bytes {
            return Err(DeviceError::ImageTooLarge {
                path,
                len,
                export_bytes,
            });
        }
        if len < export_bytes && !grow {
            return Err(DeviceError::ImageTooSmall {
                path,
                len,
                export_bytes,
            });
        }
        if len % self.page_bytes as u64 != 0 {
            return Err(DeviceError::ImageNotWholePages {
                path,
                len,
                page_bytes: self.page_bytes,
            });
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let chunk_pages = 256;
        let mut buf = vec![0u8; chunk_pages * self.page_bytes];
        let mut loaded = 0u64;
        let mut lpn = 0u64;
        let total = len / self.page_bytes as u64;
        while lpn < total {
            let n = (total - lpn).min(chunk_pages as u64) as usize;
            let bytes = &mut buf[..n * self.page_bytes];
            file.read_exact(bytes).map_err(|cause| DeviceError::File {
                path: path.clone(),
                cause,
            })?;
            for (i, page) in bytes.chunks(self.page_bytes).enumerate() {
                if page.iter().all(|&b| b == 0) {
                    continue;
                }
                let l = lpn + i as u64;
                self.store.write(l, page)?;
                let request = FtlRequest {
                    arrival_ns: 0,
                    op: Op::Write,
                    offset_bytes: l * self.page_bytes as u64,
                    length_bytes: self.page_bytes as u64,
                    placement: ftlab_core::request::Placement::default(),
                };
                state.ftl.submit(&request, 0)?;
                loaded += 1;
            }
            lpn += n as u64;
        }
        state.ftl.flush(0);
        state.ftl.reset_stats();
        Ok(loaded)
    }

    /// Fails unless `save_image(path)` will be able to create its file and make it the export's
    /// size (the process's file-size limit, `ulimit -f`, allows it): checked at start, so a
    /// mistyped directory or a low limit is reported before clients write data that could not
    /// be saved.
    pub fn check_image_writable(&self, path: &std::path::Path) -> Result<(), DeviceError> {
        #[cfg(target_os = "linux")]
        {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit(2) writes the struct it is given.
            let ok = unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } == 0;
            if ok && limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < self.size_bytes {
                return Err(DeviceError::FileSizeLimit {
                    limit_bytes: limit.rlim_cur,
                    image_bytes: self.size_bytes,
                });
            }
        }
        let tmp = tmp_path_beside(path);
        let existed = tmp.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&tmp)
            .map_err(|cause| DeviceError::CannotCreate {
                tmp: tmp.clone(),
                cause,
            })?;
        if !existed {
            let _ = std::fs::remove_file(&tmp);
        }
        Ok(())
    }

    /// Writes every page to `path` as a raw image the size of the export (zero pages as holes).
    ///
    /// A page that fails its checksum does not stop the save (the other pages are the clients'
    /// data): the image is written whole with that page as zeros, left beside `path` as
    /// `PATH.tmp` (an earlier image at `path` is kept), and the error names such LPNs (the first 16).
    ///
    /// A write that fails (a full disk) removes the incomplete `PATH.tmp` and says so; `path`
    /// keeps what it held.
    pub fn save_image(&self, path: &std::path::Path) -> Result<(), DeviceError> {
        let _state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let tmp = tmp_path_beside(path);
        let not_saved = |what, removed, cause| DeviceError::NotSaved {
            path: path.to_path_buf(),
            tmp: tmp.clone(),
            what,
            removed,
            cause,
        };
        // Only a file this save created is removed when it fails.
        let mut file =
            AtomicFile::create(path).map_err(|e| not_saved("creating", false, e.cause))?;
        let mut unreadable = Vec::new();
        if let Err(e) = self.write_image(file.file(), &mut unreadable) {
            drop(file);
            return Err(not_saved("writing", true, e));
        }
        if !unreadable.is_empty() {
            return Err(DeviceError::Unreadable {
                path: path.to_path_buf(),
                tmp: file.keep_beside(),
                unreadable,
            });
        }
        file.commit().map_err(|e| match e.action {
            "syncing" => not_saved("writing", true, e.cause),
            _ => DeviceError::File {
                path: e.path,
                cause: e.cause,
            },
        })
    }

    /// Writes every readable page to `file` (at `tmp`); pages that fail their checksum are collected in
    /// `unreadable` and left as holes.
    fn write_image(
        &self,
        file: &mut std::fs::File,
        unreadable: &mut Vec<ftlab_store::StoreError>,
    ) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        file.set_len(self.size_bytes)?;
        let mut page = vec![0u8; self.page_bytes];
        for lpn in 0..self.size_bytes / self.page_bytes as u64 {
            if let Err(e) = self.store.read(lpn, &mut page) {
                // The error names the LPN.
                unreadable.push(e);
                continue;
            }
            if page.iter().any(|&b| b != 0) {
                file.seek(SeekFrom::Start(lpn * self.page_bytes as u64))
                    .and_then(|_| file.write_all(&page))?;
            }
        }
        Ok(())
    }
}
