//! NBD over TLS: `NBD_OPT_STARTTLS` upgrades a connection in the middle of option haggling, as
//! qemu-nbd and nbdkit do (the NBD spec's "TLS support").
//!
//! A connection is read by its workers and written by its reply path at the same time, while a
//! TLS session is one state machine. So both halves share the session (`Slot`): the reader
//! feeds what it read from the socket into the session and takes plaintext out, the writer puts
//! plaintext in and sends the records the session made. The session's lock is never held across
//! a system call, so a worker waiting for the client's next request does not stop replies. Only
//! the writer writes to the socket, so records leave in the order they were sealed; what the
//! reader's side makes (a TLS 1.3 key update answered) leaves with the next reply, as TLS allows.

use crate::Incoming;
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConnection;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// When TLS is offered and whether it is required (the NBD spec's NOTLS, SELECTIVETLS with no
/// TLS-only export, and FORCEDTLS modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is refused with `NBD_REP_ERR_POLICY`.
    #[default]
    Off,
    /// A client may start TLS or not.
    Allow,
    /// Every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` before TLS gets
    /// `NBD_REP_ERR_TLS_REQD`; `NBD_OPT_EXPORT_NAME` before TLS ends the connection.
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "allow" => Ok(Self::Allow),
            "require" => Ok(Self::Require),
            _ => Err(format!("`{s}`: expected require, allow or off")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {cause}", path.display())]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The server's TLS identity and how clients are checked, loaded once at start.
pub struct TlsSetup {
    pub mode: TlsMode,
    config: Arc<rustls::ServerConfig>,
    /// Whether clients must present a certificate signed by `--tls-ca`.
    pub verifies_clients: bool,
}

impl TlsSetup {
    /// The certificate chain and key of the server (PEM), and the authority client certificates
    /// must chain to (PEM; without one, clients are not asked for a certificate).
    pub fn load(
        mode: TlsMode,
        cert: &Path,
        key: &Path,
        ca: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|cause| TlsError::Read {
                path: path.to_owned(),
                cause,
            })
        };
        let invalid = |path: &Path, what: String| TlsError::Invalid {
            path: path.to_owned(),
            what,
        };
        let certificates = |path: &Path| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let pem = read(path)?;
            let chain = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(path, format!("not a PEM certificate file: {e}")))?;
            if chain.is_empty() {
                return Err(invalid(path, "no CERTIFICATE block in it".into()));
            }
            Ok(chain)
        };
        let chain = certificates(cert)?;
        let private_key = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| {
            invalid(
                key,
                format!("no private key in it (PEM PKCS#8, PKCS#1 or SEC1): {e}"),
            )
        })?;
        // AES-128-GCM first, and the server's order decides: GnuTLS clients (qemu, libnbd)
        // prefer AES-256, whose four extra rounds per block cost both ends on every record for
        // no security NBD needs (both are approved for TLS 1.3).
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites.sort_by_key(|suite| {
            !matches!(
                suite.suite(),
                rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                    | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            )
        });
        let provider = Arc::new(provider);
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certificates(ca)? {
                    roots
                        .add(c)
                        .map_err(|e| invalid(ca, format!("not a usable CA certificate: {e}")))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid(ca, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, private_key)
            .map_err(|e| invalid(key, format!("does not go with {}: {e}", cert.display())))?;
        config.ignore_client_order = true;
        Ok(Self {
            mode,
            config: Arc::new(config),
            verifies_clients: ca.is_some(),
        })
    }
}

/// The TLS session of a connection, once started; shared by its reading and writing halves.
pub(crate) type Slot = Arc<OnceLock<Mutex<ServerConnection>>>;

/// What a finished TLS handshake tells about the client.
pub(crate) struct Established {
    /// `cn:NAME` and `san:NAME` of the client's certificate (none without one).
    pub names: Vec<String>,
    pub version: String,
    pub cipher: String,
}

/// Runs the TLS handshake on the connection's plain halves (the `NBD_REP_ACK` to STARTTLS sent),
/// `early` being what the client sent after STARTTLS that was read already, and puts the
/// session in `slot`, from which on both halves speak TLS. On failure the TLS alert is sent
/// before the error is returned: the connection must end.
pub(crate) fn start<R: Read, W: Write>(
    setup: &TlsSetup,
    slot: &Slot,
    early: &[u8],
    r: &mut R,
    w: &mut W,
) -> Result<Established, String> {
    let mut conn = ServerConnection::new(setup.config.clone()).map_err(|e| e.to_string())?;
    let mut pending = early.to_vec();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let mut fed = &pending[..];
        while !fed.is_empty() {
            conn.read_tls(&mut fed).map_err(|e| e.to_string())?;
            if let Err(e) = conn.process_new_packets() {
                // The alert that tells the client why.
                while conn.wants_write() && conn.write_tls(w).is_ok() {}
                let _ = w.flush();
                return Err(e.to_string());
            }
        }
        pending.clear();
        while conn.wants_write() {
            conn.write_tls(w).map_err(|e| e.to_string())?;
        }
        w.flush().map_err(|e| e.to_string())?;
        if !conn.is_handshaking() {
            break;
        }
        let n = r.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the client closed the connection during the TLS handshake".into());
        }
        pending.extend_from_slice(&buf[..n]);
    }
    let names = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| certificate_names(leaf))
        .unwrap_or_default();
    let established = Established {
        names,
        version: conn
            .protocol_version()
            .map(|v| format!("{v:?}"))
            .unwrap_or_default(),
        cipher: conn
            .negotiated_cipher_suite()
            .map(|c| format!("{:?}", c.suite()))
            .unwrap_or_default(),
    };
    if slot.set(Mutex::new(conn)).is_err() {
        return Err("TLS was started twice".into());
    }
    Ok(established)
}

