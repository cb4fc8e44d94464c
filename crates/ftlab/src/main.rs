//! The `ftlab` command line: the only place that does terminal I/O and turns errors into
//! messages and exit codes.

use clap::{Parser, Subcommand};
use config_args::ConfigArgs;
use policy_cmd::PolicyCommand;
use sim_cmd::SimArgs;
use std::path::PathBuf;

mod bench;
mod bench_cache;
mod bench_latency;
mod bench_serve;
mod bench_store;
mod bench_sweep;
mod config_args;
mod experiment;
mod experiment_fdp;
mod grid;
mod mapbench_cmd;
mod output;
mod plot;
mod policy_cmd;
mod progress;
mod serve;
mod sim_cmd;
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
    /// Run a parameter sweep (a sweep file's grid, zip, cases and seeds) on this machine's cores or a
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
        Command::Sim(args) => sim_cmd::run(args),
        Command::Plot { report, out } => plot::run(&report, out.as_deref()),
        Command::Bench(args) => bench::run(args),
        Command::Experiment(args) => experiment::run(args),
        Command::Sweep(args) => sweep_cmd::run(args),
        Command::Mapbench(args) => mapbench_cmd::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Check { dir, repair } => volumes_cmd::run_check(&dir, repair),
        Command::Snapshot { command } => volumes_cmd::run_snapshot(command),
        Command::Image { command } => volumes_cmd::run_image(command),
        Command::Policy { command } => policy_cmd::run(command),
        Command::TlsCerts(args) => tls_certs::run(args),
        Command::SqliteBench(args) => sqlite_bench::run(args),
        Command::Presets => config_args::print_presets(),
        Command::Config(args) => config_args::print_config(&args),
    };
    if let Err(e) = result {
        eprintln!("ftlab: error: {e:#}");
        std::process::exit(1);
    }
}
