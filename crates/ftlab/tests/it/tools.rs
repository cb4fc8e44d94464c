//! Real clients against `ftlab serve`: fio with verify, nbdcopy, and ext4 through nbdfuse and a
//! loop device. A missing tool or kernel feature is a loud SKIPPED line, never a silent pass.

use crate::support::{skip, temp_dir, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `ftlab serve` on a Unix socket in a directory of its own; SIGTERM on drop.
struct Server {
    child: Child,
    socket: PathBuf,
    // Dropped after `child` is killed.
    _dir: TempDir,
}

impl Server {
    fn start(name: &str, logical_bytes: u64) -> Server {
        Self::start_with(name, logical_bytes, &[])
    }

    fn start_with(name: &str, logical_bytes: u64, extra: &[&str]) -> Server {
        let dir = temp_dir(&format!("{name}-server"));
        let socket = dir.join("nbd.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_ftlab"))
            .args(["serve", "--no-tcp", "--unix"])
            .arg(&socket)
            .args(["--set", &format!("capacity.logical_bytes={logical_bytes}")])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The socket file appears at bind(2), a moment before listen(2): wait until it answers.
        for _ in 0..500 {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Server {
            child,
            socket,
            _dir: dir,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///ftlab?socket={}", self.socket.display())
    }

    /// Stops the server and returns its final summary.
    fn stop(mut self) -> String {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap())
            .wait_with_output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// fio with its nbd ioengine.
fn have_fio_nbd() -> bool {
    have("fio")
        && Command::new("fio")
            .arg("--enghelp")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("nbd"))
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn fio_randwrite_and_randrw_verify_over_the_whole_device() {
    if !have_fio_nbd() {
        return skip(
            "fio_randwrite_and_randrw_verify_over_the_whole_device",
            "fio with the nbd ioengine is not installed (apt-get install fio)",
        );
    }
    // A device small enough for GC to run: 192 MiB of flash, 160 MiB exposed.
    let size = 160u64 << 20;
    let dir = temp_dir("fio-record");
    let (record, stats) = (dir.join("record.log"), dir.join("stats.json"));
    let device = [
        "--set",
        "flash.blocks_per_die=3",
        "--set",
        "flash.superblock_dies=1",
    ];
    let mut extra = device.to_vec();
    let (record_s, stats_s) = (record.display().to_string(), stats.display().to_string());
    extra.extend([
        "--record",
        &record_s,
        "--stats",
        &stats_s,
        "--stats-interval",
        "0.2",
    ]);
    let server = Server::start_with("fio", size, &extra);
    for rw in ["randwrite", "randrw"] {
        // In the test's directory: fio leaves its verify state file where it runs.
        let out = run(Command::new("fio")
            .current_dir(dir.path())
            .args(["--name=verify", "--ioengine=nbd", "--bs=4k", "--iodepth=16"])
            .arg(format!("--uri={}", server.uri()))
            .arg(format!("--rw={rw}"))
            .arg(format!("--size={size}"))
            .args([
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--randrepeat=1",
            ]));
        // fio exits non-zero on a verify failure (verify_fatal); its summary shows no error.
        assert!(out.contains("err= 0"), "{out}");
    }
    let summary = server.stop();
    assert!(summary.contains("WAF"), "{summary}");
    // The server's own statistics against a replay of what it recorded.
    let live = crate::support::read_json(&stats);
    assert!(
        live["gc_write_pages"].as_u64().unwrap() > 0,
        "GC ran: {live}"
    );
    let replay = run(Command::new(env!("CARGO_BIN_EXE_ftlab"))
        .args(["sim", "--trace"])
        .arg(&record)
        .args(["--set", &format!("capacity.logical_bytes={size}")])
        .args(device)
        .args(["--json"])
        .arg(dir.join("replay.json")));
    let replayed = crate::support::read_json(dir.join("replay.json"));
    for key in [
        "host_write_pages",
        "nand_write_pages",
        "gc_write_pages",
        "erases",
    ] {
        assert_eq!(
            live[key], replayed[key],
            "{key}: server vs replay\n{replay}"
        );
    }
    assert_eq!(
        live["waf"].as_f64().unwrap(),
        replayed["waf"].as_f64().unwrap()
    );
    // Simulated latency: one sample per request the model saw, as in the replay; and the
    // configuration it ran.
    for op in ["read", "write", "trim", "flush"] {
        assert_eq!(
            live["latency_ns"][op]["count"], replayed["latency_ns"][op]["count"],
            "{op}"
        );
    }
    assert!(live["latency_ns"]["write"]["p50"].as_u64().unwrap() > 0);
    for section in ["flash", "capacity", "ftl"] {
        assert_eq!(
            live["config"][section], replayed["config"][section],
            "{section}"
        );
    }
    // What the clients saw: every command answered, each counted once.
    let client = &live["client_latency_ns"];
    let answered: u64 = ["read", "write", "trim", "flush"]
        .iter()
        .map(|op| client[op]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, live["nbd_requests"].as_u64().unwrap(), "{client}");
    assert!(client["write"]["p50"].as_u64().unwrap() > 0, "{client}");
}

fn real_data_file(path: &Path, bytes: usize) {
    let mut data = Vec::with_capacity(bytes);
    let mut stack = vec![PathBuf::from("/usr/lib")];
    while data.len() < bytes {
        let Some(dir) = stack.pop() else { break };
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = rd.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                if let Ok(b) = std::fs::read(e.path()) {
                    data.extend_from_slice(&b);
                }
            }
            if data.len() >= bytes {
                break;
            }
        }
    }
    data.resize(bytes, 0x5a);
    std::fs::write(path, data).unwrap();
}

#[test]
fn nbdcopy_a_real_file_in_and_out_gives_identical_bytes() {
    if !have("nbdcopy") {
        return skip(
            "nbdcopy_a_real_file_in_and_out_gives_identical_bytes",
            "nbdcopy is not installed (apt-get install libnbd-bin)",
        );
    }
    let size = 256usize << 20;
    let dir = temp_dir("nbdcopy");
    let file = dir.join("in.bin");
    real_data_file(&file, size);
    let server = Server::start("nbdcopy", size as u64);
    run(Command::new("nbdcopy").arg(&file).arg(server.uri()));
    let back = dir.join("out.bin");
    run(Command::new("nbdcopy").arg(server.uri()).arg(&back));
    let (a, b) = (std::fs::read(&file).unwrap(), std::fs::read(&back).unwrap());
    assert_eq!(a.len(), b.len());
    assert!(a == b, "bytes differ after the round trip");
    let summary = server.stop();
    assert!(summary.contains("compr_data_size"), "{summary}");
}

/// Whether ext4 can be mounted on an export here (nbdfuse, a loop device, root); if not, says
/// SKIPPED for `test` and why.
fn ext4_ready(test: &str) -> bool {
    for tool in [
        "nbdfuse",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
        "fusermount3",
    ] {
        if !have(tool) {
            skip(
                test,
                &format!("{tool} is not installed (apt-get install libnbd-bin fuse3)"),
            );
            return false;
        }
    }
    if !Path::new("/dev/fuse").exists() || !Path::new("/dev/loop-control").exists() {
        skip(
            test,
            "/dev/fuse or /dev/loop-control is missing on this machine",
        );
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "ext4 through a loop device needs root");
        return false;
    }
    true
}

