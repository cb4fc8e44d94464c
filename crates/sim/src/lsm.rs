//! The LSM workload (`workload.kind = "lsm"`): a leveled LSM store (RocksDB, Pebble) seen from
//! the block device, file by file, on a filesystem that allocates extents and discards freed
//! ones.
//!
//! The model, per memtable of `lsm_memtable_bytes`:
//! 1. WAL appends of `request_size_bytes` fill a WAL file as large as the memtable;
//! 2. meanwhile, in the background, the previous memtable is flushed as an L0 SST and its WAL
//!    deleted (trimmed);
//! 3. with `lsm_l0_files` L0 files, all of them and all of Lbase are merged into Lbase;
//! 4. while a level Li (i >= 1, not the last) holds more than its target, one of its SSTs (round
//!    robin) is merged with the Li+1 SSTs its key range overlaps (Li+1's size x the SST's share
//!    of Li) into Li+1.
//!
//! The background jobs (flush, compactions) run concurrently with the WAL appends and with each
//! other: their requests are interleaved a request at a time, spread over the memtable's
//! appends so that they finish as it fills (the store's background threads keep up). This
//! interleaving is what puts short-lived and long-lived data in the same erase unit of a
//! device without placement.
//!
//! Keys are uniform over `lsm_key_space_bytes`, so a merge into level L drops the share of the
//! incoming bytes whose keys L already holds (L's size over the key space): the last level
//! converges to the key space, and the level targets are the key space divided by the fanout
//! per level up, down to the first level above L0 whose target exceeds `lsm_l0_files`
//! memtables (Lbase, as RocksDB's dynamic level sizes). Compactions read their inputs, write
//! their outputs as SSTs of at most `lsm_sst_bytes`, then delete the inputs. It starts as after
//! `mkfs` (a discard of the whole span) and a bulk load of the key space into the last level.
//!
//! Each write carries the tier of the FDP Ethereum Benchmark as its placement handle (capped at
//! the device's last handle): 0 WAL, 1 flush, 2 L0 -> Lbase, 3 into a middle level, 4 into the
//! last level; or handle 0 for all (`lsm_placement = "one"`, the baseline).
//!
//! Not modelled: filesystem metadata and journal writes, key skew, the memtable's own
//! deduplication, compression, and the CPU: requests are issued as the device completes them.

use ftlab_core::config::{ConfigError, LsmPlacement, WorkloadConfig};
use ftlab_core::request::{Op, Placement, Request};
use std::collections::{BTreeMap, VecDeque};

/// SST reads and writes go to the device in requests of at most this size.
const SST_IO_BYTES: u64 = 1 << 20;
/// Extents are allocated in units of this many bytes (a filesystem block).
const BLOCK_BYTES: u64 = 4096;

/// Where a write comes from: the FDP Ethereum Benchmark's tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Tier {
    Wal = 0,
    Flush = 1,
    L0Compaction = 2,
    MidCompaction = 3,
    DeepCompaction = 4,
}

/// A file and the extents it occupies.
#[derive(Clone, Debug)]
struct File {
    size_bytes: u64,
    extents: Vec<(u64, u64)>,
    /// The background job that writes it (0: written before any job).
    written_by: u64,
}

/// A background job's requests in order, and the jobs whose files it reads.
#[derive(Clone, Debug)]
struct Job {
    id: u64,
    requests: VecDeque<Request>,
    waits_for: Vec<u64>,
}

/// First-fit extent allocation over the span, as a filesystem hands out free space from its
/// lowest free block (`BLOCK_BYTES` granularity).
#[derive(Clone, Debug)]
struct Extents {
    /// Free extents, start -> length.
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
}

impl Extents {
    fn new(span_bytes: u64) -> Self {
        Self {
            free: BTreeMap::from([(0, span_bytes)]),
            free_bytes: span_bytes,
        }
    }

