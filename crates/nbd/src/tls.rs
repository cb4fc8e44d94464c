//! NBD over TLS: `NBD_OPT_STARTTLS` upgrades a connection in the middle of option haggling, as
//! qemu-nbd and nbdkit do (the NBD spec's "TLS support").
//!
//! rustls runs the handshake (TLS 1.3 only). After it, a connection is read by its workers and
//! written by its reply path at the same time, so each half protects its own direction's
//! records with its own key (RFC 8446 section 5): no lock is shared per record and a record is
//! sealed and opened in place, in the buffer that goes to or came from the socket. That is the
//! split kTLS makes between user space and the kernel, and rustls's `kernel` API is made for
//! it: rustls keeps the session's secrets and derives the next keys when the client asks for a
//! key update (section 4.6.3), or when the server's own records near the cipher's
//! confidentiality limit. No crate offers a record layer split in two halves for blocking
//! sockets; rustls's own connection is one state machine that both halves would have to lock,
//! and costs a copy and an allocation per record more (`ftlab bench tls` measures the cost).
use crate::Incoming;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection, WebPkiClientVerifier};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::ConnectionTrafficSecrets;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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
    type Err = ftlab_core::units::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Self::Off),
            "allow" => Ok(Self::Allow),
            "require" => Ok(Self::Require),
            _ => Err(ftlab_core::units::UnknownChoice::new(
                s,
                "the TLS mode",
                "require, allow or off",
            )),
        }
    }
}

/// Which of a client certificate's subject common names become principal names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CnNames {
    /// Every CN (`cn:NAME` each): a certificate with two CNs is both.
    #[default]
    Every,
    /// The first CN only: an authority that lets a requester add CNs cannot grant more.
    First,
}

impl std::str::FromStr for CnNames {
    type Err = ftlab_core::units::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "every" => Ok(Self::Every),
            "first" => Ok(Self::First),
            _ => Err(ftlab_core::units::UnknownChoice::new(
                s,
                "which common names are principals",
                "every or first",
            )),
        }
    }
}

/// Why a TLS handshake failed (the client was sent rustls's alert first, where it made one).
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
    #[error("encoding a handshake record: {0}")]
    Encode(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the client closed TLS during its handshake")]
    ClosedTls,
    #[error("the client sent early data, which this server does not take")]
    EarlyData,
    #[error("the client sent more than {kib} KiB not yet handled during the TLS handshake")]
    TooMuch { kib: usize },
    #[error("the client closed the connection during the TLS handshake")]
    Closed,
    #[error("not TLS 1.3")]
    NotTls13,
    #[error("TLS was started twice")]
    StartedTwice,
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
    /// Which CNs of a client certificate are principal names.
    pub cn_names: CnNames,
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
        // TLS 1.3 only: the record layer below is 1.3's (every NBD client with TLS, GnuTLS since
        // 3.6.5 and OpenSSL since 1.1.1, speaks it).
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?;
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
        // The halves take the traffic keys from rustls once the handshake is over.
        config.enable_secret_extraction = true;
        Ok(Self {
            mode,
            config: Arc::new(config),
            verifies_clients: ca.is_some(),
            cn_names: CnNames::Every,
        })
    }
}

/// TLS record content types (RFC 8446 section 5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// The handshake message type of a key update (section 4.6.3).
const KEY_UPDATE: u8 = 24;
/// A record's header: content type, legacy version, length.
const HEADER_BYTES: usize = 5;
const TAG_BYTES: usize = 16;
/// The most plaintext one record carries (section 5.1) and the most ciphertext a peer may send
/// in one (section 5.2).
const MAX_PLAINTEXT_BYTES: usize = 1 << 14;
const MAX_CIPHERTEXT_BYTES: usize = MAX_PLAINTEXT_BYTES + 256;
/// The handshake's bytes from the client are held up to this (a client certificate chain fits
/// many times); what the client sent after its Finished must fit the reader's buffer too.
const MAX_HANDSHAKE_BYTES: usize = 64 << 10;
/// The reader's buffer: what one socket read brings, and room for a whole record behind it.
const READ_BUFFER_BYTES: usize = MAX_HANDSHAKE_BYTES + HEADER_BYTES + MAX_CIPHERTEXT_BYTES;
/// The most plaintext the writer seals per call: a larger write is taken in parts.
const MAX_WRITE_BYTES: usize = 256 << 10;

