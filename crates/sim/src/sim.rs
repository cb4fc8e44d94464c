//! The simulation driver: feeds requests from a generator or a trace into the FTL core, in open
//! loop (trace timestamps) or closed loop (a fixed number outstanding), and records what the
//! host sees. Owns: arrival times, latency histograms, the time series, preconditioning.
//! Does not know: flash internals beyond the FTL's public counters.

use crate::device::{ConfiguredFtl, FtlVisitor};
use crate::placement::PlacementRanges;
use crate::report::{PowerCutInfo, Recorder, Report, TraceInfo};
use crate::trace::{TraceError, TraceReader};
use crate::workload::Generator;
use ftlab_core::config::Config;
use ftlab_core::ftl::mapping::MappingTable;
use ftlab_core::ftl::{Ftl, FtlError};
use ftlab_core::request::{Op, Request};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Config(#[from] ftlab_core::config::ConfigError),
    #[error(transparent)]
    Trace(#[from] TraceError),
    // `cause`, not `source`: thiserror would also make it the cause, printed twice by `{:#}`.
    #[error(
        "{location}: {cause} (pass --wrap to fold such addresses into the device, or size it for the trace with --set capacity.logical_bytes=BYTES)"
    )]
    OutOfRange { location: String, cause: FtlError },
    #[error("{location}: {cause}")]
    Request { location: String, cause: FtlError },
    #[error("workload: {0}")]
    Workload(ftlab_core::config::ConfigError),
    #[error(transparent)]
    Memory(#[from] ftlab_core::memory::MemoryError),
}

/// What the driver reports while it runs (for a progress bar).
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub phase: &'a str,
    pub done: u64,
    pub total: Option<u64>,
}

const PROGRESS_EVERY: u64 = 1 << 16;

enum Requests {
    Generator {
        generator: Generator,
        remaining: u64,
        /// With an LSM and `workload.overwrites`: the bytes still to write.
        write_bytes_left: Option<u64>,
    },
    Trace(Box<TraceReader>),
}

/// Where the measured requests come from, and the placement ranges that override their
/// placement IDs.
struct Source {
    requests: Requests,
    ranges: Option<PlacementRanges>,
}

impl Source {
    #[inline]
    fn next(&mut self) -> Result<Option<Request>, SimError> {
        let mut request = match &mut self.requests {
            Requests::Generator {
                generator,
                remaining,
                write_bytes_left,
            } => {
                if *remaining == 0 || *write_bytes_left == Some(0) {
                    return Ok(None);
                }
                *remaining -= 1;
                let r = generator.next_request();
                if let (Some(left), Op::Write) = (write_bytes_left.as_mut(), r.op) {
                    *left = left.saturating_sub(r.length_bytes);
                }
                r
            }
            Requests::Trace(reader) => match reader.next_request()? {
                Some(r) => r,
                None => return Ok(None),
            },
        };
        if let Some(ranges) = &self.ranges {
            ranges.apply(&mut request);
        }
        Ok(Some(request))
    }

    fn location(&self) -> String {
        match &self.requests {
            Requests::Generator { .. } => "generator".into(),
            Requests::Trace(r) => format!("{}:{}", r.path().display(), r.line_number()),
        }
    }
}

/// Runs the configured simulation and returns its report.
pub fn run(config: &Config, progress: &mut dyn FnMut(Progress)) -> Result<Report, SimError> {
    run_observed(config, progress, &mut |_, _| {})
}

/// [`run`], showing `observe` each measured request as it is submitted, with its arrival time
/// (simulated ns since the measured phase began): what `ftlab sim --record` writes.
pub fn run_observed(
    config: &Config,
    progress: &mut dyn FnMut(Progress),
    observe: &mut dyn FnMut(&Request, u64),
) -> Result<Report, SimError> {
    let geometry = config.geometry()?;
    // Before the first table is allocated: a device too large for the host is an error naming
    // its keys, not an abort on a failed allocation.
    ftlab_core::memory::MemoryEstimate::of(config, &geometry)
        .check(ftlab_core::memory::available().as_ref())?;
    // Ideal placement knows each page's lifetime: a first pass records the writes.
    let lifetimes = match config.fdp.placement {
        ftlab_core::config::PlacementPolicy::Ideal => {
            Some(ConfiguredFtl::new(config, &geometry).visit(RecordWrites { config, progress })?)
        }
        _ => None,
    };
    ConfiguredFtl::new(config, &geometry).visit(Simulate {
        config,
        progress,
        lifetimes,
        observe,
    })
}

