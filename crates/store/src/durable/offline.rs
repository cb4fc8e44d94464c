//! A device directory opened while no server holds it: `ftlab check` (verify, repair) and
//! `ftlab image export|import` (raw images out of and into a directory). The directory's lock
//! keeps these apart from a running server; what they print is the caller's.

use super::{
    checkpoint_position, device_geometry, model_op, DamagedPage, DataDir, DirOptions, ModelRequest,
    Opened, VolumeInfo, DEVICE_FILE,
};
use crate::log::{repair_from, segment_indices, LogError, Repaired};
use ftlab_core::atomic_file::{AtomicFile, AtomicFileError};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Why an offline command did nothing (or, for a check, found damage it did not repair).
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("{}: no `{DEVICE_FILE}` file: not a directory `ftlab serve --data` made", .0.display())]
    NotADevice(PathBuf),
    #[error("{}: no snapshot or clone `{name}`", dir.display())]
    NoVolume { dir: PathBuf, name: String },
    #[error(
        "{}: {bytes} bytes, larger than the device's {device_bytes} (size it with --set \
         capacity.logical_bytes={bytes})",
        file.display()
    )]
    ImageTooLarge {
        file: PathBuf,
        bytes: u64,
        device_bytes: u64,
    },
    #[error("{}: not empty: import makes a new device directory", .0.display())]
    NotEmpty(PathBuf),
    #[error("{}: exists and is not a regular file: not replaced", .0.display())]
    NotARegularFile(PathBuf),
    /// An export that failed part way: `file` keeps what it held.
    #[error("{}: not written: {cause}", file.display())]
    NotWritten {
        file: PathBuf,
        cause: Box<OfflineError>,
    },
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(transparent)]
    Replace(#[from] AtomicFileError),
    #[error(transparent)]
    Log(#[from] LogError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OfflineError + '_ {
    move |cause| OfflineError::Io {
        path: path.to_path_buf(),
        cause,
    }
}

/// Opens `dir`, writable or not, with the geometry its device file names.
pub fn open_offline(dir: &Path, read_only: bool) -> Result<DataDir, OfflineError> {
    let Some((pages, page_bytes)) = device_geometry(dir)? else {
        return Err(OfflineError::NotADevice(dir.to_path_buf()));
    };
    Ok(DataDir::open(
        dir,
        &DirOptions {
            read_only,
            ..DirOptions::new(pages, page_bytes)
        },
    )?
    .0)
}

/// What `ftlab check` found.
#[derive(Debug)]
pub struct Checked {
    /// Segment files in the directory.
    pub segments: usize,
    pub opened: Opened,
    pub volumes: Vec<VolumeInfo>,
    /// Mapped page records read back, each verifying.
    pub verified_pages: u64,
    /// Mapped pages whose records do not verify (each named; reads of them are EIO).
    pub damaged_pages: Vec<DamagedPage>,
    /// With `repair`: the damaged pages it zeroed.
    pub zeroed_pages: Vec<DamagedPage>,
    /// Why the model's archive was not whole, and whether the repair wrote it anew.
    pub model_damage: Option<(String, bool)>,
}

/// Verifies `dir` read-only: every record after the checkpoint by checksum and sequence, every
/// mapped page read back. With `repair`, damage that stops the directory opening is cut (the
/// damaged segment and every later one set aside, never deleted), told to `on_repair` with
/// the damage found, and the check run again.
pub fn check(
    dir: &Path,
    repair: bool,
    on_repair: &mut dyn FnMut(&LogError, &Repaired),
) -> Result<Checked, OfflineError> {
    if !dir.is_dir() {
        return Err(OfflineError::NotADirectory(dir.to_path_buf()));
    }
    let Some((pages, page_bytes)) = device_geometry(dir)? else {
        return Err(OfflineError::NotADevice(dir.to_path_buf()));
    };
    let open = || {
        DataDir::open(
            dir,
            &DirOptions {
                segment_bytes: 1 << 20,
                ..DirOptions::new(pages, page_bytes).read_only()
            },
        )
    };
    let (data, mut opened) = match open() {
        Ok(o) => o,
        Err(e) if repair => {
            let r = repair_from(dir, checkpoint_position(dir))?;
            on_repair(&e, &r);
            open()?
        }
        Err(e) => return Err(e.into()),
    };
    // A damaged model archive costs only the model's exactness: a repair writes it anew (a
    // writable open does) and the check runs again.
    let (data, opened, model_damage) = match opened.model_damage.take() {
        Some(why) if repair => {
            drop(data);
            drop(DataDir::open(dir, &DirOptions::new(pages, page_bytes))?);
            let (data, opened) = open()?;
            (data, opened, Some((why, true)))
        }
        why => (data, opened, why.map(|w| (w, false))),
    };
    let mut verified = data.verify()?;
    // A page whose record does not verify is lost already: a repair zeroes it (a trim logged
    // for it), so the rest of the device is served and exported whole, and checks again.
    let mut zeroed = Vec::new();
    if repair && !verified.damaged.is_empty() {
        drop(data);
        let (mut w, _) = DataDir::open(dir, &DirOptions::new(pages, page_bytes))?;
        w.zero_damaged(&verified.damaged)?;
        drop(w);
        zeroed = std::mem::take(&mut verified.damaged);
        verified = open()?.0.verify()?;
    }
    Ok(Checked {
        verified_pages: verified.pages,
        damaged_pages: verified.damaged,
        zeroed_pages: zeroed,
        model_damage,
        segments: segment_indices(dir)?.len(),
        opened,
        volumes: open()?.0.volumes(),
    })
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub image_bytes: u64,
    pub pages_written: u64,
    /// With `skip_damaged`: the pages whose records do not verify, written as zeros.
    pub skipped: Vec<DamagedPage>,
}

/// Writes the device of `dir` (or its snapshot or clone `volume`) to `file` as a raw image,
/// every byte of it (unwritten pages as holes), replacing `file` atomically. A page whose
/// record does not verify stops the export, naming it, or with `skip_damaged` is written as
/// zeros and listed.
pub fn export_image(
    dir: &Path,
    volume: Option<&str>,
    file: &Path,
    skip_damaged: bool,
) -> Result<Exported, OfflineError> {
    let data = open_offline(dir, true)?;
    let (pages, page_bytes) = device_geometry(dir)?.expect("open_offline checked");
    let id = match volume {
        None => 0,
        Some(v) => {
            data.volume_named(v)
                .ok_or_else(|| OfflineError::NoVolume {
                    dir: dir.to_path_buf(),
                    name: v.to_string(),
                })?
                .0
        }
    };
    if let Ok(meta) = std::fs::symlink_metadata(file) {
        if !meta.file_type().is_file() {
            return Err(OfflineError::NotARegularFile(file.to_path_buf()));
        }
    }
    let image_bytes = pages * page_bytes as u64;
    let mut out = AtomicFile::create(file)?;
    let tmp = out.tmp_path().to_path_buf();
    let mut skipped = Vec::new();
    let mut write = || -> Result<u64, OfflineError> {
        let out = out.file();
        out.set_len(image_bytes).map_err(io(&tmp))?;
        let mut written = 0;
        let mut locs = data.volume_pages(id);
        locs.sort_unstable();
        data.load_pages(
            id,
            &locs,
            &mut |lpn, page| {
                written += 1;
                out.write_all_at(page, lpn * page_bytes as u64)
            },
            skip_damaged.then_some(&mut skipped),
        )?;
        Ok(written)
    };
    // Dropped uncommitted on an error, `out` removes its file beside.
    let not_written = |cause| OfflineError::NotWritten {
        file: file.to_path_buf(),
        cause: Box::new(cause),
    };
    let pages_written = write().map_err(not_written)?;
    out.commit().map_err(|e| not_written(e.into()))?;
    Ok(Exported {
        image_bytes,
        pages_written,
        skipped,
    })
}

/// Makes `dir` (absent or empty) a device of `pages` pages of `page_bytes` from the raw image
/// `file`: its non-zero pages written to the device and, as writes of at most 1 MiB a
/// microsecond apart, to the FTL model's log (the model replays them at the first serve).
/// Returns the pages written.
pub fn import_image(
    file: &Path,
    dir: &Path,
    pages: u64,
    page_bytes: usize,
) -> Result<u64, OfflineError> {
    let image = std::fs::File::open(file).map_err(io(file))?;
    let len = image.metadata().map_err(io(file))?.len();
    let device_bytes = pages * page_bytes as u64;
    if len > device_bytes {
        return Err(OfflineError::ImageTooLarge {
            file: file.to_path_buf(),
            bytes: len,
            device_bytes,
        });
    }
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(OfflineError::NotEmpty(dir.to_path_buf()));
    }
    let (mut data, _) = DataDir::open(dir, &DirOptions::new(pages, page_bytes))?;
    let mut page = vec![0u8; page_bytes];
    let mut written = 0u64;
    let mut run: Option<(u64, u64)> = None;
    let mut clock_ns = 0u64;
    let mut flush_run = |data: &mut DataDir, run: &mut Option<(u64, u64)>| {
        if let Some((first, n)) = run.take() {
            clock_ns += 1000;
            data.request(ModelRequest {
                op: model_op::WRITE,
                offset_bytes: first * page_bytes as u64,
                length_bytes: (n * page_bytes as u64) as u32,
                arrival_ns: clock_ns,
                reclaim_group: 0,
                handle: 0,
            })?;
        }
        Ok::<(), LogError>(())
    };
    let image_pages = len.div_ceil(page_bytes as u64);
    let mut reader = std::io::BufReader::with_capacity(1 << 20, image);
    for lpn in 0..image_pages {
        page.fill(0);
        let mut got = 0;
        while got < page_bytes {
            match reader.read(&mut page[got..]).map_err(io(file))? {
                0 => break,
                n => got += n,
            }
        }
        if page.iter().all(|&b| b == 0) {
            flush_run(&mut data, &mut run)?;
            continue;
        }
        data.write_page(0, lpn, &page)?;
        written += 1;
        run = match run {
            Some((first, n)) if (n + 1) * (page_bytes as u64) <= 1 << 20 => Some((first, n + 1)),
            Some(_) => {
                flush_run(&mut data, &mut run)?;
                Some((lpn, 1))
            }
            None => Some((lpn, 1)),
        };
    }
    flush_run(&mut data, &mut run)?;
    data.checkpoint()?;
    Ok(written)
}
