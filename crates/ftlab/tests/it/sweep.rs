//! `ftlab sweep` from the command line: a sweep run, resumed, listed and drawn; bad sweep files
//! refused before anything runs. (python/tests compares it with the Python package and Dask.)

use crate::support::{ftlab, temp_dir};

const SPEC: &str = r#"seeds = 2
[base]
preset = "validation-uniform"
set = { "flash.blocks_per_die" = 256, "workload.overwrites" = 0.5, "workload.precondition_overwrites" = 1 }
[grid]
"capacity.over_provisioning" = [0.1, 0.3]
[zip]
"workload.kind" = ["uniform", "hotcold"]
"workload.hot_access_pcent" = [80, 90]
"#;

#[test]
fn a_sweep_runs_resumes_lists_and_plots() {
    let dir = temp_dir("sweep");
    let spec = dir.join("s.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let out = dir.join("out");
    let s = spec.to_str().unwrap();
    let (ok, _, err) = ftlab(&["sweep", s, "--out", out.to_str().unwrap(), "--jobs", "2"]);
    assert!(ok, "{err}");
    assert!(err.contains("8 points (8 run, 0 done before)"), "{err}");
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(
        &header[..7],
        [
            "point",
            "config_hash",
            "capacity.over_provisioning",
            "workload.kind",
            "workload.hot_access_pcent",
            "workload.seed",
            "waf"
        ]
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 8);
    assert_eq!(&rows[7][2..6], ["0.3", "hotcold", "90", "2"]);
    // Every row names its point's report, and the report holds the row's WAF.
    for row in &rows {
        let report = crate::support::read_json(out.join("points").join(format!("{}.json", row[1])));
        assert_eq!(report["waf"].to_string(), row[6]);
        assert_eq!(report["config"]["workload"]["kind"], row[3]);
    }
    assert!(
        std::fs::metadata(out.join("results.parquet"))
            .unwrap()
            .len()
            > 1000
    );

    let (ok, _, err) = ftlab(&["sweep", s, "--out", out.to_str().unwrap()]);
    assert!(
        ok && err.contains("8 points (0 run, 8 done before)"),
        "{err}"
    );
    std::fs::remove_file(out.join("points").join(format!("{}.json", rows[3][1]))).unwrap();
    let (ok, listed, _) = ftlab(&["sweep", s, "--out", out.to_str().unwrap(), "--dry-run"]);
    assert!(ok && listed.contains("8 points, 1 to run"), "{listed}");
    assert_eq!(listed.lines().filter(|l| l.contains(" to run ")).count(), 1);
    let (ok, _, err) = ftlab(&["sweep", s, "--out", out.to_str().unwrap()]);
    assert!(ok && err.contains("(1 run, 7 done before)"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("results.csv")).unwrap(),
        csv
    );

    let prefix = dir.join("fig");
    let (ok, _, err) = ftlab(&[
        "sweep",
        "plot",
        out.to_str().unwrap(),
        "--x",
        "capacity.over_provisioning",
        "--y",
        "waf",
        "--series",
        "workload.kind",
        "--facet",
        "workload.seed",
        "--reference",
        "desnoyers",
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    for ext in ["png", "svg"] {
        assert!(std::fs::metadata(prefix.with_extension(ext)).unwrap().len() > 1000);
    }
    let (ok, _, err) = ftlab(&[
        "sweep",
        "plot",
        out.to_str().unwrap(),
        "--x",
        "rho",
        "--y",
        "waf",
    ]);
    assert!(
        !ok && err.contains("no column `rho`") && err.contains("capacity.over_provisioning"),
        "{err}"
    );
}

#[test]
fn bad_sweep_files_are_refused_before_anything_runs() {
    let dir = temp_dir("sweep-bad");
    let cases = [
        (
            "[grid]\n\"ftl.gc_polcy\" = [\"greedy\"]\n",
            "bad.toml:2:",
            "ftl.gc_polcy",
        ),
        (
            "[grid]\n\"ftl.gc_policy\" = []\n",
            "bad.toml:2:",
            "no values",
        ),
        (
            "seeds = 2\n[grid]\n\"flash.channels\" = [8, \"eight\"]\n",
            "bad.toml:3:",
            "flash.channels",
        ),
        (
            "[grid]\n\"flash.channels\" = [8]\n[axes]\n",
            "bad.toml:3:",
            "axes",
        ),
    ];
    for (text, at, key) in cases {
        let spec = dir.join("bad.toml");
        std::fs::write(&spec, text).unwrap();
        let out = dir.join("out");
        let (ok, _, err) = ftlab(&[
            "sweep",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(!ok, "{text:?} was accepted");
        assert!(err.contains(at) && err.contains(key), "{text:?}: {err}");
        assert!(!out.exists(), "{text:?}: something was created");
    }
}

/// Every example sweep file in sweeps/ expands (its keys exist, its values have their types) and
/// a dry run creates nothing.
#[test]
fn the_example_sweep_files_are_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sweeps");
    let dir = temp_dir("sweep-examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let out = dir.join("out");
        let (ok, listed, err) = ftlab(&[
            "sweep",
            path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--dry-run",
        ]);
        assert!(ok, "{}: {err}", path.display());
        assert!(listed.contains(" to run "), "{listed}");
        assert!(!out.exists(), "a dry run created {}", out.display());
        checked += 1;
    }
    assert!(checked >= 4, "{checked} sweep files");
}
