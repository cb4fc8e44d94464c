//! The server's FTL model with the configured mapping table. The FTL is generic over the table
//! (one monomorphised hot path each); the server matches on this enum once per request piece,
//! never per page.

use crate::config::Config;
use crate::ftl::mapping::{ExtentMapping, FlatMapping, HashMapping, LearnedMapping, MappingTable};
use crate::ftl::{Ftl, FtlError, FtlStats};
use crate::request::Request;

/// Boxed: the FTLs differ in size by their tables' inline state, and the enum is made once.
pub enum ModelFtl {
    Flat(Box<Ftl<FlatMapping>>),
    Hash(Box<Ftl<HashMapping>>),
    Extent(Box<Ftl<ExtentMapping>>),
    Learned(Box<Ftl<LearnedMapping>>),
}

macro_rules! each {
    ($self:expr, $ftl:ident => $body:expr) => {
        match $self {
            ModelFtl::Flat($ftl) => $body,
            ModelFtl::Hash($ftl) => $body,
            ModelFtl::Extent($ftl) => $body,
            ModelFtl::Learned($ftl) => $body,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned: Option<crate::ftl::mapping::learned::LearnedActivity>,
}

impl ModelFtl {
    pub fn new(config: &Config, logical_pages: u64) -> Self {
        match config.ftl.mapping.as_str() {
            "hash" => ModelFtl::Hash(Box::new(Ftl::new(config, HashMapping::new()))),
            "extent" => ModelFtl::Extent(Box::new(Ftl::new(config, ExtentMapping::new()))),
            "learned" => ModelFtl::Learned(Box::new(Ftl::new(
                config,
                LearnedMapping::new(logical_pages)
                    .buffer_live_divisor(config.ftl.learned_buffer_divisor),
            ))),
            // Config validation admits only the tables above and `flat`.
            _ => ModelFtl::Flat(Box::new(Ftl::new(config, FlatMapping::new(logical_pages)))),
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

    pub fn mapping(&self) -> MappingSummary {
        each!(self, f => MappingSummary {
            table: f.mapping().name(),
            bytes: f.mapping_bytes() as u64,
            live_mappings: f.mapping().live_mappings(),
            compressed_get_fraction: f.mapping().compressed_get_fraction(),
            learned: f.mapping().learned_activity(),
        })
    }
}
