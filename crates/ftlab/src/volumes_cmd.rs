//! `ftlab snapshot` and `ftlab image`: a durable device's snapshots and clones, and raw images
//! in and out of its directory. With the device served, snapshot commands go through the
//! server's control socket (`DIR/control.sock`, one JSON line each way); otherwise they open
//! the directory themselves (its lock keeps two writers apart).

use anyhow::{Context, Result};
use ftlab_device::control::{control_path, Control, MAX_CONTROL_LINE_BYTES};
use ftlab_device::Device;
use ftlab_store::durable::{device_geometry, DataDir, DirOptions, ModelRequest, VolumeKind};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    /// Make a snapshot (read-only) or, with --clone, a clone (writable) of the device or of
    /// --from: no data copied. Served as export `EXPORT@NAME` (e.g. nbd+unix:///ftlab@NAME).
    Create {
        /// The directory `ftlab serve --data` keeps.
        dir: PathBuf,
        /// 1 to 200 of A-Z a-z 0-9 - _ .
        name: String,
        /// A writable clone sharing unchanged pages, instead of a snapshot.
        #[arg(long)]
        clone: bool,
        /// Of this snapshot or clone instead of the device.
        #[arg(long, value_name = "NAME")]
        from: Option<String>,
    },
    /// List the device, its snapshots and clones.
    List { dir: PathBuf },
    /// Delete a snapshot or clone; the cleaner frees the records only it held.
    Delete { dir: PathBuf, name: String },
}

#[derive(clap::Subcommand)]
pub enum ImageCommand {
    /// Write the device (or a snapshot or clone: DIR@NAME) as a raw image, every byte of it
    /// (unwritten pages as holes). The directory must not be served: for a served one, read
    /// the export with `qemu-img convert -O raw nbd+unix:///ftlab@NAME?socket=S FILE`.
    Export {
        /// DIR or DIR@NAME.
        source: String,
        /// The raw image to write (replaced atomically: written beside, then renamed).
        file: PathBuf,
    },
    /// Make a durable device directory from a raw image: its non-zero pages written to the
    /// device through the FTL model's log (the model replays them at the first serve).
    Import {
        #[command(flatten)]
        config: crate::ConfigArgs,
        /// The raw image (at most the device's logical size).
        file: PathBuf,
        /// A directory that does not exist yet or is empty.
        dir: PathBuf,
    },
}

/// Listens on `DIR/control.sock` (mode 0600: the directory's owner only) until `stop`. A
/// socket file left by a server that died is replaced; anything else at the path is refused.
pub fn spawn_control(
    device: Arc<Device>,
    dir: &Path,
    policy: Option<PathBuf>,
    stop: Arc<AtomicBool>,
) -> Result<PathBuf> {
    let path = control_path(dir);
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        use std::os::unix::fs::FileTypeExt;
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "{}: exists and is not a socket: not replaced",
            path.display()
        );
        anyhow::ensure!(
            UnixStream::connect(&path).is_err(),
            "{}: another server answers on it",
            path.display()
        );
        std::fs::remove_file(&path).with_context(|| path.display().to_string())?;
    }
    let listener = UnixListener::bind(&path).with_context(|| path.display().to_string())?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| path.display().to_string())?;
    }
    listener.set_nonblocking(true)?;
    let at = path.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(&device, policy.as_deref(), stream) {
                        eprintln!("ftlab serve: control socket: {e:#}");
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let _ = std::fs::remove_file(&at);
    });
    Ok(path)
}

/// One request and its reply; a slow or oversized client is cut off.
fn answer(device: &Device, policy: Option<&Path>, stream: UnixStream) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_CONTROL_LINE_BYTES)).read_line(&mut line)?;
    let principal = ftlab_device::policy::Principal::of_unix_peer(&stream);
    let reply = match Control::parse(line.trim_end()) {
        Ok(c) => {
            let reply = device.control(policy, &principal, &c);
            match (&c, policy) {
                (Control::ReloadPolicy, Some(path)) if reply["ok"] == true => eprintln!(
                    "ftlab serve: {}: policy reloaded ({} statements)",
                    path.display(),
                    reply["statements"]
                ),
                (Control::ReloadPolicy, Some(_)) => {
                    eprintln!(
                        "ftlab serve: policy {}",
                        reply["error"].as_str().unwrap_or("")
                    )
                }
                (Control::List | Control::ReloadPolicy, _) => {}
                _ if reply["ok"] == true => eprintln!("ftlab serve: control: {}", c.line()),
                _ => {}
            }
            reply
        }
        Err(e) => serde_json::json!({ "ok": false, "error": e.to_string() }),
    };
    writeln!(&stream, "{reply}")?;
    Ok(())
}

