//! The NBD server against a client written here, over in-process socket pairs (no kernel NBD),
//! with a byte-level oracle; protocol abuse on one connection while another keeps working; and
//! qemu-io against the real binary.

use crate::support::{config, temp_dir};
use ftlab_core::rng::SplitMix64;
use ftlab_device::{Device, DeviceOptions, Latency, LocalCommand};
use ftlab_nbd::protocol as p;
use ftlab_nbd::{serve_connection, NbdOptions};
use ftlab_store::codec::Codec;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

const SIZE: u64 = 64 << 20;

/// The device the tests serve: FEMU-like flash cut to 64 MiB exposed (SIZE), small enough
/// for GC to run.
fn small_config() -> ftlab_core::config::Config {
    config(
        "femu",
        &[
            "flash.blocks_per_die=4",
            "flash.superblock_dies=1",
            "capacity.logical_bytes=67108864",
        ],
    )
}

fn device() -> Arc<Device> {
    device_with(Latency::None)
}

fn device_with(latency: Latency) -> Arc<Device> {
    device_with_limit(latency, None)
}

fn device_with_limit(latency: Latency, mem_limit_bytes: Option<u64>) -> Arc<Device> {
    device_with_codec(latency, mem_limit_bytes, Codec::Lz4)
}

fn device_with_codec(latency: Latency, mem_limit_bytes: Option<u64>, codec: Codec) -> Arc<Device> {
    let c = small_config();
    let options = DeviceOptions {
        latency,
        codec,
        mem_limit_bytes,
        ..options()
    };
    Arc::new(Device::new(&c, options).unwrap())
}

/// The options the tests start from: export `ftlab`, no latency emulation, lz4, no record, no
/// limits beyond the defaults, writable.
fn options() -> DeviceOptions {
    DeviceOptions {
        export_name: "ftlab".into(),
        exports: Vec::new(),
        latency: Latency::None,
        codec: Codec::Lz4,
        record: None,
        record_format: ftlab_device::RecordFormat::Nbdkit,
        mem_limit_bytes: None,
        max_inflight_bytes: ftlab_device::DEFAULT_MAX_INFLIGHT_BYTES,
        read_only: false,
        data: None,
        durability: Default::default(),
        checkpoint_every_bytes: Some(256 << 20),
        maintenance: Default::default(),
        cache_bytes: 1 << 20,
        cache_policy: Default::default(),
    }
}

/// Starts serving one end of a socket pair; returns the client's end and the server's result
/// (its error as the log would print it).
fn connect(device: &Arc<Device>) -> (UnixStream, std::thread::JoinHandle<Result<(), String>>) {
    connect_with(device, &NbdOptions::default())
}

/// [`connect`] to a server with these options (TLS).
fn connect_with(
    device: &Arc<Device>,
    nbd: &NbdOptions,
) -> (UnixStream, std::thread::JoinHandle<Result<(), String>>) {
    let (client, server) = UnixStream::pair().unwrap();
    // A server that stops answering fails the test instead of hanging it.
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let (device, nbd) = (device.clone(), nbd.clone());
    let handle = std::thread::spawn(move || {
        let reader = server.try_clone().unwrap();
        serve_connection(&device, &nbd, reader, server).map_err(|e| e.to_string())
    });
    (client, handle)
}

pub(crate) struct Client {
    s: UnixStream,
    cookie: u64,
    /// Structured replies were negotiated.
    structured: bool,
    /// The message of the last structured error chunk.
    last_error_message: String,
}

fn option(s: &mut impl Write, option: u32, data: &[u8]) {
    let mut m = p::IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// (reply type, data) of one option reply.
fn option_reply(s: &mut impl Read) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u64::from_be_bytes(h[..8].try_into().unwrap()),
        p::REPLY_MAGIC_OPT
    );
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    (kind, d)
}

fn go_data(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&1u16.to_be_bytes());
    d.extend_from_slice(&p::INFO_BLOCK_SIZE.to_be_bytes());
    d
}

fn greet(s: &mut UnixStream) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g, &p::greeting());
    s.write_all(&(p::CLIENT_FIXED_NEWSTYLE | p::CLIENT_NO_ZEROES).to_be_bytes())
        .unwrap();
}

impl Client {
    fn open(device: &Arc<Device>) -> (Client, std::thread::JoinHandle<Result<(), String>>) {
        Client::open_with(device, false)
    }

    fn open_with(
        device: &Arc<Device>,
        structured: bool,
    ) -> (Client, std::thread::JoinHandle<Result<(), String>>) {
        Client::open_negotiating(device, structured, |_| {})
    }

    /// Opens a connection, `negotiate` sending options (after structured replies, when asked
    /// for) before `NBD_OPT_GO`.
    fn open_negotiating(
        device: &Arc<Device>,
        structured: bool,
        negotiate: impl FnOnce(&mut UnixStream),
    ) -> (Client, std::thread::JoinHandle<Result<(), String>>) {
        let (mut s, h) = connect(device);
        greet(&mut s);
        if structured {
            // With data it is refused; without, acknowledged.
            option(&mut s, p::OPT_STRUCTURED_REPLY, b"x");
            assert_eq!(option_reply(&mut s).0, p::REP_ERR_INVALID);
            option(&mut s, p::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(option_reply(&mut s).0, p::REP_ACK);
        }
        negotiate(&mut s);
        option(&mut s, p::OPT_GO, &go_data("ftlab"));
        let mut size = None;
        loop {
            let (kind, d) = option_reply(&mut s);
            match kind {
                p::REP_INFO if u16::from_be_bytes([d[0], d[1]]) == p::INFO_EXPORT => {
                    size = Some(u64::from_be_bytes(d[2..10].try_into().unwrap()));
                    let flags = u16::from_be_bytes([d[10], d[11]]);
                    // DF only with structured replies, as the spec requires.
                    assert_eq!(flags & p::TF_SEND_DF != 0, structured);
                }
                p::REP_INFO => {}
                p::REP_ACK => break,
                other => panic!("unexpected reply {other:#x}"),
            }
        }
        assert_eq!(size, Some(SIZE));
        let client = Client {
            s,
            cookie: 0,
            structured,
            last_error_message: String::new(),
        };
        (client, h)
    }

    pub(crate) fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> (u32, Vec<u8>) {
        self.cookie += 1;
        let mut m = p::REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&command.to_be_bytes());
        m.extend_from_slice(&self.cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&length.to_be_bytes());
        m.extend_from_slice(data);
        self.s.write_all(&m).unwrap();
        let mut magic = [0u8; 4];
        self.s.read_exact(&mut magic).unwrap();
        if u32::from_be_bytes(magic) == p::STRUCTURED_REPLY_MAGIC {
            assert!(
                self.structured,
                "a structured reply that was not negotiated"
            );
            return self.structured_reply(offset);
        }
        assert!(
            !(self.structured && command == p::CMD_READ),
            "a simple reply to a read after structured replies were negotiated"
        );
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&magic);
        self.s.read_exact(&mut h[4..]).unwrap();
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            p::SIMPLE_REPLY_MAGIC
        );
        assert_eq!(u64::from_be_bytes(h[8..].try_into().unwrap()), self.cookie);
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let mut d = Vec::new();
        if command == p::CMD_READ && error == 0 {
            d.resize(length as usize, 0);
            self.s.read_exact(&mut d).unwrap();
        }
        (error, d)
    }

    /// NBD_CMD_DISC: no reply; the server ends the connection in order.
    fn disconnect(&mut self) {
        let mut m = p::REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&0u16.to_be_bytes());
        m.extend_from_slice(&p::CMD_DISC.to_be_bytes());
        m.extend_from_slice(&[0u8; 20]);
        self.s.write_all(&m).unwrap();
    }

    /// The rest of a one-chunk structured reply (the magic is read).
    fn structured_reply(&mut self, offset: u64) -> (u32, Vec<u8>) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        let flags = u16::from_be_bytes([h[0], h[1]]);
        let kind = u16::from_be_bytes([h[2], h[3]]);
        assert_eq!(
            u64::from_be_bytes(h[4..12].try_into().unwrap()),
            self.cookie
        );
        let len = u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize;
        assert_eq!(
            flags,
            p::REPLY_FLAG_DONE,
            "ftlab answers in one final chunk"
        );
        let mut payload = vec![0u8; len];
        self.s.read_exact(&mut payload).unwrap();
        match kind {
            p::REPLY_TYPE_NONE => {
                assert_eq!(len, 0);
                (0, Vec::new())
            }
            p::REPLY_TYPE_OFFSET_DATA => {
                assert!(len > 8, "no empty data chunks");
                assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), offset);
                (0, payload[8..].to_vec())
            }
            // The context id, then (length, flags) descriptors.
            p::REPLY_TYPE_BLOCK_STATUS => (0, payload),
            p::REPLY_TYPE_ERROR => {
                let error = u32::from_be_bytes(payload[..4].try_into().unwrap());
                let n = u16::from_be_bytes([payload[4], payload[5]]) as usize;
                assert_eq!(n + 6, len);
                self.last_error_message = String::from_utf8(payload[6..].to_vec()).unwrap();
                assert_ne!(error, 0);
                (error, Vec::new())
            }
            other => panic!("unexpected chunk type {other}"),
        }
    }
}