#[test]
fn ext4_through_nbdfuse_and_a_loop_device_survives_fsck_and_remount() {
    if !ext4_ready("ext4_through_nbdfuse_and_a_loop_device_survives_fsck_and_remount") {
        return;
    }
    let dir = temp_dir("ext4");
    let (fuse_dir, mnt) = (dir.join("fuse"), dir.join("mnt"));
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let server = Server::start("ext4", 1 << 30);
    let mut fuse = Command::new("nbdfuse")
        .arg(&fuse_dir)
        .arg(server.uri())
        .spawn()
        .unwrap();
    let image = fuse_dir.join("nbd");
    for _ in 0..200 {
        if image.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let loop_dev = run(Command::new("losetup")
        .args(["--direct-io=on", "-f", "--show"])
        .arg(&image))
    .lines()
    .next()
    .unwrap()
    .trim()
    .to_string();
    let result = std::panic::catch_unwind(|| {
        run(Command::new("mkfs.ext4").args(["-q", &loop_dev]));
        run(Command::new("mount").arg(&loop_dev).arg(&mnt));
        let tree = Path::new("/usr/share/doc");
        run(Command::new("cp").arg("-a").arg(tree).arg(&mnt));
        let sums = |root: &Path| {
            run(Command::new("sh").arg("-c").arg(format!(
                "cd '{}' && find . -type f -exec sha256sum {{}} + | sort -k2",
                root.display()
            )))
        };
        let before = sums(tree);
        run(Command::new("umount").arg(&mnt));
        let fsck = run(Command::new("e2fsck").args(["-fn", &loop_dev]));
        assert!(fsck.contains("Pass 5"), "{fsck}");
        run(Command::new("mount").arg(&loop_dev).arg(&mnt));
        let after = sums(&mnt.join("doc"));
        run(Command::new("umount").arg(&mnt));
        assert!(before.lines().count() > 100);
        assert!(before == after, "file checksums differ after remount");
    });
    // After a failure the file system may still be mounted, which would keep the loop device
    // and the FUSE mount busy (left behind on the machine).
    if result.is_err() {
        let _ = Command::new("umount").arg(&mnt).status();
    }
    let _ = Command::new("losetup").args(["-d", &loop_dev]).status();
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg(&fuse_dir)
        .status();
    let _ = fuse.wait();
    let summary = server.stop();
    assert!(summary.contains("WAF"), "{summary}");
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn image_saved_at_shutdown_is_loaded_at_the_next_start() {
    if !have("qemu-io") {
        return skip(
            "image_saved_at_shutdown_is_loaded_at_the_next_start",
            "qemu-io is not installed (apt-get install qemu-utils)",
        );
    }
    let dir = temp_dir("image");
    let image = dir.join("ssd.img");
    let image_s = image.display().to_string();
    let size = 64u64 << 20;
    let server = Server::start_with("image-1", size, &["--image", &image_s]);
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 0x77 12345 100000",
            "-c",
            "write -P 0x11 60000000 4096",
        ])
        .arg(server.uri()));
    server.stop();
    assert_eq!(std::fs::metadata(&image).unwrap().len(), size);
    let server = Server::start_with("image-2", size, &["--image", &image_s]);
    let out = run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0x77 12345 100000",
            "-c",
            "read -P 0x11 60000000 4096",
        ])
        .args(["-c", "read -P 0 0 12345"])
        .arg(server.uri()));
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let summary = server.stop();
    // Loading is not client I/O: the second session wrote nothing.
    assert!(summary.contains("host write pages 0,"), "{summary}");
}