    /// Extents for `size_bytes` (rounded up to a block), lowest free first; None if the span
    /// has not that much free.
    fn allocate(&mut self, size_bytes: u64) -> Option<Vec<(u64, u64)>> {
        let mut need = size_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        if need > self.free_bytes {
            return None;
        }
        self.free_bytes -= need;
        let mut got = Vec::new();
        while need > 0 {
            let (&start, &len) = self.free.iter().next().expect("free bytes counted");
            self.free.remove(&start);
            let take = len.min(need);
            got.push((start, take));
            if take < len {
                self.free.insert(start + take, len - take);
            }
            need -= take;
        }
        Some(got)
    }

    /// Returns extents to the free space, merging neighbours.
    fn release(&mut self, extents: &[(u64, u64)]) {
        for &(start, len) in extents {
            self.free_bytes += len;
            let (mut start, mut len) = (start, len);
            if let Some((&before, &blen)) = self.free.range(..start).next_back() {
                if before + blen == start {
                    self.free.remove(&before);
                    start = before;
                    len += blen;
                }
            }
            if let Some(&after_len) = self.free.get(&(start + len)) {
                self.free.remove(&(start + len));
                len += after_len;
            }
            self.free.insert(start, len);
        }
    }
}

/// The generator's state.
pub struct Lsm {
    span_bytes: u64,
    key_space_bytes: u64,
    memtable_bytes: u64,
    l0_files: usize,
    sst_bytes: u64,
    wal_append_bytes: u64,
    placement: LsmPlacement,
    /// Level 0 first; the last is the deepest.
    levels: Vec<VecDeque<File>>,
    /// Target bytes of levels 1.. (index 0 unused).
    targets: Vec<u64>,
    fs: Extents,
    /// Requests ready for the device, in order.
    out: VecDeque<Request>,
    /// Background jobs (flushes, compactions) not yet finished.
    jobs: VecDeque<Job>,
    next_job: u64,
    /// The WAL of the memtable being filled, deleted once it is flushed.
    previous_wal: Option<File>,
    started: bool,
    /// Counts for the report's reader (and tests).
    pub stats: LsmStats,
}

/// What the LSM did, in files and bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LsmStats {
    pub flushes: u64,
    pub compactions: u64,
    /// Bytes written per tier (WAL, flush, L0, mid, deep).
    pub written_bytes: [u64; 5],
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// The level targets for `key_space` (index 0 unused; the last is the key space).
fn level_targets(key_space: u64, fanout: u64, base_bytes: u64) -> Vec<u64> {
    let mut from_bottom = vec![key_space];
    while let Some(&t) = from_bottom.last() {
        let up = t / fanout;
        if up <= base_bytes || from_bottom.len() == 8 {
            break;
        }
        from_bottom.push(up);
    }
    let mut targets = vec![0];
    targets.extend(from_bottom.into_iter().rev());
    targets
}

