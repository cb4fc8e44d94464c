//! The report's sections: the trace, the device, the mapping table, the traffic, FDP, power
//! loss, GC and the requests, each as the JSON schema (docs/report-schema.md) names it.

use super::*;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TraceInfo {
    pub path: String,
    pub format: String,
    pub requests: u64,
    pub bad_lines_skipped: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub physical_bytes: u64,
    pub logical_bytes: u64,
    pub over_provisioning: f64,
    pub spare_factor: f64,
    pub dies: u32,
    pub superblocks: u32,
    pub pages_per_superblock: u32,
    pub free_superblocks_end: u32,
    pub erase_count_min: u32,
    pub erase_count_max: u32,
    pub erase_count_mean: f64,
    /// Fraction of die-time the dies were busy during the measured phase.
    pub die_utilization: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MappingInfo {
    pub table: String,
    /// As the run ended: the table's buffer and spare capacity included.
    pub bytes: u64,
    /// The most the table held at any point of the run, preconditioning included: the DRAM it
    /// needs (`MappingTable::peak_heap_bytes`; a merge's scratch vectors aside).
    #[serde(default)]
    pub bytes_peak: u64,
    /// After folding its buffer and returning spare capacity (`MappingTable::compact`;
    /// what `ftlab mapbench` reports): unlike `bytes`, it does not depend on where the run
    /// stopped in the table's cycles of merging and collecting garbage.
    #[serde(default)]
    pub bytes_compacted: u64,
    pub live_mappings: u64,
    pub bytes_per_live_mapping: f64,
    /// All FTL DRAM: mapping, reverse map, block metadata, buffer index.
    pub ftl_metadata_bytes: u64,
    /// Tables with an update buffer (`learned`): the fraction of lookups its compressed layer
    /// answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed_get_fraction: Option<f64>,
    /// What the table did beyond mapping, under its name (`learned`: what its buffer did, merges
    /// and updates in place, and its groups' encodings).
    #[serde(flatten)]
    pub activity: Option<TableActivity>,
}

impl MappingInfo {
    /// The table's figures as they stand (`bytes_compacted` as `bytes`: compacting is the
    /// caller's choice, since it changes the table).
    pub(crate) fn of<M: MappingTable>(ftl: &Ftl<M>) -> MappingInfo {
        let live = ftl.mapping().live_mappings();
        let bytes = ftl.mapping_bytes() as u64;
        MappingInfo {
            table: ftl.mapping().name().to_string(),
            bytes,
            bytes_peak: ftl.mapping().peak_heap_bytes() as u64,
            bytes_compacted: bytes,
            live_mappings: live,
            bytes_per_live_mapping: bytes_per_mapping(bytes, live),
            ftl_metadata_bytes: ftl.metadata_bytes() as u64,
            compressed_get_fraction: ftl.mapping().compressed_get_fraction().map(round6),
            activity: ftl.mapping().activity(),
        }
    }

    /// The learned table's activity, when the table is `learned`.
    pub fn learned(&self) -> Option<&ftlab_learned::LearnedActivity> {
        match &self.activity {
            Some(TableActivity::Learned(a)) => Some(a),
            None => None,
        }
    }
}

/// Flash page writes by what they carry, as the Hexa-SSD paper splits them, and the mapping
/// table's reads. `nand_write_pages` is their sum.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Traffic {
    /// Host data (UD).
    pub user_pages: u64,
    /// Translation pages written back (MD).
    pub mapping_pages: u64,
    /// GC moving user data (GUD).
    pub gc_user_pages: u64,
    /// GC moving translation pages (GMD).
    pub gc_mapping_pages: u64,
    /// Translation pages read because the cached table missed (0: the table is all cached).
    pub map_read_pages: u64,
}

