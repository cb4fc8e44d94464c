//! The files `serve` keeps beside the device, and its word to a service manager: `--image`
//! resolved once, `--pidfile`, `--stats`, and systemd's `NOTIFY_SOCKET`.

use anyhow::{Context, Result};
use ftlab_device::Device;
use std::path::{Path, PathBuf};

pub(super) fn write_stats(device: &Device, path: &std::path::Path) -> Result<()> {
    let json = serde_json::to_string_pretty(&device.stats_json())? + "\n";
    ftlab_core::atomic_file::write_atomically(path, json.as_bytes())?;
    Ok(())
}

/// `--image` as it will be used: the file to load and replace at the save.
pub(super) struct ImagePath {
    pub(super) path: PathBuf,
    pub(super) exists: bool,
}

/// Checks `--image` before anything is served: a regular file, or nothing yet (created at the
/// save). A symbolic link is followed once, here: the save writes `TARGET.tmp` beside the target
/// and renames it over the target, so the link stays a link and the target gets the data (a
/// rename over the link itself would replace the link and leave the target stale). Anything
/// else (a device node, FIFO, socket or directory) is refused: the save's rename would replace
/// it with a regular file, `/dev/null` included when run as root.
pub(super) fn resolve_image(path: &Path) -> Result<ImagePath> {
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ImagePath {
                path: path.to_owned(),
                exists: false,
            })
        }
        Err(e) => anyhow::bail!("--image {}: {e}", path.display()),
    };
    let resolved = if link.file_type().is_symlink() {
        std::fs::canonicalize(path).with_context(|| {
            format!(
                "--image {}: a symbolic link whose target cannot be reached",
                path.display()
            )
        })?
    } else {
        path.to_owned()
    };
    let meta =
        std::fs::metadata(&resolved).with_context(|| format!("--image {}", resolved.display()))?;
    let kind = file_kind(&meta.file_type());
    anyhow::ensure!(
        meta.file_type().is_file(),
        "--image {}{}: is a {kind}, not a regular file; the image is saved by replacing its file, \
         so give the path of a raw image file (or of one to create)",
        path.display(),
        if resolved != path {
            format!(" (a link to {})", resolved.display())
        } else {
            String::new()
        }
    );
    Ok(ImagePath {
        path: resolved,
        exists: true,
    })
}

/// What a file is, for an error message.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "directory"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_symlink() {
        "symbolic link"
    } else {
        "regular file"
    }
}

/// Writes this process's ID to `path` (replaced atomically, so a reader never sees it half
/// written). A file already there is replaced only when it is a regular file naming no
/// running process (a crashed run's).
pub(super) fn write_pidfile(path: &Path) -> Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            meta.file_type().is_file(),
            "--pidfile {}: is a {}, not a regular file; not replacing it",
            path.display(),
            file_kind(&meta.file_type())
        );
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Ok(pid) = text.trim().parse::<i32>() {
            // SAFETY: kill(2) with signal 0 only checks that the process exists.
            let alive = pid > 0
                && (unsafe { libc::kill(pid, 0) } == 0
                    || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
            anyhow::ensure!(
                !alive,
                "--pidfile {}: names process {pid}, which is running (another server?)",
                path.display()
            );
        }
    }
    ftlab_core::atomic_file::write_atomically(path, format!("{}\n", std::process::id()).as_bytes())
        .with_context(|| format!("--pidfile {}", path.display()))
}

/// Tells systemd (or any service manager speaking its protocol) `state`, when it started us
/// with `NOTIFY_SOCKET`. Written here rather than taken from a crate: it is one datagram to a
/// Unix socket (an abstract one when the path starts with `@`), and a failure only costs the
/// notification.
pub(super) fn notify_service_manager(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(socket) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let message = format!("{state}\nMAINPID={}\n", std::process::id());
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|addr| socket.send_to_addr(message.as_bytes(), &addr))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            Err(std::io::Error::other("abstract sockets are Linux-only"))
        }
    } else {
        socket.send_to(message.as_bytes(), &path)
    };
    if let Err(e) = sent {
        eprintln!(
            "ftlab serve: NOTIFY_SOCKET {}: {e}",
            Path::new(&path).display()
        );
    }
}