/// The first pass of ideal placement: the run, for its write log's lifetimes.
struct RecordWrites<'a, 'p> {
    config: &'a Config,
    progress: &'p mut dyn FnMut(Progress),
}

impl FtlVisitor for RecordWrites<'_, '_> {
    type Output = Result<Vec<u64>, SimError>;
    fn visit<M: MappingTable>(self, mut ftl: Ftl<M>) -> Self::Output {
        ftl.record_writes();
        let progress = self.progress;
        let mut first_pass = |p: Progress| {
            progress(Progress {
                phase: "ideal placement, first pass: lifetimes",
                ..p
            })
        };
        run_on(self.config, &mut ftl, &mut first_pass, &mut |_, _| {})?;
        let logical = ftl.geometry().logical_pages;
        Ok(ftlab_core::ftl::lifetimes_from_log(
            &ftl.take_write_log(),
            logical,
        ))
    }
}

/// Issues `count` requests from `next` with `queue_depth` outstanding, starting at `start_ns`;
/// returns when the last completes. Used for preconditioning (nothing is recorded).
fn drive_closed<M: MappingTable>(
    ftl: &mut Ftl<M>,
    count: u64,
    queue_depth: u32,
    start_ns: u64,
    mut next: impl FnMut(u64) -> Request,
    phase: &str,
    progress: &mut dyn FnMut(Progress),
) -> u64 {
    let mut outstanding: BinaryHeap<Reverse<u64>> =
        (0..queue_depth).map(|_| Reverse(start_ns)).collect();
    let mut end_ns = start_ns;
    // Two requests of lookahead, as in the measured phase, so the FTL can prefetch.
    let mut upcoming = (count > 0).then(|| next(0));
    let mut after = (count > 1).then(|| next(1));
    for i in 0..count {
        let mut slot = outstanding.peek_mut().expect("queue depth >= 1");
        let request = upcoming.take().expect("one request per step");
        upcoming = after.take();
        after = (i + 2 < count).then(|| next(i + 2));
        ftl.prefetch_ahead(upcoming.as_ref(), after.as_ref());
        let done = ftl
            .submit(&request, slot.0)
            .expect("preconditioning stays within the device");
        end_ns = end_ns.max(done);
        *slot = Reverse(done);
        drop(slot);
        if i % PROGRESS_EVERY == 0 {
            progress(Progress {
                phase,
                done: i,
                total: Some(count),
            });
        }
    }
    end_ns
}

fn precondition<M: MappingTable>(
    ftl: &mut Ftl<M>,
    config: &Config,
    progress: &mut dyn FnMut(Progress),
) -> u64 {
    let geometry = ftl.geometry().clone();
    let page = u64::from(geometry.page_size_bytes);
    // The filled share, in whole pages (all of it by default).
    let fill = config.workload.precondition_fill;
    let logical = if fill >= 1.0 {
        geometry.logical_bytes()
    } else {
        ((geometry.logical_pages as f64 * fill) as u64).max(1) * page
    };
    // Sequential fill in 128 KiB requests (the FTL splits them into pages).
    let chunk = (128 * 1024u64).max(page).min(logical);
    let fill_requests = logical.div_ceil(chunk);
    let qd = config.workload.queue_depth.max(32);
    let mut t = drive_closed(
        ftl,
        fill_requests,
        qd,
        0,
        |i| {
            let offset = i * chunk;
            Request {
                arrival_ns: 0,
                op: Op::Write,
                offset_bytes: offset,
                length_bytes: chunk.min(logical - offset),
                placement: ftlab_core::request::Placement::default(),
            }
        },
        "precondition: sequential fill",
        progress,
    );
    let random_pages =
        (config.workload.precondition_overwrites * (logical / page) as f64).round() as u64;
    // A seed of its own, so the measured workload's sequence does not depend on this phase.
    let mut writer =
        Generator::uniform_writer(config.workload.seed ^ 0x005E_ED0F_F111, logical, page);
    t = drive_closed(
        ftl,
        random_pages,
        qd,
        t,
        |_| writer.next_request(),
        "precondition: random overwrite",
        progress,
    );
    ftl.flush(t).max(ftl.timing().horizon_ns())
}