/// One direction's record protection: the suite's AEAD, with each record's nonce the IV XOR its
/// sequence number (section 5.3).
struct RecordKey {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl RecordKey {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> std::io::Result<Self> {
        let (algorithm, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(invalid("a cipher suite without a record layer here")),
        };
        let key = UnboundKey::new(algorithm, key.as_ref())
            .map_err(|_| invalid("a traffic key of the wrong length"))?;
        let iv = iv
            .as_ref()
            .try_into()
            .map_err(|_| invalid("a traffic IV of the wrong length"))?;
        Ok(Self {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce; the sequence number moves on.
    fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        for (n, s) in nonce[aead::NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *n ^= s;
        }
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }

    /// Appends to `out` one record carrying `content` of `content_type` (no padding).
    fn seal(&mut self, content_type: u8, content: &[u8], out: &mut Vec<u8>) {
        assert!(content.len() <= MAX_PLAINTEXT_BYTES);
        let length = content.len() + 1 + TAG_BYTES;
        let header = [APPLICATION_DATA, 3, 3, (length >> 8) as u8, length as u8];
        let start = out.len();
        out.extend_from_slice(&header);
        out.extend_from_slice(content);
        out.push(content_type);
        let nonce = self.next_nonce();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER_BYTES..])
            .expect("a record is far below the AEAD's length limit");
        out.extend_from_slice(tag.as_ref());
    }

