//! A connection's read side that can tell whether the client has sent more than was read.
//!
//! The server asks it after reading a large request: bytes already waiting mean the client keeps
//! several requests in flight, so the connection's workers will keep the cores busy and the
//! request's pages are better handled on the worker's own thread than handed to the store's
//! thread pool (see `Device::execute`).

use std::io::Read;

pub trait Incoming: Read {
    /// Whether bytes are waiting to be read now; never blocks, consumes nothing. `false` when it
    /// cannot tell.
    fn bytes_waiting(&self) -> bool;
    /// How long a read may wait for data before failing (`None`: for ever). Input that never
    /// waits (in memory) ignores it.
    fn set_read_timeout(&self, _timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        Ok(())
    }
}

impl Incoming for std::os::unix::net::UnixStream {
    fn bytes_waiting(&self) -> bool {
        socket_bytes_waiting(self)
    }
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, timeout)
    }
}

impl Incoming for std::net::TcpStream {
    fn bytes_waiting(&self) -> bool {
        socket_bytes_waiting(self)
    }
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, timeout)
    }
}

/// In-memory input (tests, fuzzing): whatever is left is waiting.
impl<T: AsRef<[u8]>> Incoming for std::io::Cursor<T> {
    fn bytes_waiting(&self) -> bool {
        (self.position() as usize) < self.get_ref().as_ref().len()
    }
}

/// std has no non-blocking "bytes available" query (`peek` blocks on an empty socket unless the
/// socket is switched to non-blocking, which the other worker's blocking read must not see), so
/// this asks the kernel with FIONREAD.
#[cfg(target_os = "linux")]
fn socket_bytes_waiting(socket: &impl std::os::fd::AsRawFd) -> bool {
    let mut bytes: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `bytes`.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::FIONREAD, &mut bytes) };
    rc == 0 && bytes > 0
}

#[cfg(not(target_os = "linux"))]
fn socket_bytes_waiting<T>(_: &T) -> bool {
    false
}
