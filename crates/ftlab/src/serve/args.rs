//! `serve`'s command line: every flag, its parsers, and what the flags make of the device's and
//! the NBD server's options.

use anyhow::Result;
use ftlab_core::units::parse_size;
use ftlab_device::{DeviceOptions, Latency, RecordFormat};
use ftlab_nbd::{ConnectionLimits, NbdOptions};
use ftlab_store::codec::Codec;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: crate::config_args::ConfigArgs,
    /// TCP address to listen on (a non-loopback address only when given explicitly).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: String,
    /// Also (or, with --no-tcp, only) listen on this Unix socket.
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Do not listen on TCP.
    #[arg(long)]
    pub no_tcp: bool,
    /// Export name clients ask for ("" is always accepted too).
    #[arg(long, default_value = "ftlab")]
    pub export_name: String,
    /// Serve several exports from the one device (NVMe namespaces sharing its flash and FTL),
    /// each `NAME[=SIZE][,handle=H][,handles=A:B:...][,ranges=FILE][,read-only]`, laid out in
    /// order over the device's logical space: SIZE in bytes or with K/M/G/T (omitted: what is
    /// left); its writes carry placement ID H (or G:H), or the PIDs of a range file of offsets
    /// within the export (docs/trace-formats.md); handles= is its placement handle list (PID
    /// handle i is device handle A, B, ... in turn; without it, device handle i); read-only
    /// refuses its writes. Replaces
    /// --export-name; "" names the first. E.g. --export wal=1G,handle=1 --export db,handle=2
    /// with --set ftl.streams=3.
    #[arg(long = "export", value_name = "SPEC", value_parser = parse_export)]
    pub exports: Vec<ftlab_device::ExportSpec>,
    /// Page store codec: lz4, zstd[:LEVEL], zstd-dict[:LEVEL], none (pages as they are). zstd-dict trains its
    /// dictionaries (one for text pages, one for binary) by itself (a few seconds of one core,
    /// logged): first once 4096 pages are stored compressed (neither same-filled nor raw), then
    /// each time that count has doubled.
    #[arg(long, default_value = "lz4")]
    pub store: String,
    /// Memory limit of the page store, as zram's mem_limit: bytes, or with a K/M/G/T suffix
    /// (powers of 1024). Writes that need more memory fail with ENOSPC; trims free memory.
    /// Not with --data (a durable device keeps its pages on disk, not in the page store).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_size, conflicts_with = "data")]
    pub mem_limit: Option<u64>,
    /// Reply timing: none, real (hold replies until the simulated completion), scaled:FACTOR.
    #[arg(long, default_value = "none")]
    pub latency: String,
    /// Record every request the FTL model sees, in nbdkit log format (replay with `ftlab sim
    /// --trace FILE`).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Format of --record: nbdkit (everything) or msr (reads and writes only: MSR has no trim).
    #[arg(long, default_value = "nbdkit", value_parser = RecordFormat::parse)]
    pub record_format: RecordFormat,
    /// Load the device's bytes from this raw image at start (when it exists) and save them back
    /// at a clean shutdown (SIGINT, SIGTERM or SIGHUP: connections are drained first, so every write
    /// acknowledged is saved). Nothing is saved if the process dies otherwise. The image must be a
    /// regular file of exactly the export's size, or absent (then it is created at the save); a
    /// symbolic link is resolved once at start, and the save replaces its target (written beside
    /// the target, then renamed), leaving the link as it is. A device node, FIFO, socket or
    /// directory is refused.
    #[arg(long, conflicts_with = "data")]
    pub image: Option<PathBuf>,
    /// Keep the device in this directory (created when absent): every write and trim is
    /// appended to a checksummed log, made durable per --durability, and replayed at the next
    /// start, after a crash too (a torn tail that no FLUSH acknowledged is dropped and said;
    /// damage before a FLUSH's commit refuses to start). docs/serve.md, "A durable device".
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// An access policy (docs/serve.md, "Access policies"): who may list, read, write, trim,
    /// flush which export. Clients on --unix are known by their uid and gid, TCP clients are
    /// anonymous. SIGHUP then reloads it (checked first: a refused file leaves the old in
    /// force) for the connections made after it, instead of stopping the server.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// NBD over TLS (NBD_OPT_STARTTLS, as qemu-nbd and nbdkit): require (every option but
    /// STARTTLS is refused with NBD_REP_ERR_TLS_REQD until TLS is on), allow (the client
    /// chooses) or off. Default: require with --tls-cert, off without.
    #[arg(long, value_name = "MODE", value_parser = |s: &str| s.parse::<ftlab_nbd::tls::TlsMode>())]
    pub tls: Option<ftlab_nbd::tls::TlsMode>,
    /// The server's certificate chain (PEM) for TLS; with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Ask every TLS client for a certificate signed by this authority (PEM) and refuse those
    /// without one; the certificate's subject CN and alternative names become the client's
    /// principal (`cn:NAME`, `san:NAME`) for --policy.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// Which subject common names of a client certificate are principals: every (`cn:NAME`
    /// for each) or first (the first only, for an authority that lets a requester add CNs).
    #[arg(long, value_name = "WHICH", default_value = "every", requires = "tls_ca",
          value_parser = |s: &str| s.parse::<ftlab_nbd::tls::CnNames>())]
    pub tls_cn: ftlab_nbd::tls::CnNames,
    /// Append an audit log here, a JSON line per event: every connection (principal, address),
    /// every denied decision with the statement that decided it, every policy reload.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9100, `GET
    /// /metrics`): WAF, flash programs by cause, GC, per-command latency histograms, the page
    /// store's mm_stat, connections, denied decisions. With --policy, only if it allows
    /// `anonymous` the action `metrics` (HTTP clients are anonymous).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// With --data: when the log is synced (fdatasync) before answering: flush (FLUSH and FUA
    /// writes; concurrent flushes share one sync), always (every write and trim too), never.
    #[arg(long, default_value = "flush", value_parser = ftlab_device::Durability::parse)]
    pub durability: ftlab_device::Durability,
    /// With --data: write a checkpoint (the maps of every volume; recovery replays only the log
    /// after it) each time this much was logged since the last, and at a clean shutdown; the
    /// cleaner then deletes segments no volume needs, copying out the live records of those at
    /// most half live. Bytes, or with K/M/G/T; at least 1M. Default: a quarter of the
    /// device's size, within 16M..256M.
    #[arg(long, value_parser = parse_size)]
    pub checkpoint_every: Option<u64>,
    /// With --data: memory for decompressed pages read from the log (the device's, its
    /// snapshots' and clones'), bytes or with K/M/G/T; 0: none.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub cache: u64,
    /// The policy of --cache: arc (adaptive: resists scans) or lru.
    #[arg(long, default_value = "arc", value_parser = ftlab_store::cache::CachePolicy::parse)]
    pub cache_policy: ftlab_store::cache::CachePolicy,
    /// Accept an --image smaller than the export (an empty file included): the pages past its
    /// end read as zeros, and the save writes it at the export's full size. Without this flag a
    /// size mismatch is refused, since a truncated image would silently lose its missing part
    /// for good at the next save.
    #[arg(long, requires = "image")]
    pub grow_image: bool,
    /// Write live statistics (JSON) to this file at start, every --stats-interval seconds
    /// and at exit.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// Seconds between two writes of --stats.
    #[arg(long, allow_negative_numbers = true, default_value_t = 5.0)]
    pub stats_interval: f64,
    /// Write the server's process ID here once every listener is bound (a script or service
    /// manager waits for it to appear), remove it at exit. A stale file (its process gone) is
    /// replaced; one naming a running process is an error. Under systemd (`NOTIFY_SOCKET` set),
    /// `READY=1` is also sent at that moment, so `Type=notify` units work.
    #[arg(long)]
    pub pidfile: Option<PathBuf>,
    /// Export the device read-only (NBD_FLAG_READ_ONLY): writes, trims and zeroes are refused
    /// with EPERM; --image is loaded and never saved.
    #[arg(long)]
    pub read_only: bool,
    /// Connections served at once; one more is accepted, closed at once and logged. Each holds
    /// three threads and about 5 MiB of its own (its 2 MiB allowance of requests in flight, two
    /// kept payload buffers, socket buffers), besides its share of --max-inflight-bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Memory that requests in flight may hold beyond each connection's own 2 MiB allowance,
    /// for all connections together (bytes, or with K/M/G/T), at least 33M (one request of the
    /// largest size, 32 MiB). A request is charged before its payload or reply exists; when the
    /// budget is spent, connections with large requests wait, reading nothing (TCP pushes back
    /// on their clients), while small requests keep being served.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_size, default_value = "256M")]
    pub max_inflight_bytes: u64,
    /// Seconds a client has to finish the handshake after connecting.
    #[arg(long, allow_negative_numbers = true, default_value_t = 10.0, value_parser = parse_seconds)]
    pub handshake_timeout: f64,
    /// Disconnect a client that sends nothing for this many seconds (between requests or in the
    /// middle of one); 0, the default, never does (NBD clients may sit idle for hours).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0, value_parser = parse_seconds)]
    pub idle_timeout: f64,
}