/// Block status, checked by the clients that use it: `nbdinfo --map` and `qemu-img map` see
/// unwritten and trimmed ranges as holes, and nbdcopy skips them (its copy stays sparse);
/// `nbdinfo` sees CACHE offered and `--read-only` advertised.
#[test]
fn real_clients_see_holes_and_copy_sparse() {
    const TEST: &str = "real_clients_see_holes_and_copy_sparse";
    for tool in ["nbdinfo", "nbdcopy", "qemu-io", "qemu-img"] {
        if !have(tool) {
            return skip(
                TEST,
                &format!("{tool} is not installed (apt-get install libnbd-bin qemu-utils)"),
            );
        }
    }
    let server = Server::start("holes", 64 << 20);
    let uri = server.uri();
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0xab 1M 64k",
        "-c",
        "write -P 0xcd 8M 4k",
        "-c",
        "write -P 0xee 16M 1M",
        "-c",
        "discard 16M 512k",
        &uri,
    ]));
    // nbdinfo --map: "offset length type description" per extent.
    let map = run(Command::new("nbdinfo").args(["--map", &uri]));
    let data: Vec<(u64, u64)> = map
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[3] == "data").then(|| (f[0].parse().unwrap(), f[1].parse().unwrap()))
        })
        .collect();
    assert_eq!(
        data,
        [
            (1 << 20, 64 << 10),
            (8 << 20, 4 << 10),
            ((16 << 20) + (512 << 10), 512 << 10)
        ],
        "{map}"
    );
    assert!(map.contains("hole,zero"), "{map}");
    // qemu-img map: the same extents as data, the rest zero.
    let qmap = run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &uri]));
    let entries: serde_json::Value = serde_json::from_str(
        qmap.lines()
            .filter(|l| !l.is_empty())
            .collect::<String>()
            .trim(),
    )
    .unwrap_or_else(|e| panic!("{e}: {qmap}"));
    let qdata: Vec<(u64, u64)> = entries
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == true)
        .map(|e| (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(qdata, data, "{qmap}");
    // nbdcopy to a file skips the holes: the copy takes about the data's blocks, not 64 MiB.
    let dir = crate::support::temp_dir("holes-copy");
    let out = dir.join("copy.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&out));
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    use std::os::unix::fs::MetadataExt;
    let allocated = meta.blocks() * 512;
    assert!(allocated <= 2 << 20, "{allocated} bytes allocated");
    let bytes = std::fs::read(&out).unwrap();
    assert!(bytes[1 << 20..(1 << 20) + (64 << 10)]
        .iter()
        .all(|&b| b == 0xab));
    assert!(bytes[(16 << 20) + (512 << 10)..17 << 20]
        .iter()
        .all(|&b| b == 0xee));
    assert!(bytes[16 << 20..(16 << 20) + (512 << 10)]
        .iter()
        .all(|&b| b == 0));
    let info = run(Command::new("nbdinfo").arg(&uri));
    assert!(
        info.contains("can_cache: true") && info.contains("is_read_only: false"),
        "{info}"
    );
    server.stop();
    let ro = Server::start_with("holes-ro", 64 << 20, &["--read-only"]);
    let info = run(Command::new("nbdinfo").arg(ro.uri()));
    assert!(info.contains("is_read_only: true"), "{info}");
    ro.stop();
}

/// Two exports of one device (`--export`), each with its placement handle, written and
/// verified by two fio processes at once: both verify, the statistics count each export's
/// bytes, and each export's writes land on its handle.
#[test]
fn fio_verifies_two_exports_at_once() {
    if !have_fio_nbd() {
        return skip(
            "fio_verifies_two_exports_at_once",
            "fio with the nbd ioengine is not installed (apt-get install fio)",
        );
    }
    let size = 160u64 << 20;
    let dir = temp_dir("fio-exports");
    let stats = dir.join("stats.json");
    let stats_s = stats.display().to_string();
    let server = Server::start_with(
        "fio-exports",
        size,
        &[
            "--set",
            "flash.blocks_per_die=3",
            "--set",
            "flash.superblock_dies=1",
            "--set",
            "ftl.streams=3",
            "--export",
            "wal=32M,handle=1",
            "--export",
            "db,handle=2",
            "--stats",
            &stats_s,
            "--stats-interval",
            "0.2",
        ],
    );
    let fio = |name: &str, bytes: u64| {
        Command::new("fio")
            .current_dir(dir.path())
            .args([&format!("--name={name}"), "--ioengine=nbd", "--bs=4k"])
            .args(["--iodepth=8", "--rw=randwrite", "--randrepeat=1"])
            .arg(format!(
                "--uri=nbd+unix:///{name}?socket={}",
                server.socket.display()
            ))
            .arg(format!("--size={bytes}"))
            .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (wal, db) = (fio("wal", 32 << 20), fio("db", size - (32 << 20)));
    for child in [wal, db] {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("err= 0"), "{text}");
    }
    server.stop();
    let live = crate::support::read_json(&stats);
    let exports = live["exports"].as_array().unwrap();
    assert_eq!(exports[0]["name"], "wal");
    // fio wrote each export once over (its verify reads come after).
    assert_eq!(exports[0]["written_bytes"], 32 << 20);
    assert_eq!(exports[1]["written_bytes"], size - (32 << 20));
    let placements = live["fdp"]["placements"].as_array().unwrap();
    assert_eq!(placements[1]["host_pages"], (32u64 << 20) / 4096);
    assert_eq!(placements[2]["host_pages"], (size - (32 << 20)) / 4096);
    assert_eq!(placements[0]["host_pages"], 0);
}

/// `scripts/rocksdb-fdp.sh`, short: RocksDB's db_bench on ext4 over one export, then with its
/// WAL on a second export and handle; both file systems clean, both WAFs reported, and the WAL's
/// writes on handle 1 in the second run.
#[test]
fn rocksdb_with_its_wal_on_a_second_export() {
    const NAME: &str = "rocksdb_with_its_wal_on_a_second_export";
    for tool in [
        "nbdfuse",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "fusermount3",
        "db_bench",
    ] {
        if !have(tool) {
            return skip(
                NAME,
                &format!(
                    "{tool} is not installed (apt-get install libnbd-bin fuse3 rocksdb-tools)"
                ),
            );
        }
    }
    if !Path::new("/dev/fuse").exists() || !Path::new("/dev/loop-control").exists() {
        return skip(
            NAME,
            "/dev/fuse or /dev/loop-control is missing on this machine",
        );
    }
    if unsafe { libc::geteuid() } != 0 {
        return skip(NAME, "ext4 through a loop device needs root");
    }
    let dir = temp_dir("rocksdb");
    let work = dir.join("work");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/rocksdb-fdp.sh");
    let out = run(Command::new(script)
        .env("WORK", &work)
        .env("WAL_BYTES", "128M")
        .env("FTLAB", env!("CARGO_BIN_EXE_ftlab"))
        .args([
            "100000",
            "--set",
            "flash.blocks_per_die=16",
            "--set",
            "flash.superblock_dies=8",
        ])
        .args([
            "--set",
            "capacity.logical_bytes=805306368",
            "--set",
            "ftl.streams=3",
        ]));
    assert_eq!(out.matches("e2fsck -fn: clean").count(), 2, "{out}");
    assert!(
        out.contains("one: WAF ") && out.contains("fdp: WAF "),
        "{out}"
    );
    assert!(
        out.contains("with the WAL on its own export and handle"),
        "{out}"
    );
    let fdp = crate::support::read_json(work.join("fdp/stats.json"));
    let placements = fdp["fdp"]["placements"].as_array().unwrap();
    // The WAL (handle 1) and the SSTs (handle 2) both reached the device; nothing on handle 0.
    assert!(
        placements[1]["host_pages"].as_u64().unwrap() > 1000,
        "{fdp}"
    );
    assert!(
        placements[2]["host_pages"].as_u64().unwrap() > 1000,
        "{fdp}"
    );
    assert_eq!(placements[0]["host_pages"], 0);
    let one = crate::support::read_json(work.join("one/stats.json"));
    assert!(one["fdp"]["placements"][0]["host_pages"].as_u64().unwrap() > 1000);
}

/// qcow2 in and out of a durable device with qemu-img, and raw images with `ftlab image`:
/// a qcow2 image converted onto the served export, a snapshot made through the control socket
/// (`ftlab snapshot create`), the device written again, the snapshot converted back to qcow2
/// equals the original; offline, `ftlab image export DIR@NAME` equals it too, and `ftlab image
/// import` makes a device that serves the same bytes.
#[test]
fn qemu_img_and_ftlab_image_move_images_in_and_out_of_a_durable_device() {
    const TEST: &str = "qemu_img_and_ftlab_image_move_images_in_and_out_of_a_durable_device";
    for tool in ["qemu-img", "qemu-io"] {
        if !have(tool) {
            return skip(
                TEST,
                &format!("{tool} is not installed (apt-get install qemu-utils)"),
            );
        }
    }
    let work = temp_dir("image-io");
    let data = work.join("data");
    let data_arg = data.to_str().unwrap().to_string();
    let original = work.join("original.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&original)
        .arg("32M"));
    run(Command::new("qemu-io")
        .args([
            "-f",
            "qcow2",
            "-c",
            "write -P 0x5a 0 1M",
            "-c",
            "write -P 0x33 5M 12k",
            "-c",
            "write -P 0x77 31M 1M",
        ])
        .arg(&original));
    let server = Server::start_with("image-io", 32 << 20, &["--data", &data_arg]);
    let uri = server.uri();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "qcow2", "-O", "raw"])
        .arg(&original)
        .arg(&uri));
    let ftlab = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_ftlab")).args(args));
    let made = ftlab(&["snapshot", "create", &data_arg, "before"]);
    assert!(made.contains("through the server"), "{made}");
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 2M"])
        .arg(&uri));
    let listed = ftlab(&["snapshot", "list", &data_arg]);
    assert!(
        listed.contains("before") && listed.contains("snapshot"),
        "{listed}"
    );
    let back = work.join("back.qcow2");
    let snap_uri = uri.replace("/ftlab?", "/ftlab@before?");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&snap_uri)
        .arg(&back));
    let same = run(Command::new("qemu-img")
        .arg("compare")
        .arg(&original)
        .arg(&back));
    assert!(same.contains("identical"), "{same}");
    // The device itself holds the new write.
    let differs = Command::new("qemu-img")
        .arg("compare")
        .args(["-F", "raw"])
        .arg(&original)
        .arg(&uri)
        .output()
        .unwrap();
    assert!(!differs.status.success());
    server.stop();
    // Offline.
    let raw = work.join("before.raw");
    ftlab(&[
        "image",
        "export",
        &format!("{data_arg}@before"),
        raw.to_str().unwrap(),
    ]);
    let same = run(Command::new("qemu-img")
        .arg("compare")
        .args(["-F", "raw"])
        .arg(&original)
        .arg(&raw));
    assert!(same.contains("identical"), "{same}");
    let imported = work.join("imported");
    ftlab(&[
        "image",
        "import",
        "--set",
        "capacity.logical_bytes=33554432",
        raw.to_str().unwrap(),
        imported.to_str().unwrap(),
    ]);
    let checked = ftlab(&["check", imported.to_str().unwrap()]);
    assert!(checked.contains("verify"), "{checked}");
    let server = Server::start_with(
        "image-import",
        32 << 20,
        &["--data", imported.to_str().unwrap()],
    );
    let same = run(Command::new("qemu-img")
        .arg("compare")
        .args(["-F", "raw"])
        .arg(&original)
        .arg(server.uri()));
    assert!(same.contains("identical"), "{same}");
    let summary = server.stop();
    // The imported pages reached the model through its log: 1 MiB + 12 KiB + 1 MiB written.
    assert!(summary.contains("host write pages 515,"), "{summary}");
}

