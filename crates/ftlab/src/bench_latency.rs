//! `ftlab bench latency`: does the live device keep the time it models? A device served with
//! `--latency real` in this process, fio (its NBD engine) as the client: per cell (reads and
//! writes, 4 KiB and 128 KiB, QD 1 and 32, the device idle and with GC running) the model's
//! latency of the cell's requests (its histograms before and after, subtracted) beside what fio
//! saw, what the server saw (header read to reply written), the replies that left late and the
//! server's CPU per request. Rows with `--latency none` give the floor: what fio sees of a
//! server that holds nothing (the transport, both sides' wake-ups, the server's own work).

use anyhow::{Context, Result};
use ftlab_core::config::ConfigBuilder;
use ftlab_core::request::Op;
use ftlab_device::{Device, DeviceOptions, Late, Latency};
use ftlab_sim::report::{LatencySummary, OpHistograms};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A device served on a Unix socket by threads of this process, until dropped.
struct Served {
    device: Arc<Device>,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Served {
    fn uri(&self) -> String {
        format!("nbd+unix:///ftlab?socket={}", self.socket.display())
    }
}

/// The femu flash with `logical_bytes` of logical space over 7 % spare (so a full device
/// collects garbage), superblocks of one die, as `bench replay` sizes MQSim's device.
fn device(logical_bytes: u64, latency: Latency) -> Result<Device> {
    let blocks_per_die = (logical_bytes as f64 / 0.93 / 4096.0 / 64.0 / 256.0).ceil() as u64 + 2;
    let mut b = ConfigBuilder::from_preset("femu")?;
    for s in [
        format!("capacity.logical_bytes={logical_bytes}"),
        format!("flash.blocks_per_die={blocks_per_die}"),
        "flash.superblock_dies=1".into(),
        "capacity.spare_factor=0.07".into(),
    ] {
        b.set(&s)?;
    }
    let options = DeviceOptions {
        export_name: "ftlab".into(),
        exports: Vec::new(),
        latency,
        codec: ftlab_store::codec::Codec::Lz4,
        record: None,
        record_format: ftlab_device::RecordFormat::Nbdkit,
        mem_limit_bytes: None,
        max_inflight_bytes: ftlab_device::DEFAULT_MAX_INFLIGHT_BYTES,
        read_only: false,
        data: None,
        durability: Default::default(),
        checkpoint_every_bytes: None,
        maintenance: Default::default(),
        cache_bytes: 1 << 20,
        cache_policy: Default::default(),
    };
    Ok(Device::new(&b.build()?, options)?)
}

fn serve(dir: &Path, name: &str, device: Device) -> Result<Served> {
    let socket = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    // Polled, so that dropping `Served` stops the acceptor.
    listener.set_nonblocking(true)?;
    let device = Arc::new(device);
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let (device, stop) = (device.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let device = device.clone();
                        let _ = stream.set_nonblocking(false);
                        std::thread::spawn(move || {
                            let Ok(reader) = stream.try_clone() else {
                                return;
                            };
                            let options = ftlab_nbd::NbdOptions::default();
                            let _ = ftlab_nbd::serve_connection(&device, &options, reader, stream);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
    };
    Ok(Served {
        device,
        socket,
        stop,
        acceptor: Some(acceptor),
    })
}

/// One fio job (and, with `beside`, a second job run with it whose figures are not read).
struct Job<'a> {
    rw: &'a str,
    bs: &'a str,
    iodepth: u32,
    offset: u64,
    size: u64,
    /// Stop after this many bytes (writes on an idle device must not fill it); 0: time only.
    io_limit: u64,
    beside: Option<&'a str>,
}

/// fio's latency (submission to completion) of the job's operation.
struct Seen {
    mean_ns: f64,
    p99_ns: f64,
    ios: u64,
}

fn fio(uri: &str, job: &Job, seconds: u32) -> Result<Seen> {
    let mut cmd = std::process::Command::new("fio");
    cmd.args([
        "--output-format=json",
        "--ioengine=nbd",
        "--lat_percentiles=1",
        "--norandommap",
        "--randrepeat=0",
    ])
    .arg(format!("--uri={uri}"))
    .arg(format!("--runtime={seconds}"))
    .args(["--name=measured"])
    .arg(format!("--rw={}", job.rw))
    .arg(format!("--bs={}", job.bs))
    .arg(format!("--iodepth={}", job.iodepth))
    .arg(format!("--offset={}", job.offset))
    .arg(format!("--size={}", job.size));
    // Whichever comes first: the run time or the bytes (time-based runs loop over the range).
    if job.io_limit > 0 {
        cmd.arg(format!("--io_size={}", job.io_limit));
    } else {
        cmd.arg("--time_based");
    }
    if let Some(rw) = job.beside {
        cmd.args(["--name=beside", "--bs=4k", "--iodepth=4"])
            .arg(format!("--rw={rw}"))
            .arg(format!("--offset={}", job.offset))
            .arg(format!("--size={}", job.size));
    }
    let out = cmd.output().context("running fio (apt-get install fio)")?;
    anyhow::ensure!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find('{').context("no JSON in fio's output")?;
    let v: serde_json::Value = serde_json::from_str(&text[start..])?;
    let side = &v["jobs"][0][if job.rw.contains("read") {
        "read"
    } else {
        "write"
    }];
    let lat = &side["lat_ns"];
    Ok(Seen {
        mean_ns: lat["mean"].as_f64().unwrap_or(0.0),
        p99_ns: lat["percentile"]["99.000000"].as_f64().unwrap_or(0.0),
        ios: side["total_ios"].as_u64().unwrap_or(0),
    })
}

/// This process's CPU time (user + system), in microseconds: the server's, fio being another.
fn cpu_us() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// What one cell measured.
struct Cell {
    model: LatencySummary,
    server: LatencySummary,
    client: Seen,
    late: u64,
    late_mean_ns: f64,
    cpu_us_per_io: f64,
    waf: f64,
}

fn summary(h: &OpHistograms, op: Op) -> LatencySummary {
    let s = h.summaries();
    match op {
        Op::Read => s.read,
        _ => s.write,
    }
}

fn measure(served: &Served, job: &Job, seconds: u32) -> Result<Cell> {
    let d = &served.device;
    let op = if job.rw.contains("read") {
        Op::Read
    } else {
        Op::Write
    };
    let (model0, server0, late0) = (
        d.model_latency_histograms(),
        d.client_latency_histograms(),
        d.late_replies(),
    );
    let (_, f0) = d.ftl_stats();
    let cpu0 = cpu_us();
    let client = fio(&served.uri(), job, seconds)?;
    let cpu = cpu_us() - cpu0;
    let (_, f1) = d.ftl_stats();
    let late1 = d.late_replies();
    let model = summary(&d.model_latency_histograms().since(&model0), op);
    let server = summary(&d.client_latency_histograms().since(&server0), op);
    let late = late1.late - late0.late;
    let host = f1.host_write_pages - f0.host_write_pages;
    let nand = f1.nand_write_pages() - f0.nand_write_pages();
    Ok(Cell {
        late_mean_ns: (late1.late_total_ns - late0.late_total_ns) as f64 / late.max(1) as f64,
        late,
        cpu_us_per_io: cpu / client.ios.max(1) as f64,
        waf: if host > 0 {
            nand as f64 / host as f64
        } else {
            0.0
        },
        model,
        server,
        client,
    })
}

/// The bars: fio's mean within 5 % + 5 us of the model's, its p99 within 10 %.
fn meets(c: &Cell) -> (bool, bool) {
    let m = c.model.mean;
    let p = c.model.p99 as f64;
    (
        (c.client.mean_ns - m).abs() <= 0.05 * m + 5_000.0,
        (c.client.p99_ns - p).abs() <= 0.10 * p,
    )
}

fn row(state: &str, job: &Job, c: &Cell, bars: bool) {
    let us = |ns: f64| ns / 1000.0;
    let (mean_ok, p99_ok) = meets(c);
    let yes = |ok: bool| {
        if !bars {
            "-"
        } else if ok {
            "yes"
        } else {
            "no"
        }
    };
    println!(
        "| {state} | {} {} QD{} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:+.1} | {} ({:.1}) | {:.1} | {:.2} | {} | {} |",
        job.rw,
        job.bs,
        job.iodepth,
        us(c.model.mean),
        us(c.model.p99 as f64),
        us(c.client.mean_ns),
        us(c.client.p99_ns),
        us(c.server.mean),
        us(c.server.p99 as f64),
        us(c.client.mean_ns - c.model.mean),
        c.late,
        us(c.late_mean_ns),
        c.cpu_us_per_io,
        c.waf,
        yes(mean_ok),
        yes(p99_ok),
    );
}

/// Fills `[0, bytes)` sequentially, then (`overwrite`) writes it over once at random.
fn precondition(served: &Served, bytes: u64, overwrite: bool) -> Result<()> {
    let fill = Job {
        rw: "write",
        bs: "1m",
        iodepth: 8,
        offset: 0,
        size: bytes,
        io_limit: bytes,
        beside: None,
    };
    fio(&served.uri(), &fill, 600)?;
    if overwrite {
        let random = Job {
            rw: "randwrite",
            bs: "4k",
            iodepth: 32,
            io_limit: bytes,
            ..fill
        };
        fio(&served.uri(), &random, 600)?;
    }
    Ok(())
}

/// The grid's cells (rw, bs, iodepth), in the table's order: reads and writes, 4 KiB and
/// 128 KiB, QD 1 and 32; only QD 1 4 KiB when `qd1_4k_only` (`--quick`, the floor rows).
fn cells(qd1_4k_only: bool) -> impl Iterator<Item = (&'static str, &'static str, u32)> {
    ["randread", "randwrite"]
        .into_iter()
        .flat_map(|rw| ["4k", "128k"].into_iter().map(move |bs| (rw, bs)))
        .flat_map(|(rw, bs)| [1u32, 32].into_iter().map(move |qd| (rw, bs, qd)))
        .filter(move |&(_, bs, qd)| !qd1_4k_only || (qd == 1 && bs == "4k"))
}

/// `quick`: the QD 1 4 KiB cells only.
pub fn run(machine: String, seconds: u32, work_dir: &Path, quick: bool) -> Result<()> {
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating {}", work_dir.display()))?;
    println!(
        "ftlab bench latency on {machine}; fio's NBD engine as the client, {seconds} s a cell"
    );
    println!(
        "times in us, mean / p99; `late`: replies that left more than {} us after the model's completion (their mean lateness)",
        Late::LATE_AFTER_NS / 1000
    );
    println!("| device | job | model | fio | server | fio - model | late | server CPU us/IO | WAF | mean within 5 % + 5 us | p99 within 10 % |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    // Idle: reads over the first GiB, written once; writes to the second, never written, and
    // at most 256 MiB a cell, so that no cell makes the device collect garbage.
    const GIB: u64 = 1 << 30;
    let mut gib_written = 0u64;
    for latency in [Latency::None, Latency::Real] {
        let name = if latency == Latency::None {
            "idle, --latency none (floor)"
        } else {
            "idle"
        };
        let served = serve(work_dir, "idle", device(4 * GIB, latency)?)?;
        precondition(&served, GIB, false)?;
        for (rw, bs, iodepth) in cells(latency == Latency::None || quick) {
            let reads = rw == "randread";
            let job = Job {
                rw,
                bs,
                iodepth,
                offset: if reads { 0 } else { GIB + gib_written },
                size: GIB,
                io_limit: if reads { 0 } else { 256 << 20 },
                beside: None,
            };
            if !reads {
                gib_written += 256 << 20;
            }
            let cell = measure(&served, &job, seconds)?;
            row(name, &job, &cell, latency == Latency::Real);
        }
        gib_written = 0;
    }
    // GC running: a 512 MiB device with 7 % spare written full and over once; reads run beside
    // a writer (4 KiB random, QD 4), writes make the garbage they collect.
    let bytes = 512 << 20;
    let served = serve(work_dir, "gc", device(bytes, Latency::Real)?)?;
    precondition(&served, bytes, true)?;
    for (rw, bs, iodepth) in cells(quick) {
        let reads = rw == "randread";
        let job = Job {
            rw,
            bs,
            iodepth,
            offset: 0,
            size: bytes,
            io_limit: 0,
            beside: reads.then_some("randwrite"),
        };
        let cell = measure(&served, &job, seconds)?;
        row("GC running", &job, &cell, true);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The grid is the eight cells in the table's order; the quick one its two QD 1
    /// 4 KiB cells.
    #[test]
    fn the_grid_has_every_cell_once_and_quick_only_qd1_4k() {
        let all: Vec<_> = super::cells(false).collect();
        assert_eq!(all.len(), 8);
        assert_eq!(all[0], ("randread", "4k", 1));
        assert_eq!(all[7], ("randwrite", "128k", 32));
        let quick: Vec<_> = super::cells(true).collect();
        assert_eq!(quick, [("randread", "4k", 1), ("randwrite", "4k", 1)]);
    }
}