#[test]
fn structured_replies_carry_reads_and_errors() {
    let device = device();
    let (mut c, h) = Client::open_with(&device, true);
    let mut oracle = vec![0u8; 1 << 20];
    let mut rng = SplitMix64::new(17);
    for _ in 0..300 {
        let offset = rng.bounded(1 << 20);
        let len = (1 + rng.bounded(20_000) as u32).min((1 << 20) - offset as u32);
        let end = (offset + u64::from(len)) as usize;
        if rng.bounded(2) == 0 {
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8 & 0x0f).collect();
            assert_eq!(c.request(p::CMD_WRITE, 0, offset, len, &data).0, 0);
            oracle[offset as usize..end].copy_from_slice(&data);
        } else {
            let (err, d) = c.request(p::CMD_READ, 0, offset, len, &[]);
            assert_eq!(err, 0);
            assert!(d == oracle[offset as usize..end], "read at {offset}+{len}");
        }
    }
    // A zero-length read is a bare final chunk; a read past the end an error with a message.
    assert_eq!(c.request(p::CMD_READ, 0, 0, 0, &[]), (0, Vec::new()));
    let (err, _) = c.request(p::CMD_READ, 0, SIZE - 10, 4096, &[]);
    assert_eq!(err, p::EINVAL);
    assert!(
        c.last_error_message.contains("offset"),
        "{}",
        c.last_error_message
    );
    // The connection still serves; DF ("don't fragment") reads are one chunk like all reads.
    const CMD_FLAG_DF: u16 = 1 << 2;
    let (err, d) = c.request(p::CMD_READ, CMD_FLAG_DF, 0, 4096, &[]);
    assert_eq!((err, &d[..]), (0, &oracle[..4096]));
    drop(c);
    assert!(h.join().unwrap().is_ok());
}

#[test]
fn reads_return_what_was_written_at_any_offset_and_length() {
    let device = device();
    let (mut c, _h) = Client::open(&device);
    let mut oracle = vec![0u8; SIZE as usize];
    let mut rng = SplitMix64::new(3);
    // Confine most traffic to 2 MiB so requests overlap.
    for i in 0..600 {
        let offset = rng.bounded(2 << 20);
        let len = 1 + rng.bounded(if i % 3 == 0 { 20_000 } else { 4096 }) as u32;
        let end = (offset + u64::from(len)) as usize;
        match rng.bounded(6) {
            0 | 1 => {
                let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8 & 0x0f).collect();
                let fua = if rng.bounded(4) == 0 {
                    p::CMD_FLAG_FUA
                } else {
                    0
                };
                assert_eq!(c.request(p::CMD_WRITE, fua, offset, len, &data).0, 0);
                oracle[offset as usize..end].copy_from_slice(&data);
            }
            2 => {
                let flags = if rng.bounded(2) == 0 {
                    p::CMD_FLAG_NO_HOLE
                } else {
                    0
                };
                assert_eq!(c.request(p::CMD_WRITE_ZEROES, flags, offset, len, &[]).0, 0);
                oracle[offset as usize..end].fill(0);
            }
            3 => {
                // Trim may leave data or zeros; only whole pages are deallocated here.
                assert_eq!(c.request(p::CMD_TRIM, 0, offset, len, &[]).0, 0);
                let a = offset.div_ceil(4096) as usize * 4096;
                let b = end / 4096 * 4096;
                if a < b {
                    oracle[a..b].fill(0);
                }
            }
            4 => assert_eq!(c.request(p::CMD_FLUSH, 0, 0, 0, &[]).0, 0),
            _ => {
                let (e, d) = c.request(p::CMD_READ, 0, offset, len, &[]);
                assert_eq!(e, 0);
                assert!(
                    d == oracle[offset as usize..end],
                    "read at {offset} +{len} differs"
                );
            }
        }
    }
    let (e, d) = c.request(p::CMD_READ, 0, 0, 2 << 20, &[]);
    assert_eq!(e, 0);
    assert!(d == oracle[..2 << 20]);
    let (_, stats) = device.ftl_stats();
    let (host, nand) = (stats.host_write_pages, stats.nand_write_pages());
    assert!(
        host > 0 && nand >= host / 2,
        "the FTL saw the writes: host {host} nand {nand}"
    );
}

#[test]
fn protocol_abuse_closes_only_the_abusive_connection() {
    let device = device();
    let (mut good, good_h) = Client::open(&device);
    let data = vec![7u8; 4096];
    assert_eq!(good.request(p::CMD_WRITE, 0, 4096, 4096, &data).0, 0);

    // Requests past the end or too long: errors, connection stays usable.
    assert_eq!(
        good.request(p::CMD_READ, 0, SIZE - 100, 4096, &[]).0,
        p::EINVAL
    );
    assert_eq!(
        good.request(p::CMD_WRITE, 0, SIZE - 100, 200, &[1u8; 200])
            .0,
        p::ENOSPC
    );
    assert_eq!(
        good.request(p::CMD_READ, 0, 0, p::MAX_REQUEST_BYTES + 1, &[])
            .0,
        p::EINVAL
    );
    assert_eq!(good.request(99, 0, 0, 0, &[]).0, p::EINVAL);
    // A flush names no range: whatever it carries is ignored (an offset near 2^64 used to
    // overflow the server's page arithmetic; found by the fuzz target).
    assert_eq!(good.request(p::CMD_FLUSH, 0, u64::MAX - 10, 4096, &[]).0, 0);
    assert_eq!(good.request(p::CMD_READ, 0, 4096, 4096, &[]).1, data);
    // Without a payload, longer than the maximum block size is fine (mkfs discards the whole
    // device in one request).
    assert!(SIZE > u64::from(p::MAX_REQUEST_BYTES));
    for command in [p::CMD_TRIM, p::CMD_WRITE_ZEROES] {
        assert_eq!(good.request(command, 0, 0, SIZE as u32, &[]).0, 0);
        assert_eq!(
            good.request(p::CMD_READ, 0, 4096, 4096, &[]).1,
            vec![0u8; 4096]
        );
        assert_eq!(good.request(p::CMD_WRITE, 0, 4096, 4096, &data).0, 0);
    }

    // Unknown option, unknown export, malformed GO: answered, negotiation goes on.
    let (mut s, h) = connect(&device);
    greet(&mut s);
    option(&mut s, 42, b"whatever");
    assert_eq!(option_reply(&mut s).0, p::REP_ERR_UNSUP);
    option(&mut s, p::OPT_GO, &go_data("nope"));
    assert_eq!(option_reply(&mut s).0, p::REP_ERR_UNKNOWN);
    option(&mut s, p::OPT_GO, &[0, 0, 0, 9, b'x']);
    assert_eq!(option_reply(&mut s).0, p::REP_ERR_INVALID);
    option(&mut s, p::OPT_LIST, &[]);
    assert_eq!(option_reply(&mut s).0, p::REP_SERVER);
    assert_eq!(option_reply(&mut s).0, p::REP_ACK);
    option(&mut s, p::OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut s).0, p::REP_ACK);
    assert_eq!(h.join().unwrap(), Ok(()));

    // Each of these closes its connection with a reason.
    type Abuse = Box<dyn Fn(&mut UnixStream)>;
    let abuses: Vec<(&str, Abuse)> = vec![
        (
            "truncated handshake",
            Box::new(|s: &mut UnixStream| {
                s.write_all(&[0, 0]).unwrap();
            }),
        ),
        (
            "not fixed newstyle",
            Box::new(|s: &mut UnixStream| {
                s.write_all(&0u32.to_be_bytes()).unwrap();
            }),
        ),
        (
            "wrong option magic",
            Box::new(|s: &mut UnixStream| {
                s.write_all(&1u32.to_be_bytes()).unwrap();
                s.write_all(&[0x55; 16]).unwrap();
            }),
        ),
        (
            "oversized option",
            Box::new(|s: &mut UnixStream| {
                s.write_all(&1u32.to_be_bytes()).unwrap();
                let mut m = p::IHAVEOPT.to_be_bytes().to_vec();
                m.extend_from_slice(&p::OPT_GO.to_be_bytes());
                m.extend_from_slice(&u32::MAX.to_be_bytes());
                s.write_all(&m).unwrap();
            }),
        ),
    ];
    for (what, abuse) in abuses {
        let (mut s, h) = connect(&device);
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        abuse(&mut s);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let result = h.join().unwrap();
        assert!(result.is_err(), "{what}: {result:?}");
    }
    // Garbage in transmission: wrong request magic, and a write longer than the maximum.
    for garbage in [vec![0xAAu8; 28], {
        let mut m = p::REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&0u16.to_be_bytes());
        m.extend_from_slice(&p::CMD_WRITE.to_be_bytes());
        m.extend_from_slice(&[0u8; 16]);
        m.extend_from_slice(&u32::MAX.to_be_bytes());
        m
    }] {
        let (mut c, h) = Client::open(&device);
        c.s.write_all(&garbage).unwrap();
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(h.join().unwrap().is_err());
    }
    // The well-behaved connection kept working throughout.
    assert_eq!(good.request(p::CMD_READ, 0, 4096, 4096, &[]).1, data);
    // NBD_CMD_DISC has no reply: the server ends the connection in order.
    good.disconnect();
    assert_eq!(good_h.join().unwrap(), Ok(()));
}

