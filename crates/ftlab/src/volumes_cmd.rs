//! `ftlab snapshot`, `ftlab image` and `ftlab policy reload`: a durable device's snapshots and
//! clones, and raw images in and out of its directory. With the device served, snapshot
//! commands go through the server's control socket (`ftlab_device::control::send`); otherwise
//! they open the directory themselves (`ftlab_store::durable::offline`; its lock keeps two
//! writers apart).

use anyhow::Result;
use ftlab_device::control::{control_path, Control};
use ftlab_store::durable::{offline, VolumeKind};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Subcommand)]
pub enum SnapshotCommand {
    /// Make a snapshot (read-only) or, with --clone, a clone (writable) of the device or of
    /// --from: no data copied. Served as export `EXPORT@NAME` (e.g. nbd+unix:///ftlab@NAME).
    Create {
        /// The directory `ftlab serve --data` keeps.
        dir: PathBuf,
        /// 1 to 200 of A-Z a-z 0-9 - _ . not starting with . (checked before anything is sent).
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
        /// Write a page whose record does not verify as zeros (each is listed) instead of
        /// stopping at it: to salvage the rest of a damaged device.
        #[arg(long)]
        skip_damaged: bool,
    },
    /// Make a durable device directory from a raw image: its non-zero pages written to the
    /// device through the FTL model's log (the model replays them at the first serve).
    Import {
        #[command(flatten)]
        config: crate::config_args::ConfigArgs,
        /// The raw image (at most the device's logical size).
        file: PathBuf,
        /// A directory that does not exist yet or is empty.
        dir: PathBuf,
    },
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
    let Some(reply) = ftlab_device::control::send(dir, &Control::ReloadPolicy)? else {
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
    // The name rule, before anything is sent or opened.
    control.check()?;
    if let Some(reply) = ftlab_device::control::send(&dir, &control)? {
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
                control.describe(),
                reply["elapsed_ms"].as_f64().unwrap_or(0.0)
            );
        }
        return Ok(());
    }
    let read_only = matches!(control, Control::List);
    let started = Instant::now();
    let mut data = offline::open_offline(&dir, read_only)?;
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
        control.describe(),
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

pub fn run_image(cmd: ImageCommand) -> Result<()> {
    match cmd {
        ImageCommand::Export {
            source,
            file,
            skip_damaged,
        } => export(&source, &file, skip_damaged),
        ImageCommand::Import { config, file, dir } => import(&config, &file, &dir),
    }
}

fn export(source: &str, file: &Path, skip_damaged: bool) -> Result<()> {
    let (dir, volume) = match source.rsplit_once('@') {
        Some((d, v)) => (Path::new(d), Some(v)),
        None => (Path::new(source), None),
    };
    let e = offline::export_image(dir, volume, file, skip_damaged).map_err(|e| {
        anyhow::anyhow!(
            "{e}\n(`--skip-damaged` writes zeros for a page that does not verify and goes on; \
             `ftlab check --repair` zeroes it in the directory)"
        )
    })?;
    for d in &e.skipped {
        println!("skipped, written as zeros: {d}");
    }
    println!(
        "{}: {} bytes, {} pages written from {source}{}",
        file.display(),
        e.image_bytes,
        e.pages_written,
        if e.skipped.is_empty() {
            String::new()
        } else {
            format!("; {} damaged page(s) written as zeros", e.skipped.len())
        }
    );
    Ok(())
}

fn import(config: &crate::config_args::ConfigArgs, file: &Path, dir: &Path) -> Result<()> {
    let config = crate::config_args::config_layers(config, &[], &[])?.build_device()?;
    let geometry = config.geometry()?;
    let written = offline::import_image(
        file,
        dir,
        geometry.logical_pages,
        geometry.page_size_bytes as usize,
    )?;
    println!(
        "{}: a device of {} bytes made from {} ({written} non-zero pages)",
        dir.display(),
        geometry.logical_bytes(),
        file.display()
    );
    Ok(())
}

/// `ftlab check DIR [--repair]`.
pub fn run_check(dir: &std::path::Path, repair: bool) -> anyhow::Result<()> {
    let checked = ftlab_store::durable::offline::check(dir, repair, &mut |damage, r| {
        println!("{damage}");
        println!(
            "repaired: {} records kept after the checkpoint, {} bytes cut; set aside \
             (nothing deleted):",
            r.kept_records, r.cut_bytes
        );
        for p in &r.set_aside {
            println!("  {}", p.display());
        }
    })?;
    let opened = &checked.opened;
    println!(
        "{}: {} segment(s); checkpoint at record {}; {} records after it verify ({} model \
         requests in all); {} volume(s) ({}); {} mapped page records read back and verify",
        dir.display(),
        checked.segments,
        opened.checkpoint_seq,
        opened.replayed_records,
        opened.requests.len(),
        checked.volumes.len(),
        checked
            .volumes
            .iter()
            .map(|v| if v.name.is_empty() {
                "the device".to_string()
            } else {
                format!("{:?} {}", v.kind, v.name).to_lowercase()
            })
            .collect::<Vec<_>>()
            .join(", "),
        checked.verified_pages,
    );
    for d in &checked.zeroed_pages {
        println!("repaired: zeroed {d}");
    }
    for d in &checked.damaged_pages {
        println!("damaged: {d}");
    }
    if let Some(why) = &opened.dropped_why {
        println!(
            "the log ends in a {}-byte torn tail after its last whole commit; the next start \
             drops it ({why})",
            opened.dropped_bytes
        );
    }
    match &checked.model_damage {
        Some((why, true)) => println!(
            "repaired: the FTL model's saved requests were damaged ({why}); they were written \
             anew from what verifies (the model's report differs from an uninterrupted run's; \
             the data does not)"
        ),
        Some((why, false)) => {
            println!(
                "the FTL model's saved requests are damaged ({why}): every page is served all \
                 the same; the next start (or `ftlab check --repair`) rebuilds the model from \
                 what verifies"
            );
        }
        None => {}
    }
    let model_damaged = matches!(checked.model_damage, Some((_, false)));
    if !checked.damaged_pages.is_empty() {
        println!(
            "{} page(s) do not verify: their reads are answered EIO; `ftlab check --repair` \
             zeroes them, `ftlab image export --skip-damaged` salvages the rest",
            checked.damaged_pages.len()
        );
    }
    if model_damaged || !checked.damaged_pages.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