impl Lsm {
    pub fn new(w: &WorkloadConfig, span_bytes: u64) -> Result<Self, ConfigError> {
        let key_space_bytes = if w.lsm_key_space_bytes == 0 {
            span_bytes / 10 * 4
        } else {
            w.lsm_key_space_bytes
        };
        if w.lsm_memtable_bytes < 1 << 20 {
            return Err(invalid(
                "workload.lsm_memtable_bytes",
                "must be at least 1 MiB",
            ));
        }
        if w.lsm_sst_bytes < 1 << 20 {
            return Err(invalid("workload.lsm_sst_bytes", "must be at least 1 MiB"));
        }
        if !(2..=100).contains(&w.lsm_fanout) {
            return Err(invalid("workload.lsm_fanout", "must be in 2..=100"));
        }
        if !(1..=64).contains(&w.lsm_l0_files) {
            return Err(invalid("workload.lsm_l0_files", "must be in 1..=64"));
        }
        if w.request_size_bytes > w.lsm_memtable_bytes {
            return Err(invalid(
                "workload.request_size_bytes",
                "an LSM's WAL appends must be smaller than its memtable",
            ));
        }
        let fanout = u64::from(w.lsm_fanout);
        let l0 = u64::from(w.lsm_l0_files);
        let base_bytes = l0 * w.lsm_memtable_bytes;
        let targets = level_targets(key_space_bytes, fanout, base_bytes);
        // The most the files can take at once: every level a file over its target, L0 full
        // and one more flushed, the WAL, and the largest compaction's output beside its inputs.
        let levels: u64 = targets.iter().map(|t| t + w.lsm_sst_bytes).sum();
        let l0_bytes = (l0 + 1) * w.lsm_memtable_bytes;
        let biggest_merge =
            (targets[1] + l0_bytes).max((fanout + 2) * w.lsm_sst_bytes) + w.lsm_sst_bytes;
        let footprint = levels + l0_bytes + w.lsm_memtable_bytes + biggest_merge;
        if footprint > span_bytes {
            return Err(invalid(
                "workload.lsm_key_space_bytes",
                format!(
                    "the LSM's files may need {footprint} bytes (key space {key_space_bytes}, levels {:?}, L0, WAL and a compaction's output), more than the {span_bytes}-byte span: lower the key space or the memtable and SST sizes",
                    &targets[1..]
                ),
            ));
        }
        Ok(Self {
            span_bytes,
            key_space_bytes,
            memtable_bytes: w.lsm_memtable_bytes,
            l0_files: w.lsm_l0_files as usize,
            sst_bytes: w.lsm_sst_bytes,
            wal_append_bytes: w.request_size_bytes,
            placement: w.lsm_placement,
            levels: vec![VecDeque::new(); targets.len()],
            targets,
            fs: Extents::new(span_bytes),
            out: VecDeque::new(),
            jobs: VecDeque::new(),
            next_job: 1,
            previous_wal: None,
            started: false,
            stats: LsmStats::default(),
        })
    }

    /// The level targets, Lbase first.
    pub fn level_targets(&self) -> &[u64] {
        &self.targets[1..]
    }

    pub fn level_bytes(&self, level: usize) -> u64 {
        self.levels[level].iter().map(|f| f.size_bytes).sum()
    }

    pub fn next_request(&mut self) -> Request {
        loop {
            if let Some(r) = self.out.pop_front() {
                return r;
            }
            if !self.started {
                self.start();
            } else {
                self.memtable_cycle();
            }
        }
    }

    fn placement(&self, tier: Tier) -> Placement {
        match self.placement {
            LsmPlacement::Tiers => Placement::handle(tier as u8),
            LsmPlacement::One => Placement::default(),
        }
    }

    /// mkfs's discard, then the key space bulk-loaded into the last level.
    fn start(&mut self) {
        self.started = true;
        self.out
            .push_back(Request::new(0, Op::Trim, 0, self.span_bytes));
        let last = self.levels.len() - 1;
        let mut left = self.key_space_bytes;
        let mut load = self.new_job();
        while left > 0 {
            let size = left.min(self.sst_bytes);
            let file = self.create(&mut load, size, Tier::DeepCompaction);
            self.levels[last].push_back(file);
            left -= size;
        }
        self.out.extend(load.requests);
    }

    /// Moves a request to the device's queue; a trim frees its extent for new files from now
    /// on (never sooner: a new file's writes must reach the device after the old one's trim).
    fn emit(&mut self, r: Request) {
        if r.op == Op::Trim {
            self.fs.release(&[(r.offset_bytes, r.length_bytes)]);
        }
        self.out.push_back(r);
    }

    /// Extents for a new file; when the span is full, the oldest background job is finished
    /// first (its trims free space), as a store waits for its compactions.
    fn allocate(&mut self, size_bytes: u64) -> Vec<(u64, u64)> {
        loop {
            if let Some(extents) = self.fs.allocate(size_bytes) {
                return extents;
            }
            // The oldest job waits for no other.
            let job = self
                .jobs
                .pop_front()
                .expect("the footprint check at construction keeps the files within the span");
            for r in job.requests {
                self.emit(r);
            }
        }
    }