/// Iterations of the crash loops: a few here, `scripts/crash-loop.sh` runs 200.
pub fn crash_iterations() -> u64 {
    std::env::var("FTLAB_CRASH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

/// fio writes with verify headers (4 KiB random writes, QD 16, a flush every 64) to a durable
/// device served with `--durability always`, and the server is killed with SIGKILL at a random
/// moment; restarted on the same directory, fio verifies every write it issued but the last
/// QD (those may not have been acknowledged: any acknowledged one must be there). Each
/// iteration has its own seed, so a page that lost its write would hold the previous
/// iteration's header and fail. Checkpoints and the cleaner run during the loop (a
/// checkpoint every 4 MiB); `ftlab check` verifies the directory at the end.
#[test]
fn fio_verify_survives_a_kill_9_loop() {
    const TEST: &str = "fio_verify_survives_a_kill_9_loop";
    if !have_fio_nbd() {
        return skip(
            TEST,
            "fio with the nbd ioengine is not installed (apt-get install fio)",
        );
    }
    let work = temp_dir("crash-loop");
    let data = work.join("data").display().to_string();
    let size = 64u64 << 20;
    let args = [
        "--data",
        &data,
        "--durability",
        "always",
        "--checkpoint-every",
        "4M",
        "--set",
        "flash.blocks_per_die=4",
        "--set",
        "flash.superblock_dies=1",
    ];
    let mut rng = ftlab_core::rng::SplitMix64::new(74);
    let fio = |uri: &str, seed: u64, extra: &[&str]| {
        Command::new("fio")
            .current_dir(work.path())
            .args([
                "--name=crash",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=4k",
            ])
            .args(["--iodepth=16", "--verify=crc32c"])
            .arg(format!("--uri={uri}"))
            .arg(format!("--size={size}"))
            .arg(format!("--randseed={seed}"))
            .args(extra)
            .output()
            .unwrap()
    };
    let mut verified = 0u64;
    for i in 0..crash_iterations() {
        let server = Server::start_with("crash-loop", size, &args);
        let uri = server.uri();
        let pid = server.child.id() as i32;
        let delay_ms = 150 + rng.bounded(900);
        let killer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        let out = fio(
            &uri,
            1000 + i,
            &[
                "--do_verify=0",
                "--time_based",
                "--runtime=60",
                "--fsync=64",
            ],
        );
        killer.join().unwrap();
        drop(server);
        let text = String::from_utf8_lossy(&out.stdout);
        let issued: u64 = text
            .split("issued rwts: total=0,")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let Some(sure) = issued.checked_sub(16).filter(|&n| n > 0) else {
            continue;
        };
        let server = Server::start_with("crash-loop", size, &args);
        let out = fio(
            &server.uri(),
            1000 + i,
            &[
                "--verify_only",
                "--verify_fatal=1",
                &format!("--io_size={}", sure * 4096),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("err= 0"),
            "iteration {i}: {sure} of {issued} writes verified?\n{text}"
        );
        verified += sure;
        server.stop();
    }
    assert!(verified > 0, "no iteration wrote anything before its kill");
    let checked = run(Command::new(env!("CARGO_BIN_EXE_ftlab"))
        .arg("check")
        .arg(&data));
    assert!(checked.contains("verify"), "{checked}");
    eprintln!(
        "{TEST}: {} iterations, {verified} writes verified",
        crash_iterations()
    );
}

/// ext4 on a durable device, the server killed with SIGKILL while a copy writes to the mounted
/// file system: each iteration mounts it again (the journal recovered), checks every file
/// written and synced (`sync`: FLUSH down the loop device and nbdfuse) in the two iterations
/// before, deletes older sets and what the killed copies left, writes and syncs a new set,
/// starts copying /usr/share/doc unsynced, and kills the server mid-copy. At the end e2fsck
/// -fn is clean after a last journal recovery.
#[test]
fn ext4_on_a_durable_device_survives_kill_9_mid_copy() {
    const TEST: &str = "ext4_on_a_durable_device_survives_kill_9_mid_copy";
    if !ext4_ready(TEST) {
        return;
    }
    let work = temp_dir("ext4-crash");
    let data = work.join("data").display().to_string();
    let (fuse_dir, mnt) = (work.join("fuse"), work.join("mnt"));
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    // The bytes of file `k` of iteration `i`'s synced set.
    let content = |i: u64, k: u64| -> Vec<u8> {
        let mut rng = ftlab_core::rng::SplitMix64::new(i * 1000 + k);
        let len = 4096 + rng.bounded(60_000) as usize;
        (0..len)
            .map(|b| (rng.bounded(7) as u8).wrapping_add(b as u8 / 64))
            .collect()
    };
    const FILES: u64 = 150;
    // Attaches the served device: nbdfuse, then a loop device over its file.
    let attach = |server: &Server| -> (Child, String) {
        let fuse = Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(server.uri())
            .spawn()
            .unwrap();
        let image = fuse_dir.join("nbd");
        for _ in 0..400 {
            if image.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let dev = run(Command::new("losetup")
            .args(["--direct-io=on", "-f", "--show"])
            .arg(&image));
        (fuse, dev.lines().next().unwrap().trim().to_string())
    };
    let detach = |mut fuse: Child, dev: &str| {
        if Command::new("umount")
            .arg(&mnt)
            .status()
            .is_ok_and(|s| !s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&mnt).status();
        }
        let _ = Command::new("losetup").args(["-d", dev]).status();
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&fuse_dir)
            .status();
        let _ = fuse.kill();
        let _ = fuse.wait();
    };
    let args = ["--data", &data, "--durability", "flush"];
    let mut rng = ftlab_core::rng::SplitMix64::new(4);
    let iterations = crash_iterations();
    for i in 0..iterations {
        let server = Server::start_with("ext4-crash", 1 << 30, &args);
        let (fuse, dev) = attach(&server);
        let result = std::panic::catch_unwind(|| {
            if i == 0 {
                run(Command::new("mkfs.ext4").args(["-q", &dev]));
            }
            run(Command::new("mount").arg(&dev).arg(&mnt));
            // The last two synced sets (older ones are deleted, so the device never fills).
            for j in i.saturating_sub(2)..i {
                for k in 0..FILES {
                    let path = mnt.join(format!("synced-{j}/{k}"));
                    let got = std::fs::read(&path).unwrap_or_default();
                    assert!(
                        got == content(j, k),
                        "iteration {i}: {} lost its synced bytes",
                        path.display()
                    );
                }
            }
            if let Some(old) = i.checked_sub(2) {
                std::fs::remove_dir_all(mnt.join(format!("synced-{old}"))).unwrap();
            }
            for e in std::fs::read_dir(&mnt).unwrap() {
                let path = e.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if name.starts_with("unsynced-") {
                    std::fs::remove_dir_all(&path).unwrap();
                }
            }
            let dir = mnt.join(format!("synced-{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            for k in 0..FILES {
                std::fs::write(dir.join(k.to_string()), content(i, k)).unwrap();
            }
            run(&mut Command::new("sync"));
        });
        if let Err(e) = result {
            detach(fuse, &dev);
            std::panic::resume_unwind(e);
        }
        // An unsynced copy, and the server killed in the middle of it.
        let mut copy = Command::new("cp")
            .arg("-a")
            .arg("/usr/share/doc")
            .arg(mnt.join(format!("unsynced-{i}")))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100 + rng.bounded(500)));
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(server.child.id() as i32, libc::SIGKILL) };
        let _ = copy.kill();
        let _ = copy.wait();
        drop(server);
        detach(fuse, &dev);
    }
    // A last journal recovery, then the file system checked.
    let server = Server::start_with("ext4-crash", 1 << 30, &args);
    let (fuse, dev) = attach(&server);
    let mounted = Command::new("mount")
        .arg(&dev)
        .arg(&mnt)
        .status()
        .unwrap()
        .success();
    let _ = Command::new("umount").arg(&mnt).status();
    let fsck = Command::new("e2fsck").args(["-fn", &dev]).output().unwrap();
    detach(fuse, &dev);
    server.stop();
    let text =
        String::from_utf8_lossy(&fsck.stdout).into_owned() + &String::from_utf8_lossy(&fsck.stderr);
    assert!(
        mounted,
        "the file system did not mount after {iterations} kills"
    );
    assert!(
        fsck.status.success(),
        "e2fsck -fn after {iterations} kills:\n{text}"
    );
    eprintln!("{TEST}: {iterations} iterations, e2fsck clean");
}

