//! The one place that builds "an FTL with the configured mapping table": `ConfiguredFtl`. The
//! FTL is generic over its table (one monomorphised hot path each, no dynamic dispatch per page),
//! so the choice is an enum: the server keeps it and matches once per request piece; the
//! simulator hands the FTL inside to a `FtlVisitor`, which runs generic code on it.

use ftlab_core::config::{Config, MappingKind};
use ftlab_core::ftl::mapping::{ExtentMapping, FlatMapping, HashMapping, MappingTable};
use ftlab_core::ftl::{Ftl, FtlError, FtlStats};
use ftlab_core::geometry::Geometry;
use ftlab_core::request::Request;
use ftlab_learned::LearnedMapping;

/// Generic work on an FTL whatever its table (`ConfiguredFtl::visit`).
pub trait FtlVisitor {
    type Output;
    fn visit<M: MappingTable>(self, ftl: Ftl<M>) -> Self::Output;
}

/// Boxed: the FTLs differ in size by their tables' inline state, and the enum is made once.
#[derive(serde::Serialize, serde::Deserialize)]
pub enum ConfiguredFtl {
    Flat(Box<Ftl<FlatMapping>>),
    Hash(Box<Ftl<HashMapping>>),
    Extent(Box<Ftl<ExtentMapping>>),
    Learned(Box<Ftl<LearnedMapping>>),
}

macro_rules! each {
    ($self:expr, $ftl:ident => $body:expr) => {
        match $self {
            ConfiguredFtl::Flat($ftl) => $body,
            ConfiguredFtl::Hash($ftl) => $body,
            ConfiguredFtl::Extent($ftl) => $body,
            ConfiguredFtl::Learned($ftl) => $body,
        }
    };
}

/// The mapping table's name and DRAM, for the statistics.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MappingSummary {
    pub table: &'static str,
    pub bytes: u64,
    pub live_mappings: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compressed_get_fraction: Option<f64>,
    /// The table's own account, under its name (`learned`).
    #[serde(flatten)]
    pub activity: Option<ftlab_core::ftl::mapping::TableActivity>,
}

impl ConfiguredFtl {
    /// The FTL `config` describes, on its validated `geometry`, with the table `ftl.mapping`
    /// names.
    pub fn new(config: &Config, geometry: &Geometry) -> Self {
        let logical_pages = geometry.logical_pages;
        let g = || geometry.clone();
        match config.ftl.mapping {
            MappingKind::Hash => {
                ConfiguredFtl::Hash(Box::new(Ftl::new(config, g(), HashMapping::new())))
            }
            MappingKind::Extent => {
                ConfiguredFtl::Extent(Box::new(Ftl::new(config, g(), ExtentMapping::new())))
            }
            MappingKind::Learned => ConfiguredFtl::Learned(Box::new(Ftl::new(
                config,
                g(),
                LearnedMapping::new(logical_pages)
                    .buffer_live_divisor(config.ftl.learned_buffer_divisor),
            ))),
            MappingKind::Flat => ConfiguredFtl::Flat(Box::new(Ftl::new(
                config,
                g(),
                FlatMapping::new(logical_pages),
            ))),
        }
    }

    /// Runs `visitor` on the FTL inside, monomorphised for its table.
    pub fn visit<V: FtlVisitor>(self, visitor: V) -> V::Output {
        match self {
            ConfiguredFtl::Flat(f) => visitor.visit(*f),
            ConfiguredFtl::Hash(f) => visitor.visit(*f),
            ConfiguredFtl::Extent(f) => visitor.visit(*f),
            ConfiguredFtl::Learned(f) => visitor.visit(*f),
        }
    }

    pub fn submit(&mut self, request: &Request, now_ns: u64) -> Result<u64, FtlError> {
        each!(self, f => f.submit(request, now_ns))
    }

    pub fn flush(&mut self, now_ns: u64) -> u64 {
        each!(self, f => f.flush(now_ns))
    }