    /// A new file of `size_bytes` (rounded up to whole blocks, as the filesystem stores it),
    /// its writes (in SST-sized requests) added to `job`.
    fn create(&mut self, job: &mut Job, size_bytes: u64, tier: Tier) -> File {
        let size_bytes = size_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let extents = self.allocate(size_bytes);
        let placement = self.placement(tier);
        for &(start, len) in &extents {
            for (at, n) in chunks(len, SST_IO_BYTES) {
                let mut r = Request::new(0, Op::Write, start + at, n);
                r.placement = placement;
                job.requests.push_back(r);
            }
        }
        self.stats.written_bytes[tier as usize] += size_bytes;
        File {
            size_bytes,
            extents,
            written_by: job.id,
        }
    }

    fn new_job(&mut self) -> Job {
        self.next_job += 1;
        Job {
            id: self.next_job - 1,
            requests: VecDeque::new(),
            waits_for: Vec::new(),
        }
    }

    /// Reads a file: after the job that writes it, if that has not finished.
    fn read(&self, job: &mut Job, file: &File) {
        if self.jobs.iter().any(|j| j.id == file.written_by) {
            job.waits_for.push(file.written_by);
        }
        for &(start, len) in &file.extents {
            for (at, n) in chunks(len, SST_IO_BYTES) {
                job.requests
                    .push_back(Request::new(0, Op::Read, start + at, n));
            }
        }
    }

    /// Deletes a file: its extents are discarded (and freed as the trims are issued).
    fn delete(job: &mut Job, file: File) {
        for &(start, len) in &file.extents {
            job.requests
                .push_back(Request::new(0, Op::Trim, start, len));
        }
    }

    /// One memtable's worth of WAL appends, and meanwhile the background jobs: the flush of the
    /// memtable the last cycle filled (then its WAL's deletion) and the compactions that flush
    /// makes due, round robin a request at a time, spread so that they finish with the WAL
    /// (the store's background threads keep up with its writers).
    fn memtable_cycle(&mut self) {
        if let Some(wal) = self.previous_wal.take() {
            let mut flush = self.new_job();
            let l0 = self.create(&mut flush, self.memtable_bytes, Tier::Flush);
            Self::delete(&mut flush, wal);
            self.jobs.push_back(flush);
            self.levels[0].push_back(l0);
            self.stats.flushes += 1;
            if self.levels[0].len() >= self.l0_files {
                self.compact_l0();
            }
            // Level by level, top down, while one is over its target.
            for level in 1..self.levels.len() - 1 {
                while self.level_bytes(level) > self.targets[level] {
                    self.compact_down(level);
                }
            }
        }
        let wal = File {
            size_bytes: self.memtable_bytes,
            extents: self.allocate(self.memtable_bytes),
            written_by: 0,
        };
        let wal_placement = self.placement(Tier::Wal);
        let mut appends = VecDeque::new();
        for &(start, len) in &wal.extents {
            for (at, n) in chunks(len, self.wal_append_bytes) {
                let mut r = Request::new(0, Op::Write, start + at, n);
                r.placement = wal_placement;
                appends.push_back(r);
            }
        }
        self.stats.written_bytes[Tier::Wal as usize] += self.memtable_bytes;
        let mut background: usize = self.jobs.iter().map(|j| j.requests.len()).sum();
        while let Some(append) = appends.pop_front() {
            self.emit(append);
            // This append's share of what the background still has to do.
            let share = background.div_ceil(appends.len() + 1);
            for _ in 0..share {
                if self.step_background() {
                    background -= 1;
                }
            }
        }
        debug_assert!(self.jobs.is_empty());
        self.previous_wal = Some(wal);
    }

    /// Issues one request of the first job (round robin) that waits for no unfinished job;
    /// false when there is none left.
    fn step_background(&mut self) -> bool {
        for _ in 0..self.jobs.len() {
            let mut job = self.jobs.pop_front().expect("counted");
            let ready = job
                .waits_for
                .iter()
                .all(|id| !self.jobs.iter().any(|j| j.id == *id));
            if !ready {
                self.jobs.push_back(job);
                continue;
            }
            let r = job.requests.pop_front();
            if !job.requests.is_empty() {
                self.jobs.push_back(job);
            }
            if let Some(r) = r {
                self.emit(r);
                return true;
            }
        }
        false
    }