#[test]
fn qemu_io_writes_patterns_at_odd_offsets_and_reads_them_back() {
    if std::process::Command::new("qemu-io")
        .arg("--version")
        .output()
        .is_err()
    {
        return crate::support::skip(
            "qemu_io_writes_patterns_at_odd_offsets_and_reads_them_back",
            "qemu-io is not installed (apt-get install qemu-utils)",
        );
    }
    let dir = temp_dir("qemu");
    let sock = dir.join("nbd.sock");
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_ftlab"))
        .args(["serve", "--no-tcp", "--unix"])
        .arg(&sock)
        .args(["--set", "capacity.logical_bytes=268435456"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let url = format!("nbd+unix:///ftlab?socket={}", sock.display());
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw"])
        .args(["-c", "write -P 0x5a 1000 70001"])
        .args(["-c", "write -P 0xc3 200003 513"])
        .args(["-c", "write -z 4096 8192"])
        .args(["-c", "read -P 0x5a 1000 3096"])
        .args(["-c", "read -P 0 4096 8192"])
        .args(["-c", "read -P 0x5a 12288 58713"])
        .args(["-c", "read -P 0xc3 200003 513"])
        .args(["-c", "read -P 0 0 1000"])
        .args(["-c", "discard 1048576 1048576"])
        .args(["-c", "read -P 0 1048576 1048576"])
        .args(["-c", "flush"])
        .arg(&url)
        .output()
        .unwrap();
    // SIGTERM: the server prints its summary and exits.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGTERM);
    }
    let status = server.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.contains("Pattern verification failed"), "{stdout}");
    assert_eq!(stdout.matches("read ").count(), 6, "{stdout}");
    assert!(status.success());
}

#[test]
fn real_latency_holds_replies_for_the_simulated_time_and_overlaps_requests_in_flight() {
    // femu timing: a page program takes 200 us; superblocks of one die each here.
    let device = device_with(Latency::Real);
    let (mut c, _h) = Client::open(&device);
    let t = std::time::Instant::now();
    assert_eq!(c.request(p::CMD_WRITE, 0, 0, 4096, &[1u8; 4096]).0, 0);
    let one = t.elapsed();
    assert!(
        one >= std::time::Duration::from_micros(200),
        "replied after {one:?}"
    );
    // 32 writes in flight: pages of the open superblock sit on one die, so the device takes
    // 32 x 200 us; the client sees the last reply after about that long, not 32 round trips
    // of sleeping one after another (which would be 1 + 2 + ... + 32 x 200 us).
    let t = std::time::Instant::now();
    let mut m = Vec::new();
    for i in 0..32u64 {
        m.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
        m.extend_from_slice(&0u16.to_be_bytes());
        m.extend_from_slice(&p::CMD_WRITE.to_be_bytes());
        m.extend_from_slice(&(100 + i).to_be_bytes());
        m.extend_from_slice(&((i + 1) * 4096).to_be_bytes());
        m.extend_from_slice(&4096u32.to_be_bytes());
        m.extend_from_slice(&[2u8; 4096]);
    }
    c.s.write_all(&m).unwrap();
    let mut cookies = Vec::new();
    for _ in 0..32 {
        let mut h = [0u8; 16];
        c.s.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
        cookies.push(u64::from_be_bytes(h[8..].try_into().unwrap()));
    }
    let all = t.elapsed();
    cookies.sort_unstable();
    assert_eq!(cookies, (100..132).collect::<Vec<u64>>());
    assert!(all >= std::time::Duration::from_micros(32 * 200), "{all:?}");
    assert!(
        all < std::time::Duration::from_millis(60),
        "replies did not overlap: {all:?}"
    );
}

/// `--mem-limit`: once the store is full, writes get ENOSPC, the connection keeps working, what
/// was written reads back, and a trim makes room again.
#[test]
fn a_full_store_answers_enospc_and_keeps_serving() {
    let device = device_with_limit(Latency::None, Some(1 << 20));
    let (mut c, _h) = Client::open(&device);
    let mut rng = SplitMix64::new(11);
    let mut written = Vec::new();
    let mut refused = None;
    for i in 0..1024u64 {
        let data: Vec<u8> = (0..65536).map(|_| rng.next_u64() as u8).collect();
        let (err, _) = c.request(p::CMD_WRITE, 0, i * 65536, 65536, &data);
        if err != 0 {
            refused = Some((i, err));
            break;
        }
        written.push(data);
    }
    let (at, err) = refused.expect("1 MiB of random data cannot hold 64 MiB");
    assert_eq!(err, p::ENOSPC);
    assert!(at >= 8, "refused after only {at} writes of 64 KiB");
    for (i, data) in written.iter().enumerate() {
        let (err, back) = c.request(p::CMD_READ, 0, i as u64 * 65536, 65536, &[]);
        assert_eq!((err, &back), (0, data), "chunk {i}");
    }
    let (err, _) = c.request(p::CMD_TRIM, 0, 0, 4 << 20, &[]);
    assert_eq!(err, 0);
    let (err, _) = c.request(p::CMD_WRITE, 0, at * 65536, 4096, &written[0][..4096]);
    assert_eq!(err, 0, "after a trim the write fits");
}

/// `ftl.mapping` applies to the server's FTL model too, and its statistics name the table.
#[test]
fn the_server_models_the_configured_mapping_table() {
    let c = config(
        "femu",
        &[
            "flash.blocks_per_die=4",
            "flash.superblock_dies=1",
            "capacity.logical_bytes=67108864",
            "ftl.mapping=\"learned\"",
        ],
    );
    let device = Arc::new(Device::new(&c, options()).unwrap());
    let (mut c, _h) = Client::open(&device);
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for i in 0..8u64 {
        assert_eq!(c.request(p::CMD_WRITE, 0, i << 20, 1 << 20, &data).0, 0);
    }
    let (err, back) = c.request(p::CMD_READ, 0, 3 << 20, 1 << 20, &[]);
    assert_eq!((err, back == data), (0, true));
    let stats = device.stats_json();
    assert_eq!(stats["mapping"]["table"], "learned");
    assert_eq!(stats["mapping"]["live_mappings"], 8 * 256);
    assert!(stats["mapping"]["compressed_get_fraction"]
        .as_f64()
        .is_some());
    crate::docs::assert_serve_stats_documented(&stats);
}

#[test]
fn a_zstd_dict_device_trains_its_dictionary_by_itself_once_enough_is_stored() {
    use ftlab_device::dictionary::{DictionarySchedule, FIRST_TRAINING_PAGES};
    let level = 3;
    let device = device_with_codec(Latency::None, None, Codec::ZstdDict { level });
    let (mut c, _h) = Client::open(&device);
    // Log-like text: a shared vocabulary with varying fields, as a dictionary is meant for.
    let mut rng = SplitMix64::new(7);
    let mut text = String::new();
    while text.len() < FIRST_TRAINING_PAGES as usize * 4096 {
        let r = rng.next_u64();
        text += &format!(
            "2026-11-22T12:{:02}:{:02} {} conn={} peer=10.0.{}.{} bytes={} status={}\n",
            r % 60,
            (r >> 8) % 60,
            [
                "INFO accepted",
                "WARN slow request",
                "INFO closed",
                "ERROR reset by peer"
            ][(r >> 16) as usize % 4],
            (r >> 20) % 100_000,
            (r >> 40) % 256,
            (r >> 48) % 256,
            (r >> 24) % 1_000_000,
            [200, 404, 500][(r >> 56) as usize % 3],
        );
    }
    let data = &text.as_bytes()[..FIRST_TRAINING_PAGES as usize * 4096];
    let mut schedule = DictionarySchedule::default();
    let write = |c: &mut Client, bytes: &[u8], at: usize| {
        for (i, chunk) in bytes.chunks(1 << 20).enumerate() {
            let offset = (at + (i << 20)) as u64;
            let len = chunk.len() as u32;
            assert_eq!(c.request(p::CMD_WRITE, 0, offset, len, chunk).0, 0);
        }
    };
    let write_all = |c: &mut Client| write(c, data, 0);
    let last_page = data.len() - 4096;
    write(&mut c, &data[..last_page], 0);
    assert_eq!(
        device.train_dictionary_if_due(&mut schedule),
        None,
        "one page short of the threshold"
    );
    write(&mut c, &data[last_page..], last_page);
    let line = device.train_dictionary_if_due(&mut schedule).unwrap();
    assert!(line.contains("trained"), "{line}");
    assert_eq!(device.train_dictionary_if_due(&mut schedule), None);
    let dictionary_bytes = device.store_stats().dictionary_bytes;
    assert!(dictionary_bytes > 0 && dictionary_bytes <= 1 << 20);
    let plain = device.store_stats().compr_data_size;
    // The same bytes again, now with the dictionary: smaller, and read back exactly.
    write_all(&mut c);
    let with_dictionary = device.store_stats().compr_data_size;
    assert!(
        (with_dictionary as f64) < 0.9 * plain as f64,
        "{with_dictionary} vs {plain}"
    );
    let (err, back) = c.request(p::CMD_READ, 0, 0, 1 << 20, &[]);
    assert_eq!((err, &back[..]), (0, &data[..1 << 20]));
    // Other codecs never train.
    let lz4 = device_with(Latency::None);
    assert_eq!(
        lz4.train_dictionary_if_due(&mut DictionarySchedule::default()),
        None
    );
}

