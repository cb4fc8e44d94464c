//! `ftlab sqlite-bench`: an OLTP-like SQLite workload through the ftlab VFS (the FTL model on,
//! no emulated latency), per journal mode and page size, with what it did to the device (host
//! and flash writes, WAF, flushes, simulated latency), against the same workload on a file in
//! tmpfs with SQLite's default VFS.

use anyhow::{Context, Result};
use ftlab_core::rng::SplitMix64;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
ftlab sqlite-bench                                   # every journal mode, 4 KiB pages\n  \
ftlab sqlite-bench --journal-mode wal --page-size 8192 --transactions 5000\n  \
ftlab sqlite-bench --journal-mode delete --device /var/tmp/sqlite-dev   # a durable device")]
pub struct SqliteBenchArgs {
    /// delete, truncate, persist, wal, memory, off, or all (each in turn on a fresh device).
    #[arg(long, default_value = "all", value_parser = ["all", "delete", "truncate", "persist", "wal", "memory", "off"])]
    journal_mode: String,
    /// SQLite's page size (512 to 65536, a power of two).
    #[arg(long, default_value_t = 4096)]
    page_size: u32,
    /// Transactions to run (each: 10 order inserts, 10 stock updates, 5 indexed reads, and a
    /// delete of an old order every 4th).
    #[arg(long, default_value_t = 2000)]
    transactions: u64,
    /// PRAGMA synchronous: off, normal or full.
    #[arg(long, default_value = "full", value_parser = ["off", "normal", "full"])]
    synchronous: String,
    /// Keep the database on a durable device in this directory (created when absent); one
    /// journal mode only. Default: a device in memory.
    #[arg(long, value_name = "DIR")]
    device: Option<PathBuf>,
    /// Print `committed N` after each transaction's COMMIT returned (for crash tests).
    #[arg(long)]
    log_commits: bool,
    /// Skip the run on a tmpfs file with the default VFS.
    #[arg(long)]
    no_baseline: bool,
    /// Seed of the workload's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The device's logical size (with K/M/G): small enough that the workload's writes fill
    /// it several times, so GC runs and WAF tells the journal modes apart.
    #[arg(long, default_value = "128M")]
    size: String,
    /// The page store's codec under the device: none (the pages as they are), lz4, zstd[:LEVEL].
    #[arg(long, default_value = "none")]
    codec: String,
    /// Runs of each side per journal mode, alternating (medians); one with --device.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Write the results (each mode's device report included) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The workload's tables, sized for a few MB after the default run.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS stock(item INTEGER PRIMARY KEY, quantity INTEGER, data TEXT);
CREATE TABLE IF NOT EXISTS orders(id INTEGER PRIMARY KEY, customer INTEGER, item INTEGER, amount INTEGER, note TEXT);
CREATE INDEX IF NOT EXISTS orders_customer ON orders(customer);
CREATE TABLE IF NOT EXISTS commits(n INTEGER);
";
const ITEMS: i64 = 10_000;
const CUSTOMERS: u64 = 3_000;

fn text(rng: &mut SplitMix64, bytes: usize) -> String {
    const WORDS: [&str; 8] = [
        "alpha", "beta", "gamma", "delta", "flash", "page", "block", "erase",
    ];
    let mut s = String::with_capacity(bytes + 8);
    while s.len() < bytes {
        s.push_str(WORDS[(rng.next_u64() % 8) as usize]);
        s.push(' ');
    }
    s
}

/// What one run did.
struct Run {
    seconds: f64,
    transactions: u64,
    digest: u64,
}

/// Sets the connection up and runs the workload; `commit` is told after each COMMIT returned.
fn workload(
    c: &Connection,
    mode: &str,
    args: &SqliteBenchArgs,
    mut commit: impl FnMut(u64),
) -> Result<Run> {
    c.execute_batch(&format!("PRAGMA page_size={}", args.page_size))?;
    let got: String = c.query_row(&format!("PRAGMA journal_mode={mode}"), [], |r| r.get(0))?;
    anyhow::ensure!(
        got == mode,
        "journal_mode {mode} was refused (SQLite kept {got})"
    );
    c.execute_batch(&format!("PRAGMA synchronous={}", args.synchronous))?;
    c.execute_batch(SCHEMA)?;
    let mut rng = SplitMix64::new(args.seed);
    let start = Instant::now();
    let stocked: i64 = c.query_row("SELECT count(*) FROM stock", [], |r| r.get(0))?;
    if stocked == 0 {
        c.execute_batch("BEGIN")?;
        {
            let mut insert =
                c.prepare("INSERT INTO stock(item, quantity, data) VALUES (?1, ?2, ?3)")?;
            for item in 0..ITEMS {
                insert.execute((item, 100, text(&mut rng, 60)))?;
            }
        }
        c.execute_batch("INSERT INTO commits VALUES (0); COMMIT")?;
    }
    let mut insert =
        c.prepare("INSERT INTO orders(customer, item, amount, note) VALUES (?1, ?2, ?3, ?4)")?;
    let mut update = c.prepare("UPDATE stock SET quantity = quantity - ?2 WHERE item = ?1")?;
    let mut by_customer = c.prepare("SELECT sum(amount) FROM orders WHERE customer = ?1")?;
    let mut delete = c.prepare("DELETE FROM orders WHERE id = (SELECT min(id) FROM orders)")?;
    let mut counted = c.prepare("UPDATE commits SET n = n + 1")?;
    let mut digest = 0u64;
    for t in 0..args.transactions {
        c.execute_batch("BEGIN")?;
        for _ in 0..10 {
            let item = (rng.next_u64() % ITEMS as u64) as i64;
            let amount = (1 + rng.next_u64() % 10) as i64;
            let customer = (rng.next_u64() % CUSTOMERS) as i64;
            insert.execute((customer, item, amount, text(&mut rng, 40)))?;
            update.execute((item, amount))?;
        }
        for _ in 0..5 {
            let customer = (rng.next_u64() % CUSTOMERS) as i64;
            let sum: Option<i64> = by_customer.query_row([customer], |r| r.get(0))?;
            digest = digest
                .wrapping_mul(31)
                .wrapping_add(sum.unwrap_or(0) as u64);
        }
        if t % 4 == 3 {
            delete.execute([])?;
        }
        counted.execute([])?;
        c.execute_batch("COMMIT")?;
        commit(t + 1);
    }
    let seconds = start.elapsed().as_secs_f64();
    let total: i64 = c.query_row("SELECT sum(quantity) FROM stock", [], |r| r.get(0))?;
    digest = digest.wrapping_mul(31).wrapping_add(total as u64);
    let check: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    anyhow::ensure!(
        check == "ok",
        "integrity_check after the {mode} run: {check}"
    );
    Ok(Run {
        seconds,
        transactions: args.transactions,
        digest,
    })
}

/// A directory in tmpfs for the baseline (the default VFS's file there costs no disk I/O).
fn tmpfs_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// One run through the ftlab VFS on a fresh device (or `--device`): the run and the device's
/// report as it ended.
fn run_ftlab(
    mode: &str,
    args: &SqliteBenchArgs,
    i: usize,
    round: u32,
) -> Result<(Run, serde_json::Value)> {
    // A name of its own per run: each on a fresh in-memory device. A durable device keeps its
    // database's name (reopened by the next run).
    let name = match &args.device {
        Some(_) => "bench.db".to_string(),
        None => format!("sqlite-bench-{}-{i}-{round}.db", std::process::id()),
    };
    let uri = match &args.device {
        Some(dir) => format!(
            "file:{name}?vfs=ftlab&codec={}&size={}&device={}",
            args.codec,
            args.size,
            dir.display()
        ),
        None => format!(
            "file:{name}?vfs=ftlab&codec={}&size={}",
            args.codec, args.size
        ),
    };
    let c = Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .with_context(|| format!("opening {uri}"))?;
    let log = args.log_commits;
    let run = workload(&c, mode, args, |n| {
        if log {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "committed {n}");
            let _ = out.flush();
        }
    })?;
    let report = ftlab_sqlite::device_of(&name)
        .context("the device closed early")?
        .device()
        .stats_json();
    Ok((run, report))
}

