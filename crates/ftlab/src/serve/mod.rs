//! `ftlab serve`: the device's lifecycle. It starts the device, binds every listener before
//! saying it is ready, serves until SIGINT, SIGTERM or SIGHUP, then drains the connections,
//! saves what must be saved and prints the summary. The flags are `args`, the listeners and
//! connections `listeners`, the files beside the device `files`, the control socket `control`.

mod args;
mod control;
mod files;
mod listeners;

pub use args::ServeArgs;

use anyhow::{Context, Result};
use files::{notify_service_manager, resolve_image, write_pidfile, write_stats};
use ftlab_device::Device;
use ftlab_store::codec::Codec;
use listeners::{drain, spawn_metrics, Connection, Listeners};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    let config = crate::config_args::config_layers(&args.config, &[], &[])?.build_device()?;
    let (options, nbd) = args.options()?;
    let codec = options.codec;
    let device = Arc::new(Device::new(&config, options)?);
    let nbd = Arc::new(nbd);
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
    let mut listeners = Listeners::bind(&args)?;
    // From here on, an error must not leave the socket file behind.
    if let Some(path) = &args.pidfile {
        if let Err(e) = write_pidfile(path) {
            listeners.remove_socket();
            return Err(e);
        }
    }
    listeners.announce(&device);
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
    let mut control_socket = None;
    if let Some(dir) = args.data.as_ref().filter(|_| !args.read_only) {
        let control =
            control::spawn_control(device.clone(), dir, args.policy.clone(), stop.clone())?;
        eprintln!(
            "ftlab serve: snapshots and clones: `ftlab snapshot create {} NAME` (control socket {})",
            dir.display(),
            control.path.display()
        );
        control_socket = Some(control);
        // Checkpoints and cleaning: the device's own thread (`Maintenance::Background`).
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
        if listeners.accept(&mut connections, args.max_connections, &device, &nbd) {
            idle = false;
        }
        if idle {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    listeners.stop_listening();
    if let Some(c) = control_socket {
        c.close();
    }
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
    print_summary(&device);
    listeners.remove_socket();
    if let Some(path) = &args.pidfile {
        let _ = std::fs::remove_file(path);
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
}

/// The run's last lines on stdout: the FTL model's WAF, the clients' latency, the page store.
fn print_summary(device: &Device) {
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
}