/// `serve --policy` with real clients on a Unix socket (known by their uid): a write the policy
/// does not allow fails with EPERM while reads work; after SIGHUP reloads a policy that allows
/// this uid nothing, NBD_OPT_GO is refused with NBD_REP_ERR_POLICY; a malformed file sent by
/// SIGHUP is refused and the old policy stays; the audit log has every connection, denial and
/// reload as JSON lines.
#[test]
fn a_policy_decides_what_real_clients_may_do_and_reloads_on_sighup() {
    let test = "a_policy_decides_what_real_clients_may_do_and_reloads_on_sighup";
    if !have("qemu-io") || !have("nbdinfo") {
        skip(test, "qemu-io or nbdinfo missing");
        return;
    }
    let dir = temp_dir("policy");
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let policy = dir.join("policy.toml");
    let allow = |principal: &str, actions: &str| {
        format!(
            "[[statement]]\nsid = \"s\"\neffect = \"allow\"\nprincipals = [\"{principal}\"]\n\
             actions = [{actions}]\nexports = [\"*\"]\n"
        )
    };
    std::fs::write(
        &policy,
        allow(&format!("uid:{uid}"), "\"read\", \"list\", \"flush\""),
    )
    .unwrap();
    let audit = dir.join("audit.jsonl");
    let server = Server::start_with(
        "policy",
        64 << 20,
        &[
            "--set",
            "flash.blocks_per_die=32",
            "--policy",
            policy.to_str().unwrap(),
            "--audit",
            audit.to_str().unwrap(),
        ],
    );
    let qemu_io = |command: &str| {
        let out = Command::new("qemu-io")
            .args(["-f", "raw", "-c", command, &server.uri()])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let written = qemu_io("write 0 4k");
    assert!(written.contains("Operation not permitted"), "{written}");
    assert!(qemu_io("read 0 4k").contains("read 4096/4096"));
    let listed = run(Command::new("nbdinfo").arg("--list").arg(server.uri()));
    assert!(listed.contains("ftlab"), "{listed}");
    let events = |kind: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .filter(|e| e["event"] == kind)
            .collect()
    };
    let sighup_until = |kind: &str| {
        let before = events(kind).len();
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(server.child.id() as i32, libc::SIGHUP);
        }
        for _ in 0..500 {
            if events(kind).len() > before {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("no {kind} event after SIGHUP");
    };
    // This uid may now do nothing: the export is refused at NBD_OPT_GO.
    std::fs::write(&policy, allow(&format!("uid:{}", uid + 1), "\"*\"")).unwrap();
    sighup_until("policy_reload");
    let refused = Command::new("nbdinfo")
        .arg("--size")
        .arg(server.uri())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("policy"),
        "{refused:?}"
    );
    // A malformed file is refused; the old policy stays in force.
    std::fs::write(&policy, "[[statement]]\neffect = \"permit\"\n").unwrap();
    sighup_until("policy_refused");
    assert!(!Command::new("nbdinfo")
        .arg("--size")
        .arg(server.uri())
        .status()
        .unwrap()
        .success());
    std::fs::write(&policy, allow("*", "\"*\"")).unwrap();
    sighup_until("policy_reload");
    assert!(qemu_io("write 0 4k").contains("wrote 4096/4096"));
    let summary = server.stop();
    assert!(summary.contains("host write pages 1"), "{summary}");

    let connects = events("connect");
    assert!(connects.len() >= 6, "{connects:?}");
    assert!(connects
        .iter()
        .all(|c| principal_has(c, &format!("uid:{uid}"))));
    let denied = events("denied");
    assert!(
        denied.iter().any(|d| d["action"] == "write"
            && d["export"] == "ftlab"
            && d["reason"].as_str().unwrap().contains("default deny")),
        "{denied:?}"
    );
    assert!(events("policy_refused")[0]["reason"]
        .as_str()
        .unwrap()
        .contains("policy.toml:2:"));
}