    pub fn reset_stats(&mut self) {
        each!(self, f => f.reset_stats())
    }

    pub fn stats(&self) -> &FtlStats {
        each!(self, f => f.stats())
    }

    /// The report of the device as it stands (`Report::snapshot`), from `start_ns` to `now_ns`.
    pub fn report(
        &self,
        config: &Config,
        recorder: &crate::report::Recorder,
        start_ns: u64,
        now_ns: u64,
    ) -> crate::report::Report {
        each!(self, f => crate::report::Report::snapshot(config, f, recorder, start_ns, now_ns))
    }

    /// The model's whole state, with `recorder`'s, as bytes (`load` reads them back): a
    /// model restored from them takes the next requests exactly as this one would.
    pub fn save(&self, recorder: &crate::report::Recorder) -> Vec<u8> {
        use bincode::Options;
        bincode::DefaultOptions::new()
            .serialize(&(self, recorder))
            .expect("an FTL serialises")
    }

    /// The model `save` wrote, for `config` on its `geometry`: refused when it was saved with
    /// another mapping table or flash geometry, or the bytes are not a saved model.
    pub fn load(
        config: &Config,
        geometry: &Geometry,
        bytes: &[u8],
    ) -> Result<(ConfiguredFtl, crate::report::Recorder), String> {
        use bincode::Options;
        let (mut ftl, recorder): (ConfiguredFtl, crate::report::Recorder) =
            bincode::DefaultOptions::new()
                .with_limit(bytes.len() as u64)
                .deserialize(bytes)
                .map_err(|e| format!("not a saved model ({e})"))?;
        let kind = match &ftl {
            ConfiguredFtl::Flat(_) => MappingKind::Flat,
            ConfiguredFtl::Hash(_) => MappingKind::Hash,
            ConfiguredFtl::Extent(_) => MappingKind::Extent,
            ConfiguredFtl::Learned(_) => MappingKind::Learned,
        };
        if kind != config.ftl.mapping {
            return Err(format!(
                "saved with ftl.mapping={kind:?}, not {:?}",
                config.ftl.mapping
            )
            .to_lowercase());
        }
        let same = |g: &Geometry| serde_json::to_value(g).ok();
        if same(each!(&ftl, f => f.geometry())) != same(geometry) {
            return Err("saved with another flash geometry or capacity".into());
        }
        each!(&mut ftl, f => f.restore_geometry(geometry.clone()));
        Ok((ftl, recorder))
    }

