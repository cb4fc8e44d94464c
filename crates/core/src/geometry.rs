//! Device geometry, computed once from the configuration with its relations checked; every other
//! module asks it instead of recomputing (FEMU's `ssdparams` habit).
//!
//! Address layout. Dies are numbered channel-fastest (`die = lun * channels + channel`), so that
//! consecutive dies sit on different channels. A *superblock* is the allocation and GC unit: one
//! block on each of `superblock_dies` consecutive dies (FEMU's "line" when it spans all dies).
//! A physical page number is `ppn = superblock * pages_per_superblock + slot`, and slot `k` of a
//! superblock is page `k / superblock_dies` of the block on die `k % superblock_dies` of its group:
//! writes filling a superblock in slot order are striped across channels, then dies, then pages.

use crate::addr::Ppn;
use crate::config::{Config, ConfigError};
use serde::Serialize;

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Geometry {
    pub channels: u32,
    pub dies_per_channel: u32,
    pub planes_per_die: u32,
    pub blocks_per_die: u32,
    pub pages_per_block: u32,
    pub page_size_bytes: u32,
    pub dies: u32,
    pub superblock_dies: u32,
    /// Groups of `superblock_dies` dies; superblock `s` lives on group `s % superblock_groups`.
    pub superblock_groups: u32,
    pub superblocks: u32,
    pub pages_per_superblock: u32,
    pub physical_pages: u64,
    pub logical_pages: u64,
    /// Superblocks that must stay free: foreground GC below this (see `FtlConfig`).
    pub free_superblocks_min: u32,
    /// Mapping entries in one translation page (`page size / ftl.mapping_entry_bytes`).
    pub entries_per_translation_page: u32,
    /// Translation pages of the whole mapping table.
    pub translation_pages: u32,
    /// Translation pages that may be dirty at once (`ftl.protected_ratio` of them, at least
    /// one); None when all may (the model is off: nothing is written back).
    pub protected_translation_pages: Option<u32>,
    /// Translation pages the mapping cache holds (`ftl.mapping_cache_bytes`); None: all.
    pub cached_translation_pages: Option<u32>,
    /// Background GC while free superblocks <= this (FEMU's `gc_thres_lines`); None = never.
    pub gc_background_free_superblocks: Option<u32>,
    /// Foreground GC while free superblocks <= this (`gc_thres_lines_high`); None = never.
    /// Both thresholds count the free superblocks of one reclaim group.
    pub gc_foreground_free_superblocks: Option<u32>,
    /// FDP reclaim groups: superblock `s` belongs to group
    /// `(s % superblock_groups) / (superblock_groups / reclaim_groups)`.
    pub reclaim_groups: u32,
    /// Reclaim unit handles (`fdp.handles`, or `ftl.streams` persistently isolated ones).
    pub handles: u32,
    /// Bit `h` set: handle `h` is persistently isolated.
    pub persistent_handles: u64,
    #[serde(skip)]
    pub pps: Divisor,
    #[serde(skip)]
    groups: Divisor,
    #[serde(skip)]
    sb_dies: Divisor,
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Geometry {
    pub fn from_config(config: &Config) -> Result<Geometry, ConfigError> {
        let f = &config.flash;
        for (key, v) in [
            ("flash.channels", f.channels),
            ("flash.dies_per_channel", f.dies_per_channel),
            ("flash.planes_per_die", f.planes_per_die),
            ("flash.blocks_per_die", f.blocks_per_die),
            ("flash.pages_per_block", f.pages_per_block),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if f.page_size_bytes < 512 || !f.page_size_bytes.is_power_of_two() {
            return Err(invalid(
                "flash.page_size_bytes",
                format!(
                    "{} is not a power of two >= 512 (sectors are 512 bytes)",
                    f.page_size_bytes
                ),
            ));
        }
        if !f.blocks_per_die.is_multiple_of(f.planes_per_die) {
            return Err(invalid(
                "flash.blocks_per_die",
                "must be a multiple of flash.planes_per_die (blocks are spread evenly over planes)",
            ));
        }
        let dies = u64::from(f.channels) * u64::from(f.dies_per_channel);
        if dies > 1 << 16 {
            return Err(invalid("flash.channels", "more than 65536 dies in total"));
        }
        let dies = dies as u32;
        let superblock_dies = if f.superblock_dies == 0 {
            dies
        } else {
            f.superblock_dies
        };
        if superblock_dies > dies || !dies.is_multiple_of(superblock_dies) {
            return Err(invalid(
                "flash.superblock_dies",
                format!("{superblock_dies} must divide the {dies} dies (0 = all dies)"),
            ));
        }
        let superblock_groups = dies / superblock_dies;
        let superblocks = u64::from(superblock_groups) * u64::from(f.blocks_per_die);
        let pages_per_superblock = u64::from(superblock_dies) * u64::from(f.pages_per_block);
        let physical_pages = superblocks * pages_per_superblock;
        // Flat tables index pages with u32 and reserve u32::MAX as "none".
        if physical_pages >= u64::from(u32::MAX) || pages_per_superblock > 1 << 24 {
            return Err(invalid(
                "flash.blocks_per_die",
                format!("{physical_pages} physical pages: at most 2^32 - 2 are supported"),
            ));
        }
        let c = &config.capacity;
        let given = [
            c.logical_bytes.is_some(),
            c.over_provisioning.is_some(),
            c.spare_factor.is_some(),
        ]
        .iter()
        .filter(|x| **x)
        .count();
        if given != 1 {
            return Err(invalid(
                "capacity",
                "give exactly one of capacity.logical_bytes, capacity.over_provisioning, capacity.spare_factor",
            ));
        }
        let capacity_key = if c.logical_bytes.is_some() {
            "capacity.logical_bytes"
        } else if c.over_provisioning.is_some() {
            "capacity.over_provisioning"
        } else {
            "capacity.spare_factor"
        };
        let logical_pages = if let Some(bytes) = c.logical_bytes {
            if bytes % u64::from(f.page_size_bytes) != 0 {
                return Err(invalid(
                    "capacity.logical_bytes",
                    "must be a multiple of flash.page_size_bytes",
                ));
            }
            bytes / u64::from(f.page_size_bytes)
        } else if let Some(rho) = c.over_provisioning {
            if !(rho.is_finite() && rho > 0.0) {
                return Err(invalid("capacity.over_provisioning", "must be > 0"));
            }
            (physical_pages as f64 / (1.0 + rho)).floor() as u64
        } else {
            let sf = c.spare_factor.expect("one capacity key is set");
            if !(sf.is_finite() && sf > 0.0 && sf < 1.0) {
                return Err(invalid(
                    "capacity.spare_factor",
                    "must be strictly between 0 and 1",
                ));
            }
            (physical_pages as f64 * (1.0 - sf)).floor() as u64
        };
        let ftl = &config.ftl;
        let divisor = ftl.learned_buffer_divisor;
        if !(divisor.is_power_of_two() && divisor <= 1 << 20) {
            return Err(invalid(
                "ftl.learned_buffer_divisor",
                format!("{divisor} is not a power of two from 1 to 1048576"),
            ));
        }
        if !(ftl.write_buffer_mib.is_finite() && ftl.write_buffer_mib >= 0.0) {
            return Err(invalid("ftl.write_buffer_mib", "must be a number >= 0"));
        }
        if ftl.streams == 0 || ftl.streams > 64 {
            return Err(invalid("ftl.streams", "must be in 1..=64"));
        }
        let fdp = &config.fdp;
        if !fdp.handles.is_empty() && ftl.streams != 1 {
            return Err(invalid(
                "fdp.handles",
                "give either fdp.handles or ftl.streams (a stream is a persistently isolated handle), not both",
            ));
        }
        let (handles, persistent_handles) = if fdp.handles.is_empty() {
            (ftl.streams, u64::MAX >> (64 - ftl.streams))
        } else {
            if fdp.handles.len() > 64 {
                return Err(invalid(
                    "fdp.handles",
                    format!("{} handles: at most 64", fdp.handles.len()),
                ));
            }
            let mask = fdp
                .handles
                .iter()
                .enumerate()
                .filter(|(_, t)| **t == crate::config::HandleType::Persistent)
                .fold(0u64, |m, (h, _)| m | 1 << h);
            (fdp.handles.len() as u32, mask)
        };
        if fdp.placement != crate::config::PlacementPolicy::Host && handles < 2 {
            return Err(invalid(
                "fdp.placement",
                "auto and ideal placement choose among handles: give at least two (fdp.handles or ftl.streams)",
            ));
        }
        let reclaim_groups = fdp.reclaim_groups;
        if reclaim_groups == 0
            || reclaim_groups > 256
            || !superblock_groups.is_multiple_of(reclaim_groups)
        {
            return Err(invalid(
                "fdp.reclaim_groups",
                format!(
                    "{reclaim_groups} must divide the {superblock_groups} die groups of {superblock_dies} dies (flash.superblock_dies)"
                ),
            ));
        }
        for (key, v) in [
            ("ftl.gc_thres_pcent", ftl.gc_thres_pcent),
            ("ftl.gc_thres_pcent_high", ftl.gc_thres_pcent_high),
        ] {
            if !(0.0..=100.0).contains(&v) {
                return Err(invalid(key, format!("{v} is not a percentage in 0..=100")));
            }
        }
        if ftl.gc_thres_pcent_high < ftl.gc_thres_pcent {
            return Err(invalid(
                "ftl.gc_thres_pcent_high",
                "must be >= ftl.gc_thres_pcent (foreground GC starts later than background GC)",
            ));
        }
        if ftl.gc_free_superblocks_min < 2 {
            return Err(invalid(
                "ftl.gc_free_superblocks_min",
                "must be at least 2: a host write may take one free superblock just before GC needs another to copy into",
            ));
        }
        if !(ftl.protected_ratio > 0.0 && ftl.protected_ratio <= 1.0) {
            return Err(invalid(
                "ftl.protected_ratio",
                format!("{} is not in (0, 1]", ftl.protected_ratio),
            ));
        }
        let entry = ftl.mapping_entry_bytes;
        // Large entries make small test devices with many translation pages.
        if entry < 4 || entry > f.page_size_bytes || !f.page_size_bytes.is_multiple_of(entry) {
            return Err(invalid(
                "ftl.mapping_entry_bytes",
                format!(
                    "{entry}: must be at least 4 bytes and divide the {}-byte page",
                    f.page_size_bytes
                ),
            ));
        }
        let entries_per_translation_page = f.page_size_bytes / entry;
        let translation_pages = logical_pages.div_ceil(u64::from(entries_per_translation_page));
        let cache_pages = ftl.mapping_cache_bytes / u64::from(f.page_size_bytes);
        let cached_translation_pages = (ftl.mapping_cache_bytes > 0
            && cache_pages < translation_pages)
            .then_some(cache_pages as u32);
        if cached_translation_pages == Some(0) {
            return Err(invalid(
                "ftl.mapping_cache_bytes",
                format!(
                    "{} bytes hold no {}-byte translation page",
                    ftl.mapping_cache_bytes, f.page_size_bytes
                ),
            ));
        }
        // A cache smaller than the table persists it too: what it evicts must be on flash.
        let persistent = ftl.protected_ratio < 1.0 || cached_translation_pages.is_some();
        let protected_translation_pages = persistent.then(|| {
            let protected =
                ((ftl.protected_ratio * translation_pages as f64).floor() as u64).max(1) as u32;
            // Only cached pages can be dirty.
            protected.min(cached_translation_pages.unwrap_or(u32::MAX))
        });
        // Per reclaim group: each handle's frontier (two with GC's apart), and one shared by the
        // initially isolated handles' GC. Translation pages have a frontier of their own, and
        // take room beside the data.
        let shared_gc = u32::from(persistent_handles.count_ones() < handles);
        let frontiers_per_group =
            handles * if ftl.gc_separate_frontier { 2 } else { 1 } + shared_gc;
        let frontiers = reclaim_groups * frontiers_per_group + u32::from(persistent);
        let reserved = u64::from(reclaim_groups) * u64::from(ftl.gc_free_superblocks_min)
            + u64::from(frontiers);
        // GC can always reclaim space only if the valid data fits in the superblocks that are
        // neither reserved free nor open, with at least one page of slack.
        let usable_pages = superblocks.saturating_sub(reserved) * pages_per_superblock;
        if logical_pages == 0 {
            return Err(invalid(
                capacity_key,
                format!(
                    "leaves no logical page: the device needs at least one ({} bytes)",
                    f.page_size_bytes
                ),
            ));
        }
        let mapping_room = if persistent { translation_pages } else { 0 };
        if logical_pages + mapping_room >= usable_pages {
            return Err(invalid(
                "capacity",
                format!(
                    "{logical_pages} logical pages do not fit: {superblocks} superblocks of {pages_per_superblock} pages, \
                     {reserved} reserved for GC and open frontiers, leave {usable_pages}; raise over-provisioning"
                ),
            ));
        }
        let superblocks = superblocks as u32;
        // FEMU: gc_thres_lines = (int)((1 - gc_thres_pcent) * tt_lines), GC while free <= it.
        // 100 % means "never" here (FEMU would still collect at zero free lines).
        // Per reclaim group: each has its free pool and its GC.
        let group_superblocks = superblocks / reclaim_groups;
        let free_at = |pcent: f64| {
            (pcent < 100.0)
                .then(|| ((1.0 - pcent / 100.0) * f64::from(group_superblocks)).floor() as u32)
        };
        // Foreground GC makes host writes wait until this many superblocks are free: the logical
        // data must fit in the rest, or every write would stall on GC that cannot succeed.
        if let Some(kept_free) = free_at(ftl.gc_thres_pcent_high) {
            let rest =
                u64::from(superblocks.saturating_sub(reclaim_groups * (kept_free + 1) + frontiers))
                    * pages_per_superblock;
            if logical_pages >= rest {
                return Err(invalid(
                    "ftl.gc_thres_pcent_high",
                    format!(
                        "foreground GC would keep {} of {superblocks} superblocks free, leaving too few for {logical_pages} logical pages; raise it or the over-provisioning",
                        reclaim_groups * (kept_free + 1)
                    ),
                ));
            }
        }
        let timing_keys = [
            ("flash.read_latency_ns", f.read_latency_ns),
            ("flash.program_latency_ns", f.program_latency_ns),
            ("flash.erase_latency_ns", f.erase_latency_ns),
        ];
        for (key, v) in timing_keys {
            if v > 1_000_000_000_000 {
                return Err(invalid(key, "more than 1000 s per operation"));
            }
        }
        Ok(Geometry {
            channels: f.channels,
            dies_per_channel: f.dies_per_channel,
            planes_per_die: f.planes_per_die,
            blocks_per_die: f.blocks_per_die,
            pages_per_block: f.pages_per_block,
            page_size_bytes: f.page_size_bytes,
            dies,
            superblock_dies,
            superblock_groups,
            superblocks,
            pages_per_superblock: pages_per_superblock as u32,
            physical_pages,
            logical_pages,
            free_superblocks_min: ftl.gc_free_superblocks_min,
            entries_per_translation_page,
            translation_pages: translation_pages as u32,
            protected_translation_pages,
            cached_translation_pages,
            gc_background_free_superblocks: free_at(ftl.gc_thres_pcent),
            gc_foreground_free_superblocks: free_at(ftl.gc_thres_pcent_high),
            reclaim_groups,
            handles,
            persistent_handles,
            pps: Divisor::new(pages_per_superblock as u32),
            groups: Divisor::new(superblock_groups),
            sb_dies: Divisor::new(superblock_dies),
        })
    }

    pub fn logical_bytes(&self) -> u64 {
        self.logical_pages * u64::from(self.page_size_bytes)
    }

    pub fn physical_bytes(&self) -> u64 {
        self.physical_pages * u64::from(self.page_size_bytes)
    }

    /// rho = (physical - logical) / logical.
    pub fn over_provisioning(&self) -> f64 {
        (self.physical_pages - self.logical_pages) as f64 / self.logical_pages as f64
    }

    #[inline]
    pub fn superblock_of(&self, ppn: Ppn) -> u32 {
        self.pps.quotient(ppn.get())
    }

    /// The die a physical page lives on.
    #[inline]
    pub fn die_of(&self, ppn: Ppn) -> u32 {
        let superblock = self.pps.quotient(ppn.get());
        let slot = ppn.get() - superblock * self.pages_per_superblock;
        self.groups.remainder(superblock) * self.superblock_dies + self.sb_dies.remainder(slot)
    }

    /// The reclaim group a superblock belongs to.
    #[inline]
    pub fn reclaim_group_of(&self, superblock: u32) -> u32 {
        self.groups.remainder(superblock) / (self.superblock_groups / self.reclaim_groups)
    }

    /// Whether handle `handle` is persistently isolated.
    #[inline]
    pub fn is_persistent(&self, handle: u8) -> bool {
        handle < 64 && self.persistent_handles >> handle & 1 != 0
    }

    /// The die of slot-0 .. slot-(superblock_dies-1) of a superblock: its first die.
    #[inline]
    pub fn first_die_of_superblock(&self, superblock: u32) -> u32 {
        (superblock % self.superblock_groups) * self.superblock_dies
    }
}

/// A divisor fixed at construction. Division is on the per-page path and geometry sizes are
/// usually powers of two: then it is a shift and a mask, decided once instead of per call.
#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize)]
pub struct Divisor {
    pub value: u32,
    /// log2(value) when value is a power of two, else u32::MAX.
    shift: u32,
}

/// What a deserialised `Geometry`'s skipped divisors hold until the geometry is replaced by the
/// configuration's (`Ftl::load`): never used to divide.
impl Default for Divisor {
    fn default() -> Self {
        Divisor::new(1)
    }
}

impl Divisor {
    pub fn new(value: u32) -> Self {
        assert!(value > 0);
        Self {
            value,
            shift: if value.is_power_of_two() {
                value.trailing_zeros()
            } else {
                u32::MAX
            },
        }
    }

    #[inline(always)]
    pub fn quotient(self, n: u32) -> u32 {
        if self.shift != u32::MAX {
            n >> self.shift
        } else {
            n / self.value
        }
    }

    #[inline(always)]
    pub fn remainder(self, n: u32) -> u32 {
        if self.shift != u32::MAX {
            n & (self.value - 1)
        } else {
            n % self.value
        }
    }
}

impl Config {
    pub fn geometry(&self) -> Result<Geometry, ConfigError> {
        Geometry::from_config(self)
    }
}
