use ftlab::config::{Config, ConfigBuilder};
use std::path::PathBuf;

pub fn config(preset: &str, sets: &[&str]) -> Config {
    let mut b = ConfigBuilder::from_preset(preset).expect("preset");
    for s in sets {
        b.set(s).expect("override");
    }
    b.build().expect("valid config")
}

pub fn run(config: &Config) -> ftlab::Report {
    ftlab::sim::run(config, &mut |_| {}).expect("simulation runs")
}

/// `../shared` beside the project root.
pub fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

pub fn trace(name: &str) -> PathBuf {
    shared().join("traces").join(name)
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ftlab-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
