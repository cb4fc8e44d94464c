//! What a configured device needs of the host's memory, estimated from its configuration before
//! anything is allocated, and what the host can give: a device too large for the machine is
//! refused with the estimate and the keys that drive it, instead of aborting on a failed
//! allocation halfway through building its tables.
//!
//! Owns: the per-structure byte counts and the reading of the host's limits. Does not know: how
//! the tables are built (the counts mirror their `heap_bytes`, checked by a test).

use crate::config::{Config, MappingKind};
use crate::geometry::Geometry;
use serde::Serialize;

/// One structure's share of the estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryPart {
    pub name: &'static str,
    pub bytes: u64,
    /// How the bytes follow from the configuration, and the keys that set them.
    pub basis: String,
}

/// The DRAM a device's FTL tables take: every structure sized by the configuration, the mapping
/// table at its worst (every logical page mapped, as after preconditioning).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryEstimate {
    pub parts: Vec<MemoryPart>,
    pub total_bytes: u64,
}

/// Bytes per logical page each mapping table takes at its worst (every page mapped to a random
/// PPN): the flat array exactly; hashbrown's u32 pairs at its lowest load (8 bytes and a control
/// byte a bucket, buckets at most 16/7 of the entries); the extent map's 12-byte runs when every
/// page is a run of its own; the learned table's documented worst case (4.0-4.5 bytes a mapping,
/// docs/mapping.md) with its update buffer at its fullest.
fn mapping_bytes_per_page(table: MappingKind) -> (f64, &'static str) {
    match table {
        MappingKind::Hash => (9.0 * 16.0 / 7.0, "about 20.6 B per logical page at worst"),
        MappingKind::Extent => (12.0, "12 B per run, at worst a run per logical page"),
        MappingKind::Learned => (
            7.0,
            "about 7 B per logical page at worst (random PPNs, its buffer full)",
        ),
        MappingKind::Flat => (4.0, "4 B per logical page"),
    }
}

impl MemoryEstimate {
    pub fn of(config: &Config, g: &Geometry) -> Self {
        let flash_keys = "flash.channels x dies_per_channel x blocks_per_die x pages_per_block";
        let capacity_keys = "capacity.logical_bytes (or over_provisioning, spare_factor)";
        let (per_page, how) = mapping_bytes_per_page(config.ftl.mapping);
        let mut parts = vec![
            MemoryPart {
                name: "reverse map",
                bytes: g.physical_pages * 4,
                basis: format!(
                    "4 B per physical page x {} pages ({flash_keys})",
                    g.physical_pages
                ),
            },
            MemoryPart {
                name: "valid-page bitmaps",
                bytes: u64::from(g.superblocks)
                    * u64::from(g.pages_per_superblock).div_ceil(64)
                    * 8,
                basis: format!("1 bit per physical page ({flash_keys})"),
            },
            MemoryPart {
                name: "superblock lists",
                bytes: u64::from(g.superblocks) * 19
                    + u64::from(g.reclaim_groups) * (u64::from(g.pages_per_superblock) + 1) * 4,
                basis: format!("19 B per superblock x {} superblocks", g.superblocks),
            },
            MemoryPart {
                name: "mapping table",
                bytes: (g.logical_pages as f64 * per_page) as u64,
                basis: format!(
                    "`{}`: {how} x {} pages (ftl.mapping, {capacity_keys})",
                    config.ftl.mapping.name(),
                    g.logical_pages
                ),
            },
        ];
        let buffer_pages = ((config.ftl.write_buffer_mib * (1u64 << 20) as f64) as u64
            / u64::from(g.page_size_bytes))
        .min(g.logical_pages);
        if buffer_pages > 0 {
            parts.push(MemoryPart {
                name: "write buffer index",
                bytes: g.logical_pages * 4 + buffer_pages * 6,
                basis: format!(
                    "4 B per logical page and 6 B per buffered page (ftl.write_buffer_mib, {capacity_keys})"
                ),
            });
        }
        if config.fdp.placement == crate::config::PlacementPolicy::Auto {
            parts.push(MemoryPart {
                name: "auto placement history",
                bytes: g.logical_pages * 4,
                basis: format!("4 B per logical page (fdp.placement = \"auto\", {capacity_keys})"),
            });
        }
        let total_bytes = parts.iter().map(|p| p.bytes).sum();
        Self { parts, total_bytes }
    }

    /// Refuses the device when it needs more than `available` (with what the host allows, if
    /// it can tell).
    pub fn check(&self, available: Option<&Available>) -> Result<(), MemoryError> {
        let Some(available) = available else {
            return Ok(());
        };
        if self.total_bytes <= available.bytes {
            return Ok(());
        }
        let parts: Vec<String> = self
            .parts
            .iter()
            .filter(|p| p.bytes > 0)
            .map(|p| format!("{} {} ({})", p.name, binary_size(p.bytes), p.basis))
            .collect();
        Err(MemoryError {
            needed_bytes: self.total_bytes,
            available: available.clone(),
            parts: parts.join("; "),
        })
    }
}

