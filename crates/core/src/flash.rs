//! NAND timing: one timeline per die and per channel, in simulated nanoseconds.
//!
//! Operations are scheduled eagerly in the order the FTL issues them (as FEMU does): each starts
//! when its inputs are ready and the die (and, for transfers, the channel) is free, and returns its
//! completion time. Nothing here reads a clock.
//!
//! The FTL issues every operation through one function (`Ftl::flash`) as a [`FlashOp`] tagged
//! with its [`Cause`] and placement, and counts it there in [`FlashCounts`]: the report's
//! host/GC/mapping page counts and the per-placement counts FDP statistics need are all read
//! from that one record.

use crate::addr::Ppn;
use crate::config::FlashConfig;
use crate::geometry::Geometry;

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub struct FlashTiming {
    read_latency_ns: u64,
    program_latency_ns: u64,
    erase_latency_ns: u64,
    /// Time one page takes on the channel bus.
    transfer_ns: u64,
    channels: u32,
    die_free_ns: Vec<u64>,
    channel_free_ns: Vec<u64>,
    /// Busy time per die, for utilisation figures.
    die_busy_ns: Vec<u64>,
}

/// When an operation's data has left the controller (for a program: its buffer slot is free
/// again) and when the operation is done (the page durable, sensed and transferred, erased).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
pub struct OpTimes {
    pub transferred_ns: u64,
    pub done_ns: u64,
}

impl OpTimes {
    /// An operation whose data is where it goes when it is done (a read, an erase).
    pub fn at(done_ns: u64) -> Self {
        Self {
            transferred_ns: done_ns,
            done_ns,
        }
    }
}

pub fn transfer_ns(bytes: u64, mb_per_s: u64) -> u64 {
    if mb_per_s == 0 {
        0
    } else {
        // 1 MB/s = 1 byte per microsecond = 1e-3 bytes per ns.
        (bytes * 1000).div_ceil(mb_per_s)
    }
}

/// Why the FTL touches flash. Every operation carries one and is counted under it; a new reason
/// (a translation page, a reclaim unit's own GC) is a new variant.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Host data: a host read's page, a host page's program.
    Host = 0,
    /// The old page a partial-page host write reads to merge with the new bytes.
    ReadModifyWrite = 1,
    /// Garbage collection: reading and programming a victim's valid pages, erasing it.
    Gc = 2,
    /// The mapping table's own pages (translation pages), where a table persists itself.
    Mapping = 3,
}

impl Cause {
    pub const COUNT: usize = 4;
    pub const ALL: [Cause; Cause::COUNT] = [
        Cause::Host,
        Cause::ReadModifyWrite,
        Cause::Gc,
        Cause::Mapping,
    ];
}

/// The placement of translation pages (the mapping table's own pages): their superblocks never
/// hold user data. Streams are 0..64, so it is free.
pub const MAPPING_PLACEMENT: u8 = u8::MAX;

/// The placement of the reclaim units GC fills with initially isolated handles' data: shared by
/// all of them (FDP allows GC to mix them), never by a persistently isolated handle's.
pub const SHARED_GC_PLACEMENT: u8 = u8::MAX - 1;

/// One flash operation and what it addresses.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashOp {
    /// Sense a page and move it across the channel.
    Read { ppn: Ppn },
    /// Move a page across the channel and program it.
    Program { ppn: Ppn },
    /// Erase a superblock: one physical block on each die it spans.
    Erase { superblock: u32 },
}

/// Per placement (stream / FDP placement handle): pages programmed and physical blocks erased,
/// by cause.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementCounts {
    pub program_pages: [u64; Cause::COUNT],
    pub erased_blocks: [u64; Cause::COUNT],
    /// Superblocks (reclaim units) opened for this placement's writes.
    pub units_opened: u64,
    /// Reclaim units closed before they were full, their time limit exceeded.
    pub units_closed_unfilled: u64,
    /// GC victims of this placement whose valid pages GC moved ("media relocated" events),
    /// and the pages it moved out of them.
    pub relocations: u64,
    pub relocated_pages: u64,
}

/// The flash operations an FTL issued, by cause, and (programs and erases) by placement. Reads
/// have no placement: a host read finds its page through the mapping, not through a stream.
/// Every placement a `u8` can name has its counts, so counting needs no bounds check.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct FlashCounts {
    read_pages: [u64; Cause::COUNT],
    #[serde(with = "crate::serde_state::boxed")]
    placements: Box<[PlacementCounts; 256]>,
}

impl Default for FlashCounts {
    fn default() -> Self {
        Self {
            read_pages: [0; Cause::COUNT],
            placements: Box::new(std::array::from_fn(|_| PlacementCounts::default())),
        }
    }
}

impl FlashCounts {
    /// Counts `units` operations (pages; for an erase, physical blocks).
    #[inline(always)]
    pub fn record(&mut self, op: FlashOp, cause: Cause, placement: u8, units: u64) {
        let c = cause as usize;
        let p = &mut self.placements[usize::from(placement)];
        match op {
            FlashOp::Read { .. } => self.read_pages[c] += units,
            FlashOp::Program { .. } => p.program_pages[c] += units,
            FlashOp::Erase { .. } => p.erased_blocks[c] += units,
        }
    }

    /// A reclaim unit of `placement` was closed before it was full.
    #[inline]
    pub fn unit_closed_unfilled(&mut self, placement: u8) {
        self.placements[usize::from(placement)].units_closed_unfilled += 1;
    }

