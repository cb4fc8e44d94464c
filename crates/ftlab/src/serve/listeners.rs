//! Where clients come from: the TCP and Unix listeners, a thread per connection, the admission
//! limit, the drain at shutdown, and the `--metrics` HTTP responder.

use super::ServeArgs;
use anyhow::{Context, Result};
use ftlab_device::Device;
use ftlab_nbd::{serve_connection_as, NbdOptions};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The listeners `--listen` and `--unix` ask for, bound and polled (non-blocking).
pub(super) struct Listeners {
    tcp: Option<TcpListener>,
    /// `--listen` as given (named when the bound address cannot be read).
    listen: String,
    unix: Option<UnixListener>,
    /// `--unix`: the socket file, removed at exit (and only if it is still a socket).
    unix_path: Option<PathBuf>,
}

impl Listeners {
    /// Binds every listener, or none.
    pub(super) fn bind(args: &ServeArgs) -> Result<Self> {
        anyhow::ensure!(
            !args.no_tcp || args.unix.is_some(),
            "no listener: give --unix or drop --no-tcp"
        );
        let tcp = if args.no_tcp {
            None
        } else {
            let l = TcpListener::bind(&args.listen)
                .with_context(|| format!("listening on {}", args.listen))?;
            l.set_nonblocking(true)?;
            Some(l)
        };
        let unix = match &args.unix {
            Some(path) => {
                let l = bind_unix(path)?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        Ok(Self {
            tcp,
            listen: args.listen.clone(),
            unix,
            unix_path: args.unix.clone(),
        })
    }

    /// Says where each export is served, a line each (scripts read the port from it).
    pub(super) fn announce(&self, device: &Device) {
        for (name, size) in device.export_sizes() {
            if let Some(l) = &self.tcp {
                // The address bound, which names the port when --listen asked for any (port 0).
                let addr = l
                    .local_addr()
                    .map_or_else(|_| self.listen.clone(), |a| a.to_string());
                eprintln!("ftlab serve: export `{name}` ({size} bytes) on nbd://{addr}/{name}");
            }
            if let Some(path) = &self.unix_path {
                eprintln!(
                    "ftlab serve: export `{name}` ({size} bytes) on nbd+unix:///{name}?socket={}",
                    path.display()
                );
            }
        }
    }

    /// Accepts at most one client on each listener and serves it (or refuses it past `max`);
    /// true when one came.
    pub(super) fn accept(
        &self,
        connections: &mut Vec<Connection>,
        max: u32,
        device: &Arc<Device>,
        nbd: &Arc<NbdOptions>,
    ) -> bool {
        let mut came = false;
        if let Some((stream, peer)) = self.tcp.as_ref().and_then(|l| l.accept().ok()) {
            came = true;
            admit(
                connections,
                max,
                device,
                nbd,
                peer.to_string(),
                ftlab_device::policy::Principal::anonymous(),
                stream,
            );
        }
        if let Some((stream, _)) = self.unix.as_ref().and_then(|l| l.accept().ok()) {
            came = true;
            let principal = ftlab_device::policy::Principal::of_unix_peer(&stream);
            admit(
                connections,
                max,
                device,
                nbd,
                format!("unix client {}", principal.names.join(" ")),
                principal,
                stream,
            );
        }
        came
    }

    /// Closes the listeners (new clients are refused by the kernel); the socket file stays
    /// until [`remove_socket`](Self::remove_socket).
    pub(super) fn stop_listening(&mut self) {
        self.tcp = None;
        self.unix = None;
    }

    /// Removes the `--unix` socket file (only if a socket is still there: never a file another
    /// program put at the path since).
    pub(super) fn remove_socket(&self) {
        if let Some(path) = self.unix_path.as_deref().filter(|p| is_socket(p)) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Serves a client just accepted, unless `max` connections are served already: then it is
/// closed at once (it sees the connection end before the greeting), so that it is told rather
/// than left waiting in the backlog, and the refusal is logged.
fn admit<S: Socket>(
    connections: &mut Vec<Connection>,
    max: u32,
    device: &Arc<Device>,
    nbd: &Arc<NbdOptions>,
    who: String,
    principal: ftlab_device::policy::Principal,
    stream: S,
) {
    device.connected(&principal, &who);
    if connections.len() >= max as usize {
        eprintln!("ftlab serve: {who}: refused: {max} connections already (--max-connections)");
        return;
    }
    match Connection::accept(device, nbd, who.clone(), principal, stream) {
        Ok(c) => connections.push(c),
        Err(e) => eprintln!("ftlab serve: {who}: refused: {e}"),
    }
}

/// Scrapes answered at once, each on a thread of its own; a connection beyond them is closed
/// unanswered, so a flood of connections holds at most this many threads.
const METRICS_CLIENTS: usize = 8;

/// A scrape's whole request head must arrive within this (not each read: a client sending a
/// byte a second would otherwise hold its thread for hours).
const METRICS_HEAD_DEADLINE: Duration = Duration::from_secs(2);

/// Answers `GET /metrics` on `listener` until `stop`: one request a connection, its head at
/// most 8 KiB and `METRICS_HEAD_DEADLINE`, up to `METRICS_CLIENTS` at once, so that neither a
/// slow client nor a silent one delays anyone else's scrape. A hand-written HTTP/1.1 responder:
/// one fixed GET needs no HTTP crate.
pub(super) fn spawn_metrics(
    listener: TcpListener,
    device: Arc<Device>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            if active.fetch_add(1, Ordering::AcqRel) >= METRICS_CLIENTS {
                active.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let (device, open, done) = (device.clone(), open.clone(), active.clone());
            let spawned = std::thread::Builder::new()
                .name("ftlab-metrics".into())
                .spawn(move || {
                    scrape(stream, &device, &open);
                    done.fetch_sub(1, Ordering::AcqRel);
                });
            if spawned.is_err() {
                active.fetch_sub(1, Ordering::AcqRel);
            }
        }
    });
}

/// Reads from a stream until a deadline: each read waits at most what is left of it.
struct Deadline<'a> {
    stream: &'a std::net::TcpStream,
    until: std::time::Instant,
}

impl std::io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        (&*self.stream).read(buf)
    }
}