/// `run`'s generic half, for the FTL `ConfiguredFtl` built.
struct Simulate<'a, 'p> {
    config: &'a Config,
    progress: &'p mut dyn FnMut(Progress),
    /// Ideal placement's lifetimes, from the first pass.
    lifetimes: Option<Vec<u64>>,
    observe: &'p mut dyn FnMut(&Request, u64),
}

impl FtlVisitor for Simulate<'_, '_> {
    type Output = Result<Report, SimError>;
    fn visit<M: MappingTable>(self, mut ftl: Ftl<M>) -> Self::Output {
        if let Some(lifetimes) = self.lifetimes {
            ftl.use_lifetimes(lifetimes);
        }
        run_on(self.config, &mut ftl, self.progress, self.observe)
    }
}

/// Runs the configured simulation on a given FTL (any mapping table: `ftlab mapbench` runs it on
/// one that records its updates).
pub fn run_with<M: MappingTable>(
    config: &Config,
    mut ftl: Ftl<M>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Report, SimError> {
    run_on(config, &mut ftl, progress, &mut |_, _| {})
}

fn run_on<M: MappingTable>(
    config: &Config,
    ftl: &mut Ftl<M>,
    progress: &mut dyn FnMut(Progress),
    observe: &mut dyn FnMut(&Request, u64),
) -> Result<Report, SimError> {
    let geometry = ftl.geometry().clone();
    let w = &config.workload;
    if w.power_cut_at_ns.is_some() {
        // The check after the cut compares the durable copy with the table.
        ftl.keep_durable_copy();
    }
    let mut start_ns = 0;
    if w.precondition {
        start_ns = precondition(ftl, config, progress);
    }
    ftl.reset_stats();

    let ranges = match &w.placement_ranges {
        Some(path) => Some(PlacementRanges::load(Path::new(path))?),
        None => None,
    };
    let (requests, total, open_loop) = match &w.trace {
        Some(path) => {
            let reader = TraceReader::open(Path::new(path), w.format, w.skip_bad_lines)?;
            (
                Requests::Trace(Box::new(reader)),
                None,
                w.replay == ftlab_core::config::Replay::Open,
            )
        }
        None => {
            let generator =
                Generator::new(w, geometry.logical_bytes()).map_err(SimError::Workload)?;
            let overwrite_bytes = |o: f64| (o * geometry.logical_bytes() as f64) as u64;
            let (requests, write_bytes_left) = match (w.requests, w.overwrites) {
                (Some(r), _) => (r, None),
                (None, Some(o)) if generator.counts_bytes() => (u64::MAX, Some(overwrite_bytes(o))),
                (None, Some(o)) => (
                    ((o * geometry.logical_bytes() as f64) / generator.request_size_bytes() as f64)
                        .round() as u64,
                    None,
                ),
                (None, None) => (1_000_000, None),
            };
            (
                Requests::Generator {
                    generator,
                    remaining: requests,
                    write_bytes_left,
                },
                (requests != u64::MAX).then_some(requests),
                false,
            )
        }
    };
    let mut source = Source { requests, ranges };

    let mut recorder = Recorder::new(config.report.series_interval_ns, start_ns);
    let mut outstanding: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    if !open_loop {
        outstanding.extend((0..w.queue_depth).map(|_| Reverse(start_ns)));
    }
    let capacity = geometry.logical_bytes();
    let wall = Instant::now();
    let mut done: u64 = 0;
    let mut end_ns = start_ns;
    // Two requests of lookahead let the FTL prefetch the cache lines they will touch.
    let mut upcoming = source.next()?;
    let mut after = source.next()?;
    let cut_ns = w.power_cut_at_ns.map(|at| start_ns.saturating_add(at));
    while let Some(request) = upcoming {
        upcoming = after;
        after = source.next()?;
        ftl.prefetch_ahead(upcoming.as_ref(), after.as_ref());
        let arrival_ns = if open_loop {
            // Bounded: trace spans are < 2^60 ns and time_scale <= 1000.
            start_ns.saturating_add((request.arrival_ns as f64 * w.time_scale) as u64)
        } else {
            // The earliest completion frees a slot; its entry is replaced below (one sift).
            outstanding.peek().expect("queue depth >= 1").0
        };
        if cut_ns.is_some_and(|cut| arrival_ns >= cut) {
            break;
        }
        recorder.advance(arrival_ns, ftl);
        observe(&request, arrival_ns - start_ns);
        let end = request.offset_bytes.saturating_add(request.length_bytes);
        let completion_ns = if request.op != Op::Flush && end > capacity && w.wrap {
            // Fold every page into the device: the request is cut where it crosses the end, and one
            // longer than the whole device covers it once.
            let mut done_ns = arrival_ns;
            let (mut offset, mut remaining) =
                (request.offset_bytes, request.length_bytes.min(capacity));
            while remaining > 0 {
                let start = offset % capacity;
                let length = remaining.min(capacity - start);
                let piece = Request {
                    offset_bytes: start,
                    length_bytes: length,
                    ..request
                };
                done_ns = done_ns.max(submit(ftl, &piece, arrival_ns, &source)?);
                offset += length;
                remaining -= length;
            }
            done_ns
        } else {
            submit(ftl, &request, arrival_ns, &source)?
        };
        if !open_loop {
            *outstanding.peek_mut().expect("queue depth >= 1") = Reverse(completion_ns);
        }
        end_ns = end_ns.max(completion_ns);
        recorder.record(&request, arrival_ns, completion_ns);
        done += 1;
        if done.is_multiple_of(PROGRESS_EVERY) {
            progress(Progress {
                phase: "simulate",
                done,
                total,
            });
        }
    }
    // The run ends with a flush: buffered data reaches flash and is counted; or with a power
    // cut, which programs the same on capacitor power, and the translation pages too.
    let power_cut = match cut_ns {
        Some(cut) => {
            // Every request that arrived before the cut was acknowledged (the model commits a
            // request as it is submitted): the capacitors start once the last has completed.
            let from_ns = cut.max(end_ns);
            let c = ftl.power_cut(from_ns);
            end_ns = end_ns.max(c.done_ns);
            Some(PowerCutInfo::check(
                ftl,
                cut - start_ns,
                c.done_ns - from_ns,
                c,
            ))
        }
        None => {
            end_ns = end_ns.max(ftl.flush(end_ns));
            None
        }
    };
    let wall_seconds = wall.elapsed().as_secs_f64();
    recorder.finish(end_ns, ftl);
    let trace = match &source.requests {
        Requests::Trace(r) => Some(TraceInfo {
            path: r.path().display().to_string(),
            format: r.format().name().to_string(),
            requests: r.requests,
            bad_lines_skipped: r.bad_lines(),
        }),
        Requests::Generator { .. } => None,
    };
    let mut report = Report::build(config, ftl, recorder, start_ns, end_ns, trace, wall_seconds);
    report.power_cut = power_cut;
    Ok(report)
}

impl PowerCutInfo {
    /// What the cut `c` at `at_ns` (into the measured phase) flushed in `flush_ns`, and the durable state
    /// checked entry by entry against the table (which holds every acknowledged write).
    fn check<M: MappingTable>(
        ftl: &Ftl<M>,
        at_ns: u64,
        flush_ns: u64,
        c: ftlab_core::ftl::PowerCut,
    ) -> Self {
        let logical = ftl.geometry().logical_pages;
        let (mut checked, mut wrong) = (0u64, 0u64);
        if let Some(t) = ftl.translation() {
            for lpn in (0..logical as u32).map(ftlab_core::addr::Lpn::new) {
                let durable = t.durable(lpn).expect("kept for the cut");
                let table = ftl.lookup(lpn).map_or(u32::MAX, |p| p.get());
                checked += 1;
                wrong += u64::from(durable != table);
            }
        }
        PowerCutInfo {
            at_ns,
            buffered_pages: c.buffered_pages,
            dirty_translation_pages: c.dirty_translation_pages,
            flush_ns,
            lpns_checked: checked,
            lpns_not_durable: wrong,
        }
    }
}

#[inline]
fn submit<M: MappingTable>(
    ftl: &mut Ftl<M>,
    request: &Request,
    now_ns: u64,
    source: &Source,
) -> Result<u64, SimError> {
    ftl.submit(request, now_ns).map_err(|e| match e {
        FtlError::OutOfRange { .. } => SimError::OutOfRange {
            location: source.location(),
            cause: e,
        },
        other => SimError::Request {
            location: source.location(),
            cause: other,
        },
    })
}