    /// Opens in place the body of a record whose header is `header`: its content type and the
    /// length of its content, which starts where the body did.
    fn open(
        &mut self,
        header: [u8; HEADER_BYTES],
        body: &mut [u8],
    ) -> std::io::Result<(u8, usize)> {
        let nonce = self.next_nonce();
        let inner = self
            .key
            .open_in_place(nonce, Aad::from(header), body)
            .map_err(|_| invalid("a record failed authentication (bad_record_mac)"))?;
        // The content, its type, then zeros of padding.
        let end = inner
            .iter()
            .rposition(|&b| b != 0)
            .ok_or_else(|| invalid("a record without a content type"))?;
        Ok((inner[end], end))
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

fn session_error(e: rustls::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// The TLS session of a connection, once its handshake is over: where each half takes its key
/// from, and rustls's hold on the secrets the next keys derive from.
pub(crate) struct Session {
    /// The reader's start, taken on its first read.
    rx: Mutex<Option<ReaderStart>>,
    /// The writer's key, taken on its first write.
    tx: Mutex<Option<RecordKey>>,
    secrets: Mutex<KernelConnection<ServerConnectionData>>,
    /// The client asked for a key update: the writer sends its own before its next record.
    update_requested: AtomicBool,
    /// How many records one key may seal (the suite's confidentiality limit).
    records_per_key: u64,
}

/// The reading half's key, and what the client sent after its Finished that the handshake
/// read already: plaintext rustls opened, and bytes of records not yet whole.
struct ReaderStart {
    key: RecordKey,
    plaintext: Vec<u8>,
    raw: Vec<u8>,
}

impl Session {
    fn lock_secrets(&self) -> std::sync::MutexGuard<'_, KernelConnection<ServerConnectionData>> {
        self.secrets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Seals a key update into `out` under the writer's key, then moves the writer to the next.
    fn update_tx(&self, tx: &mut RecordKey, out: &mut Vec<u8>) -> std::io::Result<()> {
        // update_not_requested: the client's keys are its own business.
        tx.seal(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0], out);
        *tx = RecordKey::new(
            self.lock_secrets()
                .update_tx_secret()
                .map_err(session_error)?,
        )?;
        Ok(())
    }
}

/// A connection's TLS session, once STARTTLS has made one; shared by its reading and writing
/// halves.
pub(crate) type Slot = Arc<OnceLock<Session>>;

/// What a finished TLS handshake tells about the client.
pub(crate) struct Established {
    /// `cn:NAME` and `san:NAME` of the client's certificate (none without one).
    pub names: Vec<String>,
    pub version: String,
    pub cipher: String,
}

/// Runs the TLS handshake on the connection's plain halves (the `NBD_REP_ACK` to STARTTLS sent),
/// `early` being what the client sent after STARTTLS that was read already, and puts the
/// session in `slot`, from which on both halves speak TLS. On failure the TLS alert rustls
/// made is sent before the error is returned: the connection must end.
pub(crate) fn start<R: Read, W: Write>(
    setup: &TlsSetup,
    slot: &Slot,
    early: &[u8],
    r: &mut R,
    w: &mut W,
) -> Result<Established, HandshakeError> {
    let mut conn = UnbufferedServerConnection::new(setup.config.clone())?;
    let mut incoming = early.to_vec();
    let mut outgoing = vec![0u8; 16 << 10];
    let mut outgoing_bytes = 0;
    // Application data the client sent with its Finished, opened by rustls.
    let mut plaintext = Vec::new();
    let mut chunk = vec![0u8; 16 << 10];
    loop {
        let UnbufferedStatus { mut discard, state } = conn.process_tls_records(&mut incoming);
        let state = match state {
            Ok(state) => state,
            Err(e) => {
                incoming.drain(..discard);
                send_alert(&mut conn, &mut incoming, w);
                return Err(e.into());
            }
        };
        let mut done = false;
        let mut read_more = false;
        match state {
            ConnectionState::EncodeTlsData(mut data) => loop {
                match data.encode(&mut outgoing[outgoing_bytes..]) {
                    Ok(n) => {
                        outgoing_bytes += n;
                        break;
                    }
                    Err(EncodeError::InsufficientSize(size)) => {
                        outgoing.resize(outgoing_bytes + size.required_size, 0)
                    }
                    Err(e) => return Err(HandshakeError::Encode(e.to_string())),
                }
            },
            ConnectionState::TransmitTlsData(data) => {
                w.write_all(&outgoing[..outgoing_bytes])
                    .and_then(|()| w.flush())?;
                outgoing_bytes = 0;
                data.done();
            }
            ConnectionState::BlockedHandshake => read_more = true,
            ConnectionState::ReadTraffic(mut records) => {
                while let Some(record) = records.next_record() {
                    let record = record?;
                    discard += record.discard;
                    plaintext.extend_from_slice(record.payload);
                }
            }
            ConnectionState::WriteTraffic(_) => done = true,
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(HandshakeError::ClosedTls)
            }
            _ => return Err(HandshakeError::EarlyData),
        }
        incoming.drain(..discard);
        if done {
            break;
        }
        // What is left of it after the handshake must fit the reader's buffer.
        if incoming.len() + plaintext.len() + chunk.len() > MAX_HANDSHAKE_BYTES {
            return Err(HandshakeError::TooMuch {
                kib: (MAX_HANDSHAKE_BYTES - chunk.len()) >> 10,
            });
        }
        if read_more {
            let n = r.read(&mut chunk)?;
            if n == 0 {
                return Err(HandshakeError::Closed);
            }
            incoming.extend_from_slice(&chunk[..n]);
        }
    }
    let names = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| certificate_names(leaf, setup.cn_names))
        .unwrap_or_default();
    let (secrets, kernel) = conn.dangerous_into_kernel_connection()?;
    let suite = kernel.negotiated_cipher_suite();
    let established = Established {
        names,
        version: format!("{:?}", kernel.protocol_version()),
        cipher: format!("{:?}", suite.suite()),
    };
    let records_per_key = suite
        .tls13()
        .map(|s| s.common.confidentiality_limit)
        .ok_or(HandshakeError::NotTls13)?;
    let session = Session {
        rx: Mutex::new(Some(ReaderStart {
            key: RecordKey::new(secrets.rx)?,
            plaintext,
            raw: incoming,
        })),
        tx: Mutex::new(Some(RecordKey::new(secrets.tx)?)),
        secrets: Mutex::new(kernel),
        update_requested: AtomicBool::new(false),
        records_per_key,
    };
    if slot.set(session).is_err() {
        return Err(HandshakeError::StartedTwice);
    }
    Ok(established)
}

/// Sends the alert rustls queued when the handshake failed, so that the client learns why.
fn send_alert<W: Write>(conn: &mut UnbufferedServerConnection, incoming: &mut [u8], w: &mut W) {
    // One call: the queued alert comes out before rustls deframes anything, and a second call
    // would deframe the offending bytes again and queue a second fatal alert (rustls asserts
    // that it never does; found by the tls_connection fuzz target). The same buffer as before:
    // rustls may still point into it.
    if let Ok(ConnectionState::EncodeTlsData(mut data)) = conn.process_tls_records(incoming).state {
        let mut outgoing = vec![0u8; 1 << 10];
        if let Ok(n) = data.encode(&mut outgoing) {
            let _ = w.write_all(&outgoing[..n]);
            let _ = w.flush();
        }
    }
}

/// The principal names a client certificate carries: `cn:` for each common name of its subject
/// (the first only with `CnNames::First`), `san:` for each DNS name, e-mail address, URI and IP
/// address among its alternative names.
pub fn certificate_names(der: &[u8], cn_names: CnNames) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .map(|cn| format!("cn:{cn}"))
        .take(match cn_names {
            CnNames::Every => usize::MAX,
            CnNames::First => 1,
        })
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

/// A connection's reading half: the socket as it is until TLS starts, then the content of the
/// records read from it, each opened in place in the buffer the socket filled.
pub(crate) struct TlsReader<R> {
    pub inner: R,
    pub slot: Slot,
    records: Records,
}

/// The reading half's records once TLS is on.
#[derive(Default)]
struct Records {
    key: Option<RecordKey>,
    /// What the client sent with its Finished, opened by rustls: read first (`[early_read..]`).
    early: Vec<u8>,
    early_read: usize,
    buffer: Box<[u8]>,
    /// `buffer[content]`: the last record's content not yet read.
    content: Range<usize>,
    /// `buffer[next..end]`: bytes from the socket not yet opened.
    next: usize,
    end: usize,
    /// The client's close_notify came: its data ends here.
    closed: bool,
}

impl<R> TlsReader<R> {
    pub fn new(inner: R, slot: Slot) -> Self {
        Self {
            inner,
            slot,
            records: Records::default(),
        }
    }
}

impl Records {
    /// Takes the session's receiving start (once, on the first read after the handshake).
    fn begin(&mut self, session: &Session) -> std::io::Result<()> {
        let ReaderStart {
            key,
            plaintext: early,
            raw,
        } = session
            .rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| invalid("a second reader of one session"))?;
        self.buffer = vec![0u8; READ_BUFFER_BYTES].into_boxed_slice();
        // Bounded by the handshake's limit, below the buffer's size.
        self.buffer[..raw.len()].copy_from_slice(&raw);
        (self.next, self.end) = (0, raw.len());
        self.early = early;
        self.key = Some(key);
        Ok(())
    }

