//! A TLS client's bytes, valid and not, through a whole NBD connection over TLS. The client
//! (rustls) sends the NBD greeting's flags and `NBD_OPT_STARTTLS` and runs the handshake; then
//! the input is chunks (a tag byte, a little-endian u16 length, the bytes), each sealed by the
//! client (tag even: NBD bytes over TLS) or written raw to the socket (tag odd: anything as
//! records, after valid ones). Errors close the connection; panics are bugs. A thread drains
//! what the server sends, so that neither end blocks on a full socket.
#![no_main]
use ftlab_nbd::tls::{TlsMode, TlsSetup};
use ftlab_device::{Device, DeviceOptions, Latency};
use ftlab_nbd::{serve_connection, NbdOptions};
use ftlab_store::codec::Codec;
use libfuzzer_sys::fuzz_target;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};

fn setup() -> &'static (Device, NbdOptions, Arc<rustls::ClientConfig>) {
    static SETUP: OnceLock<(Device, NbdOptions, Arc<rustls::ClientConfig>)> = OnceLock::new();
    SETUP.get_or_init(|| {
        // As a Rust program's runtime does (libFuzzer's main is not one): a write to a socket
        // the other end closed is an error, not the end of the process.
        // SAFETY: setting a signal's disposition to ignore, before any thread of ours runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cert.pem"), leaf.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        let tls = TlsSetup::load(TlsMode::Require, &dir.path().join("cert.pem"), &dir.path().join("key.pem"), None).unwrap();
        let mut b = ftlab_core::ConfigBuilder::from_preset("femu").unwrap();
        for s in ["flash.blocks_per_die=4", "flash.superblock_dies=1", "capacity.logical_bytes=67108864"] {
            b.set(s).unwrap();
        }
        let device = Device::new(
            &b.build().unwrap(),
            DeviceOptions { export_name: "ftlab".into(), exports: Vec::new(), latency: Latency::None, codec: Codec::Lz4, record: None, record_format: ftlab_device::RecordFormat::Nbdkit, mem_limit_bytes: None, max_inflight_bytes: ftlab_device::DEFAULT_MAX_INFLIGHT_BYTES, read_only: false, data: None, durability: Default::default(), checkpoint_every_bytes: 256 << 20, cache_bytes: 1 << 20, cache_policy: Default::default() },
        )
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        (device, NbdOptions { tls: Some(Arc::new(tls)), ..Default::default() }, Arc::new(client))
    })
}

/// Up to the end of the TLS handshake; false if the server ended the connection first.
fn start_tls(socket: &mut UnixStream, conn: &mut rustls::ClientConnection) -> bool {
    let mut greeting = [0u8; 18];
    let mut ack = [0u8; 20];
    let starttls = [&b"\x00\x00\x00\x03IHAVEOPT"[..], &5u32.to_be_bytes(), &0u32.to_be_bytes()].concat();
    if socket.read_exact(&mut greeting).is_err() || socket.write_all(&starttls).is_err() || socket.read_exact(&mut ack).is_err() {
        return false;
    }
    while conn.is_handshaking() {
        if conn.complete_io(socket).is_err() {
            return false;
        }
    }
    true
}

fuzz_target!(|data: &[u8]| {
    let (device, nbd, client_config) = setup();
    let (mut socket, server_socket) = UnixStream::pair().unwrap();
    std::thread::scope(|s| {
        let server = s.spawn(move || {
            let w = server_socket.try_clone().unwrap();
            let _ = serve_connection(device, nbd, server_socket, w);
        });
        let mut conn = rustls::ClientConnection::new(client_config.clone(), "localhost".try_into().unwrap()).unwrap();
        if start_tls(&mut socket, &mut conn) {
            let mut drain = socket.try_clone().unwrap();
            s.spawn(move || std::io::copy(&mut drain, &mut std::io::sink()));
            let mut rest = data;
            while rest.len() >= 3 {
                let length = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
                let (tag, chunk) = (rest[0], &rest[3..3 + length]);
                rest = &rest[3 + length..];
                let sent = if tag % 2 == 0 {
                    conn.writer().write_all(chunk).and_then(|()| {
                        while conn.wants_write() {
                            conn.write_tls(&mut socket)?;
                        }
                        Ok(())
                    })
                } else {
                    socket.write_all(chunk)
                };
                if sent.is_err() {
                    break;
                }
            }
        }
        // The end of the client: the server reads the end of its stream and stops.
        let _ = socket.shutdown(std::net::Shutdown::Both);
        server.join().unwrap();
    });
});