impl Traffic {
    pub fn of(s: &FtlStats) -> Traffic {
        Traffic {
            user_pages: s.host_program_pages(),
            mapping_pages: s.mapping_write_pages(),
            gc_user_pages: s.gc_user_write_pages(),
            gc_mapping_pages: s.gc_mapping_write_pages(),
            map_read_pages: s.flash.read_pages(ftlab_core::flash::Cause::Mapping),
        }
    }

    /// The traffic since `earlier`.
    pub(crate) fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            user_pages: self.user_pages - earlier.user_pages,
            mapping_pages: self.mapping_pages - earlier.mapping_pages,
            gc_user_pages: self.gc_user_pages - earlier.gc_user_pages,
            gc_mapping_pages: self.gc_mapping_pages - earlier.gc_mapping_pages,
            map_read_pages: self.map_read_pages - earlier.map_read_pages,
        }
    }
}

/// What power-loss protection must cover, when the mapping is persisted in translation pages
/// (`ftl.protected_ratio` below 1).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PowerLoss {
    pub translation_pages: u32,
    /// How many may be dirty at once (`protected_ratio` of them).
    pub protected_translation_pages: u32,
    /// The most that were dirty at once in the measured phase.
    pub max_dirty_translation_pages: u32,
    /// The time to program that many pages over every die from idle: what the capacitors must
    /// keep the drive powered for (the write buffer's pages aside).
    pub capacitor_flush_ns: u64,
    /// Translation pages the mapping cache holds (`ftl.mapping_cache_bytes`); null: all.
    #[serde(default)]
    pub cached_translation_pages: Option<u32>,
}

/// NVMe Flexible Data Placement statistics, as `nvme fdp stats` names them, and per placement
/// (stream / reclaim unit handle; 255 holds the translation pages).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Fdp {
    /// Host bytes with metadata written (HBMW): host page writes x page bytes.
    pub host_bytes_with_metadata_written: u64,
    /// Media bytes with metadata written (MBMW): flash programs, every cause, x page bytes.
    pub media_bytes_with_metadata_written: u64,
    /// Media bytes erased (MBE): physical blocks erased x block bytes.
    pub media_bytes_erased: u64,
    #[serde(default)]
    pub reclaim_groups: u32,
    pub placements: Vec<PlacementStats>,
    /// The latest events (at most 64, oldest first), as `nvme fdp events` lists them.
    #[serde(default)]
    pub events: Vec<FdpEventInfo>,
}

/// One placement's share of the flash work, and what it holds as the run ends.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PlacementStats {
    pub placement: u8,
    /// `persistent` or `initial` (a handle's isolation), `shared_gc` (the reclaim units GC
    /// fills with initially isolated handles' data), `mapping` (translation pages).
    #[serde(default)]
    pub kind: String,
    /// Programs of host data into the placement's reclaim units.
    pub host_pages: u64,
    /// Every program into them (host, GC, mapping).
    pub media_pages: u64,
    /// media_pages / host_pages (null without host pages).
    #[serde(default)]
    pub waf: Option<f64>,
    /// Reclaim units (superblocks) opened for its writes.
    pub reclaim_units_written: u64,
    /// Reclaim unit available media writes (RUAMW): bytes still writable in its open
    /// reclaim units (all reclaim groups) as the run ended.
    #[serde(default)]
    pub ru_available_media_writes_bytes: u64,
    pub erased_blocks: u64,
    /// Valid pages in its reclaim units as the run ended.
    pub valid_pages: u64,
    /// Events: reclaim units closed unfilled past `fdp.ru_time_limit_ns`; GC victims of
    /// this placement whose data was moved ("media relocated"), and the pages moved.
    #[serde(default)]
    pub ru_time_limit_exceeded: u64,
    #[serde(default)]
    pub media_relocated: u64,
    #[serde(default)]
    pub relocated_pages: u64,
}

/// One FDP event.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FdpEventInfo {
    pub time_ns: u64,
    /// `ru_time_limit_exceeded` or `media_relocated`.
    pub kind: String,
    pub reclaim_group: u8,
    pub placement: u8,
    /// The reclaim unit (superblock number).
    pub reclaim_unit: u32,
    /// Pages moved (media relocated) or left unwritten (time limit).
    pub pages: u32,
}