    /// Opens the record at `buffer[next..]` if it is all there; false if more must be read.
    fn open_next(&mut self, session: &Session) -> std::io::Result<bool> {
        if self.end - self.next < HEADER_BYTES {
            return Ok(false);
        }
        let header: [u8; HEADER_BYTES] = self.buffer[self.next..self.next + HEADER_BYTES]
            .try_into()
            .expect("five bytes");
        if header[0] != APPLICATION_DATA {
            return Err(invalid(&format!(
                "a record of type {} after the handshake (unexpected_message)",
                header[0]
            )));
        }
        let length = u16::from_be_bytes([header[3], header[4]]) as usize;
        if !(TAG_BYTES + 1..=MAX_CIPHERTEXT_BYTES).contains(&length) {
            return Err(invalid(&format!(
                "a record of {length} bytes (record_overflow)"
            )));
        }
        if self.end - self.next < HEADER_BYTES + length {
            return Ok(false);
        }
        let body = self.next + HEADER_BYTES;
        self.next = body + length;
        let key = self.key.as_mut().expect("begun");
        let (content_type, content_bytes) =
            key.open(header, &mut self.buffer[body..body + length])?;
        let content = &self.buffer[body..body + content_bytes];
        match content_type {
            APPLICATION_DATA => self.content = body..body + content_bytes,
            // close_notify ends the client's data; user_canceled comes before one; any
            // other alert is fatal in TLS 1.3 (section 6).
            ALERT => match content {
                [_, 0] => self.closed = true,
                [_, 90] => {}
                [_, description] => {
                    return Err(invalid(&format!("the client sent alert {description}")))
                }
                _ => return Err(invalid("a malformed alert (decode_error)")),
            },
            // The one handshake message a client sends after the handshake: a key update,
            // alone in its record as a key change must be (section 5.1).
            HANDSHAKE => match *content {
                [KEY_UPDATE, 0, 0, 1, request @ (0 | 1)] => {
                    let next = session.lock_secrets().update_rx_secret();
                    *key = RecordKey::new(next.map_err(session_error)?)?;
                    if request == 1 {
                        session.update_requested.store(true, Ordering::Release);
                    }
                }
                _ => {
                    return Err(invalid(
                        "a handshake message after the handshake other than a key update",
                    ))
                }
            },
            other => {
                return Err(invalid(&format!(
                    "a record of inner type {other} (unexpected_message)"
                )))
            }
        }
        Ok(true)
    }
}

