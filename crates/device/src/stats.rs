//! What the device reports of itself: the model's report (the simulator's schema) with what
//! only a live device has, client latency, and the page store's statistics.

use crate::Device;
use ftlab_core::request::Op;
use ftlab_sim::report::OpHistograms;
use ftlab_store::codec::Codec;
use ftlab_store::StoreStats;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Device {
    /// The live statistics: the simulator's report of the model so far (the same schema as
    /// `ftlab sim --json`; the model's clock is the wall clock since start), and what only a live
    /// device has: uptime, failure, the NBD requests applied, client latency, the store's
    /// mm_stat fields and the memory of requests in flight.
    pub fn stats_json(&self) -> serde_json::Value {
        let now_ns = self.now_ns();
        let (report, nbd_requests) = {
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (
                s.ftl.report(&self.config, &s.recorder, 0, now_ns),
                s.requests,
            )
        };
        let mut stats = serde_json::to_value(&report).expect("a report serialises");
        let live = serde_json::json!({
            "uptime_ns": now_ns,
            "failure": self.failure(),
            "nbd_requests": nbd_requests,
            "client_latency_ns": self.client_latency(),
            "late_replies": (self.options.latency != crate::Latency::None)
                .then(|| self.late_replies()),
            "store": self.store.stats(),
            "inflight_bytes": self.budget.used_bytes(),
            "durable": self.durable.as_ref().map(|d| {
                let (records, disk, volumes, stalled) = {
                    let mut data = d.lock();
                    (data.last_seq(), data.disk_stats(), data.volumes(), data.low_on_space())
                };
                serde_json::json!({
                    "dir": d.dir.display().to_string(),
                    "durability": format!("{:?}", d.mode).to_lowercase(),
                    "records": records,
                    "synced_records": d.synced_seq.load(Ordering::Relaxed),
                    "syncs": d.syncs.load(Ordering::Relaxed),
                    "recovered_records": d.recovered_records,
                    "recovered_requests": d.replayed_requests,
                    "recovery_model_restored": d.model_restored,
                    "recovery_checkpoint_seq": d.checkpoint_seq,
                    "recovery_dropped_bytes": d.dropped_bytes,
                    "model_damage": d.model_damage,
                    "damaged_reads": d.damaged_reads.load(Ordering::Relaxed),
                    "damaged_pages": d.damaged_told.lock().unwrap_or_else(|p| p.into_inner())
                        .iter().map(|&(volume, lpn)| serde_json::json!({
                            "volume": volume, "lpn": lpn,
                        })).collect::<Vec<_>>(),
                    // Changes refused for want of disk space (the log's write failed, or the
                    // free space is under the reserve kept for checkpoints and the cleaner).
                    "stalled": stalled || d.refusals.full(),
                    "disk": disk,
                    "volumes": volumes,
                    "cache": d.cache.lock().unwrap_or_else(|p| p.into_inner()).stats(),
                })
            }),
            "exports": self.exports.iter().map(|e| serde_json::json!({
                "name": e.spec.name,
                "base_bytes": e.base_bytes,
                "size_bytes": e.size_bytes,
                "placement": e.spec.ranges.is_none().then(|| serde_json::json!({
                    "reclaim_group": e.spec.placement.reclaim_group,
                    "handle": e.spec.placement.handle,
                })),
                "placement_ranges": e.spec.ranges.as_ref().map_or(0, |r| r.ranges().len()),
                "placement_handles": e.spec.handles,
                "read_only": e.spec.read_only || self.options.read_only,
                "requests": e.requests.load(Ordering::Relaxed),
                "read_bytes": e.read_bytes.load(Ordering::Relaxed),
                "written_bytes": e.written_bytes.load(Ordering::Relaxed),
                "trimmed_bytes": e.trimmed_bytes.load(Ordering::Relaxed),
            })).collect::<Vec<_>>(),
        });
        let object = stats.as_object_mut().expect("a report is an object");
        for (key, value) in live.as_object().expect("an object") {
            debug_assert!(!object.contains_key(key), "`{key}` is a report key too");
            object.insert(key.clone(), value.clone());
        }
        stats
    }

    /// The model's report (`ftlab sim --json`'s schema) as of model time `now_ns`: what a
    /// replay after a crash must reproduce exactly.
    pub fn model_report_json(&self, now_ns: u64) -> serde_json::Value {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::to_value(s.ftl.report(&self.config, &s.recorder, 0, now_ns))
            .expect("a report serialises")
    }

    /// Counts the client latency of replies a front end just handed to its client: each
    /// request's operation (None: a command that is not one), when it was read, and (latency
    /// emulation) when the model completed it and when its reply began to be sent, so a reply
    /// that left later is counted late.
    pub fn replied(
        &self,
        timings: impl Iterator<Item = (Option<Op>, Instant, Option<(Instant, Instant)>)>,
    ) {
        let now = Instant::now();
        let mut h = self
            .client_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut late = Late::default();
        for (op, read_at, due) in timings {
            if let Some(op) = op {
                h.record(op, now.duration_since(read_at).as_nanos() as u64);
            }
            if let Some((due, sent)) = due {
                late.count(sent.saturating_duration_since(due).as_nanos() as u64);
            }
        }
        drop(h);
        if late.held > 0 {
            self.late
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(&late);
        }
    }

    /// Replies held for the model's latency so far, and those that left late.
    pub fn late_replies(&self) -> Late {
        *self.late.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The model's latency histograms (arrival to modelled completion) of every request so far.
    pub fn model_latency_histograms(&self) -> OpHistograms {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.recorder.latency().clone()
    }

    /// The client latency histograms themselves (for the metrics' buckets).
    pub fn client_latency_histograms(&self) -> OpHistograms {
        self.client_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Connections admitted (`connected`) and decisions denied so far.
    pub fn access_counts(&self) -> (u64, u64) {
        (
            self.connections_total.load(Ordering::Relaxed),
            self.denied_total.load(Ordering::Relaxed),
        )
    }

    /// Per NBD command: wall-clock ns from a request read to its reply written.
    pub fn client_latency(&self) -> ftlab_sim::report::OpLatencies {
        self.client_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .summaries()
    }

    /// Requests served so far and the FTL model's counters.
    pub fn ftl_stats(&self) -> (u64, ftlab_core::ftl::FtlStats) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.requests, s.ftl.stats().clone())
    }

    pub fn store_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// With a `zstd-dict` store: (re)trains its dictionary when `schedule` says it is due (it
    /// takes seconds; call from a thread of its own). Returns a line for the log when it tried.
    pub fn train_dictionary_if_due(
        &self,
        schedule: &mut crate::dictionary::DictionarySchedule,
    ) -> Option<String> {
        if !matches!(self.store.config().codec, Codec::ZstdDict { .. }) {
            return None;
        }
        let compressed = self.store.stats().compressed_pages();
        if !schedule.due(compressed) {
            return None;
        }
        let started = Instant::now();
        Some(match self.store.train_dictionary() {
            Ok(bytes) => format!(
                "trained zstd dictionaries ({bytes} bytes, one per class of page: text, binary) \
                 from a sample of the {compressed} pages stored compressed, in {:.1} s; pages \
                 written from now on use them",
                started.elapsed().as_secs_f64()
            ),
            Err(e) => format!("dictionary training failed: {e}"),
        })
    }
}

/// Replies held until the model's completion (latency emulation) and those that left late:
/// when the server cannot keep up (the model's latency below what the host serves it in, or
/// the host too busy to wake on time), the emulation is off by this much.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Late {
    /// Replies held for the model's latency.
    pub held: u64,
    /// Those that left more than `LATE_AFTER_NS` after the model completed them.
    pub late: u64,
    /// How late those were, in all and at most.
    pub late_total_ns: u64,
    pub late_max_ns: u64,
}

impl Late {
    /// A reply this much past its completion or less is on time: the wake-up precision the
    /// delivery aims at (a few microseconds).
    pub const LATE_AFTER_NS: u64 = 2_000;

    fn count(&mut self, after_ns: u64) {
        self.held += 1;
        if after_ns > Self::LATE_AFTER_NS {
            self.late += 1;
            self.late_total_ns += after_ns;
            self.late_max_ns = self.late_max_ns.max(after_ns);
        }
    }

    fn add(&mut self, other: &Late) {
        self.held += other.held;
        self.late += other.late;
        self.late_total_ns += other.late_total_ns;
        self.late_max_ns = self.late_max_ns.max(other.late_max_ns);
    }
}
