//! ftlab's one integration-test binary (one link step instead of one per file).

mod cli;
mod config_errors;
mod determinism;
mod docs;
mod durable_faults;
mod fault_loop;
mod fdp;
mod invariants;
mod mapping;
mod metrics;
mod readme;
mod server;
mod sqlite;
mod store;
mod support;
mod sweep;
mod tools;
mod traces;
mod waf;