impl<R: Read> Read for TlsReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(session) = self.slot.get() else {
            return self.inner.read(buf);
        };
        let records = &mut self.records;
        if records.key.is_none() {
            records.begin(session)?;
        }
        if records.early_read < records.early.len() {
            let n = buf.len().min(records.early.len() - records.early_read);
            buf[..n].copy_from_slice(&records.early[records.early_read..][..n]);
            records.early_read += n;
            return Ok(n);
        }
        loop {
            if !records.content.is_empty() {
                let n = buf.len().min(records.content.len());
                buf[..n].copy_from_slice(&records.buffer[records.content.start..][..n]);
                records.content.start += n;
                return Ok(n);
            }
            if records.closed {
                return Ok(0);
            }
            if records.open_next(session)? {
                continue;
            }
            // A whole record must fit behind what is left: move that to the front.
            if records.buffer.len() - records.end < HEADER_BYTES + MAX_CIPHERTEXT_BYTES {
                records.buffer.copy_within(records.next..records.end, 0);
                (records.next, records.end) = (0, records.end - records.next);
            }
            let n = self.inner.read(&mut records.buffer[records.end..])?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "TLS: the client closed the connection without close_notify",
                ));
            }
            records.end += n;
        }
    }
}

impl<R: Incoming> Incoming for TlsReader<R> {
    fn bytes_waiting(&self) -> bool {
        let records = &self.records;
        records.early_read < records.early.len()
            || !records.content.is_empty()
            || records.next < records.end
            || self.inner.bytes_waiting()
    }
    fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }
}

/// A connection's writing half: the socket as it is until TLS starts, then records of what is
/// written, sealed in place in one buffer and sent in one write.
pub(crate) struct TlsWriter<W> {
    pub inner: W,
    pub slot: Slot,
    key: Option<RecordKey>,
    /// Sealed records on their way to the socket (kept: no allocation per write).
    sealed: Vec<u8>,
}

impl<W> TlsWriter<W> {
    pub fn new(inner: W, slot: Slot) -> Self {
        Self {
            inner,
            slot,
            key: None,
            sealed: Vec::new(),
        }
    }
}

/// The writer's key, taken from the session on its first use.
fn writer_key<'k>(
    key: &'k mut Option<RecordKey>,
    session: &Session,
) -> std::io::Result<&'k mut RecordKey> {
    if key.is_none() {
        *key = session.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
    key.as_mut()
        .ok_or_else(|| invalid("a second writer of one session"))
}