/// `NAME[=SIZE][,handle=H][,handles=A:B:...][,ranges=FILE][,read-only]`, as `--export` takes
/// it.
fn parse_export(text: &str) -> Result<ftlab_device::ExportSpec, String> {
    let mut parts = text.split(',');
    let head = parts.next().unwrap_or_default();
    let (name, size) = match head.split_once('=') {
        Some((name, size)) => (name, Some(parse_size(size).map_err(|e| e.to_string())?)),
        None => (head, None),
    };
    let mut spec = ftlab_device::ExportSpec {
        name: name.to_string(),
        size_bytes: size,
        ..Default::default()
    };
    for part in parts {
        match part.split_once('=') {
            Some(("handle", pid)) => {
                spec.placement = ftlab_sim::trace::parse_pid(pid, "handle")
                    .map_err(|e| format!("`{text}`: {}", e.reason))?;
            }
            Some(("handles", list)) => {
                spec.handles = list
                    .split(':')
                    .map(|h| h.parse::<u8>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        format!("`{text}`: handles= takes device handles 0..=255 joined by `:`")
                    })?;
            }
            Some(("ranges", path)) => {
                let ranges = ftlab_sim::placement::PlacementRanges::load(Path::new(path))
                    .map_err(|e| e.to_string())?;
                spec.ranges = Some(ranges);
            }
            None if part == "read-only" => spec.read_only = true,
            _ => {
                return Err(format!(
                    "`{part}` in `{text}`: expected handle=H, handles=A:B:..., ranges=FILE or read-only"
                ))
            }
        }
    }
    Ok(spec)
}

