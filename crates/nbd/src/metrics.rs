//! A live device's figures in the Prometheus text exposition format (version 0.0.4: `# HELP`,
//! `# TYPE`, then `name{label="value"} number` lines), what `serve --metrics` answers: the
//! format every monitoring stack scrapes. Written here from the statistics (`stats_json`) and
//! the client-latency histograms; the format is a few lines of text, no client library needed.

use ftlab_core::request::Op;
use ftlab_sim::report::OpHistograms;
use serde_json::Value;
use std::fmt::Write as _;

/// Counters only the server knows.
pub struct Counts {
    pub connections_total: u64,
    pub connections_open: u64,
    pub denied_total: u64,
}

/// The histogram buckets of per-command latency, in seconds (10 us .. 1 s).
const BUCKETS_S: [f64; 12] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 1e-1, 1.0,
];

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: f64) {
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(self.0, "{name}{labels} {}", number(value));
    }

    /// A family of one unlabelled sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, "", value);
    }
}

/// A sample value as the format writes it (`+Inf`, `NaN`, or the shortest decimal).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

fn at(stats: &Value, path: &str) -> f64 {
    path.split('.')
        .try_fold(stats, |v, k| v.get(k))
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// The exposition of `stats` (`Device::stats_json`), the client-latency histograms and `counts`.
pub fn exposition(stats: &Value, latency: &OpHistograms, counts: Counts) -> String {
    let mut o = Out(String::new());
    o.one(
        "ftlab_waf",
        "gauge",
        "Write amplification of the FTL model so far: flash page programs per host page write (NaN before any write).",
        stats["waf"].as_f64().unwrap_or(f64::NAN),
    );
    for (name, key, help) in [
        (
            "ftlab_host_write_pages_total",
            "host_write_pages",
            "Pages the host wrote.",
        ),
        (
            "ftlab_host_read_pages_total",
            "host_read_pages",
            "Pages the host read.",
        ),
        (
            "ftlab_host_trim_pages_total",
            "host_trim_pages",
            "Pages the host trimmed.",
        ),
        ("ftlab_erases_total", "erases", "Flash blocks erased."),
    ] {
        o.one(name, "counter", help, at(stats, key));
    }
    o.family(
        "ftlab_flash_program_pages_total",
        "counter",
        "Flash page programs by cause: host data, GC moving host data, translation pages written back, GC moving translation pages.",
    );
    for (cause, key) in [
        ("host", "traffic.user_pages"),
        ("gc_user", "traffic.gc_user_pages"),
        ("mapping", "traffic.mapping_pages"),
        ("gc_mapping", "traffic.gc_mapping_pages"),
    ] {
        o.sample(
            "ftlab_flash_program_pages_total",
            &format!("cause=\"{cause}\""),
            at(stats, key),
        );
    }
    o.family("ftlab_gc_total", "counter", "Garbage collections by kind.");
    for kind in ["background", "foreground"] {
        o.sample(
            "ftlab_gc_total",
            &format!("kind=\"{kind}\""),
            at(stats, &format!("gc.{kind}")),
        );
    }
    o.one(
        "ftlab_nbd_requests_total",
        "counter",
        "NBD requests served.",
        at(stats, "nbd_requests"),
    );
    let name = "ftlab_nbd_request_duration_seconds";
    o.family(
        name,
        "histogram",
        "Wall-clock time from an NBD request read to its reply written, by command.",
    );
    let bounds_ns: Vec<u64> = BUCKETS_S.iter().map(|s| (s * 1e9) as u64).collect();
    for (op, label) in [
        (Op::Read, "read"),
        (Op::Write, "write"),
        (Op::Trim, "trim"),
        (Op::Flush, "flush"),
    ] {
        let (cumulative, count, sum_ns) = latency.buckets(op, &bounds_ns);
        for (le, c) in BUCKETS_S.iter().zip(&cumulative) {
            o.sample(
                &format!("{name}_bucket"),
                &format!("op=\"{label}\",le=\"{}\"", number(*le)),
                *c as f64,
            );
        }
        o.sample(
            &format!("{name}_bucket"),
            &format!("op=\"{label}\",le=\"+Inf\""),
            count as f64,
        );
        o.sample(
            &format!("{name}_sum"),
            &format!("op=\"{label}\""),
            sum_ns / 1e9,
        );
        o.sample(
            &format!("{name}_count"),
            &format!("op=\"{label}\""),
            count as f64,
        );
    }
    // A durable device keeps its pages in its directory's log, not in the page store: its
    // figures are the disk's, the cache's and the damage found.
    if stats.get("durable").is_some_and(|d| !d.is_null()) {
        for (key, name, kind, help) in [
            (
                "disk.disk_bytes",
                "disk_bytes",
                "gauge",
                "Bytes of the device directory's files.",
            ),
            (
                "disk.live_bytes",
                "live_bytes",
                "gauge",
                "Bytes of log records some volume maps.",
            ),
            ("disk.segments", "segments", "gauge", "Log segment files."),
            (
                "disk.client_bytes",
                "client_bytes_total",
                "counter",
                "Page bytes clients wrote.",
            ),
            (
                "disk.log_bytes",
                "log_bytes_total",
                "counter",
                "Bytes appended to the log.",
            ),
            (
                "disk.checkpoints",
                "checkpoints_total",
                "counter",
                "Checkpoints written.",
            ),
            (
                "disk.cleaned_segments",
                "cleaned_segments_total",
                "counter",
                "Segments cleaned.",
            ),
            (
                "syncs",
                "syncs_total",
                "counter",
                "fdatasync calls made for FLUSH and FUA.",
            ),
            (
                "cache.hits",
                "cache_hits_total",
                "counter",
                "Reads the page cache served.",
            ),
            (
                "cache.misses",
                "cache_misses_total",
                "counter",
                "Reads the page cache missed.",
            ),
            (
                "damaged_reads",
                "damaged_reads_total",
                "counter",
                "Reads answered EIO: the page's record does not verify.",
            ),
        ] {
            o.one(
                &format!("ftlab_durable_{name}"),
                kind,
                help,
                at(stats, &format!("durable.{key}")),
            );
        }
        let flag = |key: &str| match stats["durable"].get(key) {
            Some(Value::Bool(b)) => f64::from(u8::from(*b)),
            Some(Value::String(_)) => 1.0,
            _ => 0.0,
        };
        o.one(
            "ftlab_durable_stalled",
            "gauge",
            "1 while the log waits for disk space (changes answered ENOSPC, reads go on).",
            flag("stalled"),
        );
        o.one(
            "ftlab_durable_model_damaged",
            "gauge",
            "1 when the FTL model's archive was damaged at start (the model was rebuilt).",
            flag("model_damage"),
        );
        return finish(o, counts);
    }
    // zram's mm_stat fields, as the page store keeps them.
    for (key, help) in [
        ("orig_data_size", "Uncompressed bytes of the stored pages."),
        ("compr_data_size", "Compressed bytes of the stored pages."),
        ("mem_used_total", "Memory the page store holds."),
        ("mem_limit", "The page store's memory limit (0: none)."),
        ("mem_used_max", "The most memory the page store has held."),
        ("same_pages", "Pages stored as one repeated word."),
        ("huge_pages", "Pages stored uncompressed."),
        ("pages_compacted", "Pages moved by compaction."),
    ] {
        o.one(
            &format!("ftlab_store_{key}"),
            "gauge",
            help,
            at(stats, &format!("store.{key}")),
        );
    }
    finish(o, counts)
}

/// The families every server has: connections and the policy's denials.
fn finish(mut o: Out, counts: Counts) -> String {
    o.one(
        "ftlab_connections_total",
        "counter",
        "Client connections admitted.",
        counts.connections_total as f64,
    );
    o.one(
        "ftlab_connections_open",
        "gauge",
        "Client connections being served.",
        counts.connections_open as f64,
    );
    o.one(
        "ftlab_policy_denied_total",
        "counter",
        "Decisions the access policy denied.",
        counts.denied_total as f64,
    );
    o.0
}
