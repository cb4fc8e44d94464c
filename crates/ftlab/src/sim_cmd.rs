//! `ftlab sim`: a configuration (or a trace) simulated, its summary printed, its result files
//! written.

use crate::config_args::{build_config, ConfigArgs};
use crate::output;
use crate::progress::ProgressView;
use anyhow::Result;
use clap::Args;
use ftlab_sim::sim;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
ftlab sim                            # the built-in default: 16 GiB FEMU-like SSD, steady state, 1 M random 4 KiB writes\n  \
ftlab sim --set ftl.mapping=learned  # the same on another mapping table: flat, hash, extent or learned (same results, other DRAM)\n  \
ftlab sim --trace ../shared/traces/rocksdb.nbdlog.gz --json r.json\n  \
ftlab sim --set workload.kind=zipf --set ftl.gc_thres_pcent=90 --csv series.csv\n\n\
Every key --set and --config take is in docs/config.md; `ftlab config` prints them resolved.")]
pub struct SimArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Replay this trace (plain or gzip) instead of the configured generator.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Trace format; guessed from the content when omitted.
    #[arg(long, value_parser = ["msr", "nbdkit", "disksim", "blkparse", "fio"])]
    format: Option<String>,
    /// Replay timing: open (trace timestamps) or closed (queue depth outstanding).
    #[arg(long, value_parser = ["open", "closed"])]
    replay: Option<String>,
    /// Multiply trace inter-arrival times by this (0.5 = twice as fast).
    #[arg(long, allow_negative_numbers = true)]
    time_scale: Option<f64>,
    /// Count and skip malformed trace lines instead of stopping at the first.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Fold addresses beyond the logical capacity into it instead of failing.
    #[arg(long)]
    wrap: bool,
    /// Cut power NS simulated nanoseconds into the measured phase (workload.power_cut_at_ns):
    /// report what capacitors flush and check that the durable state maps every write.
    #[arg(long, value_name = "NS")]
    power_cut_at: Option<u64>,
    /// Sequential fill then random overwrite before measuring (workload.precondition; on by
    /// default for generators, off for --trace).
    #[arg(long)]
    precondition: bool,
    /// Workload seed (workload.seed), up to 2^63 - 1: a TOML integer, as in a config file.
    #[arg(long, allow_negative_numbers = true, value_parser = parse_seed)]
    seed: Option<u64>,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the time series as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Write every measured request (a generator's, the LSM's, or a trace's) as a trace, for
    /// replay here or in another simulator; times start at 2026-01-01 00:00 UTC.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Format of --record: nbdkit (everything, placement IDs as pid=) or msr (reads and
    /// writes only, placement IDs as an eighth field).
    #[arg(long, default_value = "nbdkit", value_parser = ftlab_sim::trace::RecordFormat::parse)]
    record_format: ftlab_sim::trace::RecordFormat,
    /// No summary on stdout, no progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// A seed as a TOML config can hold it: 0 to 2^63 - 1, a negative or too large one named as such
/// (not as "invalid digit" or an unexpected argument).
fn parse_seed(text: &str) -> Result<u64, String> {
    let v: i128 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not an integer"))?;
    u64::try_from(v)
        .ok()
        .filter(|&s| s <= i64::MAX as u64)
        .ok_or_else(|| {
            format!("{v} is not in 0..=9223372036854775807 (2^63 - 1, TOML's largest integer)")
        })
}

pub fn run(args: SimArgs) -> Result<()> {
    let mut extra = Vec::new();
    if let Some(t) = &args.trace {
        extra.push(format!(
            "workload.trace={}",
            toml_string(&t.display().to_string())
        ));
    }
    if let Some(f) = &args.format {
        extra.push(format!("workload.format={f}"));
    }
    if let Some(r) = &args.replay {
        extra.push(format!("workload.replay={r}"));
    }
    if let Some(s) = args.time_scale {
        extra.push(format!("workload.time_scale={s:?}"));
    }
    if args.skip_bad_lines {
        extra.push("workload.skip_bad_lines=true".into());
    }
    if args.wrap {
        extra.push("workload.wrap=true".into());
    }
    if let Some(ns) = args.power_cut_at {
        extra.push(format!("workload.power_cut_at_ns={ns}"));
    }
    if args.precondition {
        extra.push("workload.precondition=true".into());
    }
    if let Some(s) = args.seed {
        extra.push(format!("workload.seed={s}"));
    }
    // A replayed trace starts on a fresh device, as it was recorded, unless asked otherwise.
    let defaults = if args.trace.is_some() {
        vec!["workload.precondition=false".to_string()]
    } else {
        Vec::new()
    };
    let config = build_config(&args.config, &defaults, &extra)?;
    let json = output::Output::open_some(args.json.as_deref(), "the JSON report")?;
    let csv = output::Output::open_some(args.csv.as_deref(), "the CSV series")?;
    let mut record = output::Output::open_some(args.record.as_deref(), "the record")?;
    let mut view = ProgressView::new(!args.quiet);
    let mut record_error = None;
    let mut id = 0u64;
    let report = sim::run_observed(&config, &mut |p| view.update(p), &mut |r, arrival_ns| {
        let (Some(out), None) = (record.as_mut(), &record_error) else {
            return;
        };
        id += 1;
        if let Some(mut line) = args.record_format.line(r, RECORD_EPOCH_NS + arrival_ns, id) {
            line.push('\n');
            if let Err(e) = out.append(line.as_bytes()) {
                record_error = Some(e);
            }
        }
    });
    view.finish();
    let report = report?;
    if let Some(e) = record_error {
        return Err(e);
    }
    if let Some(out) = record {
        out.write(&[])?;
    }
    if let Some(out) = json {
        out.write(report.to_json().as_bytes())?;
    }
    if let Some(out) = csv {
        out.write(report.series_csv().as_bytes())?;
    }
    if !args.quiet {
        print!("{}", report.summary());
    }
    Ok(())
}

/// `sim --record`'s clock starts at 2026-01-01 00:00:00 UTC, so a record is the same every run.
const RECORD_EPOCH_NS: u64 = 1_767_225_600_000_000_000;

/// A TOML string literal for a path given on the command line.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}
