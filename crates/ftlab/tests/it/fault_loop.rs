//! `ftlab serve --data` on a file system of its own (a small loop-mounted ext4, a tmpfs), under
//! what a disk and an operator do to it: the disk filled and space returned, kill -9, a clean
//! stop, the lock's file deleted and a second server started, the model's files damaged, in
//! random order, with a client that tracks every acknowledged write and trim against the FLUSH
//! acknowledgements. Mounting needs root: elsewhere these tests say SKIPPED.
//!
//! `FTLAB_FAULT_ROUNDS` sets the loop's rounds (a few by default; `scripts/fault-loop.sh` runs
//! it long).

use crate::server::{go, Client};
use crate::support::{skip, temp_dir, TempDir};
use ftlab_core::rng::SplitMix64;
use ftlab_nbd::protocol as p;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

/// A file system mounted for one test, unmounted when dropped.
struct Scratch {
    mount: PathBuf,
    _dir: TempDir,
}

impl Scratch {
    /// A tmpfs of `mib` MiB, or a loop-mounted ext4 of `mib` MiB; None (the test skipped)
    /// when this process may not mount.
    fn new(test: &str, ext4: bool, mib: u64) -> Option<Scratch> {
        // SAFETY: geteuid(2) reads the process's credentials and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            skip(test, "mounting a scratch file system needs root");
            return None;
        }
        let dir = temp_dir(test);
        let mount = dir.join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let ok = if ext4 {
            let image = dir.join("fs.img");
            std::fs::File::create(&image)
                .unwrap()
                .set_len(mib << 20)
                .unwrap();
            let made = Command::new("mkfs.ext4")
                .arg("-qF")
                .arg(&image)
                .status()
                .is_ok_and(|s| s.success());
            made && Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mount)
                .status()
                .is_ok_and(|s| s.success())
        } else {
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(&mount)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok {
            let what = if ext4 {
                "a loop-mounted ext4"
            } else {
                "a tmpfs"
            };
            skip(test, &format!("{what} could not be mounted here"));
            return None;
        }
        Some(Scratch { mount, _dir: dir })
    }

    fn free_bytes(&self) -> u64 {
        let f = std::fs::File::open(&self.mount).unwrap();
        ftlab_store::log::free_bytes(&f).expect("statvfs answers on Linux")
    }

    /// Fills the disk with a ballast file until at most `leave` bytes are free; returns it.
    fn fill_leaving(&self, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.mount.join("ballast");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 256 << 10];
        while self.free_bytes() > leave {
            let n = (self.free_bytes() - leave).min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n.max(4096)]).is_err() {
                break;
            }
            f.sync_data().unwrap();
        }
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Lazily: a server a failed test left behind may still hold files.
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// A served directory: the server is killed on drop, so a failing test leaves none behind;
/// its stderr goes to a file (a pipe nobody drains would stop it).
struct Served {
    child: Child,
    log: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.log_text()
    }

    /// SIGTERM, and the exit it leads to (the final checkpoint written).
    fn stop(mut self) -> String {
        // SAFETY: kill(2) on our own child's pid; it has not been waited for, so the pid is
        // still its own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let log = self.log_text();
        assert!(status.success(), "serve exited {status}: {log}");
        log
    }
}