/// A durable server on `data` under `policy`, auditing into `audit`.
fn durable_server_with_policy(name: &str, data: &Path, policy: &Path, audit: &Path) -> Server {
    Server::start_with(
        name,
        32 << 20,
        &[
            "--data",
            data.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
            "--audit",
            audit.to_str().unwrap(),
        ],
    )
}

/// `support::ftlab` with stdout and stderr together: whether it succeeded, and what it said.
fn ftlab_merged(args: &[&str]) -> (bool, String) {
    let (ok, out, err) = crate::support::ftlab(args);
    (ok, out + &err)
}

/// The audit log's events, a JSON object a line.
fn audit_events(audit: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Snapshot actions through a durable server's control socket obey the policy and are audited:
/// a snapshot this uid may create is made; deleting it and cloning, which the policy denies,
/// are refused naming the policy, and the device keeps the snapshot; `ftlab policy reload`
/// through the same socket refuses a malformed file and puts a good one in force.
#[test]
fn snapshot_actions_obey_the_policy_and_are_audited() {
    let dir = temp_dir("policy-volumes");
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[statement]]\neffect = \"allow\"\nprincipals = [\"uid:{uid}\"]\nactions = [\"*\"]\nexports = [\"*\"]\n\n\
             [[statement]]\nsid = \"keep-snapshots\"\neffect = \"deny\"\nprincipals = [\"*\"]\n\
             actions = [\"snapshot.delete\", \"clone\"]\nexports = [\"ftlab@*\"]\n"
        ),
    )
    .unwrap();
    let data = dir.join("data");
    let audit = dir.join("audit.jsonl");
    let data_arg = data.to_str().unwrap().to_string();
    let server = durable_server_with_policy("policy-volumes", &data, &policy, &audit);
    let ftlab = ftlab_merged;
    let (ok, made) = ftlab(&["snapshot", "create", &data_arg, "monday"]);
    assert!(ok && made.contains("through the server"), "{made}");
    let (ok, deleted) = ftlab(&["snapshot", "delete", &data_arg, "monday"]);
    assert!(!ok && deleted.contains("access policy"), "{deleted}");
    let (ok, cloned) = ftlab(&["snapshot", "create", &data_arg, "tuesday", "--clone"]);
    assert!(!ok && cloned.contains("access policy"), "{cloned}");
    let (_, listed) = ftlab(&["snapshot", "list", &data_arg]);
    assert!(
        listed.contains("monday") && !listed.contains("tuesday"),
        "{listed}"
    );
    // `ftlab policy reload` through the control socket, as SIGHUP: a malformed file is
    // refused and the old policy stays; one without the deny lets the delete through.
    std::fs::write(&policy, "[[statement]]\neffect = \"permit\"\n").unwrap();
    let (ok, refused) = ftlab(&["policy", "reload", &data_arg]);
    assert!(!ok && refused.contains("old policy stays"), "{refused}");
    let (ok, _) = ftlab(&["snapshot", "delete", &data_arg, "monday"]);
    assert!(!ok, "the old policy still denies it");
    std::fs::write(
        &policy,
        format!(
            "[[statement]]\neffect = \"allow\"\nprincipals = [\"uid:{uid}\"]\nactions = [\"*\"]\nexports = [\"*\"]\n"
        ),
    )
    .unwrap();
    let (ok, reloaded) = ftlab(&["policy", "reload", &data_arg]);
    assert!(ok && reloaded.contains("1 statements"), "{reloaded}");
    let (ok, deleted) = ftlab(&["snapshot", "delete", &data_arg, "monday"]);
    assert!(ok, "{deleted}");
    drop(server.stop());
    let events = audit_events(&audit);
    assert!(events.iter().any(|e| e["event"] == "volume"
        && e["action"] == "snapshot.create"
        && e["name"] == "monday"
        && e["ok"] == true));
    for action in ["snapshot.delete", "clone"] {
        assert!(
            events.iter().any(|e| e["event"] == "denied"
                && e["action"] == action
                && e["reason"].as_str().unwrap().contains("keep-snapshots")),
            "{action}: {events:?}"
        );
    }
}

