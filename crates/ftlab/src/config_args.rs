//! What every command that builds a device takes: a preset, TOML files and `--set` keys, layered
//! in that order; `ftlab config` and `ftlab presets`.

use anyhow::Result;
use clap::Args;
use ftlab_core::config::{ConfigBuilder, DEFAULT_PRESET, PRESETS};
use std::path::PathBuf;

#[derive(Args, Clone)]
pub struct ConfigArgs {
    /// Preset to start from: femu, femu-fdp, hexa, validation-uniform.
    #[arg(long, default_value = DEFAULT_PRESET)]
    pub preset: String,
    /// TOML file merged over the preset (may be given several times).
    #[arg(long = "config", value_name = "FILE")]
    pub configs: Vec<PathBuf>,
    /// Override one key, e.g. --set flash.channels=4 --set capacity.over_provisioning=0.28.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
}

/// Preset, then `defaults` (what a command implies), then files, then --set, then `extra` (the
/// command's own flags).
pub fn build_config(
    args: &ConfigArgs,
    defaults: &[String],
    extra: &[String],
) -> Result<ftlab_core::Config> {
    Ok(config_layers(args, defaults, extra)?.build()?)
}

/// The layers of `build_config`, not yet checked.
pub fn config_layers(
    args: &ConfigArgs,
    defaults: &[String],
    extra: &[String],
) -> Result<ConfigBuilder> {
    let mut builder = ConfigBuilder::from_preset(&args.preset)?;
    for set in defaults {
        builder.set(set)?;
    }
    for path in &args.configs {
        builder.merge_file(path)?;
    }
    for set in args.sets.iter().chain(extra) {
        builder.set(set)?;
    }
    Ok(builder)
}

/// `ftlab config`: the resolved configuration as TOML, and the tables' memory as comments.
pub fn print_config(args: &ConfigArgs) -> Result<()> {
    build_config(args, &[], &[]).and_then(|c| {
        let estimate = ftlab_core::memory::MemoryEstimate::of(&c, &c.geometry()?);
        print!("{}", c.to_toml());
        // Comments, so that the output stays a config file to start from.
        println!(
            "\n# Memory the FTL's tables take, estimated (`sim` and `serve` refuse a device \
             that needs more than the host has available):"
        );
        for part in &estimate.parts {
            println!(
                "#   {:<20} {:>10}  {}",
                part.name,
                ftlab_sim::report::binary_size(part.bytes),
                part.basis
            );
        }
        println!(
            "#   {:<20} {:>10}",
            "total",
            ftlab_sim::report::binary_size(estimate.total_bytes)
        );
        Ok(())
    })
}

/// `ftlab presets`.
pub fn print_presets() -> Result<()> {
    for p in PRESETS {
        println!("{:<20} {}", p.name, p.summary);
    }
    Ok(())
}
