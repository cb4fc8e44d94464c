//! ftlab: a software SSD for FTL research. See ARCHITECTURE.md for the codemap.

pub mod config;
pub mod flash;
pub mod ftl;
pub mod geometry;
pub mod heap;
pub mod mapbench;
pub mod memory;
pub mod report;
pub mod request;
pub mod rng;
pub mod server;
pub mod sim;
pub mod store;
pub mod table;
pub mod trace;
pub mod workload;

pub use config::{Config, ConfigBuilder};
pub use report::Report;
