//! `ftlab serve`: listeners, one thread per connection, and a drain and summary on SIGINT,
//! SIGTERM or SIGHUP.

use anyhow::{Context, Result};
use ftlab_core::units::parse_size;
use ftlab_device::{Device, DeviceOptions, Latency, RecordFormat};
use ftlab_nbd::{serve_connection_as, ConnectionLimits, NbdOptions};
use ftlab_store::codec::Codec;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: crate::ConfigArgs,
    /// TCP address to listen on (a non-loopback address only when given explicitly).
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    /// Also (or, with --no-tcp, only) listen on this Unix socket.
    #[arg(long)]
    unix: Option<PathBuf>,
    /// Do not listen on TCP.
    #[arg(long)]
    no_tcp: bool,
    /// Export name clients ask for ("" is always accepted too).
    #[arg(long, default_value = "ftlab")]
    export_name: String,
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
    exports: Vec<ftlab_device::ExportSpec>,
    /// Page store codec: lz4, zstd[:LEVEL], zstd-dict[:LEVEL], none (pages as they are). zstd-dict trains its
    /// dictionaries (one for text pages, one for binary) by itself (a few seconds of one core,
    /// logged): first once 4096 pages are stored compressed (neither same-filled nor raw), then
    /// each time that count has doubled.
    #[arg(long, default_value = "lz4")]
    store: String,
    /// Memory limit of the page store, as zram's mem_limit: bytes, or with a K/M/G/T suffix
    /// (powers of 1024). Writes that need more memory fail with ENOSPC; trims free memory.
    /// Not with --data (a durable device keeps its pages on disk, not in the page store).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_size, conflicts_with = "data")]
    mem_limit: Option<u64>,
    /// Reply timing: none, real (hold replies until the simulated completion), scaled:FACTOR.
    #[arg(long, default_value = "none")]
    latency: String,
    /// Record every request the FTL model sees, in nbdkit log format (replay with `ftlab sim
    /// --trace FILE`).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Format of --record: nbdkit (everything) or msr (reads and writes only: MSR has no trim).
    #[arg(long, default_value = "nbdkit", value_parser = RecordFormat::parse)]
    record_format: RecordFormat,
    /// Load the device's bytes from this raw image at start (when it exists) and save them back
    /// at a clean shutdown (SIGINT, SIGTERM or SIGHUP: connections are drained first, so every write
    /// acknowledged is saved). Nothing is saved if the process dies otherwise. The image must be a
    /// regular file of exactly the export's size, or absent (then it is created at the save); a
    /// symbolic link is resolved once at start, and the save replaces its target (written beside
    /// the target, then renamed), leaving the link as it is. A device node, FIFO, socket or
    /// directory is refused.
    #[arg(long, conflicts_with = "data")]
    image: Option<PathBuf>,
    /// Keep the device in this directory (created when absent): every write and trim is
    /// appended to a checksummed log, made durable per --durability, and replayed at the next
    /// start, after a crash too (a torn tail that no FLUSH acknowledged is dropped and said;
    /// damage before a FLUSH's commit refuses to start). docs/serve.md, "A durable device".
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// An access policy (docs/serve.md, "Access policies"): who may list, read, write, trim,
    /// flush which export. Clients on --unix are known by their uid and gid, TCP clients are
    /// anonymous. SIGHUP then reloads it (checked first: a refused file leaves the old in
    /// force) for the connections made after it, instead of stopping the server.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// NBD over TLS (NBD_OPT_STARTTLS, as qemu-nbd and nbdkit): require (every option but
    /// STARTTLS is refused with NBD_REP_ERR_TLS_REQD until TLS is on), allow (the client
    /// chooses) or off. Default: require with --tls-cert, off without.
    #[arg(long, value_name = "MODE", value_parser = |s: &str| s.parse::<ftlab_nbd::tls::TlsMode>())]
    tls: Option<ftlab_nbd::tls::TlsMode>,
    /// The server's certificate chain (PEM) for TLS; with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Ask every TLS client for a certificate signed by this authority (PEM) and refuse those
    /// without one; the certificate's subject CN and alternative names become the client's
    /// principal (`cn:NAME`, `san:NAME`) for --policy.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// Append an audit log here, a JSON line per event: every connection (principal, address),
    /// every denied decision with the statement that decided it, every policy reload.
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP on this address (e.g. 127.0.0.1:9100, `GET
    /// /metrics`): WAF, flash programs by cause, GC, per-command latency histograms, the page
    /// store's mm_stat, connections, denied decisions. With --policy, only if it allows
    /// `anonymous` the action `metrics` (HTTP clients are anonymous).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// With --data: when the log is synced (fdatasync) before answering: flush (FLUSH and FUA
    /// writes; concurrent flushes share one sync), always (every write and trim too), never.
    #[arg(long, default_value = "flush", value_parser = ftlab_device::Durability::parse)]
    durability: ftlab_device::Durability,
    /// With --data: write a checkpoint (the maps of every volume; recovery replays only the log
    /// after it) each time this much was logged since the last, and at a clean shutdown; the
    /// cleaner then deletes segments no volume needs, copying out the live records of those at
    /// most half live. Bytes, or with K/M/G/T; at least 1M.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    checkpoint_every: u64,
    /// With --data: memory for decompressed pages read from the log (the device's, its
    /// snapshots' and clones'), bytes or with K/M/G/T; 0: none.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    cache: u64,
    /// The policy of --cache: arc (adaptive: resists scans) or lru.
    #[arg(long, default_value = "arc", value_parser = ftlab_store::cache::CachePolicy::parse)]
    cache_policy: ftlab_store::cache::CachePolicy,
    /// Accept an --image smaller than the export (an empty file included): the pages past its
    /// end read as zeros, and the save writes it at the export's full size. Without this flag a
    /// size mismatch is refused, since a truncated image would silently lose its missing part
    /// for good at the next save.
    #[arg(long, requires = "image")]
    grow_image: bool,
    /// Write live statistics (JSON) to this file at start, every --stats-interval seconds
    /// and at exit.
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Seconds between two writes of --stats.
    #[arg(long, allow_negative_numbers = true, default_value_t = 5.0)]
    stats_interval: f64,
    /// Write the server's process ID here once every listener is bound (a script or service
    /// manager waits for it to appear), remove it at exit. A stale file (its process gone) is
    /// replaced; one naming a running process is an error. Under systemd (`NOTIFY_SOCKET` set),
    /// `READY=1` is also sent at that moment, so `Type=notify` units work.
    #[arg(long)]
    pidfile: Option<PathBuf>,
    /// Export the device read-only (NBD_FLAG_READ_ONLY): writes, trims and zeroes are refused
    /// with EPERM; --image is loaded and never saved.
    #[arg(long)]
    read_only: bool,
    /// Connections served at once; one more is accepted, closed at once and logged. Each holds
    /// three threads and about 5 MiB of its own (its 2 MiB allowance of requests in flight, two
    /// kept payload buffers, socket buffers), besides its share of --max-inflight-bytes.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Memory that requests in flight may hold beyond each connection's own 2 MiB allowance,
    /// for all connections together (bytes, or with K/M/G/T), at least 33M (one request of the
    /// largest size, 32 MiB). A request is charged before its payload or reply exists; when the
    /// budget is spent, connections with large requests wait, reading nothing (TCP pushes back
    /// on their clients), while small requests keep being served.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_size, default_value = "256M")]
    max_inflight_bytes: u64,
    /// Seconds a client has to finish the handshake after connecting.
    #[arg(long, allow_negative_numbers = true, default_value_t = 10.0, value_parser = parse_seconds)]
    handshake_timeout: f64,
    /// Disconnect a client that sends nothing for this many seconds (between requests or in the
    /// middle of one); 0, the default, never does (NBD clients may sit idle for hours).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0, value_parser = parse_seconds)]
    idle_timeout: f64,
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

