use ftlab_core::config::{Config, ConfigBuilder};
use std::path::{Path, PathBuf};

/// A property test's case count: `default`, or `PROPTEST_CASES` for a long local run (CI uses
/// the defaults). The tests name their count, which would otherwise override the variable.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn config(preset: &str, sets: &[&str]) -> Config {
    let mut b = ConfigBuilder::from_preset(preset).expect("preset");
    for s in sets {
        b.set(s).expect("override");
    }
    b.build().expect("valid config")
}

pub fn run(config: &Config) -> ftlab_sim::Report {
    ftlab_sim::sim::run(config, &mut |_| {}).expect("simulation runs")
}

/// `../shared` beside the project root.
pub fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

pub fn trace(name: &str) -> PathBuf {
    shared().join("traces").join(name)
}

/// Runs the ftlab binary: (success, stdout, stderr).
pub fn ftlab(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ftlab"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A JSON file a command wrote (a report, `mapbench --json`, the server's statistics).
pub fn read_json(path: impl AsRef<Path>) -> serde_json::Value {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A directory for one test, removed when the test ends. Every run once left its directories
/// behind (a 512 MiB nbdcopy image each time) until the disk filled; now a directory stays only
/// when its test fails, and its path is printed for the post-mortem.
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.disable_cleanup(true);
            eprintln!("kept {} (the test failed)", self.0.path().display());
        }
    }
}

/// A fresh directory named after the test (`ftlab-test-NAME-XXXXXX` in the system's temp dir).
pub fn temp_dir(name: &str) -> TempDir {
    TempDir(
        tempfile::Builder::new()
            .prefix(&format!("ftlab-test-{name}-"))
            .tempdir()
            .expect("creating a test directory"),
    )
}

#[test]
fn a_test_directory_goes_when_its_test_passes_and_stays_when_it_fails() {
    let passed = temp_dir("support-pass");
    let path = passed.join("f");
    std::fs::write(&path, b"x").unwrap();
    drop(passed);
    assert!(!path.exists());
    let kept = std::thread::spawn(|| {
        let failed = temp_dir("support-fail");
        std::fs::write(failed.join("f"), b"x").unwrap();
        let path = failed.path().to_path_buf();
        std::panic::panic_any(path);
    })
    .join()
    .unwrap_err()
    .downcast::<PathBuf>()
    .unwrap();
    assert!(kept.join("f").exists());
    std::fs::remove_dir_all(*kept).unwrap();
}

/// Where skipped tests leave their line: nextest captures a passing test's output, so a
/// SKIPPED line printed alone would be invisible in a green run. `scripts/test.sh` empties this
/// file before the tests and prints it, counted, after them.
pub fn skipped_log() -> PathBuf {
    std::env::var_os("FTLAB_SKIPPED_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt"))
}

/// Marks test `test` skipped because `why`: prints SKIPPED (seen with `--no-capture` or when a
/// test fails) and appends `test: why` to `skipped_log()`, which the test command's summary
/// shows. The caller returns right after.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    println!("SKIPPED: {test}: {why}");
    eprintln!("SKIPPED: {test}: {why}");
    let path = skipped_log();
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // One write per line: tests run in parallel processes, and O_APPEND keeps lines whole.
    f.write_all(format!("{test}: {why}\n").as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

#[test]
fn a_skipped_test_leaves_its_line_for_the_summary() {
    let dir = temp_dir("skip-log");
    let log = dir.join("skipped.txt");
    // This process's environment only: each nextest test is a process of its own.
    std::env::set_var("FTLAB_SKIPPED_LOG", &log);
    skip("some_test", "qemu-io is not installed");
    skip("other_test", "needs root");
    std::env::remove_var("FTLAB_SKIPPED_LOG");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "some_test: qemu-io is not installed\nother_test: needs root\n"
    );
}