/// A page that fails its checksum at shutdown costs that page, not the image: every other page
/// is saved (beside the image, as PATH.tmp), the earlier image is kept, and the error names the
/// LPN.
#[test]
fn saving_the_image_survives_a_corrupt_page_and_names_it() {
    let dir = temp_dir("corrupt-image");
    let device = device();
    let page = 4096usize;
    let pages = 64usize;
    // Log-like text: compressible, so stored as compressed bytes the test can corrupt.
    let mut rng = SplitMix64::new(5);
    let content: Vec<u8> = (0..pages * page / 16)
        .flat_map(|_| format!("t={:010} ok\n", rng.bounded(1 << 30)).into_bytes())
        .collect();
    assert_eq!(content.len(), pages * page);
    let source = dir.join("source.img");
    std::fs::write(&source, &content).unwrap();
    assert_eq!(device.load_image(&source, true).unwrap(), pages as u64);
    let bad_lpn = 37u64;
    assert!(device.corrupt_page_for_test(bad_lpn));

    let image = dir.join("dev.img");
    std::fs::write(&image, b"the earlier image").unwrap();
    let err = device.save_image(&image).unwrap_err().to_string();
    assert!(err.contains("lpn 37"), "{err}");
    assert!(err.contains("dev.img.tmp"), "{err}");
    assert_eq!(std::fs::read(&image).unwrap(), b"the earlier image");
    let saved = std::fs::read(dir.join("dev.img.tmp")).unwrap();
    assert_eq!(saved.len() as u64, device.size_bytes());
    for lpn in 0..pages {
        let got = &saved[lpn * page..(lpn + 1) * page];
        if lpn as u64 == bad_lpn {
            assert!(got.iter().all(|&b| b == 0), "the unreadable page is zeros");
        } else {
            assert_eq!(got, &content[lpn * page..(lpn + 1) * page], "lpn {lpn}");
        }
    }
    assert!(saved[pages * page..].iter().all(|&b| b == 0));
}

/// A save that cannot write (its temporary file here is /dev/full, which can be neither sized
/// nor written, as a full disk) removes its partial file, says so, and keeps the earlier image.
#[test]
fn a_failed_save_removes_its_partial_file_and_keeps_the_earlier_image() {
    let dir = temp_dir("failed-save");
    let device = device();
    let image = dir.join("dev.img");
    std::fs::write(&image, b"the earlier image").unwrap();
    let tmp = dir.join("dev.img.tmp");
    std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
    let err = device.save_image(&image).unwrap_err().to_string();
    assert!(
        err.contains("not saved") && err.contains("dev.img.tmp removed"),
        "{err}"
    );
    assert!(
        std::fs::symlink_metadata(&tmp).is_err(),
        "{tmp:?} is still there"
    );
    assert_eq!(std::fs::read(&image).unwrap(), b"the earlier image");
}

/// A bug that panics while a request executes (armed here by a test hook) must not leave the
/// client waiting for a reply that never comes: the request is answered EIO, the device is
/// marked failed, every later request on every connection is answered EIO with the reason,
/// and the connections still end in order.
#[test]
fn a_panic_executing_a_request_fails_the_device_instead_of_hanging_its_clients() {
    let device = device();
    let (mut plain, plain_h) = Client::open(&device);
    let (mut structured, structured_h) = Client::open_with(&device, true);
    for c in [&plain, &structured] {
        // Before the fix the client waited for ever; a reply must come well within this.
        c.s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
    }
    let data = vec![0x5au8; 4096];
    assert_eq!(plain.request(p::CMD_WRITE, 0, 0, 4096, &data).0, 0);
    assert_eq!(device.failure(), None);

    device.panic_next_request_for_test();
    assert_eq!(plain.request(p::CMD_WRITE, 0, 8192, 4096, &data).0, p::EIO);
    let why = device.failure().expect("the device is marked failed");
    assert!(why.contains("WRITE at offset 8192"), "{why}");

    // Nothing executes any more, on either connection, and a structured client is told why.
    assert_eq!(plain.request(p::CMD_READ, 0, 0, 4096, &[]).0, p::EIO);
    assert_eq!(structured.request(p::CMD_READ, 0, 0, 4096, &[]).0, p::EIO);
    assert!(
        structured
            .last_error_message
            .contains("the device has failed: internal error"),
        "{}",
        structured.last_error_message
    );
    let (requests, _) = device.ftl_stats();
    assert_eq!(
        requests, 1,
        "only the write before the panic reached the model"
    );
    assert_eq!(device.stats_json()["failure"].as_str(), Some(why));

    // The connections end in order, and finishing names the failure.
    drop(plain);
    drop(structured);
    assert_eq!(plain_h.join().unwrap(), Ok(()));
    assert_eq!(structured_h.join().unwrap(), Ok(()));
    let finished = device.finish().unwrap_err().to_string();
    assert!(
        finished.contains("the device failed: internal error"),
        "{finished}"
    );
}

/// `NBD_OPT_*_META_CONTEXT` data: the export name, then the queries.
fn meta_context_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// The (length, flags) descriptors of a block status reply for context `id`.
fn descriptors(payload: &[u8], id: u32) -> Vec<(u32, u32)> {
    assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), id);
    payload[4..]
        .chunks(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                u32::from_be_bytes(d[4..].try_into().unwrap()),
            )
        })
        .collect()
}

/// `base:allocation` through `NBD_OPT_SET_META_CONTEXT` and `NBD_CMD_BLOCK_STATUS`: unwritten
/// and trimmed pages are holes reading as zeros, pages written as zeros read as zeros, the rest
/// is data (nbdinfo --map, qemu-img map and nbdcopy read this: `tools.rs`); `NBD_CMD_CACHE` is
/// accepted.
#[test]
fn block_status_tells_holes_zeros_and_data_and_cache_is_accepted() {
    const HOLE: u32 = p::STATE_HOLE | p::STATE_ZERO;
    let device = device();
    // Without structured replies the context cannot be chosen.
    let (mut plain, _h) = Client::open_negotiating(&device, false, |s| {
        option(
            s,
            p::OPT_SET_META_CONTEXT,
            &meta_context_data("ftlab", &["base:allocation"]),
        );
        assert_eq!(option_reply(s).0, p::REP_ERR_INVALID);
    });
    assert_eq!(
        plain.request(p::CMD_BLOCK_STATUS, 0, 0, 4096, &[]).0,
        p::EINVAL
    );
    let (mut c, _h) = Client::open_negotiating(&device, true, |s| {
        // LIST with no query lists every context, with id 0.
        option(
            s,
            p::OPT_LIST_META_CONTEXT,
            &meta_context_data("ftlab", &[]),
        );
        let (kind, d) = option_reply(s);
        assert_eq!(
            (kind, &d[..4], &d[4..]),
            (p::REP_META_CONTEXT, &[0u8; 4][..], &b"base:allocation"[..])
        );
        assert_eq!(option_reply(s).0, p::REP_ACK);
        // Another export's contexts: unknown.
        option(
            s,
            p::OPT_SET_META_CONTEXT,
            &meta_context_data("other", &["base:allocation"]),
        );
        assert_eq!(option_reply(s).0, p::REP_ERR_UNKNOWN);
        // SET picks the one it knows among what is asked.
        option(
            s,
            p::OPT_SET_META_CONTEXT,
            &meta_context_data("ftlab", &["qemu:dirty-bitmap:x", "base:allocation"]),
        );
        let (kind, d) = option_reply(s);
        assert_eq!(kind, p::REP_META_CONTEXT);
        assert_eq!(&d[4..], b"base:allocation");
        assert_eq!(option_reply(s).0, p::REP_ACK);
    });
    let id = 1;
    let page = |n: u8| vec![n; 4096];
    assert_eq!(c.request(p::CMD_WRITE, 0, 4096, 4096, &page(7)).0, 0);
    assert_eq!(c.request(p::CMD_WRITE, 0, 3 * 4096, 4096, &page(0)).0, 0);
    assert_eq!(
        c.request(
            p::CMD_WRITE,
            0,
            5 * 4096,
            2 * 4096,
            &[page(9), page(9)].concat()
        )
        .0,
        0
    );
    assert_eq!(c.request(p::CMD_TRIM, 0, 6 * 4096, 4096, &[]).0, 0);
    let (err, payload) = c.request(p::CMD_BLOCK_STATUS, 0, 0, 8 * 4096, &[]);
    assert_eq!(err, 0);
    assert_eq!(
        descriptors(&payload, id),
        [
            (4096, HOLE),
            (4096, 0),
            (4096, HOLE),
            (4096, p::STATE_ZERO),
            (4096, HOLE),
            (4096, 0),
            (2 * 4096, HOLE)
        ]
    );
    // From an odd offset, with REQ_ONE: the first extent only, from the offset.
    let (_, payload) = c.request(p::CMD_BLOCK_STATUS, p::CMD_FLAG_REQ_ONE, 100, 8 * 4096, &[]);
    assert_eq!(descriptors(&payload, id), [(4096 - 100, HOLE)]);
    // Beyond the device, or empty: EINVAL.
    assert_eq!(
        c.request(p::CMD_BLOCK_STATUS, 0, SIZE - 4096, 8192, &[]).0,
        p::EINVAL
    );
    assert_eq!(c.request(p::CMD_BLOCK_STATUS, 0, 0, 0, &[]).0, p::EINVAL);
    // CACHE: nothing to bring nearer than RAM; in range it succeeds.
    assert_eq!(c.request(p::CMD_CACHE, 0, 0, 1 << 20, &[]).0, 0);
    assert_eq!(c.request(p::CMD_CACHE, 0, SIZE, 4096, &[]).0, p::EINVAL);
}

