//! `ftlab plot`: not implemented yet.
use anyhow::Result;
use std::path::Path;

pub fn run(_report: &Path, _out: Option<&Path>) -> Result<()> {
    anyhow::bail!("plot is not implemented yet")
}