/// One scrape: the request head, then the answer.
fn scrape(stream: std::net::TcpStream, device: &Device, open: &std::sync::atomic::AtomicUsize) {
    use std::io::{BufRead, BufReader, Read, Write};
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let head = Deadline {
        stream: &stream,
        until: std::time::Instant::now() + METRICS_HEAD_DEADLINE,
    };
    let mut reader = BufReader::new(head.take(8 << 10));
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    // The rest of the head, read and ignored.
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line.trim() != "" {
        line.clear();
    }
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let anonymous = ftlab_device::policy::Principal::anonymous();
    let (status, body) = if !request.starts_with("GET ") {
        ("405 Method Not Allowed", "GET /metrics\n".to_string())
    } else if path != "/metrics" && path != "/" {
        ("404 Not Found", "GET /metrics\n".to_string())
    } else if !device.allows(&anonymous, "metrics", "-") {
        (
            "403 Forbidden",
            "the access policy does not allow metrics\n".to_string(),
        )
    } else {
        (
            "200 OK",
            ftlab_nbd::device_metrics(device, open.load(Ordering::Relaxed)),
        )
    };
    let _ = write!(
        &stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A client's connection, served on a thread of its own.
pub(super) struct Connection {
    pub(super) thread: std::thread::JoinHandle<()>,
    /// Shuts the socket's reading side: a read blocked on it returns end of stream.
    shut_reading: Box<dyn Fn() + Send>,
}

impl Connection {
    /// Serves a client just accepted.
    fn accept<S: Socket>(
        device: &Arc<Device>,
        nbd: &Arc<NbdOptions>,
        name: String,
        principal: ftlab_device::policy::Principal,
        stream: S,
    ) -> std::io::Result<Self> {
        stream.configure()?;
        let (reader, shut) = (stream.try_clone_socket()?, stream.try_clone_socket()?);
        let (device, nbd) = (device.clone(), nbd.clone());
        let peer = ftlab_nbd::Peer {
            principal,
            address: name.clone(),
        };
        let thread = std::thread::spawn(move || {
            if let Err(e) = serve_connection_as(&device, &nbd, &peer, reader, stream) {
                eprintln!("ftlab serve: {name}: closed: {e}");
            }
        });
        Ok(Connection {
            thread,
            shut_reading: Box::new(move || shut.shut_reading()),
        })
    }
}

/// What `serve` needs of a TCP or Unix socket.
pub(super) trait Socket:
    ftlab_nbd::Incoming + std::io::Write + Send + Sized + 'static
{
    fn try_clone_socket(&self) -> std::io::Result<Self>;
    /// Blocking (the listeners poll; a client's socket waits), a send timeout (`REPLY_STALL`: a
    /// client that reads no reply for that long is disconnected), and for TCP no Nagle delay.
    fn configure(&self) -> std::io::Result<()>;
    fn shut_reading(&self);
}

impl Socket for std::net::TcpStream {
    fn try_clone_socket(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn configure(&self) -> std::io::Result<()> {
        let _ = self.set_nodelay(true);
        self.set_write_timeout(Some(ftlab_nbd::REPLY_STALL))?;
        self.set_nonblocking(false)
    }
    fn shut_reading(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
}

impl Socket for std::os::unix::net::UnixStream {
    fn try_clone_socket(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn configure(&self) -> std::io::Result<()> {
        self.set_write_timeout(Some(ftlab_nbd::REPLY_STALL))?;
        self.set_nonblocking(false)
    }
    fn shut_reading(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
}

/// Ends every connection gracefully, as the NBD spec asks of a server shutting down: requests
/// executing finish, later ones are answered `ESHUTDOWN`, and each connection closes once it
/// has answered what it read, so the final report and `--image` hold every write a client was
/// told is done. A client that does not read its replies is not waited for beyond `DRAIN_WAIT`
/// (what it wrote is in the store already; only its replies are pending).
pub(super) fn drain(device: &Device, connections: Vec<Connection>) {
    const DRAIN_WAIT: Duration = Duration::from_secs(10);
    device.begin_shutdown();
    let live: Vec<_> = connections
        .into_iter()
        .filter(|c| !c.thread.is_finished())
        .collect();
    if live.is_empty() {
        return;
    }
    eprintln!("ftlab serve: draining {} connection(s)", live.len());
    for c in &live {
        (c.shut_reading)();
    }
    let deadline = std::time::Instant::now() + DRAIN_WAIT;
    while live.iter().any(|c| !c.thread.is_finished()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stuck = live.iter().filter(|c| !c.thread.is_finished()).count();
    if stuck > 0 {
        eprintln!(
            "ftlab serve: {stuck} connection(s) still busy after {DRAIN_WAIT:?} (a client not reading its replies?); not waiting longer"
        );
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Listens on `path`, replacing only a stale socket (one a crashed run left). Anything else
/// there is an error, never deleted: `--unix disk.img` typed for `--image disk.img` used to
/// delete the disk image.
fn bind_unix(path: &Path) -> Result<UnixListener> {
    if is_socket(path) {
        anyhow::ensure!(
            std::os::unix::net::UnixStream::connect(path).is_err(),
            "--unix {}: another server is listening there",
            path.display()
        );
        std::fs::remove_file(path)
            .with_context(|| format!("--unix {}: removing the stale socket", path.display()))?;
    } else if std::fs::symlink_metadata(path).is_ok() {
        anyhow::bail!(
            "--unix {}: the file exists and is not a socket; not replacing it (give a new path)",
            path.display()
        );
    }
    UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))
}