/// Seconds: a finite, non-negative number.
fn parse_seconds(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e9)
        .ok_or_else(|| format!("`{text}` is not a number of seconds (0 to 1e9)"))
}

impl ServeArgs {
    /// The device's and the NBD server's options, the flags checked.
    pub(super) fn options(&self) -> Result<(DeviceOptions, NbdOptions)> {
        let codec = Codec::parse(&self.store).map_err(anyhow::Error::msg)?;
        let latency = Latency::parse(&self.latency).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            self.stats_interval.is_finite() && self.stats_interval > 0.0,
            "--stats-interval must be a positive number of seconds"
        );
        anyhow::ensure!(
            self.checkpoint_every.is_none_or(|b| b >= 1 << 20),
            "--checkpoint-every {}: at least 1M (a checkpoint writes every volume's map)",
            self.checkpoint_every.unwrap_or(0)
        );
        anyhow::ensure!(
            self.handshake_timeout > 0.0,
            "--handshake-timeout must be a positive number of seconds"
        );
        let device = DeviceOptions {
            export_name: self.export_name.clone(),
            exports: self.exports.clone(),
            latency,
            codec,
            record: self.record.clone(),
            record_format: self.record_format,
            mem_limit_bytes: self.mem_limit,
            max_inflight_bytes: self.max_inflight_bytes,
            read_only: self.read_only,
            data: self.data.clone(),
            durability: self.durability,
            checkpoint_every_bytes: self.checkpoint_every,
            maintenance: ftlab_device::Maintenance::Background { log_done: true },
            cache_bytes: self.cache,
            cache_policy: self.cache_policy,
        };
        let nbd = NbdOptions {
            tls: tls_setup(self)?,
            limits: ConnectionLimits {
                handshake_timeout: Duration::from_secs_f64(self.handshake_timeout),
                idle_timeout: (self.idle_timeout > 0.0)
                    .then(|| Duration::from_secs_f64(self.idle_timeout)),
            },
        };
        Ok((device, nbd))
    }
}

/// The TLS identity of --tls-cert/--tls-key/--tls-ca, in --tls's mode; None when TLS is off.
pub(super) fn tls_setup(args: &ServeArgs) -> anyhow::Result<Option<Arc<ftlab_nbd::tls::TlsSetup>>> {
    use ftlab_nbd::tls::{TlsMode, TlsSetup};
    let mode = args.tls.unwrap_or(if args.tls_cert.is_some() {
        TlsMode::Require
    } else {
        TlsMode::Off
    });
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        anyhow::ensure!(
            mode == TlsMode::Off,
            "--tls {}: needs --tls-cert and --tls-key",
            if mode == TlsMode::Require {
                "require"
            } else {
                "allow"
            }
        );
        return Ok(None);
    };
    if mode == TlsMode::Off {
        return Ok(None);
    }
    let mut setup = TlsSetup::load(mode, cert, key, args.tls_ca.as_deref())?;
    setup.cn_names = args.tls_cn;
    Ok(Some(Arc::new(setup)))
}
