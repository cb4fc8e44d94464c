//! The core of ftlab, the layers of an SSD controller below the host interface: a [`Request`]
//! (request), the typed [`Config`] and its validated [`Geometry`](geometry::Geometry), NAND
//! timing ([`flash`]), and the page-mapping [`Ftl`](ftl::Ftl) (write buffer, block manager,
//! greedy GC) generic over its [`MappingTable`](ftl::mapping::MappingTable), with the plain
//! tables (flat, hash, extent). The learned table is `ftlab-learned`; traces, workloads and
//! reports are `ftlab-sim`. This crate has no CLI, plotting or compression dependency.
//!
//! ```
//! use ftlab_core::config::ConfigBuilder;
//! use ftlab_core::ftl::{mapping::FlatMapping, Ftl};
//! use ftlab_core::request::{Op, Request};
//!
//! let mut builder = ConfigBuilder::from_preset("femu")?;
//! builder.set("flash.blocks_per_die=64")?;
//! builder.set("capacity.over_provisioning=0.25")?;
//! let config = builder.build()?;
//! let geometry = config.geometry()?;
//! let mut ftl = Ftl::new(&config, geometry.clone(), FlatMapping::new(geometry.logical_pages));
//! ftl.submit(&Request::new(0, Op::Write, 0, 4096), 0)?;
//! assert_eq!(ftl.stats().host_write_pages, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod addr;
pub mod atomic_file;
pub mod config;
pub mod flash;
pub mod ftl;
pub mod geometry;
pub mod heap;
pub mod memory;
pub mod request;
pub mod rng;
pub mod serde_state;
pub mod table;
pub mod units;

pub use config::{Config, ConfigBuilder};
pub use request::Request;