    /// Bytes of `incoming` that survive a merge into `level`: those whose keys it does not hold.
    fn surviving(&self, incoming: u64, level: usize) -> u64 {
        let held = self.level_bytes(level).min(self.key_space_bytes);
        let kept = incoming as f64 * (1.0 - held as f64 / self.key_space_bytes as f64);
        kept as u64
    }

    fn tier_into(&self, level: usize, from_l0: bool) -> Tier {
        if from_l0 {
            Tier::L0Compaction
        } else if level == self.levels.len() - 1 {
            Tier::DeepCompaction
        } else {
            Tier::MidCompaction
        }
    }

    /// All of L0 and all of Lbase into Lbase (L0 files overlap every key).
    fn compact_l0(&mut self) {
        let inputs: Vec<File> = self.levels[0].drain(..).collect();
        let incoming: u64 = inputs.iter().map(|f| f.size_bytes).sum();
        let survivors = self.surviving(incoming, 1);
        let overlap: Vec<File> = self.levels[1].drain(..).collect();
        let kept: u64 = overlap.iter().map(|f| f.size_bytes).sum();
        self.merge(inputs, overlap, kept + survivors, 1, true);
    }

    /// One SST of `level` (the oldest) and the `level + 1` SSTs its keys overlap, into
    /// `level + 1`.
    fn compact_down(&mut self, level: usize) {
        let file = self.levels[level]
            .pop_front()
            .expect("an over-target level has a file");
        let level_bytes = self.level_bytes(level) + file.size_bytes;
        let below = self.level_bytes(level + 1);
        let survivors = self.surviving(file.size_bytes, level + 1);
        // The overlapped share of the level below: this file's share of its level.
        let overlap_bytes =
            (below as f64 * file.size_bytes as f64 / level_bytes.max(1) as f64) as u64;
        let mut overlap = Vec::new();
        let mut taken = 0;
        while taken < overlap_bytes {
            match self.levels[level + 1].pop_front() {
                Some(f) => {
                    taken += f.size_bytes;
                    overlap.push(f);
                }
                None => break,
            }
        }
        self.merge(vec![file], overlap, taken + survivors, level + 1, false);
    }

    /// A compaction job: read the inputs, write `out_bytes` as SSTs of `into` (at its end:
    /// round robin), then delete the inputs.
    fn merge(
        &mut self,
        inputs: Vec<File>,
        overlap: Vec<File>,
        out_bytes: u64,
        into: usize,
        from_l0: bool,
    ) {
        self.stats.compactions += 1;
        let mut job = self.new_job();
        for f in inputs.iter().chain(&overlap) {
            self.read(&mut job, f);
        }
        let tier = self.tier_into(into, from_l0);
        let mut left = out_bytes;
        while left > 0 {
            let size = left.min(self.sst_bytes);
            let file = self.create(&mut job, size, tier);
            self.levels[into].push_back(file);
            left -= size;
        }
        for f in inputs.into_iter().chain(overlap) {
            Self::delete(&mut job, f);
        }
        self.jobs.push_back(job);
    }
}

