//! `ftlab serve`'s NBD server: the protocol (the NBD spec's fixed newstyle handshake and
//! transmission phases, structured replies, block status, STARTTLS), one connection served over
//! any `Incoming`/`Write` pair, in front of an `ftlab_device::Device`. Blocking I/O: a thread per
//! connection does the handshake, then two workers take turns reading a request and execute it
//! (replies may leave out of order, as NBD allows), at once or when their simulated completion
//! is due.
//!
//! Owns: the wire format, TLS, option haggling, the transmission loop, the mapping of NBD
//! requests and error codes to the device's, the metrics exposition. Does not know: listeners,
//! signals or the command line (`ftlab serve` in the binary owns those), or how the device
//! keeps its pages.

mod delivery;
mod error;
mod handshake;
pub mod incoming;
pub mod metrics;
pub mod protocol;
pub mod tls;
mod transmission;

pub use error::ConnectionError;
pub use incoming::Incoming;

use error::{send, write_error};
use ftlab_device::budget;
use ftlab_device::{policy, CommandKind, Device, IoError, Latency, Target};
use handshake::Deadlined;
use protocol as p;
use std::io::{BufReader, BufWriter, Write};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What one client may hold of the server in time (its memory is the device's budget:
/// `DeviceOptions::max_inflight_bytes`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConnectionLimits {
    /// A client must finish the handshake within this time of connecting.
    pub handshake_timeout: Duration,
    /// A client that sends nothing for this long (between requests or inside one) is
    /// disconnected; `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
        }
    }
}

/// How the server meets its clients: TLS, and the time a client may take.
#[derive(Clone, Default)]
pub struct NbdOptions {
    /// NBD over TLS (`NBD_OPT_STARTTLS`); None: no TLS (STARTTLS refused).
    pub tls: Option<std::sync::Arc<tls::TlsSetup>>,
    pub limits: ConnectionLimits,
}

/// A client that reads none of its replies for this long, while they wait to be sent, is
/// disconnected (the socket's send timeout, set by whoever accepts it): its requests hold memory
/// until their replies leave.
pub const REPLY_STALL: Duration = Duration::from_secs(60);

/// What the handshake settled for a connection.
#[derive(Clone, Copy, Debug)]
struct Negotiated {
    /// The export it serves.
    export: Target,
    /// The commands the access policy allows on it, decided at negotiation (`policy::IO_*`
    /// bits; all without a policy): a reloaded policy applies to connections made after it.
    io_allowed: u8,
    /// Structured replies (`NBD_OPT_STRUCTURED_REPLY`).
    structured: bool,
    /// The `base:allocation` metadata context (`NBD_OPT_SET_META_CONTEXT`), answered by
    /// `NBD_CMD_BLOCK_STATUS` under `ALLOCATION_CONTEXT_ID`.
    allocation: bool,
}

/// The id ftlab gives `base:allocation` in a connection (the server chooses it).
const ALLOCATION_CONTEXT_ID: u32 = 1;

/// A block status reply describes at most this many extents, and looks at most this far past
/// its offset (the spec lets it describe less than asked; the client asks again from there):
/// bounds the reply's memory and the time a request holds a worker.
const MAX_STATUS_DESCRIPTORS: usize = 4096;
const MAX_STATUS_SCAN_BYTES: u64 = 256 << 20;

/// Serves one client from handshake to disconnect. `Ok` for an orderly end (ABORT, DISC or
/// end of stream between requests); `Err` with the reason when the connection had to be closed
/// for a protocol violation.
pub fn serve_connection<R: Incoming + Send, W: Write + Send>(
    device: &Device,
    options: &NbdOptions,
    reader: R,
    writer: W,
) -> Result<(), ConnectionError> {
    let peer = Peer {
        principal: policy::Principal::anonymous(),
        address: String::new(),
    };
    serve_connection_as(device, options, &peer, reader, writer)
}

/// Who is at the other end of a connection, as its listener saw it.
pub struct Peer {
    /// Its Unix credentials (a Unix socket) or anonymous (TCP); the names of its TLS
    /// certificate are added if it starts TLS. What the access policy decides by.
    pub principal: policy::Principal,
    /// Its address, for the audit log.
    pub address: String,
}