/// `--read-only`: advertised with `NBD_FLAG_READ_ONLY`, and writes, trims and zeroes that come
/// anyway are refused with EPERM, the data unchanged.
#[test]
fn a_read_only_export_refuses_writes_with_eperm() {
    let c = small_config();
    let read_only = DeviceOptions {
        read_only: true,
        ..options()
    };
    let device = Arc::new(Device::new(&c, read_only).unwrap());
    let (mut s, _h) = connect(&device);
    greet(&mut s);
    option(&mut s, p::OPT_GO, &go_data("ftlab"));
    let mut flags = None;
    loop {
        let (kind, d) = option_reply(&mut s);
        match kind {
            p::REP_INFO if u16::from_be_bytes([d[0], d[1]]) == p::INFO_EXPORT => {
                flags = Some(u16::from_be_bytes([d[10], d[11]]));
            }
            p::REP_ACK => break,
            _ => {}
        }
    }
    assert!(flags.unwrap() & p::TF_READ_ONLY != 0);
    let mut c = Client {
        s,
        cookie: 0,
        structured: false,
        last_error_message: String::new(),
    };
    let data = vec![5u8; 4096];
    assert_eq!(c.request(p::CMD_WRITE, 0, 0, 4096, &data).0, p::EPERM);
    assert_eq!(c.request(p::CMD_TRIM, 0, 0, 4096, &[]).0, p::EPERM);
    assert_eq!(c.request(p::CMD_WRITE_ZEROES, 0, 0, 4096, &[]).0, p::EPERM);
    let (err, back) = c.request(p::CMD_READ, 0, 0, 4096, &[]);
    assert_eq!((err, back == vec![0u8; 4096]), (0, true));
    assert_eq!(c.request(p::CMD_FLUSH, 0, 0, 0, &[]).0, 0);
    assert_eq!(device.ftl_stats().1.host_write_pages, 0);
}

/// Over a fresh connection `s`: the greeting, then GO for export `name` (structured replies
/// off); the client and the size GO gave.
pub(crate) fn go(mut s: UnixStream, name: &str) -> (Client, u64) {
    greet(&mut s);
    option(&mut s, p::OPT_GO, &go_data(name));
    let mut size = 0;
    loop {
        let (kind, d) = option_reply(&mut s);
        match kind {
            p::REP_INFO if u16::from_be_bytes([d[0], d[1]]) == p::INFO_EXPORT => {
                size = u64::from_be_bytes(d[2..10].try_into().unwrap());
            }
            p::REP_INFO => {}
            p::REP_ACK => break,
            other => panic!("export `{name}`: unexpected reply {other:#x}"),
        }
    }
    let client = Client {
        s,
        cookie: 0,
        structured: false,
        last_error_message: String::new(),
    };
    (client, size)
}

/// Opens export `name` of an in-process device; returns the client, the connection's thread
/// and the size GO gave.
fn open_export(
    device: &Arc<Device>,
    name: &str,
) -> (Client, std::thread::JoinHandle<Result<(), String>>, u64) {
    let (s, h) = connect(device);
    let (client, size) = go(s, name);
    (client, h, size)
}

/// Two exports (namespaces) on one device, each with its placement handle: LIST names both,
/// each has its own size and bounds, a write to one never shows in the other, and the model
/// places each export's writes on its handle; the statistics count per export.
#[test]
fn exports_share_the_device_and_keep_to_their_own_ranges() {
    let c = config(
        "femu",
        &[
            "flash.blocks_per_die=4",
            "flash.superblock_dies=1",
            "capacity.logical_bytes=67108864",
            "ftl.streams=3",
        ],
    );
    let spec = |name: &str, size: Option<u64>, handle: u8| ftlab_device::ExportSpec {
        name: name.into(),
        size_bytes: size,
        placement: ftlab_device::Placement::handle(handle),
        ..Default::default()
    };
    let dir = temp_dir("exports");
    let record = dir.join("record.nbdlog");
    let two = DeviceOptions {
        exports: vec![spec("wal", Some(16 << 20), 1), spec("db", None, 2)],
        record: Some(record.clone()),
        ..options()
    };
    let device = Arc::new(Device::new(&c, two).unwrap());

    // LIST: both names.
    let (mut s, h) = connect(&device);
    greet(&mut s);
    option(&mut s, p::OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (kind, d) = option_reply(&mut s);
        if kind == p::REP_ACK {
            break;
        }
        assert_eq!(kind, p::REP_SERVER);
        names.push(String::from_utf8(d[4..].to_vec()).unwrap());
    }
    assert_eq!(names, ["wal", "db"]);
    option(&mut s, p::OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut s).0, p::REP_ACK);
    drop(s);
    h.join().unwrap().unwrap();

    let (mut wal, hw, wal_size) = open_export(&device, "wal");
    let (mut db, hd, db_size) = open_export(&device, "db");
    assert_eq!((wal_size, db_size), (16 << 20, 48 << 20));
    // The same offsets in both: each reads back its own bytes.
    let a = vec![0xaau8; 65536];
    let b = vec![0xbbu8; 65536];
    for i in 0..64u64 {
        assert_eq!(wal.request(p::CMD_WRITE, 0, i * 65536, 65536, &a).0, 0);
        assert_eq!(db.request(p::CMD_WRITE, 0, i * 65536, 65536, &b).0, 0);
    }
    for i in 0..64u64 {
        assert_eq!(wal.request(p::CMD_READ, 0, i * 65536, 65536, &[]).1, a);
        assert_eq!(db.request(p::CMD_READ, 0, i * 65536, 65536, &[]).1, b);
    }
    // Each export's end is its own: the wal's last page works, one past it does not.
    assert_eq!(
        wal.request(p::CMD_WRITE, 0, wal_size - 4096, 4096, &a[..4096])
            .0,
        0
    );
    assert_eq!(
        wal.request(p::CMD_WRITE, 0, wal_size, 4096, &a[..4096]).0,
        p::ENOSPC
    );
    assert_eq!(
        wal.request(p::CMD_READ, 0, wal_size, 4096, &[]).0,
        p::EINVAL
    );
    assert_eq!(db.request(p::CMD_READ, 0, db_size - 4096, 4096, &[]).0, 0);
    // The db's first page is still its own after the wal wrote its last.
    assert_eq!(db.request(p::CMD_READ, 0, 0, 4096, &[]).1, b[..4096]);
    // NBD_CMD_DISC (no reply) ends each connection in order.
    wal.disconnect();
    db.disconnect();
    hw.join().unwrap().unwrap();
    hd.join().unwrap().unwrap();

    let stats = device.stats_json();
    let exports = stats["exports"].as_array().unwrap();
    assert_eq!(exports[0]["written_bytes"], 64 * 65536 + 4096);
    assert_eq!(exports[1]["written_bytes"], 64 * 65536);
    assert_eq!(exports[1]["base_bytes"], 16 << 20);
    let placements = stats["fdp"]["placements"].as_array().unwrap();
    let host = |h: usize| placements[h]["host_pages"].as_u64().unwrap();
    assert_eq!((host(0), host(1), host(2)), (0, 64 * 16 + 1, 64 * 16));
    // The record holds device offsets and each write's placement: the db's first write at its
    // base, on handle 2.
    device.finish().unwrap();
    let text = std::fs::read_to_string(&record).unwrap();
    let writes: Vec<&str> = text.lines().filter(|l| l.contains(" Write ")).collect();
    assert_eq!(writes.len(), 2 * 64 + 1);
    assert!(
        writes[0].contains("offset=0x0 ") && writes[0].contains(" pid=1 "),
        "{}",
        writes[0]
    );
    assert!(
        writes[1].contains("offset=0x1000000 ") && writes[1].contains(" pid=2 "),
        "{}",
        writes[1]
    );

    // A handle the device does not have, or exports beyond it, are refused.
    let refused = |exports| {
        let options = DeviceOptions {
            exports,
            ..options()
        };
        Device::new(&c, options).err().unwrap().to_string()
    };
    let e = refused(vec![spec("x", None, 3)]);
    assert!(
        e.contains("export `x`") && e.contains("placement 0:3"),
        "{e}"
    );
    let e = refused(vec![
        spec("x", Some(60 << 20), 0),
        spec("y", Some(8 << 20), 0),
    ]);
    assert!(e.contains("export `y`") && e.contains("do not fit"), "{e}");
    let e = refused(vec![spec("x", Some(1 << 20), 0), spec("x", None, 0)]);
    assert!(e.contains("named twice"), "{e}");
    let e = refused(vec![ftlab_device::ExportSpec {
        handles: vec![2],
        ..spec("x", None, 1)
    }]);
    assert!(e.contains("beyond its list of 1"), "{e}");

    // A placement handle list: this export's placement handle 0 is the device's handle 2.
    let listed = DeviceOptions {
        exports: vec![ftlab_device::ExportSpec {
            handles: vec![2],
            ..spec("x", None, 0)
        }],
        ..options()
    };
    let device = Arc::new(Device::new(&c, listed).unwrap());
    let (mut x, hx, _) = open_export(&device, "x");
    assert_eq!(x.request(p::CMD_WRITE, 0, 0, 4096, &a[..4096]).0, 0);
    x.disconnect();
    hx.join().unwrap().unwrap();
    let stats = device.stats_json();
    assert_eq!(stats["fdp"]["placements"][2]["host_pages"], 1);
    assert_eq!(
        stats["exports"][0]["placement_handles"],
        serde_json::json!([2])
    );
}

