//! The `ftlab` command line: the only place that does terminal I/O and turns errors into
//! messages and exit codes.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use ftlab_core::config::{ConfigBuilder, DEFAULT_PRESET, PRESETS};
use ftlab_sim::sim::{self, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod bench;
mod bench_cache;
mod bench_serve;
mod bench_store;
mod bench_sweep;
mod experiment;
mod experiment_fdp;
mod grid;
mod mapbench_cmd;
mod output;
mod plot;
mod serve;
mod sqlite_bench;
mod sweep_cmd;
mod tls_certs;
mod volumes_cmd;

#[derive(Parser)]
#[command(
    name = "ftlab",
    version,
    about = "A fast, deterministic software SSD: what does an FTL design do to WAF, latency and DRAM?",
    long_about = "ftlab simulates an SSD (NAND geometry and timing, page-mapping FTL, write buffer, \
greedy GC, TRIM, streams) under a synthetic workload or a replayed block trace, and reports write \
amplification, latency percentiles, IOPS and mapping-table DRAM in simulated time.\n\n\
Examples:\n  ftlab sim                                   # FEMU-like device, 1 M uniform 4 KiB writes\n  \
ftlab sim --preset validation-uniform       # the WAF reference check (expect ~7.62)\n  \
ftlab sim --trace pgbench.nbdlog.gz --set capacity.logical_bytes=4294967296 --json r.json\n  \
ftlab sim --set workload.kind=zipf --set workload.read_pcent=30 --set workload.queue_depth=64\n  \
ftlab plot r.json                           # r-waf.png/svg, r-latency.png/svg\n  \
ftlab sweep sweeps/waf-vs-op.toml           # a parameter sweep, into one CSV/Parquet table\n  \
ftlab bench                                 # simulator speed\n  \
ftlab mapbench rocksdb.nbdlog.gz            # mapping tables side by side (--json r.json)\n  \
ftlab presets                               # list presets; ftlab config --preset hexa shows one"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a simulation and print its summary.
    Sim(SimArgs),
    /// Draw WAF-over-time and latency-CDF plots (PNG and SVG) from a JSON report.
    Plot {
        /// A report written by `ftlab sim --json`.
        report: PathBuf,
        /// Output path prefix (default: the report path without .json).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Measure simulator speed (simulated host page writes per wall second) and trace replay.
    Bench(bench::BenchArgs),
    /// Reproduce a paper's evaluation grid: `ftlab experiment hexa` runs the Hexa-SSD grid
    /// (protected ratio x write buffer x FIFO/Hexa x random, JESD219, pgbench), in parallel and
    /// resumable, into target/experiment-hexa/ (a report per point, hexa.csv, hexa.png/svg).
    Experiment(experiment::ExperimentArgs),
    /// Run a parameter sweep (a sweep file's grid, zip and seeds) on this machine's cores or a
    /// Dask cluster, resumable, into one CSV/Parquet table; `sweep plot` draws its columns.
    Sweep(sweep_cmd::SweepArgs),
    /// Compare mapping tables (flat u64/u32, hash, extent, learned) on traces: speed, memory,
    /// lossless read-back.
    Mapbench(mapbench_cmd::MapbenchArgs),
    /// Serve the emulated SSD over NBD (fio, qemu, nbdfuse + ext4 ...), FTL model in the loop.
    Serve(Box<serve::ServeArgs>),
    /// A durable device's snapshots and clones: create, list, delete (through the running
    /// server's control socket when it is served).
    Snapshot {
        #[command(subcommand)]
        command: volumes_cmd::SnapshotCommand,
    },
    /// Raw images in and out of a durable device's directory: export DIR[@NAME] FILE,
    /// import FILE DIR.
    Image {
        #[command(subcommand)]
        command: volumes_cmd::ImageCommand,
    },
    /// Verify a durable device's directory (`serve --data DIR`) offline: every record's
    /// checksum and sequence, every segment present; exit 1 when acknowledged data is damaged.
    Check {
        /// The directory `ftlab serve --data` keeps.
        dir: PathBuf,
        /// Salvage what verifies: the records before the first damage are kept, the damaged
        /// segment's original and every later segment set aside as NAME.damaged (nothing is
        /// deleted), so that `serve --data` starts again.
        #[arg(long)]
        repair: bool,
    },
    /// Access policies (`serve --policy FILE`): `policy check FILE --principal P --action A
    /// --export E` says whether the file allows it, and which statement decided.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Run an OLTP-like SQLite workload through the ftlab VFS (FTL model on) per journal mode
    /// and print what it did to the device (WAF, flushes, simulated latency) beside the same
    /// workload on a tmpfs file with SQLite's default VFS.
    SqliteBench(sqlite_bench::SqliteBenchArgs),
    /// Write a test certificate authority, a server certificate and client certificates for
    /// `serve --tls-cert/--tls-key/--tls-ca`, laid out as qemu and libnbd read them.
    #[command(after_help = "Example:\n  \
ftlab tls-certs pki --client alice --client bob\n  \
ftlab serve --tls-cert pki/server-cert.pem --tls-key pki/server-key.pem --tls-ca pki/ca-cert.pem\n  \
nbdinfo 'nbds://localhost/ftlab?tls-certificates=pki/client-alice'")]
    TlsCerts(tls_certs::TlsCertsArgs),
    /// List the built-in presets.
    Presets,
    /// Print the fully resolved configuration as TOML (a starting point for --config files).
    Config(ConfigArgs),
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Check a policy file and explain one decision: allowed or denied, by which statement (or by
    /// default: what no statement allows is denied). Exit 0 when allowed, 3 when denied, 1 when
    /// the file is refused.
    #[command(after_help = "Examples:\n  \
ftlab policy check policy.toml --principal cn:ops-alice --action write --export db\n  \
ftlab policy check policy.toml --principal uid:1000 --principal gid:100 --action read --export db@monday\n  \
ftlab policy check policy.toml --action list --export db          # an anonymous client")]
    Check {
        /// The policy file (docs/serve.md, "Access policies").
        file: PathBuf,
        /// A name the client goes by: cn:NAME or san:NAME (its TLS certificate), uid:N or gid:N
        /// (its Unix socket credentials); repeat for each. None: anonymous.
        #[arg(long = "principal", value_name = "KIND:NAME")]
        principals: Vec<String>,
        /// read, write, trim, flush, list, snapshot.create, snapshot.delete, clone, metrics.
        #[arg(long, value_parser = ftlab_device::policy::ACTIONS)]
        action: String,
        /// The export (NAME, or NAME@SNAPSHOT for a snapshot or clone).
        #[arg(long)]
        export: String,
    },
    /// Make the server running on a durable directory (`serve --data DIR --policy FILE`) read
    /// its policy file again, through its control socket (as SIGHUP does): checked whole first,
    /// a refused file leaves the old policy in force and the error is printed (exit 1).
    Reload {
        /// The served device directory.
        dir: PathBuf,
    },
}

#[derive(Args, Clone)]
pub struct ConfigArgs {
    /// Preset to start from: femu, femu-fdp, hexa, validation-uniform.
    #[arg(long, default_value = DEFAULT_PRESET)]
    preset: String,
    /// TOML file merged over the preset (may be given several times).
    #[arg(long = "config", value_name = "FILE")]
    configs: Vec<PathBuf>,
    /// Override one key, e.g. --set flash.channels=4 --set capacity.over_provisioning=0.28.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Args)]
#[command(after_help = "Examples:\n  \
ftlab sim                            # the built-in default: 16 GiB FEMU-like SSD, steady state, 1 M random 4 KiB writes\n  \
ftlab sim --set ftl.mapping=learned  # the same on another mapping table: flat, hash, extent or learned (same results, other DRAM)\n  \
ftlab sim --trace ../shared/traces/rocksdb.nbdlog.gz --json r.json\n  \
ftlab sim --set workload.kind=zipf --set ftl.gc_thres_pcent=90 --csv series.csv\n\n\
Every key --set and --config take is in docs/config.md; `ftlab config` prints them resolved.")]
struct SimArgs {
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

/// Preset, then `defaults` (what a command implies), then files, then --set, then `extra` (the
/// command's own flags).
fn build_config(
    args: &ConfigArgs,
    defaults: &[String],
    extra: &[String],
) -> Result<ftlab_core::Config> {
    Ok(config_layers(args, defaults, extra)?.build()?)
}

/// The layers of `build_config`, not yet checked.
fn config_layers(
    args: &ConfigArgs,
    defaults: &[String],
    extra: &[String],
) -> Result<ConfigBuilder> {
    let mut builder = ConfigBuilder::from_preset(&args.preset)?;
    for set in defaults {
        builder.set(set)?;
    }
    for path in &args.configs {
        builder.merge_file(path)?;
    }
    for set in args.sets.iter().chain(extra) {
        builder.set(set)?;
    }
    Ok(builder)
}

/// A progress bar that appears only on a terminal and only once a run has taken a second.
pub struct ProgressView {
    started: Instant,
    bar: Option<ProgressBar>,
    phase: String,
    enabled: bool,
}

impl ProgressView {
    pub fn new(enabled: bool) -> Self {
        Self {
            started: Instant::now(),
            bar: None,
            phase: String::new(),
            enabled: enabled && std::io::stderr().is_terminal(),
        }
    }

    pub fn update(&mut self, p: Progress) {
        if !self.enabled || self.started.elapsed() < Duration::from_secs(1) {
            return;
        }
        if self.bar.is_none() || self.phase != p.phase {
            if let Some(b) = self.bar.take() {
                b.finish_and_clear();
            }
            let bar = match p.total {
                Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template(
                            "{msg:32} [{bar:40}] {percent:>3}% {human_pos}/{human_len} eta {eta}",
                        )
                        .expect("valid template")
                        .progress_chars("=> "),
                    ),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template("{msg:32} {spinner} {human_pos} requests")
                            .expect("valid template"),
                    ),
            };
            bar.set_message(p.phase.to_string());
            self.phase = p.phase.to_string();
            self.bar = Some(bar);
        }
        if let Some(b) = &self.bar {
            b.set_position(p.done);
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

fn run_sim(args: SimArgs) -> Result<()> {
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

/// `ftlab check DIR [--repair]`.
fn check(dir: &std::path::Path, repair: bool) -> anyhow::Result<()> {
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
    if let Some(why) = &opened.dropped_why {
        println!(
            "a {}-byte tail no FLUSH acknowledged will be dropped at the next start ({why})",
            opened.dropped_bytes
        );
    }
    Ok(())
}

/// `ftlab policy check`: prints the decision and exits 3 when it is a denial.
fn policy_check(
    file: &std::path::Path,
    names: Vec<String>,
    action: &str,
    export: &str,
) -> Result<()> {
    use ftlab_device::policy::{Policy, Principal};
    let policy = Policy::load(file)?;
    let principal = Principal { names };
    let decision = policy.decide(&principal, action, export);
    println!(
        "{} {action} on {export}: {}",
        principal.describe(),
        decision.explain(&policy)
    );
    if !decision.allowed {
        std::process::exit(3);
    }
    Ok(())
}

/// A TOML string literal for a path given on the command line.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn main() {
    // A write past the file-size limit (`ulimit -f`) then fails with EFBIG, reported as an error
    // naming the file, instead of SIGXFSZ ending the process without a word (for `serve`,
    // while it saves its image, before its report).
    #[cfg(target_os = "linux")]
    // SAFETY: setting a signal's disposition to "ignore" runs no code in the handler.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Sim(args) => run_sim(args),
        Command::Plot { report, out } => plot::run(&report, out.as_deref()),
        Command::Bench(args) => bench::run(args),
        Command::Experiment(args) => experiment::run(args),
        Command::Sweep(args) => sweep_cmd::run(args),
        Command::Mapbench(args) => mapbench_cmd::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Check { dir, repair } => check(&dir, repair),
        Command::Snapshot { command } => volumes_cmd::run_snapshot(command),
        Command::Image { command } => volumes_cmd::run_image(command),
        Command::Policy {
            command:
                PolicyCommand::Check {
                    file,
                    principals,
                    action,
                    export,
                },
        } => policy_check(&file, principals, &action, &export),
        Command::Policy {
            command: PolicyCommand::Reload { dir },
        } => volumes_cmd::reload_policy(&dir),
        Command::TlsCerts(args) => tls_certs::run(args),
        Command::SqliteBench(args) => sqlite_bench::run(args),
        Command::Presets => {
            for p in PRESETS {
                println!("{:<20} {}", p.name, p.summary);
            }
            Ok(())
        }
        Command::Config(args) => build_config(&args, &[], &[]).and_then(|c| {
            let estimate = ftlab_core::memory::MemoryEstimate::of(&c, &c.geometry()?);
            print!("{}", c.to_toml());
            // Comments, so that the output stays a config file to start from.
            println!(
                "\n# Memory the FTL's tables take, estimated (`sim` and `serve` refuse a device \
                 that needs more than the host has available):"
            );
            for part in &estimate.parts {
                println!(
                    "#   {:<20} {:>10}  {}",
                    part.name,
                    ftlab_sim::report::binary_size(part.bytes),
                    part.basis
                );
            }
            println!(
                "#   {:<20} {:>10}",
                "total",
                ftlab_sim::report::binary_size(estimate.total_bytes)
            );
            Ok(())
        }),
    };
    if let Err(e) = result {
        eprintln!("ftlab: error: {e:#}");
        std::process::exit(1);
    }
}
