//! `ftlab mapbench`: the command line over `ftlab_mapbench`.

use anyhow::{Context, Result};
use ftlab_learned::BUFFER_LIVE_DIVISOR;
use ftlab_mapbench::{DriveSetup, OpsOptions, PpnSource, SIM_SPARE_FACTOR, TABLE_NAMES};
use ftlab_sim::report::binary_size;
use ftlab_sim::trace::TraceFormat;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
ftlab mapbench ../shared/traces/rocksdb.nbdlog.gz\n  \
ftlab mapbench --ppns both --json maps.json ../shared/traces/*.nbdlog.gz\n  \
ftlab mapbench --tables extent,learned --device-bytes 4294967296 pgbench.msr.csv.gz\n  \
ftlab mapbench --ppns simulator --precondition ../shared/traces/pgbench.msr.csv.gz\n  \
ftlab mapbench --ppns simulator --precondition --spare-factor 0.2 \\\n      \
--sim-set ftl.gc_separate_frontier=true ../shared/traces/files.msr.csv.gz\n\n\
SET counts every update (page write or trimmed page); GET looks up every page the trace reads \
or writes, in trace order, after the updates. Memory is measured after each table merges its \
update buffer and returns spare capacity; 'allocator bytes' is glibc's own count of the same.")]
pub struct MapbenchArgs {
    /// Traces (any format `ftlab sim` reads; gzip is detected).
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Trace format; guessed from the content when omitted.
    #[arg(long, value_parser = ["msr", "nbdkit", "disksim", "blkparse", "fio"])]
    format: Option<String>,
    /// Where PPNs come from: log-head (each page write takes the next PPN, the JDB-FTL report's
    /// method), simulator (ftlab's FTL: the default preset's flash sized to the device plus 7 %
    /// spare, or --spare-factor, with any --sim-set; the pages its GC moves are updates too,
    /// once the trace has written more than the free space, and the output says how many), or
    /// both.
    #[arg(long, default_value = "log-head", value_parser = ["log-head", "simulator", "both"])]
    ppns: String,
    /// With --ppns simulator or both: the simulated drive's spare fraction, (physical -
    /// logical) / physical, to which its flash is sized [default: 0.07].
    #[arg(long, allow_negative_numbers = true, value_name = "F", value_parser = parse_spare_factor)]
    spare_factor: Option<f64>,
    /// With --ppns simulator or both: a setting of the simulated drive over the default preset,
    /// as `ftlab sim --set` takes it (docs/config.md), e.g. ftl.gc_separate_frontier=true,
    /// ftl.gc_thres_pcent=90, flash.pages_per_block=512 (the flash is sized after it), or, with
    /// --precondition, workload.precondition_overwrites=1 (an aged drive: random overwrites
    /// after the fill). May be given several times. Keys mapbench sets itself (capacity.*,
    /// flash.blocks_per_die, flash.page_size_bytes, workload.trace/format/precondition) and
    /// ftl.mapping are refused.
    #[arg(long, value_name = "KEY=VALUE")]
    sim_set: Vec<String>,
    /// Tables to compare (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = TABLE_NAMES.map(String::from))]
    tables: Vec<String>,
    /// Device size in bytes (the LPN space); default: the highest address the trace touches,
    /// rounded up to a GiB.
    #[arg(long, allow_negative_numbers = true)]
    device_bytes: Option<u64>,
    /// Fill the device first: every LPN written once, in order, before the trace (as `ftlab sim
    /// --precondition` fills a drive, without its random overwrites), so the trace runs on a
    /// full drive and, with --ppns simulator, the garbage collection moves pages (the output
    /// says how many). The fill's updates count as SETs. A trace that begins by discarding the
    /// whole device (mkfs, in the nbdkit logs) frees the fill again; the MSR versions do not.
    #[arg(long)]
    precondition: bool,
    /// Instead of the side-by-side comparison: repeat the (single, log-head) trace's pattern over
    /// a device of this size (bytes, or with K/M/G/T: 16T is 16 TiB) with the learned table alone,
    /// and report its memory; flat arrays of that size are only computed.
    #[arg(long, allow_negative_numbers = true, value_name = "SIZE", value_parser = ftlab_core::units::parse_size)]
    tile_to: Option<u64>,
    /// Throughput is the fastest of this many runs, each on a fresh table (in each run the
    /// lookup phases are timed three times over); latency quantiles are the median over as many
    /// timed passes.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// The learned table's update buffer may hold one in N live mappings (N a power of two up
    /// to 2^20; whatever N, at least 256 and at most 2^20 LPNs). A smaller N means fewer merges
    /// and more lookups answered by the buffer rather than the compressed layer.
    #[arg(long, allow_negative_numbers = true, value_name = "N", default_value_t = BUFFER_LIVE_DIVISOR, value_parser = parse_divisor)]
    learned_buffer_divisor: u64,
    /// Write the results as JSON: one object per trace and PPN source (an array when several).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// glibc's per-thread cache holds freed chunks that its statistics still count as in use, which
/// would blur the allocator cross-check by up to ~100 KiB; the run re-executes itself once with
/// the cache off (the tables allocate rarely, so their speed is unaffected).
fn rerun_without_thread_cache() -> Result<bool> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const TUNABLE: &str = "glibc.malloc.tcache_count=0";
        if std::env::var("GLIBC_TUNABLES").is_ok_and(|v| v.contains(TUNABLE)) {
            return Ok(false);
        }
        let exe = std::env::current_exe().context("locating the ftlab executable")?;
        let status = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("GLIBC_TUNABLES", TUNABLE)
            .status()
            .context("re-running ftlab mapbench")?;
        if !status.success() {
            std::process::exit(status.code().unwrap_or(1));
        }
        Ok(true)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    Ok(false)
}

pub fn run(args: MapbenchArgs) -> Result<()> {
    if rerun_without_thread_cache()? {
        return Ok(());
    }
    for t in &args.tables {
        anyhow::ensure!(
            TABLE_NAMES.contains(&t.as_str()),
            "--tables: unknown table `{t}`; choose from {}",
            TABLE_NAMES.join(", ")
        );
    }
    let format = args
        .format
        .as_deref()
        .map(TraceFormat::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let sources: &[PpnSource] = match args.ppns.as_str() {
        "log-head" => &[PpnSource::LogHead],
        "simulator" => &[PpnSource::Simulator],
        _ => &[PpnSource::LogHead, PpnSource::Simulator],
    };
    anyhow::ensure!(
        sources.contains(&PpnSource::Simulator)
            || (args.spare_factor.is_none() && args.sim_set.is_empty()),
        "--spare-factor and --sim-set describe the simulated drive: they need --ppns simulator or both"
    );
    // Before any trace is read (`ops_from_trace_with` refuses them too, after reading).
    for setting in &args.sim_set {
        if let Some(why) = ftlab_mapbench::refused_setting(setting) {
            anyhow::bail!("--sim-set {why}");
        }
    }
    let options = OpsOptions {
        fill: args.precondition,
        drive: DriveSetup {
            spare_factor: args.spare_factor.unwrap_or(SIM_SPARE_FACTOR),
            settings: args.sim_set.clone(),
        },
    };
    // After the re-run above: only the process that writes it opens it.
    let json = crate::output::Output::open_some(args.json.as_deref(), "the JSON results")?;
    if let Some(bytes) = args.tile_to {
        return run_tiled(&args, format, bytes, json);
    }
    let mut all = Vec::new();
    for path in &args.traces {
        for &source in sources {
            // On stderr, and only on a terminal, after the first second.
            let mut view = crate::progress::ProgressView::new(true);
            // Its errors name the trace (and the line) themselves.
            let ops = ftlab_mapbench::ops_from_trace_with(
                path,
                format,
                args.device_bytes,
                source,
                &options,
                &mut |p| view.update(p),
            )?;
            let result = ftlab_mapbench::run(
                &path.display().to_string(),
                source,
                &ops,
                &args.tables,
                args.repeat,
                args.learned_buffer_divisor,
                &mut |p| view.update(p),
            );
            view.finish();
            println!("{}", ftlab_mapbench::markdown(&result));
            all.push(result);
        }
    }
    if let Some(out) = json {
        let text = if all.len() == 1 {
            serde_json::to_string_pretty(&all[0])?
        } else {
            serde_json::to_string_pretty(&all)?
        };
        out.write((text + "\n").as_bytes())?;
    }
    Ok(())
}

fn run_tiled(
    args: &MapbenchArgs,
    format: Option<TraceFormat>,
    bytes: u64,
    json: Option<crate::output::Output>,
) -> Result<()> {
    anyhow::ensure!(
        args.traces.len() == 1 && args.ppns == "log-head" && !args.precondition,
        "--tile-to takes one trace and log-head PPNs, without --precondition"
    );
    let path = &args.traces[0];
    let ops = ftlab_mapbench::ops_from_trace(path, format, args.device_bytes, PpnSource::LogHead)?;
    let tiles = bytes / 4096 / ops.logical_pages;
    anyhow::ensure!(
        tiles >= 1,
        "--tile-to {bytes} bytes is smaller than the trace's device ({} bytes: {})",
        ops.logical_pages * 4096,
        path.display()
    );
    let mut view = crate::progress::ProgressView::new(true);
    let result = ftlab_mapbench::run_tiled(&ops, tiles, args.learned_buffer_divisor, |done| {
        view.update(ftlab_sim::sim::Progress {
            phase: "tiling",
            done,
            total: Some(tiles),
        })
    })?;
    view.finish();
    println!(
        "{} repeated {} times: {} LPNs ({}), {} updates in {:.1} s ({:.1} M/s)\n\
         learned table: {} ({} bytes, allocator {}), {:.3} B per live mapping, {} live, lossless: {}\n\
         learned table at its peak: {} ({} bytes, buffer and arena garbage included)\n\
         process peak resident: {} (the trace's updates and the read-back's values included)\n\
         flat u32 array would need {}, flat u64 {}",
        path.display(),
        result.tiles,
        result.logical_pages,
        binary_size(result.device_bytes),
        result.updates,
        result.seconds,
        result.set_mops,
        binary_size(result.bytes),
        result.bytes,
        result.allocator_bytes.map_or_else(|| "-".into(), |a| a.to_string()),
        result.bytes_per_live_mapping,
        result.live_mappings,
        if result.lossless_verified { "yes" } else { "NO" },
        binary_size(result.bytes_peak),
        result.bytes_peak,
        result
            .peak_resident_bytes
            .map_or_else(|| "-".into(), binary_size),
        binary_size(result.flat_u32_bytes),
        binary_size(result.flat_u64_bytes),
    );
    if let Some(out) = json {
        out.write((serde_json::to_string_pretty(&result)? + "\n").as_bytes())?;
    }
    anyhow::ensure!(
        result.lossless_verified,
        "the learned table did not read back every mapping"
    );
    Ok(())
}

fn parse_spare_factor(text: &str) -> Result<f64, String> {
    let f: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if f > 0.0 && f < 1.0 {
        Ok(f)
    } else {
        Err(format!(
            "{f} is not between 0 and 1 (a fraction of the physical space)"
        ))
    }
}

fn parse_divisor(text: &str) -> Result<u64, String> {
    let n: u64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number"))?;
    if n.is_power_of_two() && n <= 1 << 20 {
        Ok(n)
    } else {
        Err(format!("{n} is not a power of two from 1 to 1048576"))
    }
}