/// Sends `c` to a served directory's control socket; None when nothing answers there.
fn send(dir: &Path, c: &Control) -> Result<Option<serde_json::Value>> {
    let Ok(mut s) = UnixStream::connect(control_path(dir)) else {
        return Ok(None);
    };
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    writeln!(s, "{}", c.line())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    Ok(Some(serde_json::from_str(&reply).with_context(|| {
        format!("{}: a reply that is not JSON", control_path(dir).display())
    })?))
}

/// Opens `dir` offline, writable or not, with the geometry its device file names.
fn open_offline(dir: &Path, read_only: bool) -> Result<DataDir> {
    let Some((pages, page_bytes)) = device_geometry(dir)? else {
        anyhow::bail!(
            "{}: no `{}` file: not a directory `ftlab serve --data` made",
            dir.display(),
            ftlab_store::durable::DEVICE_FILE
        );
    };
    Ok(DataDir::open(
        dir,
        &DirOptions {
            read_only,
            ..DirOptions::new(pages, page_bytes)
        },
    )?
    .0)
}

fn print_volumes(volumes: &[ftlab_store::durable::VolumeInfo]) {
    println!(
        "{:<24} {:<9} {:<24} {:>12}",
        "NAME", "KIND", "FROM", "PAGES"
    );
    for v in volumes {
        let name = if v.name.is_empty() {
            "(device)"
        } else {
            &v.name
        };
        let parent = if v.kind == VolumeKind::Device {
            "-"
        } else if v.parent.is_empty() {
            "(device)"
        } else {
            &v.parent
        };
        let kind = format!("{:?}", v.kind).to_lowercase();
        println!("{name:<24} {kind:<9} {parent:<24} {:>12}", v.mapped_pages);
    }
}

/// `ftlab policy reload DIR`: the running server of `DIR` reads its `--policy` file again.
pub fn reload_policy(dir: &Path) -> Result<()> {
    let Some(reply) = send(dir, &Control::ReloadPolicy)? else {
        anyhow::bail!(
            "{}: no server answers (the control socket is there only while `ftlab serve --data {}` runs; without --data, send it SIGHUP)",
            control_path(dir).display(),
            dir.display()
        );
    };
    anyhow::ensure!(
        reply["ok"] == true,
        "{}",
        reply["error"].as_str().unwrap_or("refused")
    );
    println!("policy reloaded: {} statements", reply["statements"]);
    Ok(())
}