/// Every control request is decided and audited, `list` and `reload-policy` too: a uid the
/// policy lets create snapshots but not list them sees no volume, and may not reload the policy;
/// a name carrying a newline (a second request, on a line protocol) or `..` is refused by the
/// client before anything is sent, and by the server's parser.
#[test]
fn control_requests_are_all_decided_and_names_carry_no_second_request() {
    let dir = temp_dir("policy-control");
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[statement]]\neffect = \"allow\"\nprincipals = [\"uid:{uid}\"]\n\
             actions = [\"read\", \"write\", \"snapshot.create\"]\nexports = [\"*\"]\n"
        ),
    )
    .unwrap();
    let data = dir.join("data");
    let audit = dir.join("audit.jsonl");
    let data_arg = data.to_str().unwrap().to_string();
    let server = durable_server_with_policy("policy-control", &data, &policy, &audit);
    let ftlab = ftlab_merged;
    let (ok, made) = ftlab(&["snapshot", "create", &data_arg, "monday"]);
    assert!(ok, "{made}");
    let (ok, listed) = ftlab(&["snapshot", "list", &data_arg]);
    assert!(ok, "{listed}");
    assert!(
        !listed.contains("monday") && !listed.contains("(device)"),
        "{listed}"
    );
    let (ok, reload) = ftlab(&["policy", "reload", &data_arg]);
    assert!(!ok && reload.contains("access policy"), "{reload}");
    for name in ["zz\nsnapshot\ndelete monday", "..", "a b"] {
        let (ok, refused) = ftlab(&["snapshot", "create", &data_arg, name]);
        assert!(
            !ok && refused.contains("not starting with ."),
            "{name:?}: {refused}"
        );
    }
    // Sent raw, a second line is no second request: the first line alone is parsed (and its
    // name refused), the rest is never read.
    {
        use std::io::{BufRead, Write};
        let mut s = std::os::unix::net::UnixStream::connect(data.join("control.sock")).unwrap();
        s.write_all(b"create zz snapshot\n{\"command\":\"delete\",\"name\":\"monday\"}\n")
            .unwrap();
        let mut reply = String::new();
        std::io::BufReader::new(&s).read_line(&mut reply).unwrap();
        assert!(reply.contains("not a control request"), "{reply}");
    }
    drop(server.stop());
    let events = audit_events(&audit);
    let uid_principal = format!("uid:{uid}");
    for action in ["list", "policy.reload"] {
        assert!(
            events
                .iter()
                .any(|e| (e["event"] == "control" || e["event"] == "denied")
                    && e["action"] == action
                    && principal_has(e, &uid_principal)),
            "{action}: {events:?}"
        );
    }
    // monday is still there: the smuggled delete never ran.
    assert!(
        !events.iter().any(|e| e["action"] == "snapshot.delete"),
        "{events:?}"
    );
}

