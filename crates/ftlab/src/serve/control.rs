//! The control socket of a served durable directory (`DIR/control.sock`): snapshot and clone
//! commands and policy reloads, one JSON line each way. What a command may do and does is the
//! device's (`ftlab_device::control`); this is the listener and its log lines.

use anyhow::{Context, Result};
use ftlab_device::control::{control_path, Control, MAX_CONTROL_LINE_BYTES};
use ftlab_device::Device;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The control socket's listener: `close` stops it and removes the socket file (a clean
/// shutdown leaves none behind).
pub struct ControlSocket {
    pub path: PathBuf,
    thread: std::thread::JoinHandle<()>,
}

impl ControlSocket {
    /// Waits for the listener to see `stop` (set by then), which removes the socket file.
    pub fn close(self) {
        let _ = self.thread.join();
    }
}

/// Listens on `DIR/control.sock` (mode 0600: the directory's owner only) until `stop`. A
/// socket file left by a server that died is replaced; anything else at the path is refused.
pub fn spawn_control(
    device: Arc<Device>,
    dir: &Path,
    policy: Option<PathBuf>,
    stop: Arc<AtomicBool>,
) -> Result<ControlSocket> {
    let path = control_path(dir);
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        use std::os::unix::fs::FileTypeExt;
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "{}: exists and is not a socket: not replaced",
            path.display()
        );
        anyhow::ensure!(
            UnixStream::connect(&path).is_err(),
            "{}: another server answers on it",
            path.display()
        );
        std::fs::remove_file(&path).with_context(|| path.display().to_string())?;
    }
    let listener = UnixListener::bind(&path).with_context(|| path.display().to_string())?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| path.display().to_string())?;
    }
    listener.set_nonblocking(true)?;
    let at = path.clone();
    let thread = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(&device, policy.as_deref(), stream) {
                        eprintln!("ftlab serve: control socket: {e:#}");
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let _ = std::fs::remove_file(&at);
    });
    Ok(ControlSocket { path, thread })
}

/// One request and its reply; a slow or oversized client is cut off.
fn answer(device: &Device, policy: Option<&Path>, stream: UnixStream) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_CONTROL_LINE_BYTES)).read_line(&mut line)?;
    let principal = ftlab_device::policy::Principal::of_unix_peer(&stream);
    let reply = match Control::parse(line.trim_end()) {
        Ok(c) => {
            let reply = device.control(policy, &principal, &c);
            match (&c, policy) {
                (Control::ReloadPolicy, Some(path)) if reply["ok"] == true => eprintln!(
                    "ftlab serve: {}: policy reloaded ({} statements)",
                    path.display(),
                    reply["statements"]
                ),
                (Control::ReloadPolicy, Some(_)) => {
                    eprintln!(
                        "ftlab serve: policy {}",
                        reply["error"].as_str().unwrap_or("")
                    )
                }
                (Control::List | Control::ReloadPolicy, _) => {}
                _ if reply["ok"] == true => eprintln!("ftlab serve: control: {}", c.describe()),
                _ => {}
            }
            reply
        }
        Err(e) => serde_json::json!({ "ok": false, "error": e.to_string() }),
    };
    writeln!(&stream, "{reply}")?;
    Ok(())
}