/// `ftlab serve --data data` of a `device_bytes` device on `sock`; the server and a client.
fn serve(data: &Path, sock: &Path, device_bytes: u64) -> (Served, Client) {
    let _ = std::fs::remove_file(sock);
    let log = sock.with_extension("log");
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_ftlab"))
        .args(["serve", "--no-tcp", "--unix"])
        .arg(sock)
        .arg("--data")
        .arg(data)
        .args(["--set", &format!("capacity.logical_bytes={device_bytes}")])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let served = Served { child, log };
    for _ in 0..1000 {
        if let Ok(s) = UnixStream::connect(sock) {
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            return (served, go(s, "ftlab").0);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the server never answered: {}", served.log_text());
}

/// Page `lpn` as version `version` writes it (version 0: zeros, as never written or trimmed);
/// incompressible, so that the log fills the disk as fast as the client writes.
fn page(lpn: u64, version: u64) -> Vec<u8> {
    if version == 0 {
        return vec![0; PAGE];
    }
    let mut rng = SplitMix64::new(lpn << 32 ^ version);
    (0..PAGE / 8)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect()
}

/// What each page may hold: what the last FLUSH left possible, and what was written since
/// (acknowledged or not: a failed write may have landed in part).
struct Oracle {
    flushed: Vec<Vec<u64>>,
    since: Vec<Vec<(u64, bool)>>,
    version: u64,
}

impl Oracle {
    fn new(pages: u64) -> Self {
        Oracle {
            flushed: vec![vec![0]; pages as usize],
            since: vec![Vec::new(); pages as usize],
            version: 0,
        }
    }

    /// A write (trim: version 0) of `pages` from `lpn`, acknowledged or not.
    fn wrote(&mut self, lpn: u64, pages: u64, version: u64, acked: bool) {
        for l in lpn..lpn + pages {
            self.since[l as usize].push((version, acked));
        }
    }

    /// A FLUSH was acknowledged: each page holds its last acknowledged write, or one that
    /// failed after it.
    fn flushed(&mut self) {
        for (f, s) in self.flushed.iter_mut().zip(&mut self.since) {
            match s.iter().rposition(|&(_, acked)| acked) {
                Some(i) => *f = s[i..].iter().map(|&(v, _)| v).collect(),
                None => f.extend(s.iter().map(|&(v, _)| v)),
            }
            s.clear();
        }
    }

    /// Reads every page and checks it holds what it may; then what it holds is all it may.
    fn verify(&mut self, c: &mut Client, when: &str) {
        let per = 256u64;
        let pages = self.flushed.len() as u64;
        for first in (0..pages).step_by(per as usize) {
            let n = per.min(pages - first);
            let (err, got) = c.request(p::CMD_READ, 0, first * PAGE as u64, (n * 4096) as u32, &[]);
            assert_eq!(err, 0, "{when}: reading pages {first}..{}", first + n);
            for (k, bytes) in got.chunks(PAGE).enumerate() {
                let lpn = first + k as u64;
                let l = lpn as usize;
                let allowed: Vec<u64> = self.flushed[l]
                    .iter()
                    .copied()
                    .chain(self.since[l].iter().map(|&(v, _)| v))
                    .collect();
                let Some(&v) = allowed.iter().find(|&&v| bytes == page(lpn, v)) else {
                    panic!("{when}: page {lpn} holds none of versions {allowed:?}");
                };
                self.flushed[l] = vec![v];
                self.since[l].clear();
            }
        }
    }

    /// Writes `pages` pages from `lpn` as a new version; the NBD error.
    fn write(&mut self, c: &mut Client, lpn: u64, pages: u64) -> u32 {
        self.version += 1;
        let v = self.version;
        let data: Vec<u8> = (lpn..lpn + pages).flat_map(|l| page(l, v)).collect();
        let err = c
            .request(p::CMD_WRITE, 0, lpn * PAGE as u64, data.len() as u32, &data)
            .0;
        self.wrote(lpn, pages, v, err == 0);
        err
    }

    fn trim(&mut self, c: &mut Client, lpn: u64, pages: u64) -> u32 {
        let err = c
            .request(
                p::CMD_TRIM,
                0,
                lpn * PAGE as u64,
                (pages * 4096) as u32,
                &[],
            )
            .0;
        self.wrote(lpn, pages, 0, err == 0);
        err
    }

    fn flush(&mut self, c: &mut Client) -> u32 {
        let err = c.request(p::CMD_FLUSH, 0, 0, 0, &[]).0;
        if err == 0 {
            self.flushed();
        }
        err
    }
}

/// The reproduction: a 64 MiB disk with 16 MiB of ballast under a 256 MiB device,
/// incompressible 1 MiB writes with a FLUSH every 4 until the disk is full, the ballast
/// removed, a write and FLUSH, then a stop (SIGTERM on ext4, kill -9 on tmpfs) and a restart.
/// Before the fix the server appended after a torn short write and the restart refused the
/// log ("corrupt ... and a commit follows it"), losing flushed writes.
fn full_disk_then_space_returned(test: &str, ext4: bool) {
    let Some(fs) = Scratch::new(test, ext4, 64) else {
        return;
    };
    let (data, sock) = (fs.mount.join("data"), fs.mount.with_extension("sock"));
    let device_bytes = 256u64 << 20;
    let pages = device_bytes / PAGE as u64;
    let ballast = fs.fill_leaving(fs.free_bytes().saturating_sub(16 << 20));
    let (server, mut c) = serve(&data, &sock, device_bytes);
    let mut o = Oracle::new(pages);
    let mut refused = 0;
    for k in 0..200u64 {
        let err = o.write(&mut c, k * 256, 256);
        if err == p::ENOSPC {
            refused += 1;
            break;
        }
        assert_eq!(err, 0, "write {k}");
        if k % 4 == 3 {
            assert!(matches!(o.flush(&mut c), 0 | p::ENOSPC));
        }
    }
    assert_eq!(refused, 1, "the disk never filled: {}", server.log_text());
    assert!(
        server.log_text().contains("the disk is full"),
        "{}",
        server.log_text()
    );
    // Reads go on while the disk is full.
    o.verify(&mut c, "while the disk is full");
    std::fs::remove_file(&ballast).unwrap();
    let at = 200 * 256;
    let started = Instant::now();
    while o.write(&mut c, at, 16) != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "writing never resumed after space returned: {}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(o.flush(&mut c), 0);
    let log = if ext4 { server.stop() } else { server.kill() };
    assert!(log.contains("writing resumed"), "{log}");
    let (_server, mut c) = serve(&data, &sock, device_bytes);
    o.verify(&mut c, "after the restart");
}

#[test]
fn a_full_ext4_then_space_returned_loses_nothing() {
    full_disk_then_space_returned("a_full_ext4_then_space_returned_loses_nothing", true);
}

#[test]
fn a_full_tmpfs_then_space_returned_loses_nothing_across_kill_9() {
    full_disk_then_space_returned(
        "a_full_tmpfs_then_space_returned_loses_nothing_across_kill_9",
        false,
    );
}

/// A disk filled by overwrites (mostly dead records) makes its own room: the reserve kept for
/// checkpoints and the cleaner lets them delete dead segments, and writing resumes without the
/// operator. Before the reserve, the log took the disk to its last byte, the checkpoint that
/// would let the cleaner delete segments could not be written, and every write was refused
/// for ever.
#[test]
fn a_disk_filled_by_overwrites_makes_its_own_room() {
    let test = "a_disk_filled_by_overwrites_makes_its_own_room";
    let Some(fs) = Scratch::new(test, false, 48) else {
        return;
    };
    let (data, sock) = (fs.mount.join("data"), fs.mount.with_extension("sock"));
    let device_bytes = 32u64 << 20;
    let (server, mut c) = serve(&data, &sock, device_bytes);
    // 24 MiB live in 32 MiB of room: the log's garbage fills the rest between checkpoints.
    fs.fill_leaving(32 << 20);
    let mut o = Oracle::new(device_bytes / PAGE as u64);
    let (mut refused, started) = (0u64, Instant::now());
    for round in 0..8u64 {
        for k in 0..24u64 {
            let lpn = k * 256;
            while o.write(&mut c, lpn, 256) != 0 {
                refused += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "round {round}: writes refused for ever ({refused} so far): {}",
                    server.log_text()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(o.flush(&mut c), 0);
        }
    }
    o.verify(&mut c, "after 8 rounds of overwrites");
    drop(server);
    // Told as episodes, not as a line a write.
    let log = std::fs::read_to_string(sock.with_extension("log")).unwrap();
    let told = log.matches("the disk is full").count() as u64;
    assert!(
        told <= 1 + started.elapsed().as_secs() / 60,
        "{told} lines: {log}"
    );
}

/// The faults of the loop.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Stop,
    FullDisk,
    DeletedLock,
    DamagedModel,
}

const FAULTS: [Fault; 5] = [
    Fault::Kill,
    Fault::Stop,
    Fault::FullDisk,
    Fault::DeletedLock,
    Fault::DamagedModel,
];

fn fault_rounds() -> u64 {
    std::env::var("FTLAB_FAULT_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10)
}

/// Writes (64 KiB, over the first 16 MiB) and trims, a FLUSH every 8; all acknowledged.
fn workload(o: &mut Oracle, c: &mut Client, rng: &mut SplitMix64, ops: u64) {
    let chunks = 256;
    for i in 0..ops {
        let lpn = rng.bounded(chunks) * 16;
        if rng.bounded(8) == 0 {
            assert_eq!(o.trim(c, lpn, 16), 0, "trim of page {lpn}");
        } else {
            assert_eq!(o.write(c, lpn, 16), 0, "write of page {lpn}");
        }
        if i % 8 == 7 {
            assert_eq!(o.flush(c), 0);
        }
    }
}

/// The crash-and-fault loop: every fault in a random order, again and again, each round's
/// writes checked against the oracle after it; at the end `ftlab check` passes.
#[test]
fn the_fault_loop_loses_nothing_acknowledged() {
    let test = "the_fault_loop_loses_nothing_acknowledged";
    let Some(fs) = Scratch::new(test, false, 96) else {
        return;
    };
    let (data, sock) = (fs.mount.join("data"), fs.mount.with_extension("sock"));
    let device_bytes = 64u64 << 20;
    let mut o = Oracle::new(device_bytes / PAGE as u64);
    let mut rng = SplitMix64::new(86);
    let (mut server, mut c) = serve(&data, &sock, device_bytes);
    let mut order = FAULTS.to_vec();
    for round in 0..fault_rounds() {
        if round % FAULTS.len() as u64 == 0 {
            for i in (1..order.len()).rev() {
                order.swap(i, rng.bounded(i as u64 + 1) as usize);
            }
        }
        let fault = order[(round % FAULTS.len() as u64) as usize];
        let when = format!("round {round} ({fault:?})");
        let ops = 100 + rng.bounded(100);
        workload(&mut o, &mut c, &mut rng, ops);
        match fault {
            Fault::Kill | Fault::Stop | Fault::DamagedModel => {
                // Writes in flight at the kill: not acknowledged, maybe there.
                let _ = o.write(&mut c, rng.bounded(256) * 16, 16);
                if matches!(fault, Fault::Stop) {
                    server.stop();
                    assert!(!data.join("control.sock").exists(), "{when}");
                } else {
                    server.kill();
                }
                if matches!(fault, Fault::DamagedModel) {
                    damage_model(&data, &mut rng);
                }
                (server, c) = serve(&data, &sock, device_bytes);
                o.verify(&mut c, &when);
            }
            Fault::FullDisk => {
                let ballast = fs.fill_leaving(1 << 20);
                let mut refused = false;
                for _ in 0..400 {
                    let err = o.write(&mut c, rng.bounded(256) * 16, 16);
                    if err == p::ENOSPC {
                        refused = true;
                        break;
                    }
                    assert_eq!(err, 0, "{when}");
                }
                assert!(refused, "{when}: the disk never filled");
                assert!(matches!(o.flush(&mut c), 0 | p::ENOSPC), "{when}");
                o.verify(&mut c, &format!("{when}, while the disk is full"));
                std::fs::remove_file(&ballast).unwrap();
                let started = Instant::now();
                while o.write(&mut c, rng.bounded(256) * 16, 16) != 0 {
                    assert!(
                        started.elapsed() < Duration::from_secs(10),
                        "{when}: writing never resumed: {}",
                        server.log_text()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                assert_eq!(o.flush(&mut c), 0, "{when}");
            }
            Fault::DeletedLock => {
                // Whatever an operator takes for the lock; a second server must still be
                // refused, and the first go on.
                for f in ["lock", "control.sock"] {
                    let _ = std::fs::remove_file(data.join(f));
                }
                let second = Command::new(env!("CARGO_BIN_EXE_ftlab"))
                    .args(["serve", "--no-tcp", "--unix"])
                    .arg(sock.with_extension("second"))
                    .arg("--data")
                    .arg(&data)
                    .args(["--set", &format!("capacity.logical_bytes={device_bytes}")])
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&second.stderr);
                assert!(
                    !second.status.success() && text.contains("in use"),
                    "{when}: {text}"
                );
                workload(&mut o, &mut c, &mut rng, 16);
            }
        }
    }
    o.verify(&mut c, "at the end");
    server.stop();
    let check = Command::new(env!("CARGO_BIN_EXE_ftlab"))
        .arg("check")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// Damages the FTL model's files as an operator or a disk might: `model.log` or `model.state`
/// deleted, cut in half, or a byte flipped.
fn damage_model(data: &Path, rng: &mut SplitMix64) {
    let file = data.join(["model.log", "model.state"][rng.bounded(2) as usize]);
    let Ok(mut bytes) = std::fs::read(&file) else {
        return;
    };
    match rng.bounded(3) {
        0 => std::fs::remove_file(&file).unwrap(),
        1 => std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap(),
        _ => {
            let at = rng.bounded(bytes.len().max(1) as u64) as usize;
            if let Some(b) = bytes.get_mut(at) {
                *b ^= 0x20;
            }
            std::fs::write(&file, &bytes).unwrap();
        }
    }
}