impl Fdp {
    pub(crate) fn of<M: MappingTable>(ftl: &Ftl<M>) -> Fdp {
        let s = ftl.stats();
        let g = ftl.geometry();
        let page = u64::from(g.page_size_bytes);
        let mut valid = [0u64; 256];
        for sb in 0..g.superblocks {
            valid[usize::from(ftl.blocks().stream_of(sb))] +=
                u64::from(ftl.blocks().valid_count(sb));
        }
        let available = ftl.available_media_writes();
        let kind = |p: u8| match p {
            ftlab_core::flash::MAPPING_PLACEMENT => "mapping",
            ftlab_core::flash::SHARED_GC_PLACEMENT => "shared_gc",
            h if g.is_persistent(h) => "persistent",
            _ => "initial",
        };
        let placements = s
            .flash
            .placements()
            .iter()
            .enumerate()
            .map(|(p, c)| {
                let host_pages = c.program_pages[Cause::Host as usize];
                let media_pages: u64 = c.program_pages.iter().sum();
                PlacementStats {
                    placement: p as u8,
                    kind: kind(p as u8).to_string(),
                    host_pages,
                    media_pages,
                    waf: (host_pages > 0).then(|| media_pages as f64 / host_pages as f64),
                    reclaim_units_written: c.units_opened,
                    ru_available_media_writes_bytes: available.get(p).copied().unwrap_or(0) * page,
                    erased_blocks: c.erased_blocks.iter().sum(),
                    valid_pages: valid[p],
                    ru_time_limit_exceeded: c.units_closed_unfilled,
                    media_relocated: c.relocations,
                    relocated_pages: c.relocated_pages,
                }
            })
            // Every handle, and the other placements that did anything.
            .filter(|p| {
                u32::from(p.placement) < g.handles
                    || *p
                        != PlacementStats {
                            placement: p.placement,
                            kind: p.kind.clone(),
                            ..Default::default()
                        }
            })
            .collect();
        let events = s
            .fdp_events
            .iter()
            .map(|e| FdpEventInfo {
                time_ns: e.time_ns,
                kind: match e.kind {
                    FdpEventKind::RuTimeLimitExceeded => "ru_time_limit_exceeded",
                    FdpEventKind::MediaRelocated => "media_relocated",
                }
                .to_string(),
                reclaim_group: e.reclaim_group,
                placement: e.placement,
                reclaim_unit: e.reclaim_unit,
                pages: e.pages,
            })
            .collect();
        Fdp {
            host_bytes_with_metadata_written: s.host_write_pages * page,
            media_bytes_with_metadata_written: s.nand_write_pages() * page,
            media_bytes_erased: s.erases() * u64::from(g.pages_per_block) * page,
            reclaim_groups: g.reclaim_groups,
            placements,
            events,
        }
    }
}

/// A power cut (`workload.power_cut_at_ns`): what was programmed on capacitor power, and the
/// durable state checked against the table.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PowerCutInfo {
    /// Into the measured phase.
    pub at_ns: u64,
    pub buffered_pages: u64,
    pub dirty_translation_pages: u64,
    /// From the cut (or, when requests that arrived before it were still completing, from the
    /// last completion) until the last page programmed on capacitor power was durable.
    pub flush_ns: u64,
    /// LPNs whose durable entry (translation pages on flash) was compared with the table: every
    /// one when the mapping is persisted, none otherwise.
    pub lpns_checked: u64,
    /// Those that differed (a lost write): 0 unless the model is wrong.
    pub lpns_not_durable: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GcInfo {
    pub background: u64,
    pub foreground: u64,
    pub read_pages: u64,
    pub write_pages: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Requests {
    pub read: u64,
    pub write: u64,
    pub trim: u64,
    pub flush: u64,
}