/// NBD over TLS with real clients (GnuTLS inside qemu and libnbd): qemu-io with
/// `tls-creds-x509` writes and reads a pattern back, nbdcopy over `nbds+unix://` copies the
/// export and nbdinfo describes it, all as alice, whose certificate's CN the policy allows; bob,
/// whose certificate is just as valid, is refused by the policy at NBD_OPT_GO; a client that
/// skips STARTTLS is told TLS is required; certificates of another CA, expired or missing end
/// the handshake; the audit log has each TLS session with its principal and each refusal.
#[test]
fn tls_clients_are_known_by_their_certificates() {
    let test = "tls_clients_are_known_by_their_certificates";
    if !have("qemu-io") || !have("nbdinfo") || !have("nbdcopy") {
        skip(test, "qemu-io, nbdinfo or nbdcopy missing");
        return;
    }
    let dir = temp_dir("tls");
    let pki = dir.join("pki");
    crate::server::test_pki(&pki);
    let other = dir.join("other");
    let (ok, _, err) =
        crate::support::ftlab(&["tls-certs", other.to_str().unwrap(), "--client", "alice"]);
    assert!(ok, "{err}");
    // The server's CA, so that only the client's certificate is wrong.
    std::fs::copy(
        pki.join("ca-cert.pem"),
        other.join("client-alice/ca-cert.pem"),
    )
    .unwrap();
    let none = dir.join("client-none");
    std::fs::create_dir_all(&none).unwrap();
    std::fs::copy(pki.join("ca-cert.pem"), none.join("ca-cert.pem")).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        "[[statement]]\neffect = \"allow\"\nprincipals = [\"cn:alice\"]\nactions = [\"*\"]\nexports = [\"*\"]\n",
    )
    .unwrap();
    let audit = dir.join("audit.jsonl");
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let server = Server::start_with(
        "tls",
        64 << 20,
        &[
            "--tls-cert",
            &arg(&pki.join("server-cert.pem")),
            "--tls-key",
            &arg(&pki.join("server-key.pem")),
            "--tls-ca",
            &arg(&pki.join("ca-cert.pem")),
            "--policy",
            &arg(&policy),
            "--audit",
            &arg(&audit),
        ],
    );
    let socket = server.socket.display().to_string();
    let qemu_io = |client: Option<&Path>, commands: &[&str]| {
        let mut cmd = Command::new("qemu-io");
        let mut opts = format!("driver=nbd,server.type=unix,server.path={socket},export=ftlab");
        if let Some(certs) = client {
            cmd.arg("--object").arg(format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=client",
                certs.display()
            ));
            opts.push_str(",tls-creds=tls0,tls-hostname=localhost");
        }
        cmd.arg("--image-opts").arg(opts);
        for c in commands {
            cmd.args(["-c", c]);
        }
        let out = cmd.output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let nbds = |client: &Path| {
        format!(
            "nbds+unix:///ftlab?socket={socket}&tls-certificates={}",
            client.display()
        )
    };
    let alice = pki.join("client-alice");
    let out = qemu_io(Some(&alice), &["write -P 0x5a 1M 1M", "read -P 0x5a 1M 1M"]);
    assert!(out.contains("read 1048576/1048576"), "{out}");
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let info = run(Command::new("nbdinfo").arg(nbds(&alice)));
    assert!(
        info.contains("with TLS") && info.contains("67108864"),
        "{info}"
    );
    let copy = dir.join("copy.raw");
    run(Command::new("nbdcopy").arg(nbds(&alice)).arg(&copy));
    let bytes = std::fs::read(&copy).unwrap();
    assert_eq!(bytes.len(), 64 << 20);
    assert!(bytes[..1 << 20].iter().all(|&b| b == 0));
    assert!(bytes[1 << 20..2 << 20].iter().all(|&b| b == 0x5a));

    let refused = |client: &Path| {
        let out = Command::new("nbdinfo").arg(nbds(client)).output().unwrap();
        assert!(!out.status.success(), "{client:?} was served");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Refused at NBD_OPT_GO (the audit log below says by the policy).
    let bob = refused(&pki.join("client-bob"));
    assert!(bob.contains("opt_go"), "{bob}");
    for client in [
        other.join("client-alice"),
        pki.join("client-expired"),
        none.clone(),
    ] {
        refused(&client);
    }
    let plain = qemu_io(None, &["read 0 4k"]);
    assert!(plain.contains("TLS"), "{plain}");
    let plain = Command::new("nbdinfo")
        .arg(format!("nbd+unix:///ftlab?socket={socket}"))
        .output()
        .unwrap();
    assert!(!plain.status.success());
    drop(server);

    let events = audit_events(&audit);
    let of = |kind: &'static str| events.iter().filter(move |e| e["event"] == kind);
    let sessions: Vec<_> = of("tls").collect();
    assert!(
        sessions
            .iter()
            .filter(|e| principal_has(e, "cn:alice"))
            .count()
            >= 3,
        "{sessions:?}"
    );
    assert!(sessions.iter().any(|e| principal_has(e, "cn:bob")));
    assert!(of("denied").any(|e| principal_has(e, "cn:bob")));
    let reasons: Vec<String> = of("tls_refused")
        .map(|e| e["reason"].as_str().unwrap().to_string())
        .collect();
    // GnuTLS does not offer a certificate of a CA the server did not name: no certificate.
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    for why in ["expired", "no certificates"] {
        assert!(
            reasons.iter().any(|r| r.contains(why)),
            "{why}: {reasons:?}"
        );
    }
}

/// The loadable extension (crates/sqlite-ext, built by the test command) in the sqlite3
/// shell: `.load` it, open a database on a durable device directory, write in WAL mode, and a
/// second shell process reads the rows back and integrity_check passes.
#[test]
fn the_loadable_extension_keeps_a_database_for_the_sqlite3_shell() {
    let test = "the_loadable_extension_keeps_a_database_for_the_sqlite3_shell";
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let extension = std::env::var_os("FTLAB_SQLITE_EXT")
        .map(PathBuf::from)
        .or_else(|| {
            [
                "target/debug/libftlab_vfs.so",
                "target/release/libftlab_vfs.so",
            ]
            .iter()
            .map(|p| root.join(p))
            .find(|p| p.exists())
        });
    let Some(extension) = extension.filter(|_| have("sqlite3")) else {
        skip(
            test,
            "sqlite3 or the extension missing (cargo build --manifest-path crates/sqlite-ext/Cargo.toml --target-dir target)",
        );
        return;
    };
    let dir = temp_dir("sqlite-ext");
    let device = dir.join("dev");
    let shell = |sql: &str| {
        let script = format!(
            ".bail on\n.load {}\n.open file:app.db?vfs=ftlab&device={}\n{sql}\n",
            extension.with_extension("").display(),
            device.display()
        );
        let mut child = Command::new("sqlite3")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let written = shell(
        "PRAGMA journal_mode=wal;\nCREATE TABLE t(x, y);\n\
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<5000) \
         INSERT INTO t SELECT i, hex(randomblob(64)) FROM c;\nSELECT count(*), sum(x) FROM t;",
    );
    assert!(
        written.contains("wal") && written.contains("5000|12502500"),
        "{written}"
    );
    let read = shell("SELECT count(*), sum(x) FROM t;\nPRAGMA integrity_check;");
    assert!(
        read.contains("5000|12502500") && read.contains("ok"),
        "{read}"
    );
}

/// Whether an audit line's principal (a JSON list of names) holds `name` exactly.
fn principal_has(event: &serde_json::Value, name: &str) -> bool {
    event["principal"]
        .as_array()
        .unwrap_or_else(|| panic!("principal is not a list: {event}"))
        .iter()
        .any(|n| n == name)
}
