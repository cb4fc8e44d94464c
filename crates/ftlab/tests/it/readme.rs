//! The README's example commands (its first ```sh block after "## Examples") run as written.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn readme_examples_run() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let examples = readme
        .split("## Examples")
        .nth(1)
        .expect("README has an Examples section");
    let block = examples
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("an sh block of examples");
    std::fs::create_dir_all(root.join("target")).unwrap();
    let mut ran = 0;
    for line in block.lines().filter(|l| l.starts_with("ftlab ")) {
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_ftlab"))
            .args(&args)
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{line}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    assert!(ran >= 5, "only {ran} examples found");
    for f in [
        "pgbench-waf.png",
        "pgbench-waf.svg",
        "pgbench-latency.png",
        "pgbench-latency.svg",
    ] {
        let meta = std::fs::metadata(root.join("target").join(f)).unwrap();
        assert!(meta.len() > 1000, "{f} is empty");
    }
}