fn write_stats(device: &Device, path: &std::path::Path) -> Result<()> {
    let tmp = ftlab_device::tmp_path_beside(path);
    std::fs::write(
        &tmp,
        serde_json::to_string_pretty(&device.stats_json())? + "\n",
    )
    .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Asks glibc to grow its heaps in steps of 64 MiB. A thread's arena otherwise grows by
/// `mprotect`-ing exactly what each allocation needs: filling a device with incompressible pages
/// (one 4 KiB slab each) cost about 260,000 `mprotect` calls per GiB: 1.19 s -> 0.70 s per GiB
/// of 4 KiB allocations on a thread, and a fresh `serve` took a 1 s sequential fio write at
/// 0.84-0.90 GB/s before, 1.35-1.70 GB/s after (this machine). Padding below the arenas' heap
/// size (64 MiB) left the calls as they were. Untouched pages cost no memory; the price is that
/// glibc keeps up to the pad of freed memory per heap when it trims one (after a mass TRIM).
fn grow_heaps_in_large_steps() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt(3) only sets a tuning parameter.
    unsafe {
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    grow_heaps_in_large_steps();
    // The workload section is the simulator's; hosts drive this device.
    let config = crate::config_layers(&args.config, &[], &[])?.build_device()?;
    let codec = Codec::parse(&args.store).map_err(anyhow::Error::msg)?;
    let latency = Latency::parse(&args.latency).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        args.stats_interval.is_finite() && args.stats_interval > 0.0,
        "--stats-interval must be a positive number of seconds"
    );
    anyhow::ensure!(
        args.checkpoint_every >= 1 << 20,
        "--checkpoint-every {}: at least 1M (a checkpoint writes every volume's map)",
        args.checkpoint_every
    );
    anyhow::ensure!(
        args.handshake_timeout > 0.0,
        "--handshake-timeout must be a positive number of seconds"
    );
    let device = Arc::new(Device::new(
        &config,
        DeviceOptions {
            export_name: args.export_name.clone(),
            exports: args.exports.clone(),
            latency,
            codec,
            record: args.record.clone(),
            record_format: args.record_format,
            mem_limit_bytes: args.mem_limit,
            max_inflight_bytes: args.max_inflight_bytes,
            read_only: args.read_only,
            data: args.data.clone(),
            durability: args.durability,
            checkpoint_every_bytes: args.checkpoint_every,
            cache_bytes: args.cache,
            cache_policy: args.cache_policy,
        },
    )?);
    let nbd = Arc::new(NbdOptions {
        tls: tls_setup(&args)?,
        limits: ConnectionLimits {
            handshake_timeout: Duration::from_secs_f64(args.handshake_timeout),
            idle_timeout: (args.idle_timeout > 0.0)
                .then(|| Duration::from_secs_f64(args.idle_timeout)),
        },
    });
    if let Some(summary) = device.recovery_summary() {
        eprintln!("ftlab serve: {summary}");
    }
    // Where the image is loaded from and saved to: a symbolic link's target, resolved once.
    let image = match &args.image {
        Some(path) => {
            let image = resolve_image(path)?;
            if !args.read_only {
                device.check_image_writable(&image.path)?;
            }
            if image.exists {
                let pages = device.load_image(&image.path, args.grow_image)?;
                eprintln!(
                    "ftlab serve: loaded {pages} non-zero pages from {}",
                    image.path.display()
                );
            }
            Some(image.path)
        }
        None => None,
    };
    if let Some(path) = &args.stats {
        // Now, so that a path that cannot be written stops `serve` before any client comes.
        write_stats(&device, path)?;
    }
    if let Some(path) = &args.audit {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the audit log {}", path.display()))?;
        device.set_audit(file);
    }
    if let Some(path) = &args.policy {
        device.set_policy(Some(ftlab_device::policy::Policy::load(path)?));
    }
    // Set by SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session ends the device as
    // cleanly, its image saved); the loops below poll it. With a policy, SIGHUP reloads it.
    let stop = Arc::new(AtomicBool::new(false));
    let reload = Arc::new(AtomicBool::new(false));
    let open_connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    if let Some(addr) = &args.metrics {
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("listening for --metrics on {addr}"))?;
        listener.set_nonblocking(true)?;
        eprintln!(
            "ftlab serve: metrics on http://{}/metrics",
            listener.local_addr()?
        );
        spawn_metrics(
            listener,
            device.clone(),
            open_connections.clone(),
            stop.clone(),
        );
    }
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        let flag = if signal == signal_hook::consts::SIGHUP && args.policy.is_some() {
            reload.clone()
        } else {
            stop.clone()
        };
        signal_hook::flag::register(signal, flag)
            .with_context(|| format!("installing the handler of signal {signal}"))?;
    }
    // Every listener is bound before anything says "ready": a banner followed by a failure to
    // bind the next listener told scripts the server was up when it was about to exit.
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
    // From here on, an error must not leave the socket file behind.
    let remove_socket = || {
        if let Some(path) = args.unix.as_deref().filter(|p| is_socket(p)) {
            let _ = std::fs::remove_file(path);
        }
    };
    if let Some(path) = &args.pidfile {
        if let Err(e) = write_pidfile(path) {
            remove_socket();
            return Err(e);
        }
    }
    for (name, size) in device.export_sizes() {
        if let Some(l) = &tcp {
            // The address bound, which names the port when --listen asked for any (port 0).
            let addr = l
                .local_addr()
                .map_or_else(|_| args.listen.clone(), |a| a.to_string());
            eprintln!("ftlab serve: export `{name}` ({size} bytes) on nbd://{addr}/{name}");
        }
        if let Some(path) = &args.unix {
            eprintln!(
                "ftlab serve: export `{name}` ({size} bytes) on nbd+unix:///{name}?socket={}",
                path.display()
            );
        }
    }
    notify_service_manager("READY=1");
    if matches!(codec, Codec::ZstdDict { .. }) {
        // Trainings take seconds: a thread of their own, so the listeners never wait. It is not
        // joined at shutdown: a training changes nothing until it installs its dictionary.
        let device = device.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut schedule = ftlab_device::dictionary::DictionarySchedule::default();
            while !stop.load(Ordering::SeqCst) {
                if let Some(line) = device.train_dictionary_if_due(&mut schedule) {
                    eprintln!("ftlab serve: {line}");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
    }
    if let Some(dir) = args.data.as_ref().filter(|_| !args.read_only) {
        let control = crate::volumes_cmd::spawn_control(
            device.clone(),
            dir,
            args.policy.clone(),
            stop.clone(),
        )?;
        eprintln!(
            "ftlab serve: snapshots and clones: `ftlab snapshot create {} NAME` (control socket {})",
            dir.display(),
            control.display()
        );
        // Checkpoints and cleaning: a thread of their own, so the listeners never wait.
        let device = device.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Some(line) = device.maintain() {
                    eprintln!("ftlab serve: {line}");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    }
    let mut last_stats = std::time::Instant::now();
    let mut connections: Vec<Connection> = Vec::new();
    let mut failure_told = false;
    while !stop.load(Ordering::SeqCst) {
        if let Some(why) = device.failure().filter(|_| !failure_told) {
            eprintln!(
                "ftlab serve: {why}\nftlab serve: the device has failed: every request is now answered EIO \
                 (stop the server to save --image and the report; please report the panic above)"
            );
            failure_told = true;
        }
        if let Some(path) = &args.stats {
            if last_stats.elapsed().as_secs_f64() >= args.stats_interval {
                // A full disk or a removed directory must not end the clients' device.
                if let Err(e) = write_stats(&device, path) {
                    eprintln!("ftlab serve: {e:#}");
                }
                last_stats = std::time::Instant::now();
            }
        }
        if reload.swap(false, Ordering::SeqCst) {
            let path = args.policy.as_deref().expect("only with --policy");
            match device.reload_policy(path) {
                Ok(n) => eprintln!(
                    "ftlab serve: {}: policy reloaded ({n} statements)",
                    path.display()
                ),
                Err(e) => eprintln!("ftlab serve: policy not reloaded, the old one stays: {e}"),
            }
        }
        let mut idle = true;
        connections.retain(|c| !c.thread.is_finished());
        open_connections.store(connections.len(), Ordering::Relaxed);
        if let Some((stream, peer)) = tcp.as_ref().and_then(|l| l.accept().ok()) {
            idle = false;
            admit(
                &mut connections,
                args.max_connections,
                &device,
                &nbd,
                peer.to_string(),
                ftlab_device::policy::Principal::anonymous(),
                stream,
            );
        }
        if let Some((stream, _)) = unix.as_ref().and_then(|l| l.accept().ok()) {
            idle = false;
            let principal = ftlab_device::policy::Principal::of_unix_peer(&stream);
            admit(
                &mut connections,
                args.max_connections,
                &device,
                &nbd,
                format!("unix client {}", principal.describe()),
                principal,
                stream,
            );
        }
        if idle {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    drop((tcp, unix));
    notify_service_manager("STOPPING=1");
    drain(&device, connections);
    // Each step runs even if one before it failed: the image holds the clients' data.
    let mut failed = Vec::new();
    if let Err(e) = device.finish() {
        failed.push(e.to_string());
    }
    // Read-only, nothing changed: the image is left as it was.
    if let Some(image) = image.as_ref().filter(|_| !args.read_only) {
        match device.save_image(image) {
            Ok(()) => eprintln!("ftlab serve: saved the device to {}", image.display()),
            Err(e) => failed.push(e.to_string()),
        }
    }
    if let Some(path) = &args.stats {
        if let Err(e) = write_stats(&device, path) {
            failed.push(format!("{e:#}"));
        }
    }
    let (requests, f) = device.ftl_stats();
    let client = device.client_latency();
    let ops = [
        ("read", &client.read),
        ("write", &client.write),
        ("trim", &client.trim),
        ("flush", &client.flush),
    ];
    let seen: Vec<String> = ops
        .iter()
        .filter(|(_, l)| l.count > 0)
        .map(|(op, l)| {
            let us = |ns: u64| ns as f64 / 1000.0;
            format!(
                "{op} {} p50 {:.1} p99 {:.1} max {:.1}",
                l.count,
                us(l.p50),
                us(l.p99),
                us(l.max)
            )
        })
        .collect();
    let s = device.store_stats();
    println!(
        "requests {requests}; host write pages {}, flash write pages {} (GC {}), WAF {}",
        f.host_write_pages,
        f.nand_write_pages(),
        f.gc_write_pages(),
        ftlab_sim::report::waf_text(f.waf())
    );
    if !seen.is_empty() {
        println!(
            "client latency us (request read to reply sent): {}",
            seen.join("; ")
        );
    }
    println!(
        "store: orig_data_size {} compr_data_size {} mem_used_total {} same_pages {} \
         huge_pages {}{}",
        s.orig_data_size,
        s.compr_data_size,
        s.mem_used_total,
        s.same_pages,
        s.huge_pages,
        if s.dictionary_bytes > 0 {
            format!(" dictionary_bytes {}", s.dictionary_bytes)
        } else {
            String::new()
        }
    );
    remove_socket();
    if let Some(path) = &args.pidfile {
        let _ = std::fs::remove_file(path);
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
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

/// Answers `GET /metrics` on `listener` until `stop`: one request a connection, its head at
/// most 8 KiB and 5 s (a hand-written HTTP/1.1 responder: one fixed GET needs no HTTP crate).
fn spawn_metrics(
    listener: TcpListener,
    device: Arc<Device>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    use std::io::{BufRead, BufReader, Read, Write};
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new((&stream).take(8 << 10));
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
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
                    ftlab_nbd::device_metrics(&device, open.load(Ordering::Relaxed)),
                )
            };
            let _ = write!(
                &stream,
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

/// The TLS identity of --tls-cert/--tls-key/--tls-ca, in --tls's mode; None when TLS is off.
fn tls_setup(args: &ServeArgs) -> anyhow::Result<Option<Arc<ftlab_nbd::tls::TlsSetup>>> {
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
    Ok(Some(Arc::new(TlsSetup::load(
        mode,
        cert,
        key,
        args.tls_ca.as_deref(),
    )?)))
}

/// A client's connection, served on a thread of its own.
struct Connection {
    thread: std::thread::JoinHandle<()>,
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
trait Socket: ftlab_nbd::Incoming + std::io::Write + Send + Sized + 'static {
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
fn drain(device: &Device, connections: Vec<Connection>) {
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

/// `--image` as it will be used: the file to load and replace at the save.
struct ImagePath {
    path: PathBuf,
    exists: bool,
}

/// Checks `--image` before anything is served: a regular file, or nothing yet (created at the
/// save). A symbolic link is followed once, here: the save writes `TARGET.tmp` beside the target
/// and renames it over the target, so the link stays a link and the target gets the data (a
/// rename over the link itself would replace the link and leave the target stale). Anything
/// else (a device node, FIFO, socket or directory) is refused: the save's rename would replace
/// it with a regular file, `/dev/null` included when run as root.
fn resolve_image(path: &Path) -> Result<ImagePath> {
    let link = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ImagePath {
                path: path.to_owned(),
                exists: false,
            })
        }
        Err(e) => anyhow::bail!("--image {}: {e}", path.display()),
    };
    let resolved = if link.file_type().is_symlink() {
        std::fs::canonicalize(path).with_context(|| {
            format!(
                "--image {}: a symbolic link whose target cannot be reached",
                path.display()
            )
        })?
    } else {
        path.to_owned()
    };
    let meta =
        std::fs::metadata(&resolved).with_context(|| format!("--image {}", resolved.display()))?;
    let kind = file_kind(&meta.file_type());
    anyhow::ensure!(
        meta.file_type().is_file(),
        "--image {}{}: is a {kind}, not a regular file; the image is saved by replacing its file, \
         so give the path of a raw image file (or of one to create)",
        path.display(),
        if resolved != path {
            format!(" (a link to {})", resolved.display())
        } else {
            String::new()
        }
    );
    Ok(ImagePath {
        path: resolved,
        exists: true,
    })
}

/// What a file is, for an error message.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "directory"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_symlink() {
        "symbolic link"
    } else {
        "regular file"
    }
}

/// Writes this process's ID to `path` (through `PATH.tmp` and a rename, so a reader never sees
/// it half written). A file already there is replaced only when it is a regular file naming no
/// running process (a crashed run's).
fn write_pidfile(path: &Path) -> Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(
            meta.file_type().is_file(),
            "--pidfile {}: is a {}, not a regular file; not replacing it",
            path.display(),
            file_kind(&meta.file_type())
        );
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Ok(pid) = text.trim().parse::<i32>() {
            // SAFETY: kill(2) with signal 0 only checks that the process exists.
            let alive = pid > 0
                && (unsafe { libc::kill(pid, 0) } == 0
                    || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
            anyhow::ensure!(
                !alive,
                "--pidfile {}: names process {pid}, which is running (another server?)",
                path.display()
            );
        }
    }
    let tmp = ftlab_device::tmp_path_beside(path);
    std::fs::write(&tmp, format!("{}\n", std::process::id()))
        .with_context(|| format!("--pidfile: writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("--pidfile {}", path.display()))
}

/// Tells systemd (or any service manager speaking its protocol) `state`, when it started us
/// with `NOTIFY_SOCKET`. Written here rather than taken from a crate: it is one datagram to a
/// Unix socket (an abstract one when the path starts with `@`), and a failure only costs the
/// notification.
fn notify_service_manager(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(socket) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let message = format!("{state}\nMAINPID={}\n", std::process::id());
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|addr| socket.send_to_addr(message.as_bytes(), &addr))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            Err(std::io::Error::other("abstract sockets are Linux-only"))
        }
    } else {
        socket.send_to(message.as_bytes(), &path)
    };
    if let Err(e) = sent {
        eprintln!(
            "ftlab serve: NOTIFY_SOCKET {}: {e}",
            Path::new(&path).display()
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
