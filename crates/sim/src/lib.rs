//! ftlab's simulation above the core: block traces in five formats ([`trace`]), synthetic
//! workloads ([`workload`]), the one device builder ([`device::ConfiguredFtl`]: an FTL with the
//! configured mapping table), the driver that replays requests against it in simulated time
//! ([`sim`]) and the [`Report`] it writes.

pub mod analytic;
pub mod device;
pub mod lsm;
pub mod placement;
pub mod report;
pub mod sim;
pub mod trace;
pub mod waf_window;
pub mod workload;

pub use device::{ConfiguredFtl, FtlVisitor};
pub use report::Report;
