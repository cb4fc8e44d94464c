//! `ftlab bench`: simulator speed on this machine, each figure beside a baseline measured in the
//! same run. Fixed seeds; the machine is named in the output.

use anyhow::{Context, Result};
use ftlab_core::config::ConfigBuilder;
use ftlab_core::rng::SplitMix64;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which benchmarks: steady (4 and 64 GiB steady-state random writes), replay (DiskSim
    /// trace replay), persisted (the default job with the mapping persisted, 1 % protected,
    /// against the model off), fdp (the default job on 8 handles, each an eighth of the LBA
    /// space by a range file, against one stream), all (those four); store (the compressed page
    /// store) and serve (ftlab serve against nbdkit memory, with fio; nbdkit null beside them as
    /// the client's ceiling) separately; cache (a durable device's page cache, ARC against LRU,
    /// on zipf reads with and without scans); sweep (a 16-point grid on one thread and on two,
    /// `--repeat` alternating rounds); tls (ftlab serve's IOPS over NBD with TLS against
    /// without, one server, fio alternating); latency (does `serve --latency real` keep the
    /// model's time: the model's latency beside fio's, per job, idle and with GC running).
    #[arg(default_value = "all", value_parser = ["all", "steady", "replay", "persisted", "fdp", "store", "serve", "cache", "sweep", "tls", "latency"])]
    which: String,
    /// store: write the headline figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// store: pages of real files taken from each corpus directory.
    #[arg(long, allow_negative_numbers = true, default_value_t = 40_000)]
    corpus_pages_per_dir: usize,
    /// serve, tls, latency: seconds each fio job runs.
    #[arg(long, allow_negative_numbers = true, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    seconds: u32,
    /// serve, sweep: runs of each job per server (or pool), alternating; medians are reported.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// store: corpus directories (comma-separated).
    #[arg(
        long,
        default_value = "/usr/lib,/usr/share/doc,/usr/bin",
        value_delimiter = ','
    )]
    dirs: Vec<String>,
    /// steady: skip the 64 GiB device (it needs about 2 GiB of RAM and a minute); latency:
    /// only the QD 1 4 KiB jobs.
    #[arg(long)]
    quick: bool,
    /// Where the generated DiskSim trace is kept between runs.
    #[arg(long, default_value = "target/bench")]
    work_dir: PathBuf,
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores")
}

