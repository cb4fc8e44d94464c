//! `ftlab bench serve`: `ftlab serve` (FTL model on, `--latency none`) against `nbdkit memory`
//! of the same size, both driven by fio's NBD engine in the same run. `nbdkit null` (a server
//! that keeps nothing and reads zeros) runs beside them as the client's ceiling: no server can
//! make fio go much faster than that one does, so a ratio above ceiling/nbdkit is out of reach
//! on the machine, whatever the server does.

use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

fn wait_for(socket: &Path) -> Result<()> {
    for _ in 0..500 {
        if socket.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    anyhow::bail!("{} did not appear", socket.display())
}

/// (IOPS, MB/s) of one fio job.
fn fio(uri: &str, rw: &str, bs: &str, iodepth: u32, size: u64, seconds: u32) -> Result<(f64, f64)> {
    fio_job(uri, rw, bs, iodepth, size, seconds).map(|j| (j.iops, j.mb_per_s))
}

struct FioJob {
    iops: f64,
    mb_per_s: f64,
    /// fio's own CPU (user + system) per I/O, in microseconds: the client's cost.
    client_cpu_us_per_io: f64,
}

fn fio_job(uri: &str, rw: &str, bs: &str, iodepth: u32, size: u64, seconds: u32) -> Result<FioJob> {
    let out = Command::new("fio")
        .args([
            "--name=bench",
            "--ioengine=nbd",
            "--output-format=json",
            "--time_based",
        ])
        .arg(format!("--uri={uri}"))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={iodepth}"))
        .arg(format!("--size={size}"))
        .arg(format!("--runtime={seconds}"))
        .output()
        .context("running fio (apt-get install fio)")?;
    anyhow::ensure!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json_start = text.find('{').context("no JSON in fio's output")?;
    let v: serde_json::Value = serde_json::from_str(&text[json_start..])?;
    let job = &v["jobs"][0];
    let side = if rw.contains("read") {
        &job["read"]
    } else {
        &job["write"]
    };
    let ios = side["total_ios"].as_f64().unwrap_or(0.0).max(1.0);
    // Percent of one CPU over the job's run time (ms).
    let cpu_pct = job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    let runtime_us = job["job_runtime"].as_f64().unwrap_or(0.0) * 1e3;
    Ok(FioJob {
        iops: side["iops"].as_f64().unwrap_or(0.0),
        mb_per_s: side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        client_cpu_us_per_io: cpu_pct / 100.0 * runtime_us / ios,
    })
}

/// CPU time (user + system) a process has used, in microseconds (/proc/PID/stat).
fn process_cpu_us(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name, which may hold spaces, closed by the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz * 1e6
}

/// The run with the median IOPS.
fn median(runs: &mut [(f64, f64)]) -> (f64, f64) {
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs[runs.len() / 2]
}

pub fn run(machine: String, seconds: u32, repeat: u32) -> Result<()> {
    anyhow::ensure!(
        seconds >= 1 && repeat >= 1,
        "bench serve needs at least one run of at least a second"
    );
    let dir = std::env::temp_dir().join(format!("ftlab-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The sockets go whether the run finished or failed.
    let result = run_in(&dir, machine, seconds, repeat);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(dir: &Path, machine: String, seconds: u32, repeat: u32) -> Result<()> {
    let size: u64 = 1 << 30;
    let ftlab_sock = dir.join("ftlab.sock");
    let nbdkit_sock = dir.join("nbdkit.sock");
    let null_sock = dir.join("null.sock");
    let exe = std::env::current_exe()?;
    // Each server's stdout and stderr are dropped: the table is the output.
    let start = |mut command: Command, socket: &Path, what: &str| -> Result<Proc> {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let server = Proc(child);
        wait_for(socket)?;
        Ok(server)
    };
    let mut ftlab = Command::new(&exe);
    ftlab
        .args(["serve", "--no-tcp", "--latency", "none", "--unix"])
        .arg(&ftlab_sock)
        .args(["--set", &format!("capacity.logical_bytes={size}")]);
    let _ftlab = start(ftlab, &ftlab_sock, "ftlab serve")?;
    let nbdkit = |socket: &Path, plugin: &str| {
        let mut c = Command::new("nbdkit");
        c.args(["--foreground", "--unix"])
            .arg(socket)
            .args([plugin, &size.to_string()]);
        c
    };
    let what = "nbdkit (apt-get install nbdkit)";
    let _nbdkit = start(nbdkit(&nbdkit_sock, "memory"), &nbdkit_sock, what)?;
    let _null = start(nbdkit(&null_sock, "null"), &null_sock, what)?;
    let ftlab_uri = format!("nbd+unix:///ftlab?socket={}", ftlab_sock.display());
    let nbdkit_uri = format!("nbd+unix:///?socket={}", nbdkit_sock.display());
    let null_uri = format!("nbd+unix:///?socket={}", null_sock.display());
    println!(
        "ftlab bench serve on {machine}: fio --ioengine=nbd, {seconds} s a job, 1 GiB export, {repeat} runs of each job per server alternating (medians; per-run ratio range)"
    );
    println!(
        "| job | ftlab serve (FTL on, --latency none) | nbdkit memory | ratio | ratio range | nbdkit null (client ceiling) | ceiling / nbdkit memory |"
    );
    println!("|---|---|---|---|---|---|---|");
    // The sequential job runs first and fills each export, so that random writes overwrite
    // (as on a used SSD) instead of timing the servers' first-touch allocation, and random
    // reads find data everywhere.
    for (name, rw, bs, qd) in [
        ("1 MiB sequential write", "write", "1m", 8),
        ("4 KiB randwrite QD32", "randwrite", "4k", 32),
        ("4 KiB randread QD32", "randread", "4k", 32),
    ] {
        // This machine's speed drifts by 2x within minutes: alternating runs put both servers
        // under the same drift, and each ratio compares neighbours in time.
        let (mut ftlab, mut nbdkit, mut null) = (Vec::new(), Vec::new(), Vec::new());
        let mut ratios = Vec::new();
        for _ in 0..repeat {
            let f = fio(&ftlab_uri, rw, bs, qd, size, seconds)?;
            let n = fio(&nbdkit_uri, rw, bs, qd, size, seconds)?;
            null.push(fio(&null_uri, rw, bs, qd, size, seconds)?);
            ratios.push(f.0 / n.0.max(1.0));
            ftlab.push(f);
            nbdkit.push(n);
        }
        let (fi, fb) = median(&mut ftlab);
        let (ni, nb) = median(&mut nbdkit);
        let (ci, cb) = median(&mut null);
        ratios.sort_by(f64::total_cmp);
        println!(
            "| {name} | {fi:.0} IOPS, {fb:.0} MB/s | {ni:.0} IOPS, {nb:.0} MB/s | {:.2} | {:.2}-{:.2} | {ci:.0} IOPS, {cb:.0} MB/s | {:.2} |",
            fi / ni.max(1.0),
            ratios[0],
            ratios[ratios.len() - 1],
            ci / ni.max(1.0),
        );
    }
    Ok(())
}

/// `ftlab bench tls`: one `ftlab serve --tls allow` (FTL on, `--latency none`), fio's NBD engine
/// connecting in plain and over TLS by turns, over loopback TCP and over the Unix socket, so
/// both see the same device and the same drift of the machine. The server has no `--tls-ca` (fio's libnbd may not read certificate files)
/// and the client skips checking the server's certificate: the cost measured is the session's
/// encryption, which checking does not change after the handshake.
pub fn run_tls(machine: String, seconds: u32, repeat: u32) -> Result<()> {
    anyhow::ensure!(
        seconds >= 1 && repeat >= 1,
        "bench tls needs at least one run of at least a second"
    );
    let dir = std::env::temp_dir().join(format!("ftlab-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = run_tls_in(&dir, machine, seconds, repeat);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_tls_in(dir: &Path, machine: String, seconds: u32, repeat: u32) -> Result<()> {
    let size: u64 = 1 << 30;
    let pki = dir.join("pki");
    crate::tls_certs::write(&pki, &[], &["localhost".to_string()], 1)?;
    let socket = dir.join("ftlab.sock");
    // TLS is for clients across a network: TCP (loopback here) is the transport that counts;
    // the Unix socket beside it shows the cost where the transport costs least.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new(std::env::current_exe()?)
        .args(["serve", "--latency", "none", "--tls", "allow"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert")
        .arg(pki.join("server-cert.pem"))
        .arg("--tls-key")
        .arg(pki.join("server-key.pem"))
        .arg("--unix")
        .arg(&socket)
        .args(["--set", &format!("capacity.logical_bytes={size}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting ftlab serve")?;
    let server = Proc(child);
    let server_pid = server.0.id();
    wait_for(&socket)?;
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let plain_unix = format!("nbd+unix:///ftlab?socket={}", socket.display());
    let tls_unix = format!(
        "nbds+unix:///ftlab?socket={}&tls-verify-peer=false",
        socket.display()
    );
    let plain_tcp = format!("nbd://127.0.0.1:{port}/ftlab");
    let tls_tcp = format!("nbds://127.0.0.1:{port}/ftlab?tls-verify-peer=false");
    // Data everywhere, so that reads decompress and send pages rather than zeros.
    fio(&plain_unix, "write", "1m", 8, size, seconds.max(3))?;
    println!(
        "ftlab bench tls on {machine}: ftlab serve --tls allow (FTL on, --latency none), fio --ioengine=nbd plain and over TLS by turns, {seconds} s a job, 1 GiB export, {repeat} runs each (medians; per-run ratio range)"
    );
    println!("| job | plain | TLS | TLS / plain | ratio range | server CPU us/IO plain, TLS | client (fio) CPU us/IO plain, TLS |");
    println!("|---|---|---|---|---|---|---|");
    for (name, (plain, tls), rw, bs, qd) in [
        (
            "TCP: 4 KiB randread QD1",
            (&plain_tcp, &tls_tcp),
            "randread",
            "4k",
            1,
        ),
        (
            "TCP: 4 KiB randread QD32",
            (&plain_tcp, &tls_tcp),
            "randread",
            "4k",
            32,
        ),
        (
            "TCP: 4 KiB randwrite QD32",
            (&plain_tcp, &tls_tcp),
            "randwrite",
            "4k",
            32,
        ),
        (
            "TCP: 1 MiB sequential read QD8",
            (&plain_tcp, &tls_tcp),
            "read",
            "1m",
            8,
        ),
        (
            "Unix: 4 KiB randread QD1",
            (&plain_unix, &tls_unix),
            "randread",
            "4k",
            1,
        ),
        (
            "Unix: 4 KiB randread QD32",
            (&plain_unix, &tls_unix),
            "randread",
            "4k",
            32,
        ),
    ] {
        let (mut p, mut t, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        // CPU per I/O: (server, client) for plain and for TLS, every run.
        let (mut cpu_plain, mut cpu_tls) = (Vec::new(), Vec::new());
        let measured = |uri: &str| -> Result<(FioJob, f64)> {
            let before = process_cpu_us(server_pid);
            let job = fio_job(uri, rw, bs, qd, size, seconds)?;
            let server_us = process_cpu_us(server_pid) - before;
            let ios = job.iops * seconds as f64;
            Ok((job, server_us / ios.max(1.0)))
        };
        for round in 0..repeat {
            // Which goes first alternates too: neither always runs on a warmer machine.
            let (a, b) = if round % 2 == 0 {
                let a = measured(plain)?;
                (a, measured(tls)?)
            } else {
                let b = measured(tls)?;
                (measured(plain)?, b)
            };
            ratios.push(b.0.iops / a.0.iops.max(1.0));
            cpu_plain.push((a.1, a.0.client_cpu_us_per_io));
            cpu_tls.push((b.1, b.0.client_cpu_us_per_io));
            p.push((a.0.iops, a.0.mb_per_s));
            t.push((b.0.iops, b.0.mb_per_s));
        }
        let (pi, pb) = median(&mut p);
        let (ti, tb) = median(&mut t);
        ratios.sort_by(f64::total_cmp);
        let mid = |v: &mut Vec<(f64, f64)>| {
            let mut s: Vec<f64> = v.iter().map(|x| x.0).collect();
            let mut c: Vec<f64> = v.iter().map(|x| x.1).collect();
            s.sort_by(f64::total_cmp);
            c.sort_by(f64::total_cmp);
            (s[s.len() / 2], c[c.len() / 2])
        };
        let ((sp, cp), (st, ct)) = (mid(&mut cpu_plain), mid(&mut cpu_tls));
        println!(
            "| {name} | {pi:.0} IOPS, {pb:.0} MB/s | {ti:.0} IOPS, {tb:.0} MB/s | {:.2} | {:.2}-{:.2} | {sp:.1}, {st:.1} | {cp:.1}, {ct:.1} |",
            ti / pi.max(1.0),
            ratios[0],
            ratios[ratios.len() - 1],
        );
    }
    Ok(())
}