    pub fn mapping(&self) -> MappingSummary {
        each!(self, f => MappingSummary {
            table: f.mapping().name(),
            bytes: f.mapping_bytes() as u64,
            live_mappings: f.mapping().live_mappings(),
            compressed_get_fraction: f.mapping().compressed_get_fraction(),
            activity: MappingTable::activity(f.mapping()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Recorder;
    use ftlab_core::config::ConfigBuilder;
    use ftlab_core::request::Op;
    use ftlab_core::rng::SplitMix64;

    /// Random writes (1-4 pages, with GC), trims, reads and flushes, `count` of them from
    /// `first`, a microsecond apart.
    fn requests(seed: u64, first: u64, count: u64, pages: u64) -> Vec<Request> {
        let mut rng = SplitMix64::new(seed);
        (first..first + count)
            .map(|i| {
                let lpn = rng.bounded(pages - 4);
                let op = match rng.bounded(20) {
                    0 => Op::Trim,
                    1 | 2 => Op::Read,
                    3 => Op::Flush,
                    _ => Op::Write,
                };
                let len = if op == Op::Flush {
                    0
                } else {
                    4096 * (1 + rng.bounded(4))
                };
                Request::new(i * 1000, op, lpn * 4096, len)
            })
            .collect()
    }

    /// The paths where two reports differ, with both values.
    fn differences(a: &serde_json::Value, b: &serde_json::Value, at: &str) -> Vec<String> {
        use serde_json::Value;
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => x
                .keys()
                .chain(y.keys().filter(|k| !x.contains_key(*k)))
                .flat_map(|k| {
                    differences(
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        &format!("{at}.{k}"),
                    )
                })
                .collect(),
            _ if a == b => Vec::new(),
            _ => vec![format!("{at}: {a} != {b}")],
        }
    }

    fn run(ftl: &mut ConfiguredFtl, recorder: &mut Recorder, requests: &[Request]) {
        for r in requests {
            let done = ftl.submit(r, r.arrival_ns).unwrap();
            recorder.record(r, r.arrival_ns, done);
        }
    }

    /// A model saved part way and loaded takes the rest of the run exactly as the one that ran
    /// on: the whole report equal, for every mapping table, with translation pages on flash and
    /// a write buffer too. And a saved model is refused for another table or geometry.
    #[test]
    fn a_saved_model_goes_on_as_the_one_that_ran_on() {
        for sets in [
            &["ftl.mapping=flat"][..],
            &["ftl.mapping=hash"],
            &["ftl.mapping=extent"],
            &["ftl.mapping=learned"],
            &["ftl.protected_ratio=0.25", "ftl.write_buffer_mib=1"],
            &[
                "ftl.mapping_cache_bytes=8192",
                "ftl.protected_ratio=0.5",
                "ftl.write_buffer_mib=1",
                "ftl.buffer_policy=hexa",
                "ftl.gc_policy=cost_benefit",
            ],
        ] {
            let mut b = ConfigBuilder::from_preset("femu").unwrap();
            for s in sets.iter().chain(&[
                "flash.blocks_per_die=4",
                "flash.superblock_dies=1",
                "capacity.logical_bytes=16777216",
            ]) {
                b.set(s).unwrap();
            }
            let config = b.build_device().unwrap();
            let geometry = config.geometry().unwrap();
            let pages = geometry.logical_pages;
            let mut ftl = ConfiguredFtl::new(&config, &geometry);
            let mut recorder = Recorder::without_series();
            run(&mut ftl, &mut recorder, &requests(1, 1, 20_000, pages));
            let saved = ftl.save(&recorder);
            let (mut loaded, mut loaded_recorder) =
                ConfiguredFtl::load(&config, &geometry, &saved).unwrap();
            let rest = requests(2, 20_001, 20_000, pages);
            run(&mut ftl, &mut recorder, &rest);
            run(&mut loaded, &mut loaded_recorder, &rest);
            let end = 1 << 50;
            let json = |f: &ConfiguredFtl, r: &Recorder| {
                serde_json::to_value(f.report(&config, r, 0, end)).unwrap()
            };
            let (a, b) = (json(&ftl, &recorder), json(&loaded, &loaded_recorder));
            assert!(a["erases"].as_u64().unwrap() > 0, "{sets:?}: no GC");
            if sets
                .iter()
                .any(|s| s.starts_with("ftl.mapping_cache_bytes"))
            {
                let map_reads = a["traffic"]["map_read_pages"].as_u64().unwrap();
                assert!(map_reads > 0, "{sets:?}: the mapping cache never missed");
            }
            assert_eq!(differences(&a, &b, ""), Vec::<String>::new(), "{sets:?}");

            let mut other = ConfigBuilder::from_preset("femu").unwrap();
            for s in ["flash.blocks_per_die=4", "flash.superblock_dies=1"] {
                other.set(s).unwrap();
            }
            other.set("capacity.logical_bytes=8388608").unwrap();
            let other = other.build_device().unwrap();
            let e = ConfiguredFtl::load(&other, &other.geometry().unwrap(), &saved);
            assert!(e.is_err(), "{sets:?}: loaded on another geometry");
            assert!(ConfiguredFtl::load(&config, &geometry, &saved[..saved.len() / 2]).is_err());
        }
    }
}