/// The least work any page-mapping FTL does per host write: one random store into a flat u32
/// table of the same size, with the same generator.
fn baseline_random_map_updates(logical_pages: u64, count: u64) -> f64 {
    let mut table = vec![u32::MAX; logical_pages as usize];
    let mut rng = SplitMix64::new(42);
    let start = Instant::now();
    for i in 0..count {
        let lpn = rng.bounded(logical_pages) as usize;
        table[lpn] = i as u32;
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(&table);
    count as f64 / secs
}

fn steady(logical_gib: u64) -> Result<()> {
    // 8 x 8 dies, 256-page blocks of 4 KiB, block-granular greedy GC below 2 free blocks,
    // rho = 0.28: blocks per die sized so the logical space is `logical_gib` GiB.
    let pages = (logical_gib << 30) / 4096;
    let blocks_per_die = (pages as f64 * 1.28 / 64.0 / 256.0).ceil() as u64;
    let mut b = ConfigBuilder::from_preset("validation-uniform")?;
    for s in [
        "flash.channels=8".to_string(),
        "flash.dies_per_channel=8".into(),
        format!("flash.blocks_per_die={blocks_per_die}"),
        "flash.superblock_dies=1".into(),
        "capacity.over_provisioning=0.28".into(),
        "workload.queue_depth=64".into(),
        "workload.precondition_overwrites=2".into(),
        "workload.overwrites=2".into(),
    ] {
        b.set(&s)?;
    }
    let config = b.build()?;
    let report = ftlab_sim::sim::run(&config, &mut |_| {})?;
    let sim_rate = report.host_write_pages as f64 / report.wall_seconds;
    let logical_pages = report.device.logical_bytes / 4096;
    let base = baseline_random_map_updates(logical_pages, report.host_write_pages);
    println!(
        "| steady-state uniform 4 KiB, {} GiB, rho 0.28 | {:.2} M pages/s | WAF {} | baseline (random flat-table store only) {:.2} M/s | ratio {:.3} |",
        logical_gib,
        sim_rate / 1e6,
        ftlab_sim::report::waf_text(report.waf),
        base / 1e6,
        sim_rate / base
    );
    Ok(())
}

fn replay(args: &BenchArgs) -> Result<()> {
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;
    let trace = args.work_dir.join("rand4k-3.8GiB-3.1M.disksim");
    // 3.8 GiB span rounded down to whole 4 KiB pages.
    let span_bytes = (3.8 * (1u64 << 30) as f64) as u64 / 4096 * 4096;
    if !trace.exists() {
        // Written beside and renamed, so an interrupted run leaves no half trace to reuse.
        let partial = trace.with_extension("disksim.partial");
        let file = std::fs::File::create(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        ftlab_sim::trace::disksim::write_rand4k(&mut out, span_bytes, 3_100_000, 42, 10_000)
            .and_then(|()| out.flush())
            .with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, &trace)
            .with_context(|| format!("renaming {} to {}", partial.display(), trace.display()))?;
    }
    // 7 % spare (MQSim's Overprovisioning_Ratio), physical sized so the logical space holds the
    // span: 8 x 8 dies x 256-page blocks.
    let blocks_per_die = (span_bytes as f64 / 0.93 / 4096.0 / 64.0 / 256.0).ceil() as u64 + 1;
    let mut b = ConfigBuilder::from_preset("femu")?;
    for s in [
        format!("flash.blocks_per_die={blocks_per_die}"),
        "flash.superblock_dies=1".into(),
        "capacity.spare_factor=0.07".into(),
        "ftl.gc_thres_pcent=100".into(),
        "ftl.gc_thres_pcent_high=100".into(),
        "workload.precondition=false".into(),
        format!("workload.trace=\"{}\"", trace.display()),
    ] {
        b.set(&s)?;
    }
    let config = b.build()?;
    let start = Instant::now();
    let report = ftlab_sim::sim::run(&config, &mut |_| {})?;
    let secs = start.elapsed().as_secs_f64();
    let requests = report.trace.as_ref().map_or(0, |t| t.requests);
    // Baseline: reading and splitting the same file into lines, no parsing or simulation.
    let start = Instant::now();
    let text = std::fs::read(&trace)?;
    let lines = text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    let read_secs = start.elapsed().as_secs_f64();
    println!(
        "| DiskSim replay, {} requests (fill 3.8 GiB + 3.1 M random 4 KiB), spare 7 % | {:.3} s end to end | WAF {} | baseline (read + split {} lines) {:.3} s | ratio {:.1} |",
        requests, secs, ftlab_sim::report::waf_text(report.waf), lines, read_secs, secs / read_secs
    );
    Ok(())
}

/// The default job (`ftlab sim`'s built-in default) with the mapping persisted in translation
/// pages, 1 % protected, against the same job with every change protected (the model off).
fn persisted() -> Result<()> {
    let rate = |ratio: f64| -> Result<(f64, Option<f64>)> {
        let mut b = ConfigBuilder::from_preset(ftlab_core::config::DEFAULT_PRESET)?;
        b.set(&format!("ftl.protected_ratio={ratio}"))?;
        let report = ftlab_sim::sim::run(&b.build()?, &mut |_| {})?;
        Ok((
            report.host_write_pages as f64 / report.wall_seconds,
            report.waf,
        ))
    };
    let (off, _) = rate(1.0)?;
    let (on, waf) = rate(0.01)?;
    println!(
        "| default job, mapping persisted, 1 % of translation pages protected | {:.2} M pages/s | WAF {} | the same job, every change protected {:.2} M/s | ratio {:.3} |",
        on / 1e6,
        ftlab_sim::report::waf_text(waf),
        off / 1e6,
        on / off
    );
    Ok(())
}

/// The default job on eight persistently isolated handles, each write placed by a range file
/// (an eighth of the LBA space per handle), against the same job on one stream: medians of
/// three runs each, alternating.
fn fdp(args: &BenchArgs) -> Result<()> {
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating {}", args.work_dir.display()))?;
    let logical = ConfigBuilder::from_preset(ftlab_core::config::DEFAULT_PRESET)?
        .build()?
        .geometry()?
        .logical_bytes();
    let ranges = args.work_dir.join("eighths.ranges");
    let eighth = logical / 8;
    let text: String = (0..8)
        .map(|h| format!("{}, {}, {h}\n", h * eighth, (h + 1) * eighth))
        .collect();
    std::fs::write(&ranges, text).with_context(|| format!("writing {}", ranges.display()))?;
    let rate = |handles: bool| -> Result<(f64, Option<f64>)> {
        let mut b = ConfigBuilder::from_preset(ftlab_core::config::DEFAULT_PRESET)?;
        if handles {
            b.set("ftl.streams=8")?;
            b.set(&format!(
                "workload.placement_ranges={}",
                toml::Value::String(ranges.display().to_string())
            ))?;
        }
        let report = ftlab_sim::sim::run(&b.build()?, &mut |_| {})?;
        if handles {
            anyhow::ensure!(
                report
                    .fdp
                    .placements
                    .iter()
                    .filter(|p| p.host_pages > 0)
                    .count()
                    == 8,
                "the range file did not spread the writes over 8 handles"
            );
        }
        Ok((
            report.host_write_pages as f64 / report.wall_seconds,
            report.waf,
        ))
    };
    let (mut one, mut eight) = (Vec::new(), Vec::new());
    let mut waf = None;
    for _ in 0..3 {
        one.push(rate(false)?.0);
        let (r, w) = rate(true)?;
        eight.push(r);
        waf = w;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (one, eight) = (median(&mut one), median(&mut eight));
    println!(
        "| default job on 8 FDP handles (a range file places each eighth of the LBAs), median of 3 | {:.2} M pages/s | WAF {} | the same job on one stream {:.2} M/s | ratio {:.3} |",
        eight / 1e6,
        ftlab_sim::report::waf_text(waf),
        one / 1e6,
        eight / one
    );
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.which == "serve" {
        return crate::bench_serve::run(machine(), args.seconds, args.repeat);
    }
    if args.which == "tls" {
        return crate::bench_serve::run_tls(machine(), args.seconds, args.repeat);
    }
    if args.which == "latency" {
        return crate::bench_latency::run(machine(), args.seconds, &args.work_dir, args.quick);
    }
    if args.which == "sweep" {
        return crate::bench_sweep::run(machine(), args.repeat, &args.work_dir);
    }
    if args.which == "cache" {
        return crate::bench_cache::run(machine(), &args.work_dir);
    }
    if args.which == "store" {
        let dirs: Vec<&str> = args.dirs.iter().map(String::as_str).collect();
        return crate::bench_store::run(
            args.json.as_deref(),
            &dirs,
            args.corpus_pages_per_dir,
            machine(),
        );
    }
    println!("ftlab bench on {}", machine());
    println!("| benchmark | result | check | baseline | ratio |");
    println!("|---|---|---|---|---|");
    if args.which == "all" || args.which == "steady" {
        steady(4)?;
        if !args.quick {
            steady(64)?;
        }
    }
    if args.which == "all" || args.which == "replay" {
        replay(&args)?;
    }
    if args.which == "all" || args.which == "persisted" {
        persisted()?;
    }
    if args.which == "all" || args.which == "fdp" {
        fdp(&args)?;
    }
    Ok(())
}
