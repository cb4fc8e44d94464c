//! Why a connection ended other than in order, and the socket helpers that say so.

use crate::{protocol as p, REPLY_STALL};
use std::io::{Read, Write};

/// Why a connection ended other than in order (a client's fault, or its socket's). The server
/// logs it and closes the connection; the device is not harmed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Protocol(#[from] p::ProtocolError),
    #[error("client does not speak fixed newstyle")]
    NotFixedNewstyle,
    #[error("option {option} of {length} bytes (at most {max})", max = p::MAX_OPTION_BYTES)]
    OptionTooLong { option: u32, length: u32 },
    #[error("unknown export `{0}`")]
    UnknownExport(String),
    #[error("the access policy allows this client nothing on `{0}`")]
    Denied(String),
    /// NBD_OPT_EXPORT_NAME before STARTTLS under `--tls require` (it has no error reply).
    #[error("export `{0}` asked for before TLS, which this server requires")]
    TlsRequired(String),
    #[error("TLS handshake: {0}")]
    Tls(#[from] crate::tls::HandshakeError),
    #[error("write of {0} bytes (at most {max}): cannot stay in sync", max = p::MAX_REQUEST_BYTES)]
    WriteTooLong(u32),
    #[error(
        "the client sent no {what} in the time allowed (the handshake deadline, or --idle-timeout)"
    )]
    ReadTimeout { what: &'static str },
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    #[error("reading {what}: {cause}")]
    Read {
        what: &'static str,
        cause: std::io::Error,
    },
    #[error("the client read none of its replies for {} s; disconnected", REPLY_STALL.as_secs())]
    ReplyStall,
    #[error("writing: {cause}")]
    Write { cause: std::io::Error },
    #[error("handshake not finished within {seconds} s: {cause}")]
    HandshakeDeadline {
        seconds: f64,
        cause: Box<ConnectionError>,
    },
    #[error("setting the idle timeout: {0}")]
    IdleTimeout(std::io::Error),
    /// The thread that writes delayed replies (latency emulation) stopped or panicked.
    #[error("reply writer {0}")]
    ReplyWriter(&'static str),
    /// The snapshot or clone negotiated was deleted before transmission began.
    #[error("the snapshot or clone negotiated was deleted before transmission began")]
    VolumeGone,
}

pub(crate) fn read_exact<R: Read>(
    r: &mut R,
    buf: &mut [u8],
    what: &'static str,
) -> Result<(), ConnectionError> {
    r.read_exact(buf).map_err(|e| read_error(e, what))
}

/// Whether a socket operation failed on its timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` give EAGAIN).
pub(crate) fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

pub(crate) fn read_error(cause: std::io::Error, what: &'static str) -> ConnectionError {
    if timed_out(&cause) {
        ConnectionError::ReadTimeout { what }
    } else {
        ConnectionError::Read { what, cause }
    }
}

pub(crate) fn write_error(cause: std::io::Error) -> ConnectionError {
    if timed_out(&cause) {
        ConnectionError::ReplyStall
    } else {
        ConnectionError::Write { cause }
    }
}

pub(crate) fn send<W: Write>(w: &mut W, bytes: &[u8]) -> Result<(), ConnectionError> {
    w.write_all(bytes).map_err(write_error)
}