/// `(offset, length)` pieces of at most `max` covering `0..len`.
fn chunks(len: u64, max: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..len.div_ceil(max)).map(move |i| (i * max, max.min(len - i * max)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ftlab_core::config::ConfigBuilder;

    fn workload(sets: &[&str]) -> WorkloadConfig {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        b.set("workload.kind=lsm").unwrap();
        for s in sets {
            b.set(s).unwrap();
        }
        b.build().unwrap().workload
    }

    #[test]
    fn extents_are_first_fit_and_merge_when_freed() {
        let mut fs = Extents::new(1 << 20);
        let a = fs.allocate(8192).unwrap();
        let b = fs.allocate(5000).unwrap();
        assert_eq!(a, vec![(0, 8192)]);
        assert_eq!(b, vec![(8192, 8192)], "rounded up to blocks");
        fs.release(&a);
        // The hole at 0 is reused first, then the rest continues after b.
        assert_eq!(fs.allocate(12288).unwrap(), vec![(0, 8192), (16384, 4096)]);
        fs.release(&b);
        assert!(fs.allocate(2 << 20).is_none());
        assert_eq!(fs.free_bytes, (1 << 20) - 8192 - 4096);
    }

    #[test]
    fn level_targets_shrink_by_the_fanout_down_to_lbase() {
        assert_eq!(level_targets(10_000, 10, 64), vec![0, 100, 1000, 10_000]);
        assert_eq!(level_targets(10_000, 10, 100), vec![0, 1000, 10_000]);
    }

    /// Over many memtables: the levels stay near their targets, the last near the key space;
    /// every write is tagged with its tier; the files never overlap and never leave the span;
    /// and what is written and trimmed matches the files that exist.
    #[test]
    fn the_lsm_keeps_its_shape_and_its_books() {
        let span = 2u64 << 30;
        let key_space = 512u64 << 20;
        let w = workload(&[
            "workload.lsm_memtable_bytes=1048576",
            "workload.lsm_sst_bytes=1048576",
            &format!("workload.lsm_key_space_bytes={key_space}"),
        ]);
        let mut lsm = Lsm::new(&w, span).unwrap();
        // Lbase, a middle level, the last.
        assert_eq!(lsm.level_targets().len(), 3, "{:?}", lsm.level_targets());
        // A map of which 4 KiB blocks hold file data, from the requests alone.
        let mut live = vec![false; (span / 4096) as usize];
        let mut tiers = [0u64; 5];
        let mut writes = 0u64;
        let mut drained = false;
        while !drained {
            let r = match lsm.out.pop_front() {
                Some(r) => r,
                None if lsm.stats.flushes < 1000 => lsm.next_request(),
                None => {
                    drained = true;
                    continue;
                }
            };
            assert!(r.offset_bytes + r.length_bytes <= span);
            let blocks = r.offset_bytes / 4096..(r.offset_bytes + r.length_bytes).div_ceil(4096);
            match r.op {
                Op::Write => {
                    writes += r.length_bytes;
                    tiers[usize::from(r.placement.handle)] += r.length_bytes;
                    for b in blocks {
                        live[b as usize] = true;
                    }
                }
                Op::Trim => {
                    for b in blocks {
                        live[b as usize] = false;
                    }
                }
                Op::Read => {
                    for b in blocks {
                        assert!(live[b as usize], "a read of a block no file holds");
                    }
                }
                Op::Flush => {}
            }
        }
        assert_eq!(tiers, lsm.stats.written_bytes);
        assert_eq!(writes, lsm.stats.written_bytes.iter().sum::<u64>());
        assert!(tiers.iter().all(|&t| t > 0), "every tier wrote: {tiers:?}");
        // The queue drained: the live blocks are exactly the files' (old WALs deleted).
        // The files, and the WAL of the memtable being filled.
        let files: u64 = (0..lsm.levels.len())
            .map(|l| lsm.level_bytes(l))
            .sum::<u64>()
            + lsm.previous_wal.as_ref().map_or(0, |w| w.size_bytes);
        let live_bytes = live.iter().filter(|&&b| b).count() as u64 * 4096;
        assert_eq!(live_bytes, files);
        assert_eq!(lsm.fs.free_bytes, span - files);
        let last = lsm.levels.len() - 1;
        let deepest = lsm.level_bytes(last) as f64 / key_space as f64;
        assert!(
            (0.95..=1.05).contains(&deepest),
            "last level {deepest} of the key space"
        );
        for level in 1..last {
            assert!(lsm.level_bytes(level) <= lsm.targets[level]);
        }
        // L0 -> Lbase rewrote Lbase; each deeper merge about the fanout: the LSM's own write
        // amplification (bytes written per WAL byte) is well above one.
        let amplification = writes as f64 / tiers[0] as f64;
        assert!(amplification > 4.0, "{amplification}");
    }

    #[test]
    fn a_key_space_too_large_for_the_span_is_refused() {
        let w = workload(&["workload.lsm_key_space_bytes=1073741824"]);
        let e = Lsm::new(&w, 1 << 30).err().unwrap().to_string();
        assert!(e.contains("workload.lsm_key_space_bytes"), "{e}");
    }

    /// The baseline puts every write on handle 0.
    #[test]
    fn one_placement_tags_everything_zero() {
        let w = workload(&[
            "workload.lsm_placement=\"one\"",
            "workload.lsm_memtable_bytes=1048576",
            "workload.lsm_sst_bytes=1048576",
        ]);
        let mut lsm = Lsm::new(&w, 1 << 30).unwrap();
        for _ in 0..20_000 {
            assert_eq!(lsm.next_request().placement, Placement::default());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

        /// Any parameters the generator accepts, seen from the device: a write never lands on a
        /// block a live file holds (a new file gets free extents only, freed by trims already
        /// issued), a read only on one, nothing leaves the span, and after the run the live
        /// blocks are exactly the files and the WAL.
        #[test]
        fn no_file_overwrites_another_and_reads_read_files(
            memtable_mib in 1u64..4, sst_mib in 1u64..4, fanout in 2u32..12, l0 in 1u32..6,
            key_space_mib in 16u64..160, wal_kib in 1u64..64,
        ) {
            let span = 512u64 << 20;
            let w = workload(&[
                &format!("workload.lsm_memtable_bytes={}", memtable_mib << 20),
                &format!("workload.lsm_sst_bytes={}", sst_mib << 20),
                &format!("workload.lsm_fanout={fanout}"),
                &format!("workload.lsm_l0_files={l0}"),
                &format!("workload.lsm_key_space_bytes={}", key_space_mib << 20),
                &format!("workload.request_size_bytes={}", wal_kib * 1024),
            ]);
            let Ok(mut lsm) = Lsm::new(&w, span) else { return Ok(()) };
            let mut live = vec![false; (span / 4096) as usize];
            let mut first_trim = true;
            while lsm.stats.flushes < 60 || !lsm.out.is_empty() {
                let r = lsm.next_request();
                proptest::prop_assert!(r.offset_bytes + r.length_bytes <= span);
                let blocks = r.offset_bytes / 4096..(r.offset_bytes + r.length_bytes).div_ceil(4096);
                match r.op {
                    Op::Write => for b in blocks {
                        // A WAL append continues a block it wrote itself only at a block's
                        // start; appends are whole blocks here (sizes in KiB multiples of 4
                        // are not required, so only the first touch of a block is checked).
                        if r.offset_bytes % 4096 == 0 || b > r.offset_bytes / 4096 {
                            proptest::prop_assert!(!live[b as usize], "write over live block {}", b);
                        }
                        live[b as usize] = true;
                    },
                    Op::Trim => {
                        if !first_trim {
                            for b in blocks.clone() {
                                proptest::prop_assert!(live[b as usize], "trim of a free block {}", b);
                            }
                        }
                        first_trim = false;
                        for b in blocks { live[b as usize] = false; }
                    }
                    Op::Read => for b in blocks {
                        proptest::prop_assert!(live[b as usize], "read of a free block {}", b);
                    },
                    Op::Flush => {}
                }
            }
            let files: u64 = (0..lsm.levels.len()).map(|l| lsm.level_bytes(l)).sum::<u64>()
                + lsm.previous_wal.as_ref().map_or(0, |w| w.size_bytes.div_ceil(4096) * 4096);
            let live_bytes = live.iter().filter(|&&b| b).count() as u64 * 4096;
            proptest::prop_assert_eq!(live_bytes, files);
        }
    }
}