pub fn run_snapshot(cmd: SnapshotCommand) -> Result<()> {
    let (dir, control) = match cmd {
        SnapshotCommand::Create {
            dir,
            name,
            clone,
            from,
        } => (dir, Control::Create { name, clone, from }),
        SnapshotCommand::List { dir } => (dir, Control::List),
        SnapshotCommand::Delete { dir, name } => (dir, Control::Delete { name }),
    };
    if let Some(reply) = send(&dir, &control)? {
        if reply["ok"] != true {
            anyhow::bail!(
                "{}: {}",
                dir.display(),
                reply["error"].as_str().unwrap_or("?")
            );
        }
        let volumes: Vec<ftlab_store::durable::VolumeInfo> =
            serde_json::from_value(reply["volumes"].clone()).unwrap_or_default();
        if matches!(control, Control::List) {
            print_volumes(&volumes);
        } else {
            println!(
                "{} (through the server, {:.2} ms)",
                control.line(),
                reply["elapsed_ms"].as_f64().unwrap_or(0.0)
            );
        }
        return Ok(());
    }
    let read_only = matches!(control, Control::List);
    let started = Instant::now();
    let mut data = open_offline(&dir, read_only)?;
    let opened_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    match &control {
        Control::Create { name, clone, from } => {
            let kind = if *clone {
                VolumeKind::Clone
            } else {
                VolumeKind::Snapshot
            };
            data.create_volume(from.as_deref(), name, kind)
                .map_err(anyhow::Error::msg)?;
        }
        Control::Delete { name } => data.delete_volume(name).map_err(anyhow::Error::msg)?,
        Control::List => {
            print_volumes(&data.volumes());
            return Ok(());
        }
        Control::ReloadPolicy => anyhow::bail!("a policy is reloaded by the server running on it"),
    }
    println!(
        "{} ({:.2} ms; opening the directory took {opened_ms:.0} ms)",
        control.line(),
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

pub fn run_image(cmd: ImageCommand) -> Result<()> {
    match cmd {
        ImageCommand::Export { source, file } => export(&source, &file),
        ImageCommand::Import { config, file, dir } => import(&config, &file, &dir),
    }
}

fn export(source: &str, file: &Path) -> Result<()> {
    let (dir, volume) = match source.rsplit_once('@') {
        Some((d, v)) => (Path::new(d), Some(v)),
        None => (Path::new(source), None),
    };
    let data = open_offline(dir, true)?;
    let (pages, page_bytes) = device_geometry(dir)?.expect("open_offline checked");
    let id = match volume {
        None => 0,
        Some(v) => {
            data.volume_named(v)
                .with_context(|| format!("{}: no snapshot or clone `{v}`", dir.display()))?
                .0
        }
    };
    if let Ok(meta) = std::fs::symlink_metadata(file) {
        anyhow::ensure!(
            meta.file_type().is_file(),
            "{}: exists and is not a regular file: not replaced",
            file.display()
        );
    }
    let tmp = ftlab_device::tmp_path_beside(file);
    let out = std::fs::File::create(&tmp).with_context(|| tmp.display().to_string())?;
    let write = || -> Result<u64> {
        out.set_len(pages * page_bytes as u64)?;
        let mut written = 0;
        let mut locs = data.volume_pages(id);
        locs.sort_unstable();
        data.load_pages(&locs, &mut |lpn, page| {
            written += 1;
            out.write_all_at(page, lpn * page_bytes as u64)
        })
        .with_context(|| format!("exporting into {}", tmp.display()))?;
        out.sync_all()?;
        Ok(written)
    };
    match write() {
        Ok(written) => {
            std::fs::rename(&tmp, file).with_context(|| file.display().to_string())?;
            println!(
                "{}: {} bytes, {written} pages written from {source}",
                file.display(),
                pages * page_bytes as u64
            );
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e.context(format!("{}: not written", file.display())))
        }
    }
}

fn import(config: &crate::ConfigArgs, file: &Path, dir: &Path) -> Result<()> {
    let config = crate::config_layers(config, &[], &[])?.build_device()?;
    let geometry = config.geometry()?;
    let page_bytes = geometry.page_size_bytes as usize;
    let image = std::fs::File::open(file).with_context(|| file.display().to_string())?;
    let len = image.metadata()?.len();
    anyhow::ensure!(
        len <= geometry.logical_bytes(),
        "{}: {len} bytes, larger than the device's {} (size it with --set capacity.logical_bytes={len})",
        file.display(),
        geometry.logical_bytes()
    );
    if dir.exists() {
        anyhow::ensure!(
            std::fs::read_dir(dir)?.next().is_none(),
            "{}: not empty: import makes a new device directory",
            dir.display()
        );
    }
    let (mut data, _) = DataDir::open(dir, &DirOptions::new(geometry.logical_pages, page_bytes))?;
    let mut page = vec![0u8; page_bytes];
    let mut written = 0u64;
    let mut run: Option<(u64, u64)> = None;
    let mut clock_ns = 0u64;
    // Runs of non-zero pages go to the model as writes of at most 1 MiB, a microsecond apart.
    let mut flush_run = |data: &mut DataDir, run: &mut Option<(u64, u64)>| -> Result<()> {
        if let Some((first, n)) = run.take() {
            clock_ns += 1000;
            data.request(ModelRequest {
                op: ftlab_store::durable::model_op::WRITE,
                offset_bytes: first * page_bytes as u64,
                length_bytes: (n * page_bytes as u64) as u32,
                arrival_ns: clock_ns,
                reclaim_group: 0,
                handle: 0,
            })?;
        }
        Ok(())
    };
    let pages = len.div_ceil(page_bytes as u64);
    let mut reader = std::io::BufReader::with_capacity(1 << 20, image);
    for lpn in 0..pages {
        page.fill(0);
        let mut got = 0;
        while got < page_bytes {
            match reader.read(&mut page[got..])? {
                0 => break,
                n => got += n,
            }
        }
        if page.iter().all(|&b| b == 0) {
            flush_run(&mut data, &mut run)?;
            continue;
        }
        data.write_page(0, lpn, &page)?;
        written += 1;
        run = match run {
            Some((first, n)) if (n + 1) * (page_bytes as u64) <= 1 << 20 => Some((first, n + 1)),
            Some(_) => {
                flush_run(&mut data, &mut run)?;
                Some((lpn, 1))
            }
            None => Some((lpn, 1)),
        };
    }
    flush_run(&mut data, &mut run)?;
    data.checkpoint()?;
    println!(
        "{}: a device of {} bytes made from {} ({written} non-zero pages)",
        dir.display(),
        geometry.logical_bytes(),
        file.display()
    );
    Ok(())
}