/// One run with the default VFS on a file in tmpfs.
fn run_baseline(mode: &str, args: &SqliteBenchArgs, i: usize, round: u32) -> Result<Run> {
    let path = tmpfs_dir().join(format!(
        "ftlab-sqlite-bench-{}-{i}-{round}.db",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let c = Connection::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let run = workload(&c, mode, args, |_| {});
    drop(c);
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    run
}

pub fn run(args: SqliteBenchArgs) -> Result<()> {
    ftlab_sqlite::register()
        .map_err(|rc| anyhow::anyhow!("registering the VFS: SQLite error {rc}"))?;
    anyhow::ensure!(
        args.page_size.is_power_of_two() && (512..=65536).contains(&args.page_size),
        "--page-size {}: a power of two from 512 to 65536",
        args.page_size
    );
    anyhow::ensure!(args.transactions >= 1, "--transactions: at least 1");
    ftlab_store::codec::Codec::parse(&args.codec).map_err(|e| anyhow::anyhow!("--codec: {e}"))?;
    let modes: Vec<&str> = if args.journal_mode == "all" {
        anyhow::ensure!(
            args.device.is_none(),
            "--device holds one database: give one --journal-mode"
        );
        vec!["delete", "truncate", "persist", "wal", "memory", "off"]
    } else {
        vec![args.journal_mode.as_str()]
    };
    if !args.log_commits {
        println!(
            "ftlab sqlite-bench: {} transactions (10 inserts, 10 updates, 5 indexed reads, a delete every 4th), page size {}, synchronous={}, FTL model on (femu preset), no emulated latency, page store codec {}; baseline: the default VFS on a file in {}; tx/s are medians of {} alternating runs",
            args.transactions,
            args.page_size,
            args.synchronous,
            args.codec,
            tmpfs_dir().display(),
            if args.device.is_some() { 1 } else { args.repeat }
        );
        println!("| journal mode | ftlab tx/s | tmpfs tx/s | ftlab / tmpfs | host write pages | flash write pages | WAF | flushes | host pages / tx | write p99 us (model) | results equal |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
    }
    let mut json_rows = Vec::new();
    let rounds = if args.device.is_some() || args.log_commits {
        1
    } else {
        args.repeat
    };
    for (i, mode) in modes.iter().enumerate() {
        let mut ftlab_tps = Vec::new();
        let mut baseline_tps = Vec::new();
        let mut last = None;
        for round in 0..rounds {
            // The baseline first every other round: neither side always runs on a warmer
            // machine.
            let baseline_first = round % 2 == 1;
            let mut baseline = None;
            if baseline_first && !args.no_baseline {
                baseline = Some(run_baseline(mode, &args, i, round)?);
            }
            let (ftlab, report) = run_ftlab(mode, &args, i, round)?;
            if args.log_commits {
                break;
            }
            if !baseline_first && !args.no_baseline {
                baseline = Some(run_baseline(mode, &args, i, round)?);
            }
            if let Some(b) = &baseline {
                anyhow::ensure!(
                    b.digest == ftlab.digest,
                    "{mode}: the workload's results differ between the ftlab VFS and the default VFS"
                );
                baseline_tps.push(b.transactions as f64 / b.seconds.max(1e-9));
            }
            ftlab_tps.push(ftlab.transactions as f64 / ftlab.seconds.max(1e-9));
            last = Some((ftlab, baseline, report));
        }
        let Some((ftlab, baseline, report)) = last else {
            continue;
        };
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let (f_tps, b_tps) = (
            median(&mut ftlab_tps).unwrap_or(0.0),
            median(&mut baseline_tps),
        );
        let host = report["host_write_pages"].as_u64().unwrap_or(0);
        let nand = report["nand_write_pages"].as_u64().unwrap_or(0);
        let flushes = report["requests"]["flush"].as_u64().unwrap_or(0);
        let p99_us = report["latency_ns"]["write"]["p99"].as_f64().unwrap_or(0.0) / 1000.0;
        let waf = report["waf"].as_f64();
        println!(
            "| {mode} | {f_tps:.0} | {} | {} | {host} | {nand} | {} | {flushes} | {:.1} | {p99_us:.1} | {} |",
            b_tps.map_or("-".into(), |b| format!("{b:.0}")),
            b_tps.map_or("-".into(), |b| format!("{:.2}", f_tps / b)),
            waf.map_or("n/a".into(), |w| format!("{w:.2}")),
            host as f64 / args.transactions as f64,
            if baseline.is_some() { "yes" } else { "-" },
        );
        json_rows.push(serde_json::json!({
            "journal_mode": mode,
            "page_size": args.page_size,
            "transactions": args.transactions,
            "rounds": rounds,
            "ftlab_tx_per_s": f_tps,
            "baseline_tx_per_s": b_tps,
            "results_equal": baseline.as_ref().map(|b| b.digest == ftlab.digest),
            "device": report,
        }));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&json_rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
