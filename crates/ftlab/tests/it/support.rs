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

/// A directory for one test (a test and its helpers share it by name). The path holds the
/// process id, which the system reuses: what an earlier run left there (a socket still in it
/// made a test fail with "address in use") is cleared the first time a process asks for it.
pub fn temp_dir(name: &str) -> PathBuf {
    static CLEARED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let dir = std::env::temp_dir().join(format!("ftlab-test-{}-{name}", std::process::id()));
    if CLEARED.lock().unwrap().insert(name.to_string()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