/// `ftlab serve --data DIR` killed with SIGKILL while a client writes, rounds in a row: each
/// restart replays the log, and every page reads back as what the last FLUSH covered or as a
/// later write (never older, never anything else); a trim before a FLUSH stays trimmed.
#[test]
fn a_killed_durable_server_keeps_every_flushed_write() {
    /// Killed on drop, so a failing round leaves no server behind.
    struct Server(std::process::Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let dir = temp_dir("durable");
    let (sock, data) = (dir.join("nbd.sock"), dir.join("data"));
    // `ftlab serve --data` (and `extra`) on a fresh socket, and a client of it.
    let start = |extra: &[&str], stderr: std::process::Stdio| {
        let _ = std::fs::remove_file(&sock);
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_ftlab"))
            .args(["serve", "--no-tcp", "--unix"])
            .arg(&sock)
            .arg("--data")
            .arg(&data)
            .args(extra)
            .args(["--set", "capacity.logical_bytes=67108864"])
            .args(["--set", "flash.blocks_per_die=4"])
            .args(["--set", "flash.superblock_dies=1"])
            .stderr(stderr)
            .spawn()
            .unwrap();
        let child = Server(child);
        // The socket file appears at bind(2), a moment before listen(2): connect until it
        // answers.
        let mut s = None;
        for _ in 0..500 {
            if let Ok(c) = UnixStream::connect(&sock) {
                s = Some(c);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let s = s.expect("the server answers within 5 s");
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        (child, go(s, "ftlab").0)
    };
    let pages = 256u64;
    let page = |lpn: u64, version: u64| -> Vec<u8> {
        (0..4096u64)
            .map(|i| (lpn * 31 + version * 7 + i / 64) as u8)
            .collect()
    };
    // Per LPN: the version the last FLUSH covered (0: never written or trimmed) and the
    // versions written since.
    let mut flushed = vec![0u64; pages as usize];
    let mut since: Vec<Vec<u64>> = vec![Vec::new(); pages as usize];
    let mut rng = SplitMix64::new(23);
    let mut version = 0;
    for round in 0..crate::tools::crash_iterations().max(4) {
        let (mut child, mut c) = start(&[], std::process::Stdio::piped());
        // What survived the last kill.
        for lpn in 0..pages {
            let (err, got) = c.request(p::CMD_READ, 0, lpn * 4096, 4096, &[]);
            assert_eq!(err, 0);
            let allowed: Vec<u64> = std::iter::once(flushed[lpn as usize])
                .chain(since[lpn as usize].iter().copied())
                .collect();
            let which = allowed.iter().find(|&&v| {
                if v == 0 {
                    got.iter().all(|&b| b == 0)
                } else {
                    got == page(lpn, v)
                }
            });
            let Some(&v) = which else {
                panic!("round {round}: lpn {lpn} holds none of versions {allowed:?}");
            };
            flushed[lpn as usize] = v;
            since[lpn as usize].clear();
        }
        // New writes and trims; a FLUSH every 16; the server killed mid-stream.
        let operations = 200 + rng.bounded(100);
        for i in 0..operations {
            let lpn = rng.bounded(pages);
            if rng.bounded(10) == 0 {
                assert_eq!(c.request(p::CMD_TRIM, 0, lpn * 4096, 4096, &[]).0, 0);
                since[lpn as usize].push(0);
            } else {
                version += 1;
                let data = page(lpn, version);
                assert_eq!(c.request(p::CMD_WRITE, 0, lpn * 4096, 4096, &data).0, 0);
                since[lpn as usize].push(version);
            }
            if i % 16 == 15 {
                assert_eq!(c.request(p::CMD_FLUSH, 0, 0, 0, &[]).0, 0);
                for (f, s) in flushed.iter_mut().zip(&mut since) {
                    if let Some(&last) = s.last() {
                        *f = last;
                        s.clear();
                    }
                }
            }
        }
        child.0.kill().unwrap();
        let mut stderr = String::new();
        child.0.wait().unwrap();
        std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
        if round > 0 {
            assert!(stderr.contains("log records"), "{stderr}");
        }
    }
    // Offline: the directory verifies; a flipped byte early in the log (before commits) is
    // refused naming the file, and --repair salvages the records before it.
    let check = |repair: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ftlab"));
        cmd.arg("check").arg(&data);
        if repair {
            cmd.arg("--repair");
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = check(false);
    assert!(
        ok && text.contains("segment(s)") && text.contains("verify"),
        "{text}"
    );
    let segment = data.join("seg-0000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[ftlab_store::log::SEGMENT_HEADER_BYTES + 100] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();
    let (ok, text) = check(false);
    assert!(
        !ok && text.contains("seg-0000000000000000.log") && text.contains("commit"),
        "{text}"
    );
    let (ok, text) = check(true);
    assert!(
        ok && text.contains("repaired") && text.contains(".damaged"),
        "{text}"
    );
    assert!(check(false).0);
    // Read-only: served and flushed, writes refused, the directory left byte for byte.
    let files = || {
        // Regular files (a killed server leaves its control socket).
        let mut v: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect();
        v.sort();
        v
    };
    // A torn tail, which a writable start would cut off.
    let last = files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap();
    let mut torn = std::fs::read(&last).unwrap();
    torn.extend_from_slice(b"FTLRtorn tail");
    std::fs::write(&last, &torn).unwrap();
    let before = files();
    let (server, mut c) = start(&["--read-only"], std::process::Stdio::null());
    assert_eq!(c.request(p::CMD_READ, 0, 0, 4096, &[]).0, 0);
    assert_eq!(c.request(p::CMD_FLUSH, 0, 0, 0, &[]).0, 0);
    assert_eq!(
        c.request(p::CMD_WRITE, 0, 0, 4096, &[0u8; 4096]).0,
        p::EPERM
    );
    drop(server);
    assert!(
        files() == before,
        "a read-only server changed its --data directory"
    );
}

/// The FTL model after a crash is the model before it, for every mapping table (and with
/// translation pages on flash and a write buffer): the device is dropped without its shutdown
/// (the directory as a kill leaves it) after writes, overwrites that make GC work, trims,
/// reads, flushes and a checkpoint (the model saved with it) with cleaning in the middle; the
/// device reopened on the directory restores the saved model, replays the requests after it
/// and reports, figure for figure, what the first did.
#[test]
fn the_model_after_a_crash_reports_what_it_did_before() {
    for (k, sets) in [
        &["ftl.mapping=flat"][..],
        &["ftl.mapping=hash"],
        &["ftl.mapping=extent"],
        &["ftl.mapping=learned"],
        &["ftl.protected_ratio=0.25", "ftl.write_buffer_mib=1"],
        &[
            "ftl.mapping_cache_bytes=8192",
            "ftl.protected_ratio=0.5",
            "ftl.write_buffer_mib=1",
            "ftl.buffer_policy=hexa",
            "ftl.gc_policy=cost_benefit",
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let dir = temp_dir("replay");
        let mut all = vec![
            "flash.blocks_per_die=4",
            "flash.superblock_dies=1",
            "capacity.logical_bytes=67108864",
        ];
        all.extend_from_slice(sets);
        let c = config("femu", &all);
        let options = || DeviceOptions {
            data: Some(dir.join("data")),
            checkpoint_every_bytes: Some(256 << 10),
            // This test calls `maintain` itself, once, and counts it.
            maintenance: ftlab_device::Maintenance::Manual,
            ..options()
        };
        let device = Arc::new(Device::new(&c, options()).unwrap());
        let (mut client, h, _) = open_export(&device, "ftlab");
        let mut rng = SplitMix64::new(5 + k as u64);
        let pages = SIZE / 4096;
        let mut checkpoints = 0;
        for i in 0..16000u64 {
            let lpn = rng.bounded(pages - 4);
            let r = rng.bounded(20);
            let err = if r == 0 {
                client.request(p::CMD_TRIM, 0, lpn * 4096, 4096 * 4, &[]).0
            } else if r < 3 {
                client.request(p::CMD_READ, 0, lpn * 4096, 4096, &[]).0
            } else {
                let data: Vec<u8> = (0..16384u64).map(|b| (b / 512 + i) as u8).collect();
                client.request(p::CMD_WRITE, 0, lpn * 4096, 16384, &data).0
            };
            assert_eq!(err, 0);
            if i % 64 == 63 {
                assert_eq!(client.request(p::CMD_FLUSH, 0, 0, 0, &[]).0, 0);
            }
            if i == 8000 {
                checkpoints += u32::from(device.maintain().is_some());
            }
        }
        assert_eq!(checkpoints, 1);
        client.disconnect();
        h.join().unwrap().unwrap();
        let at = 1 << 50;
        let before = device.model_report_json(at);
        assert!(
            before["erases"].as_u64().unwrap() > 0,
            "{sets:?}: no GC: {before}"
        );
        // No `finish`: as a kill leaves it (every record was written; nothing drained).
        drop(device);
        let again = Device::new(&c, options()).unwrap();
        let summary = again.recovery_summary().unwrap();
        assert!(
            summary.contains("restored the FTL model's saved state"),
            "{summary}"
        );
        let replayed = again.stats_json()["durable"]["recovered_requests"].clone();
        assert!(
            replayed.as_u64().unwrap() < 16000,
            "{sets:?}: replayed {replayed}"
        );
        assert_eq!(again.model_report_json(at), before, "{sets:?}");
        drop(again);
        // Without the saved state the requests before it are gone (the archive holds only
        // what followed): the device starts all the same, saying so.
        std::fs::remove_file(dir.join("data").join("model.state")).unwrap();
        let without = Device::new(&c, options()).unwrap();
        let summary = without.recovery_summary().unwrap();
        assert!(
            summary.contains("WARNING") && summary.contains("saved state (model.state) is missing"),
            "{summary}"
        );
    }
}

/// Bytes of the files directly in `dir` (what `du` counts of a device directory).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Every user of a durable device gets checkpoints and cleaning without asking: a device kept
/// open and written over and over stays near its size (the device's own thread), and so does
/// one opened, written once over and closed again and again (the close cleans), as the SQLite
/// VFS does. Before, only `serve` called `maintain`, and the directory grew by what was
/// written.
#[test]
fn a_durable_device_stays_bounded_whoever_uses_it() {
    let dir = temp_dir("bounded");
    let c = small_config();
    let options = || DeviceOptions {
        data: Some(dir.join("data")),
        checkpoint_every_bytes: None,
        maintenance: Default::default(),
        ..options()
    };
    // Incompressible pages: each written page costs its size in the log.
    let mut rng = SplitMix64::new(9);
    let mut chunk = vec![0u8; 1 << 20];
    let mut write_over = |device: &Device| {
        for at in (0..SIZE).step_by(chunk.len()) {
            for w in chunk.chunks_mut(8) {
                w.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            let mut none = Vec::new();
            device
                .local(LocalCommand::Write, at, &chunk, 0, &mut none)
                .unwrap();
            device
                .local(LocalCommand::Flush, 0, &[], 0, &mut none)
                .unwrap();
        }
    };
    // Segments at most half live are cleaned (twice the live bytes at most) and never the
    // one being written or the one after the last checkpoint: twice the device and two
    // segments.
    let bound = 2 * SIZE + (64 << 20);
    let device = Device::new(&c, options()).unwrap();
    for _ in 0..6 {
        write_over(&device);
    }
    let waited = std::time::Instant::now();
    while dir_bytes(&dir.join("data")) > bound && waited.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let kept_open = dir_bytes(&dir.join("data"));
    assert!(
        kept_open <= bound,
        "{kept_open} bytes after writing 6x {SIZE}"
    );
    device.finish().unwrap();
    drop(device);
    for _ in 0..6 {
        let device = Device::new(&c, options()).unwrap();
        write_over(&device);
        device.finish().unwrap();
    }
    let reopened = dir_bytes(&dir.join("data"));
    assert!(
        reopened <= bound,
        "{reopened} bytes after 6 opens each writing {SIZE}"
    );
}

/// Snapshots and clones of a durable device, through the server: a snapshot reads what the
/// device held when it was made while the device and a clone of it are written (whole and
/// partial pages, zeroes, trims); it refuses writes; the clone reads its own writes over the
/// snapshot's pages; LIST names them; after a crash all read the same; deleting the snapshot
/// leaves the clone whole, and its name is gone.
#[test]
fn snapshots_never_change_while_the_device_and_clones_are_written() {
    let dir = temp_dir("snapshots");
    let c = small_config();
    let options = || DeviceOptions {
        data: Some(dir.join("data")),
        ..options()
    };
    let pattern = |tag: u8, len: usize| -> Vec<u8> {
        (0..len).map(|i| tag.wrapping_add((i / 97) as u8)).collect()
    };
    let device = Arc::new(Device::new(&c, options()).unwrap());
    let (mut dev, h, _) = open_export(&device, "ftlab");
    let a = pattern(1, 256 << 10);
    assert_eq!(dev.request(p::CMD_WRITE, 0, 0, a.len() as u32, &a).0, 0);
    // Read back before any FLUSH: the records are still buffered in the writer.
    let (err, back) = dev.request(p::CMD_READ, 0, 8192, 8192, &[]);
    assert!(
        err == 0 && back == a[8192..16384],
        "a read of pages not yet flushed"
    );
    assert!(device.create_volume(None, "s1", false).is_ok());
    assert!(device.create_volume(Some("s1"), "c1", true).is_ok());
    assert!(
        device.create_volume(None, "s1", false).is_err(),
        "a name twice"
    );
    assert!(device.create_volume(None, "../x", false).is_err(), "a path");
    // The device overwritten; the clone written partly, zeroed and trimmed.
    let b = pattern(2, 128 << 10);
    assert_eq!(dev.request(p::CMD_WRITE, 0, 4096, b.len() as u32, &b).0, 0);
    assert_eq!(dev.request(p::CMD_TRIM, 0, 200 << 10, 8192, &[]).0, 0);
    let (mut clone, hc, size) = open_export(&device, "ftlab@c1");
    assert_eq!(size, SIZE);
    let cdata = pattern(3, 10_000);
    assert_eq!(clone.request(p::CMD_WRITE, 0, 1000, 10_000, &cdata).0, 0);
    assert_eq!(
        clone.request(p::CMD_WRITE_ZEROES, 0, 64 << 10, 8192, &[]).0,
        0
    );
    assert_eq!(clone.request(p::CMD_TRIM, 0, 128 << 10, 4096, &[]).0, 0);
    assert_eq!(clone.request(p::CMD_FLUSH, 0, 0, 0, &[]).0, 0);
    let mut want_clone = a.clone();
    want_clone[1000..11_000].copy_from_slice(&cdata);
    want_clone[64 << 10..(64 << 10) + 8192].fill(0);
    want_clone[128 << 10..(128 << 10) + 4096].fill(0);
    let mut want_dev = a.clone();
    want_dev[4096..4096 + b.len()].copy_from_slice(&b);
    want_dev[200 << 10..(200 << 10) + 8192].fill(0);
    let (mut snap, hs, _) = open_export(&device, "ftlab@s1");
    let read_all = |c: &mut Client| c.request(p::CMD_READ, 0, 0, 256 << 10, &[]).1;
    assert!(read_all(&mut snap) == a, "the snapshot changed");
    assert!(read_all(&mut clone) == want_clone, "the clone");
    assert!(read_all(&mut dev) == want_dev, "the device");
    assert_eq!(
        snap.request(p::CMD_WRITE, 0, 0, 4096, &a[..4096]).0,
        p::EPERM
    );
    for mut c in [dev, clone, snap] {
        c.disconnect();
    }
    for h in [h, hc, hs] {
        h.join().unwrap().unwrap();
    }
    let names: Vec<String> = list_exports(&device);
    assert_eq!(names, ["ftlab", "ftlab@s1", "ftlab@c1"]);
    // A crash, then the same.
    drop(device);
    let device = Arc::new(Device::new(&c, options()).unwrap());
    let (mut snap, hs, _) = open_export(&device, "ftlab@s1");
    assert!(read_all(&mut snap) == a, "the snapshot after a crash");
    snap.disconnect();
    hs.join().unwrap().unwrap();
    device.delete_volume("s1").unwrap();
    assert_eq!(list_exports(&device), ["ftlab", "ftlab@c1"]);
    let (mut clone, hc, _) = open_export(&device, "ftlab@c1");
    assert!(
        read_all(&mut clone) == want_clone,
        "the clone after its parent went"
    );
    clone.disconnect();
    hc.join().unwrap().unwrap();
    let (mut dev, h, _) = open_export(&device, "ftlab");
    assert!(read_all(&mut dev) == want_dev, "the device after a crash");
    dev.disconnect();
    h.join().unwrap().unwrap();
}

/// The export names NBD_OPT_LIST gives.
fn list_exports(device: &Arc<Device>) -> Vec<String> {
    let (mut s, h) = connect(device);
    greet(&mut s);
    option(&mut s, p::OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (kind, d) = option_reply(&mut s);
        if kind == p::REP_ACK {
            break;
        }
        assert_eq!(kind, p::REP_SERVER);
        let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
        names.push(String::from_utf8(d[4..4 + len].to_vec()).unwrap());
    }
    option(&mut s, p::OPT_ABORT, &[]);
    let _ = option_reply(&mut s);
    drop(s);
    let _ = h.join();
    names
}

/// A test PKI written by `ftlab tls-certs` (clients alice and bob), and a client certificate
/// for alice signed by the same CA but expired a year ago (made here with rcgen).
pub(crate) fn test_pki(dir: &std::path::Path) {
    let (ok, _, err) = crate::support::ftlab(&[
        "tls-certs",
        dir.to_str().unwrap(),
        "--client",
        "alice",
        "--client",
        "bob",
    ]);
    assert!(ok, "{err}");
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(dir.join("ca-key.pem")).unwrap())
            .unwrap();
    let ca = rcgen::CertificateParams::from_ca_cert_pem(
        &std::fs::read_to_string(dir.join("ca-cert.pem")).unwrap(),
    )
    .unwrap()
    .self_signed(&ca_key)
    .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let expired = dir.join("client-expired");
    std::fs::create_dir_all(&expired).unwrap();
    std::fs::copy(dir.join("ca-cert.pem"), expired.join("ca-cert.pem")).unwrap();
    std::fs::write(expired.join("client-cert.pem"), cert.pem()).unwrap();
    std::fs::write(expired.join("client-key.pem"), key.serialize_pem()).unwrap();
}

/// A rustls client of the test PKI, presenting `client` (a folder of `test_pki`) or nothing.
fn tls_client(pki: &std::path::Path, client: Option<&str>) -> rustls::ClientConnection {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(pki.join("ca-cert.pem")).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(name) => {
            let dir = pki.join(format!("client-{name}"));
            builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_file(dir.join("client-cert.pem")).unwrap()],
                    PrivateKeyDer::from_pem_file(dir.join("client-key.pem")).unwrap(),
                )
                .unwrap()
        }
    };
    rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap()
}

fn tls_device(pki: &std::path::Path, mode: ftlab_nbd::tls::TlsMode) -> (Arc<Device>, NbdOptions) {
    let setup = ftlab_nbd::tls::TlsSetup::load(
        mode,
        &pki.join("server-cert.pem"),
        &pki.join("server-key.pem"),
        Some(&pki.join("ca-cert.pem")),
    )
    .unwrap();
    let nbd = NbdOptions {
        tls: Some(Arc::new(setup)),
        ..Default::default()
    };
    (
        Arc::new(Device::new(&small_config(), options()).unwrap()),
        nbd,
    )
}

/// One simple-reply request over any stream: (error, data read).
fn simple_request(
    s: &mut (impl Read + Write),
    command: u16,
    offset: u64,
    data: &[u8],
    length: u32,
) -> (u32, Vec<u8>) {
    let mut m = p::REQUEST_MAGIC.to_be_bytes().to_vec();
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&command.to_be_bytes());
    m.extend_from_slice(&7u64.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&length.to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
    s.flush().unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_be_bytes(h[..4].try_into().unwrap()),
        p::SIMPLE_REPLY_MAGIC
    );
    let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
    let mut read = vec![
        0u8;
        if command == p::CMD_READ && error == 0 {
            length as usize
        } else {
            0
        }
    ];
    s.read_exact(&mut read).unwrap();
    (error, read)
}

/// The NBD spec's TLS modes, at the byte level, with a TLS client written here: under
/// `require` every option before STARTTLS but ABORT gets NBD_REP_ERR_TLS_REQD and
/// EXPORT_NAME ends the connection; STARTTLS upgrades, a second one is invalid, and data written
/// over TLS reads back; `allow` lets a client stay plain; a server without TLS refuses STARTTLS
/// with NBD_REP_ERR_POLICY; a client certificate of no trusted CA, expired, or none at all,
/// ends the handshake.
#[test]
fn starttls_follows_the_spec_in_every_mode() {
    use ftlab_nbd::tls::TlsMode;
    let dir = temp_dir("starttls");
    test_pki(dir.path());
    let pki = dir.path();
    let (device, nbd) = tls_device(pki, TlsMode::Require);

    // Before TLS: refused, but the connection goes on.
    let (mut s, h) = connect_with(&device, &nbd);
    greet(&mut s);
    for o in [p::OPT_GO, p::OPT_LIST, p::OPT_STRUCTURED_REPLY] {
        let data = if o == p::OPT_GO {
            go_data("ftlab")
        } else {
            Vec::new()
        };
        option(&mut s, o, &data);
        assert_eq!(option_reply(&mut s).0, p::REP_ERR_TLS_REQD, "option {o}");
    }
    // Each a denial, counted as the metrics count them.
    assert_eq!(device.access_counts().1, 3);
    option(&mut s, p::OPT_STARTTLS, b"x");
    assert_eq!(option_reply(&mut s).0, p::REP_ERR_INVALID);
    option(&mut s, p::OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).0, p::REP_ACK);
    let mut tls = rustls::StreamOwned::new(tls_client(pki, Some("alice")), s);
    option(&mut tls, p::OPT_STARTTLS, &[]);
    tls.flush().unwrap();
    assert_eq!(option_reply(&mut tls).0, p::REP_ERR_INVALID);
    option(&mut tls, p::OPT_GO, &go_data("ftlab"));
    tls.flush().unwrap();
    while option_reply(&mut tls).0 != p::REP_ACK {}
    let page: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        simple_request(&mut tls, p::CMD_WRITE, 8192, &page, 4096).0,
        0
    );
    assert_eq!(
        simple_request(&mut tls, p::CMD_READ, 8192, &[], 4096),
        (0, page.clone())
    );
    drop(tls);
    h.join().unwrap().unwrap();

    // EXPORT_NAME cannot be refused: the connection ends.
    let (mut s, h) = connect_with(&device, &nbd);
    greet(&mut s);
    option(&mut s, p::OPT_EXPORT_NAME, b"ftlab");
    let end = h.join().unwrap().unwrap_err();
    assert!(end.contains("requires"), "{end}");

    // Refused client certificates: of another CA, expired, none.
    let other = temp_dir("starttls-other");
    let (ok, _, err) = crate::support::ftlab(&[
        "tls-certs",
        other.path().to_str().unwrap(),
        "--client",
        "alice",
    ]);
    assert!(ok, "{err}");
    std::fs::copy(
        pki.join("ca-cert.pem"),
        other.path().join("client-alice/ca-cert.pem"),
    )
    .unwrap();
    std::fs::copy(pki.join("ca-cert.pem"), other.path().join("ca-cert.pem")).unwrap();
    let refusals: [(&std::path::Path, Option<&str>, &str); 3] = [
        (other.path(), Some("alice"), "UnknownIssuer"),
        (pki, Some("expired"), "expired"),
        (pki, None, "no certificates"),
    ];
    for (dir, client, why) in refusals {
        let (mut s, h) = connect_with(&device, &nbd);
        greet(&mut s);
        option(&mut s, p::OPT_STARTTLS, &[]);
        assert_eq!(option_reply(&mut s).0, p::REP_ACK);
        let mut tls = rustls::StreamOwned::new(tls_client(dir, client), s);
        option(&mut tls, p::OPT_LIST, &[]);
        assert!(
            tls.flush().is_err() || {
                let mut b = [0u8; 1];
                tls.read(&mut b).is_err()
            }
        );
        drop(tls);
        let end = h.join().unwrap().unwrap_err();
        assert!(end.contains(why), "{client:?}: {end}");
    }

    // allow: a client may stay plain.
    let (device, nbd) = tls_device(pki, TlsMode::Allow);
    let (s, h) = connect_with(&device, &nbd);
    let (mut client, _) = go(s, "ftlab");
    assert_eq!(simple_request(&mut client.s, p::CMD_READ, 0, &[], 512).0, 0);
    drop(client);
    h.join().unwrap().unwrap();

    // No TLS configured: STARTTLS is refused by policy, the connection goes on.
    let (mut s, h) = connect(&device_with(Latency::None));
    greet(&mut s);
    option(&mut s, p::OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).0, p::REP_ERR_POLICY);
    option(&mut s, p::OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut s).0, p::REP_ACK);
    drop(s);
    h.join().unwrap().unwrap();
}