/// The principal names a client certificate carries: `cn:` for each common name of its subject,
/// `san:` for each DNS name, e-mail address, URI and IP address among its alternative names.
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .map(|cn| format!("cn:{cn}"))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            let text = match name {
                GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                    s.to_string()
                }
                GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*bytes).unwrap()).to_string(),
                    16 => {
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*bytes).unwrap()).to_string()
                    }
                    _ => continue,
                },
                _ => continue,
            };
            names.push(format!("san:{text}"));
        }
    }
    names
}

fn session_error(e: rustls::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// A connection's reading half: the socket as it is until TLS starts, then the plaintext of
/// the TLS records read from it.
pub(crate) struct TlsReader<R> {
    pub inner: R,
    pub slot: Slot,
    /// Bytes read from the socket, not yet fed to the session: `raw[start..end]`.
    raw: Box<[u8]>,
    start: usize,
    end: usize,
    /// Plaintext the session holds, as it said when last asked (a hint for `bytes_waiting`).
    plaintext_bytes: usize,
}

impl<R> TlsReader<R> {
    pub fn new(inner: R, slot: Slot) -> Self {
        Self {
            inner,
            slot,
            raw: Box::default(),
            start: 0,
            end: 0,
            plaintext_bytes: 0,
        }
    }
}

impl<R: Read> Read for TlsReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(session) = self.slot.get() else {
            return self.inner.read(buf);
        };
        if self.raw.is_empty() {
            // A TLS record is at most 16 KiB and some: one read takes a few.
            self.raw = vec![0u8; 64 << 10].into_boxed_slice();
        }
        loop {
            {
                let mut conn = session.lock().unwrap_or_else(|p| p.into_inner());
                match conn.reader().read(buf) {
                    Ok(n) => {
                        self.plaintext_bytes = self.plaintext_bytes.saturating_sub(n);
                        return Ok(n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.start < self.end {
                    let mut fed = &self.raw[self.start..self.end];
                    let n = conn.read_tls(&mut fed)?;
                    self.start += n;
                    let state = conn.process_new_packets().map_err(session_error)?;
                    self.plaintext_bytes = state.plaintext_bytes_to_read();
                    continue;
                }
            }
            // Nothing left to decrypt: wait for the socket, the session unlocked.
            let n = self.inner.read(&mut self.raw)?;
            (self.start, self.end) = (0, n);
            if n == 0 {
                // End of stream: the session tells a clean close (close_notify) from a cut.
                let mut conn = session.lock().unwrap_or_else(|p| p.into_inner());
                conn.read_tls(&mut &[][..])?;
                conn.process_new_packets().map_err(session_error)?;
                return conn.reader().read(buf);
            }
        }
    }
}

impl<R: Incoming> Incoming for TlsReader<R> {
    fn bytes_waiting(&self) -> bool {
        self.plaintext_bytes > 0 || self.start < self.end || self.inner.bytes_waiting()
    }
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }
}

/// A connection's writing half: the socket as it is until TLS starts, then TLS records of what
/// is written.
pub(crate) struct TlsWriter<W> {
    pub inner: W,
    pub slot: Slot,
    /// Sealed records on their way to the socket (kept: no allocation per write).
    sealed: Vec<u8>,
}

impl<W> TlsWriter<W> {
    pub fn new(inner: W, slot: Slot) -> Self {
        Self {
            inner,
            slot,
            sealed: Vec::new(),
        }
    }
}

impl<W: Write> Write for TlsWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(session) = self.slot.get() else {
            return self.inner.write(buf);
        };
        let taken = {
            let mut conn = session.lock().unwrap_or_else(|p| p.into_inner());
            // Takes what fits the session's send buffer (64 KiB): the rest comes next call.
            let taken = conn.writer().write(buf)?;
            while conn.wants_write() {
                conn.write_tls(&mut self.sealed)?;
            }
            taken
        };
        let sent = self.inner.write_all(&self.sealed);
        self.sealed.clear();
        sent.map(|()| taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Sends the TLS close_notify on a session's way out (an orderly end, as the NBD spec asks of a
/// soft disconnect); nothing without a session.
pub(crate) fn close<W: Write>(w: &mut TlsWriter<W>) {
    let Some(session) = w.slot.get() else {
        return;
    };
    {
        let mut conn = session.lock().unwrap_or_else(|p| p.into_inner());
        conn.send_close_notify();
        while conn.wants_write() && conn.write_tls(&mut w.sealed).is_ok() {}
    }
    let _ = w.inner.write_all(&w.sealed);
    let _ = w.inner.flush();
    w.sealed.clear();
}