/// A device whose FTL tables would not fit in the memory the host allows.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "this device's FTL tables need about {} of memory, more than the {} available ({}): \
     {parts}. Make the device smaller (flash.blocks_per_die, flash.pages_per_block, \
     capacity.logical_bytes) or pick a smaller mapping table (ftl.mapping)",
    binary_size(*needed_bytes),
    binary_size(available.bytes),
    available.source
)]
pub struct MemoryError {
    pub needed_bytes: u64,
    pub available: Available,
    /// Each table's share and its basis, for the message.
    pub parts: String,
}

/// What the host lets this process allocate, and which limit says so.
#[derive(Clone, Debug, PartialEq)]
pub struct Available {
    pub bytes: u64,
    pub source: String,
}

/// The least of the host's memory not in use (`MemAvailable`), the address-space limit left
/// (`ulimit -v`, less what the process has mapped), the data limit (`ulimit -d`) and the cgroup's
/// limit left (`memory.max`); None when none can be read.
pub fn available() -> Option<Available> {
    let mut best: Option<Available> = None;
    let mut consider = |bytes: u64, source: &str| {
        if best.as_ref().is_none_or(|b| bytes < b.bytes) {
            best = Some(Available {
                bytes,
                source: source.to_string(),
            });
        }
    };
    let status_kib = |field: &str| -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = text.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
        let kib = text
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
        if let Some(kib) = kib {
            consider(kib << 10, "MemAvailable in /proc/meminfo");
        }
    }
    #[cfg(target_os = "linux")]
    {
        let limit = |resource| {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit(2) writes the struct it is given.
            let ok = unsafe { libc::getrlimit(resource, &mut l) } == 0;
            (ok && l.rlim_cur != libc::RLIM_INFINITY).then_some(l.rlim_cur)
        };
        if let Some(limit) = limit(libc::RLIMIT_AS) {
            let used = status_kib("VmSize:").unwrap_or(0) << 10;
            consider(
                limit.saturating_sub(used),
                "the address-space limit, ulimit -v",
            );
        }
        if let Some(limit) = limit(libc::RLIMIT_DATA) {
            let used = status_kib("VmData:").unwrap_or(0) << 10;
            consider(limit.saturating_sub(used), "the data limit, ulimit -d");
        }
    }
    let cgroup = |name: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{name}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    if let (Some(max), Some(current)) = (cgroup("memory.max"), cgroup("memory.current")) {
        consider(max.saturating_sub(current), "the cgroup's memory.max");
    }
    best
}

/// `bytes` in the largest binary unit that leaves at least 1 (B, KiB, MiB, GiB, TiB), for the
/// human summaries: a learned table of a few KB read "0.0 MiB".
pub fn binary_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigBuilder;
    use crate::ftl::mapping::FlatMapping;

    fn config(sets: &[&str]) -> Config {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        for s in sets {
            b.set(s).unwrap();
        }
        b.build().unwrap()
    }

    /// The estimate of the fixed structures is what the FTL allocates (`metadata_bytes`), to
    /// within the superblock lists' small change.
    #[test]
    fn the_estimate_matches_what_the_ftl_allocates() {
        for sets in [
            &["flash.blocks_per_die=16", "capacity.over_provisioning=0.25"][..],
            &[
                "flash.blocks_per_die=16",
                "capacity.over_provisioning=0.25",
                "ftl.write_buffer_mib=4",
            ][..],
        ] {
            let c = config(sets);
            let g = c.geometry().unwrap();
            let estimate = MemoryEstimate::of(&c, &g);
            let ftl = crate::ftl::Ftl::new(&c, g.clone(), FlatMapping::new(g.logical_pages));
            let real = ftl.metadata_bytes() as u64;
            let diff = estimate.total_bytes.abs_diff(real);
            assert!(
                diff * 100 <= real,
                "estimate {} against {real} allocated ({sets:?})",
                estimate.total_bytes
            );
        }
    }

    #[test]
    fn a_device_larger_than_what_is_available_is_refused_with_the_keys() {
        let c = config(&["flash.blocks_per_die=262143"]);
        let estimate = MemoryEstimate::of(&c, &c.geometry().unwrap());
        assert!(estimate.total_bytes > 16 << 30, "{estimate:?}");
        let available = Available {
            bytes: 4 << 30,
            source: "ulimit -v".into(),
        };
        let e = estimate.check(Some(&available)).unwrap_err().to_string();
        assert!(e.contains("4.0 GiB available (ulimit -v)"), "{e}");
        assert!(
            e.contains("flash.blocks_per_die") && e.contains("ftl.mapping"),
            "{e}"
        );
        assert!(estimate.check(None).is_ok());
        let small = MemoryEstimate::of(&config(&[]), &config(&[]).geometry().unwrap());
        assert!(small.check(Some(&available)).is_ok());
    }
}