impl<W: Write> Write for TlsWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let Some(session) = self.slot.get() else {
            return self.inner.write(buf);
        };
        let key = writer_key(&mut self.key, session)?;
        if session.update_requested.swap(false, Ordering::AcqRel) {
            session.update_tx(key, &mut self.sealed)?;
        }
        let taken = buf.len().min(MAX_WRITE_BYTES);
        for content in buf[..taken].chunks(MAX_PLAINTEXT_BYTES) {
            // The key update itself is a record under the old key.
            if key.seq + 1 >= session.records_per_key {
                session.update_tx(key, &mut self.sealed)?;
            }
            key.seal(APPLICATION_DATA, content, &mut self.sealed);
        }
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
    let Ok(key) = writer_key(&mut w.key, session) else {
        return;
    };
    key.seal(ALERT, &[1, 0], &mut w.sealed);
    let _ = w.inner.write_all(&w.sealed);
    let _ = w.inner.flush();
    w.sealed.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A server setup with a certificate for `localhost` from a fresh CA, and a client config
    /// trusting that CA (rustls's own client: an implementation independent of the halves).
    fn setup() -> &'static (TlsSetup, Arc<rustls::ClientConfig>) {
        static SETUP: OnceLock<(TlsSetup, Arc<rustls::ClientConfig>)> = OnceLock::new();
        SETUP.get_or_init(|| made_setup(tempfile::tempdir().unwrap().path()))
    }

    fn made_setup(dir: &Path) -> (TlsSetup, Arc<rustls::ClientConfig>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(dir.join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
        let setup = TlsSetup::load(
            TlsMode::Require,
            &dir.join("cert.pem"),
            &dir.join("key.pem"),
            None,
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        (setup, Arc::new(client))
    }

    /// The bytes a writer sent, kept beside the socket they went to.
    struct Recorded(UnixStream, Vec<u8>);
    impl Write for Recorded {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.1.extend_from_slice(buf);
            self.0.write_all(buf).map(|()| buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A handshake on a socket pair: the client's stream, the server's halves. `records_per_key`
    /// stands in for the suite's confidentiality limit.
    fn connected(
        records_per_key: u64,
    ) -> (
        rustls::StreamOwned<rustls::ClientConnection, UnixStream>,
        TlsReader<UnixStream>,
        TlsWriter<Recorded>,
    ) {
        let (setup, client_config) = setup();
        let (client_socket, server_socket) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut slot = Slot::default();
            let (mut r, mut w) = (server_socket.try_clone().unwrap(), server_socket);
            let established = start(setup, &slot, &[], &mut r, &mut w).unwrap();
            assert_eq!(established.version, "TLSv1_3");
            Arc::get_mut(&mut slot)
                .unwrap()
                .get_mut()
                .unwrap()
                .records_per_key = records_per_key;
            (
                TlsReader::new(r, slot.clone()),
                TlsWriter::new(Recorded(w, Vec::new()), slot),
            )
        });
        let conn =
            rustls::ClientConnection::new(client_config.clone(), "localhost".try_into().unwrap())
                .unwrap();
        let mut client = rustls::StreamOwned::new(conn, client_socket);
        // The client's first data goes with its Finished: the server reads it as rustls opened it.
        client.write_all(b"first").unwrap();
        client.flush().unwrap();
        let (reader, writer) = server.join().unwrap();
        (client, reader, writer)
    }

    #[test]
    fn the_halves_speak_tls_with_an_independent_client_across_key_updates() {
        let (mut client, mut reader, mut writer) = connected(3);
        let mut got = [0u8; 5];
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"first");

        // 200 KiB in 13 records, under a limit of 3 records a key: key updates on the way, which
        // rustls's client must follow to read the data back.
        let data: Vec<u8> = (0..200u32 << 10).map(|i| (i * 31 % 253) as u8).collect();
        writer.write_all(&data).unwrap();
        let mut back = vec![0u8; data.len()];
        client.read_exact(&mut back).unwrap();
        assert!(back == data, "the client read other bytes than were sent");
        let records = (data.len()).div_ceil(MAX_PLAINTEXT_BYTES);
        let updates = records / 2; // one per 2 records: the update is the key's third
        let update_bytes = HEADER_BYTES + 5 + 1 + TAG_BYTES;
        assert_eq!(
            writer.inner.1.len(),
            data.len() + records * (HEADER_BYTES + 1 + TAG_BYTES) + updates * update_bytes
        );

        // The client moves to new keys and asks the server to: the server reads under the new
        // key and sends its own update before its next record.
        writer.inner.1.clear();
        let session = writer.slot.get().unwrap();
        client.conn.refresh_traffic_keys().unwrap();
        client.write_all(b"again").unwrap();
        client.flush().unwrap();
        reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"again");
        assert!(session.update_requested.load(Ordering::Acquire));
        writer.write_all(b"reply").unwrap();
        assert_eq!(
            writer.inner.1.len(),
            update_bytes + HEADER_BYTES + 5 + 1 + TAG_BYTES
        );
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"reply");

        // close_notify both ways: an orderly end each side sees as the end of data.
        close(&mut writer);
        assert_eq!(client.read(&mut got).unwrap(), 0);
        client.conn.send_close_notify();
        client.flush().unwrap();
        assert_eq!(reader.read(&mut got).unwrap(), 0);
    }

    /// A client driven by hand through the handshake on `socket`, and its Finished, not yet
    /// sent: a test decides what goes with it.
    fn client_up_to_its_finished(socket: &mut UnixStream) -> (rustls::ClientConnection, Vec<u8>) {
        let (_, client_config) = setup();
        let mut client =
            rustls::ClientConnection::new(client_config.clone(), "localhost".try_into().unwrap())
                .unwrap();
        let mut out = Vec::new();
        loop {
            while client.wants_write() {
                client.write_tls(&mut out).unwrap();
            }
            if !client.is_handshaking() {
                return (client, out);
            }
            socket.write_all(&out).unwrap();
            out.clear();
            client.read_tls(socket).unwrap();
            client.process_new_packets().unwrap();
        }
    }

    #[test]
    fn a_record_cut_at_the_end_of_the_handshake_is_read_whole() {
        let (setup, _) = setup();
        let (mut socket, server_socket) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let slot = Slot::default();
            let (mut r, mut w) = (server_socket.try_clone().unwrap(), server_socket);
            start(setup, &slot, &[], &mut r, &mut w).unwrap();
            let mut reader = TlsReader::new(r, slot);
            let mut got = [0u8; 5];
            reader.read_exact(&mut got).unwrap();
            got
        });
        // The client driven by hand, so that its Finished and the first half of its first
        // record reach the server in one write and the rest later.
        let (mut client, mut out) = client_up_to_its_finished(&mut socket);
        client.writer().write_all(b"first").unwrap();
        while client.wants_write() {
            client.write_tls(&mut out).unwrap();
        }
        let cut = out.len() - 10;
        socket.write_all(&out[..cut]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        socket.write_all(&out[cut..]).unwrap();
        assert_eq!(&server.join().unwrap(), b"first");
    }

    /// Garbage in the same write as the client's Finished fails the handshake with one alert
    /// (asking rustls for it twice made it queue a second, which it asserts against: found by
    /// the tls_connection fuzz target).
    #[test]
    fn garbage_with_the_finished_fails_the_handshake_cleanly() {
        let (setup, _) = setup();
        let (mut socket, server_socket) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let (mut r, mut w) = (server_socket.try_clone().unwrap(), server_socket);
            start(setup, &Slot::default(), &[], &mut r, &mut w).map(|_| ())
        });
        let (_client, mut out) = client_up_to_its_finished(&mut socket);
        out.extend_from_slice(&[0x99, 3, 3, 0, 1, 0]);
        socket.write_all(&out).unwrap();
        let error = server.join().expect("no panic").unwrap_err().to_string();
        assert!(!error.is_empty());
        // One alert record (the client's view: a fatal alert, then the end).
        let mut rest = Vec::new();
        socket.read_to_end(&mut rest).unwrap();
        assert_eq!(rest.len(), 5 + 2 + 1 + TAG_BYTES, "{rest:?}");
    }

    /// TLS 1.2 is refused (the record layer here is 1.3's), with the alert that says so.
    #[test]
    fn a_tls_1_2_client_is_refused() {
        let (setup, _) = setup();
        let (client_socket, server_socket) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let (mut r, mut w) = (server_socket.try_clone().unwrap(), server_socket);
            start(setup, &Slot::default(), &[], &mut r, &mut w).map(|_| ())
        });
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let conn = rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap())
            .unwrap();
        let mut client = rustls::StreamOwned::new(conn, client_socket);
        let client_error = client.write_all(b"x").and_then(|()| client.flush());
        let mut got = [0u8; 1];
        let client_error = client_error.and_then(|()| client.read(&mut got).map(|_| ()));
        let server_error = server.join().unwrap().unwrap_err().to_string();
        assert!(server_error.contains("incompatible"), "{server_error}");
        let client_error = client_error.unwrap_err().to_string();
        assert!(client_error.contains("ProtocolVersion"), "{client_error}");
    }

    #[test]
    fn hostile_records_end_the_session_with_an_error() {
        let cases: [(&[u8], &str); 4] = [
            (&[23, 3, 3, 0xff, 0xff], "record_overflow"),
            (&[22, 3, 3, 0, 20], "unexpected_message"),
            (&[23, 3, 3, 0, 17], "bad_record_mac"),
            (&[23, 3, 3, 0, 3], "record_overflow"),
        ];
        for (bytes, why) in cases {
            let (client, mut reader, _writer) = connected(u64::MAX);
            let mut got = [0u8; 5];
            reader.read_exact(&mut got).unwrap();
            let mut socket = client.sock;
            socket.write_all(bytes).unwrap();
            socket.write_all(&[0u8; 17]).unwrap();
            let e = reader.read(&mut got).unwrap_err();
            assert!(e.to_string().contains(why), "{bytes:?}: {e}");
        }
        // A cut without close_notify is not an orderly end.
        let (client, mut reader, _writer) = connected(u64::MAX);
        let mut got = [0u8; 5];
        reader.read_exact(&mut got).unwrap();
        drop(client);
        // (Or a reset: the client left the session tickets unread.)
        let e = reader.read(&mut got).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever a client sends after the handshake (records of any type, length and body,
        /// cut anywhere), the reader returns data, an error or the end: it never panics or
        /// reads past its buffer.
        #[test]
        fn any_bytes_after_the_handshake_are_refused_or_read(
            records in proptest::collection::vec(
                (
                    proptest::prelude::prop_oneof![proptest::prelude::Just(23u8), 0u8..=255],
                    0usize..20_000,
                    proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                ),
                1..6,
            ),
            cut in 0usize..100_000,
        ) {
            let (client, mut reader, server_writer) = connected(u64::MAX);
            let mut got = [0u8; 5];
            reader.read_exact(&mut got).unwrap();
            let mut bytes = Vec::new();
            for (content_type, length, body) in records {
                bytes.extend_from_slice(&[content_type, 3, 3, (length >> 8) as u8, length as u8]);
                bytes.extend(body.iter().cycle().take(length));
            }
            bytes.truncate(cut);
            let mut socket = client.sock;
            let writer = std::thread::spawn(move || {
                let _ = socket.write_all(&bytes);
            });
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
            }
            // The server's socket closed: a client still writing stops.
            drop((reader, server_writer));
            writer.join().unwrap();
        }
    }

    /// A certificate with two CNs, one holding a comma: each CN is one name (never split at
    /// the comma), both with `CnNames::Every`, the first only with `CnNames::First`; the SANs
    /// either way.
    #[test]
    fn a_certificates_common_names_are_every_one_or_the_first() {
        use rcgen::{CertificateParams, DnType, KeyPair, SanType};
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "x,uid:0");
        // rcgen keeps one value per type: the second CN goes in under CN's own OID (2.5.4.3).
        params
            .distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 3]), "ops");
        params.subject_alt_names = vec![SanType::DnsName("host.example".try_into().unwrap())];
        let key = KeyPair::generate().unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        let mut every = certificate_names(&der, CnNames::Every);
        every.sort();
        assert_eq!(every, ["cn:ops", "cn:x,uid:0", "san:host.example"]);
        let first = certificate_names(&der, CnNames::First);
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(first.contains(&"san:host.example".to_string()));
        assert!(every.contains(&first[0]));
        assert_eq!("first".parse::<CnNames>().unwrap(), CnNames::First);
        assert!("all".parse::<CnNames>().is_err());
    }
}
