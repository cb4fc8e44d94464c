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