/// [`serve_connection`] for a client known as `peer`.
pub fn serve_connection_as<R: Incoming + Send, W: Write + Send>(
    device: &Device,
    options: &NbdOptions,
    peer: &Peer,
    reader: R,
    writer: W,
) -> Result<(), ConnectionError> {
    let limits = options.limits;
    // Both halves see the TLS session once STARTTLS has made one.
    let slot = tls::Slot::default();
    // Every read of the handshake waits at most until its deadline: a client that connects and
    // sends nothing, or half an option, holds a thread only that long.
    let mut r = BufReader::with_capacity(
        256 << 10,
        Deadlined {
            inner: tls::TlsReader::new(reader, slot.clone()),
            deadline: Some(Instant::now() + limits.handshake_timeout),
        },
    );
    let mut w = BufWriter::with_capacity(256 << 10, tls::TlsWriter::new(writer, slot));
    let share = budget::ConnectionShare::default();
    let handshake = handshake::handshake(device, options, peer, &mut r, &mut w).map_err(|e| {
        if r.get_ref().deadline.is_some_and(|d| Instant::now() >= d) {
            ConnectionError::HandshakeDeadline {
                seconds: limits.handshake_timeout.as_secs_f64(),
                cause: Box::new(e),
            }
        } else {
            e
        }
    })?;
    let Some((negotiated, principal)) = handshake else {
        tls::close(w.get_mut());
        return Ok(());
    };
    let principal = &principal;
    // The snapshot or clone served is not deleted while this connection lasts.
    let Some(_in_use) = device.use_target(negotiated.export) else {
        return Err(ConnectionError::VolumeGone);
    };
    // Transmission: no deadline, and reads wait for ever or for the idle timeout (set once
    // here: a system call per read would cost the hot path).
    r.get_mut().deadline = None;
    r.get_ref()
        .inner
        .set_read_timeout(limits.idle_timeout)
        .map_err(ConnectionError::IdleTimeout)?;
    // Transmission: replies leave at once, or (latency emulation) when their simulated
    // completion is due, from a writer thread, so requests in flight overlap as on a device.
    if device.latency() == Latency::None {
        // The writer and the replies in it not yet flushed (their clients still wait).
        let w = Mutex::new((w, Vec::new()));
        let result = transmission::transmission(
            device,
            &share,
            principal,
            negotiated,
            &mut r,
            |reply, _, timing, in_flight, charge| {
                let mut guard = w.lock().unwrap_or_else(|p| p.into_inner());
                let (w, unflushed) = &mut *guard;
                send(w, &reply)?;
                drop((reply, charge));
                unflushed.push(timing);
                // The last request in flight flushes for all: a reply queued behind one still
                // executing leaves with that one's (a send wakes the client: one per burst, not
                // per reply). Counted under the writer's lock, so no reply is left unflushed.
                if in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
                    w.flush().map_err(write_error)?;
                    device.replied(unflushed.drain(..).map(|t| (t.op, t.read_at, None)));
                }
                Ok(())
            },
        );
        if result.is_ok() {
            let (mut w, _) = w.into_inner().unwrap_or_else(|p| p.into_inner());
            if w.flush().is_ok() {
                tls::close(w.get_mut());
            }
        }
        result
    } else {
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<delivery::Due>();
            let writer = scope.spawn(move || delivery::deliver_when_due(device, rx, w));
            let result = transmission::transmission(
                device,
                &share,
                principal,
                negotiated,
                &mut r,
                |reply, hold, timing, in_flight, charge| {
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    tx.send(delivery::Due {
                        // Counted from the request's arrival: the time it took to execute is
                        // inside the modelled latency (late only when it took longer).
                        at: timing.read_at + hold,
                        seq: 0,
                        reply,
                        timing,
                        _charge: charge,
                    })
                    .map_err(|_| ConnectionError::ReplyWriter("stopped"))
                },
            );
            drop(tx);
            let written = writer
                .join()
                .unwrap_or(Err(ConnectionError::ReplyWriter("panicked")))
                .map(|mut w| tls::close(w.get_mut()));
            result.and(written)
        })
    }
}

/// The Prometheus text exposition of `device` (`metrics`), `open` connections served now.
pub fn device_metrics(device: &Device, open: usize) -> String {
    let (connections_total, denied_total) = device.access_counts();
    metrics::exposition(
        &device.stats_json(),
        &device.client_latency_histograms(),
        metrics::Counts {
            connections_total,
            connections_open: open as u64,
            denied_total,
        },
    )
}

/// The transmission flags of an export. With structured replies, DF ("don't fragment") is
/// advertised: a read is always answered in one chunk anyway.
fn transmission_flags(device: &Device, structured: bool, target: Target) -> u16 {
    let read_only = if device.is_read_only(target) {
        p::TF_READ_ONLY
    } else {
        0
    };
    // Multi-conn is safe: every completed write is visible to every connection at once
    // (one store, one lock), and a flush drains the one write buffer all share.
    p::TF_HAS_FLAGS
        | p::TF_SEND_FLUSH
        | p::TF_SEND_FUA
        | p::TF_SEND_TRIM
        | p::TF_SEND_WRITE_ZEROES
        | p::TF_SEND_FAST_ZERO
        | p::TF_CAN_MULTI_CONN
        | p::TF_SEND_CACHE
        | read_only
        | if structured { p::TF_SEND_DF } else { 0 }
}

/// The device's command for an NBD request; None for a command the device has none for
/// (block status is answered apart, disconnect never gets here).
fn device_command(r: &p::Request, arrival: Instant) -> Option<ftlab_device::Command> {
    let kind = match r.command {
        p::CMD_READ => CommandKind::Read,
        p::CMD_WRITE => CommandKind::Write,
        p::CMD_WRITE_ZEROES => CommandKind::WriteZeroes,
        p::CMD_TRIM => CommandKind::Trim,
        p::CMD_FLUSH => CommandKind::Flush,
        p::CMD_CACHE => CommandKind::Cache,
        _ => return None,
    };
    Some(ftlab_device::Command {
        kind,
        offset: r.offset,
        length: r.length,
        fua: r.flags & p::CMD_FLAG_FUA != 0,
        no_hole: r.flags & p::CMD_FLAG_NO_HOLE != 0,
        arrival: Some(arrival),
    })
}

/// The NBD error code for what the device refused (the spec's codes are POSIX's).
fn errno(e: IoError) -> u32 {
    match e {
        IoError::ReadOnly => p::EPERM,
        IoError::Io => p::EIO,
        IoError::NoSpace => p::ENOSPC,
        IoError::Invalid => p::EINVAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's own errno for each error is the one the NBD spec gives it.
    #[test]
    fn device_errors_are_the_nbd_spec_codes() {
        for e in [
            IoError::ReadOnly,
            IoError::Io,
            IoError::NoSpace,
            IoError::Invalid,
        ] {
            assert_eq!(errno(e), e.errno(), "{e:?}");
        }
    }
}