    #[inline]
    pub fn placement_mut(&mut self, placement: u8) -> &mut PlacementCounts {
        &mut self.placements[usize::from(placement)]
    }

    /// A superblock was opened for `placement`'s writes.
    #[inline]
    pub fn unit_opened(&mut self, placement: u8) {
        self.placements[usize::from(placement)].units_opened += 1;
    }

    pub fn read_pages(&self, cause: Cause) -> u64 {
        self.read_pages[cause as usize]
    }

    pub fn program_pages(&self, cause: Cause) -> u64 {
        self.placements
            .iter()
            .map(|p| p.program_pages[cause as usize])
            .sum()
    }

    pub fn erased_blocks(&self, cause: Cause) -> u64 {
        self.placements
            .iter()
            .map(|p| p.erased_blocks[cause as usize])
            .sum()
    }

    /// Every placement's counts, by placement number (0 to 255; those never used are zeros).
    pub fn placements(&self) -> &[PlacementCounts] {
        &self.placements[..]
    }
}

impl FlashTiming {
    pub fn new(flash: &FlashConfig, geometry: &Geometry) -> Self {
        Self {
            read_latency_ns: flash.read_latency_ns,
            program_latency_ns: flash.program_latency_ns,
            erase_latency_ns: flash.erase_latency_ns,
            transfer_ns: transfer_ns(u64::from(geometry.page_size_bytes), flash.channel_mb_per_s),
            channels: geometry.channels,
            die_free_ns: vec![0; geometry.dies as usize],
            channel_free_ns: vec![0; geometry.channels as usize],
            die_busy_ns: vec![0; geometry.dies as usize],
        }
    }

    // Dies are numbered channel-fastest (see geometry.rs), so a die's channel is die % channels.

    /// Page read: the die senses the page, then the data crosses the channel.
    #[inline]
    pub fn read(&mut self, die: u32, ready_ns: u64) -> u64 {
        let d = die as usize;
        let c = (die % self.channels) as usize;
        let sensed = ready_ns.max(self.die_free_ns[d]) + self.read_latency_ns;
        let start_xfer = sensed.max(self.channel_free_ns[c]);
        let done = start_xfer + self.transfer_ns;
        self.channel_free_ns[c] = done;
        // The die holds the data in its page register until the transfer ends.
        self.die_busy_ns[d] += done - ready_ns.max(self.die_free_ns[d]);
        self.die_free_ns[d] = done;
        done
    }

    /// Page program: the data crosses the channel into the die's register, then the die programs.
    #[inline]
    pub fn program(&mut self, die: u32, ready_ns: u64) -> OpTimes {
        let d = die as usize;
        let c = (die % self.channels) as usize;
        let start = ready_ns
            .max(self.die_free_ns[d])
            .max(self.channel_free_ns[c]);
        let transferred = start + self.transfer_ns;
        self.channel_free_ns[c] = transferred;
        let done = transferred + self.program_latency_ns;
        self.die_busy_ns[d] += done - start;
        self.die_free_ns[d] = done;
        OpTimes {
            transferred_ns: transferred,
            done_ns: done,
        }
    }

    #[inline]
    pub fn erase(&mut self, die: u32, ready_ns: u64) -> u64 {
        let d = die as usize;
        let start = ready_ns.max(self.die_free_ns[d]);
        let done = start + self.erase_latency_ns;
        self.die_busy_ns[d] += self.erase_latency_ns;
        self.die_free_ns[d] = done;
        done
    }

    /// When `pages` programs spread over every die from an idle start would all be durable:
    /// what capacitors must keep the drive powered for to write that many pages.
    pub fn idle_program_ns(&self, pages: u64) -> u64 {
        let mut idle = self.clone();
        idle.die_free_ns.iter_mut().for_each(|t| *t = 0);
        idle.channel_free_ns.iter_mut().for_each(|t| *t = 0);
        let dies = idle.die_free_ns.len() as u64;
        (0..pages)
            .map(|i| idle.program((i % dies) as u32, 0).done_ns)
            .max()
            .unwrap_or(0)
    }

    /// Latest time any die is busy until.
    pub fn horizon_ns(&self) -> u64 {
        self.die_free_ns.iter().copied().max().unwrap_or(0)
    }

    pub fn die_busy_ns_total(&self) -> u64 {
        self.die_busy_ns.iter().sum()
    }

    pub fn reset_busy(&mut self) {
        self.die_busy_ns.iter_mut().for_each(|b| *b = 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn operations_on_one_die_serialise_and_different_dies_overlap() {
        let mut config = Config::from_preset("femu").unwrap();
        config.flash.channel_mb_per_s = 400; // 4096 B -> 10240 ns
        let geometry = config.geometry().unwrap();
        let mut t = FlashTiming::new(&config.flash, &geometry);
        let a = t.program(0, 0);
        assert_eq!(a.transferred_ns, 10_240);
        assert_eq!(a.done_ns, 10_240 + 200_000);
        // Die 8 is on channel 0 too (channel-fastest numbering): it waits for the bus only.
        let c = t.program(8, 0);
        assert_eq!(c.transferred_ns, 10_240 * 2);
        let b = t.program(0, 0);
        assert_eq!(b.done_ns, a.done_ns + 10_240 + 200_000);
        // Die 1 is on channel 1: fully parallel.
        assert_eq!(t.program(1, 0).done_ns, a.done_ns);
        assert_eq!(t.read(1, 0), a.done_ns + 40_000 + 10_240);
        assert_eq!(t.erase(2, 5), 5 + 2_000_000);
    }
}
