//! `ftlab mapbench`: the command line over `ftlab::mapbench`.

use anyhow::{Context, Result};
use ftlab::mapbench::{self, PpnSource, TABLE_NAMES};
use ftlab::trace::TraceFormat;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
ftlab mapbench ../shared/traces/rocksdb.nbdlog.gz\n  \
ftlab mapbench --ppns both --json maps.json ../shared/traces/*.nbdlog.gz\n  \
ftlab mapbench --tables extent,learned --device-bytes 4294967296 pgbench.msr.csv.gz\n\n\
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
    /// method), simulator (ftlab's FTL on the default preset, GC relocations included), or both.
    #[arg(long, default_value = "log-head", value_parser = ["log-head", "simulator", "both"])]
    ppns: String,
    /// Tables to compare (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = TABLE_NAMES.map(String::from))]
    tables: Vec<String>,
    /// Device size in bytes (the LPN space); default: the highest address the trace touches,
    /// rounded up to a GiB.
    #[arg(long)]
    device_bytes: Option<u64>,
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
    let mut all = Vec::new();
    for path in &args.traces {
        for &source in sources {
            let ops = mapbench::ops_from_trace(path, format, args.device_bytes, source)
                .with_context(|| format!("reading {}", path.display()))?;
            let result = mapbench::run(&path.display().to_string(), source, &ops, &args.tables);
            println!("{}", mapbench::markdown(&result));
            all.push(result);
        }
    }
    if let Some(out) = &args.json {
        let text = if all.len() == 1 {
            serde_json::to_string_pretty(&all[0])?
        } else {
            serde_json::to_string_pretty(&all)?
        };
        std::fs::write(out, text + "\n").with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
