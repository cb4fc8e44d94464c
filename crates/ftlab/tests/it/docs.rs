//! The reference docs against the program: every key the program writes is documented, and every
//! documented key exists, so that docs/config.md, docs/report-schema.md, the `--json` example in
//! docs/mapping.md, docs/serve.md's table of `serve` flags and the examples `ftlab sim --help` gives
//! cannot drift from the code unnoticed.

use crate::support::{ftlab, read_json, temp_dir};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// A file of the project's documentation, by its path from the project root.
fn doc(path: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines after the first line that begins with `heading`, up to the next heading.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .split_inclusive('\n')
        .scan(0, |at, line| {
            let begins = *at;
            *at += line.len();
            Some((begins, line))
        })
        .find(|(_, line)| line.starts_with(heading))
        .map(|(at, line)| at + line.len())
        .unwrap_or_else(|| panic!("no heading `{heading}`"));
    let end = doc[start..].find("\n#").map_or(doc.len(), |e| start + e);
    &doc[start..end]
}

/// The names in backticks in `text`.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// A section's table rows: the keys named in the first cell, and the rest of the row.
fn rows(section: &str) -> Vec<(Vec<&str>, &str)> {
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let (first, rest) = l[1..].split_once('|').expect("a table row");
            (backticked(first), rest)
        })
        .collect()
}

/// Every key of `value`'s objects, at any depth (through arrays too).
fn nested_keys(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                out.insert(k.clone());
                nested_keys(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| nested_keys(v, out)),
        _ => {}
    }
}

/// `object`'s keys are exactly the keys the table in `section` names; an object value's own
/// keys, at any depth, are each named in backticks in its row (but those of `elsewhere`, whose
/// rows point to another document).
fn assert_documented(object: &Value, section: &str, what: &str, elsewhere: &[&str]) {
    let rows = rows(section);
    let documented: BTreeSet<&str> = rows.iter().flat_map(|(k, _)| k.iter().copied()).collect();
    let written: BTreeSet<&str> = object
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        written.difference(&documented).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "{what}: written but not documented"
    );
    assert_eq!(
        documented.difference(&written).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "{what}: documented but not written"
    );
    for (keys, meaning) in &rows {
        for key in keys.iter().filter(|k| !elsewhere.contains(k)) {
            let mut inner = BTreeSet::new();
            nested_keys(&object[*key], &mut inner);
            let named: BTreeSet<&str> = backticked(meaning).into_iter().collect();
            for k in &inner {
                assert!(
                    named.contains(k.as_str()),
                    "{what}: `{key}` holds `{k}`, which its row does not name"
                );
            }
        }
    }
}

/// Values for documented keys that no preset prints (the alternatives, and the trace's own).
const NOT_IN_PRESETS: [(&str, &str); 7] = [
    ("workload.placement_ranges", "\"ranges.csv\""),
    ("capacity.over_provisioning", "0.25"),
    ("capacity.spare_factor", "0.2"),
    ("workload.overwrites", "1.0"),
    ("workload.trace", "\"x.csv\""),
    ("workload.format", "\"msr\""),
    ("workload.power_cut_at_ns", "1000000"),
];

#[test]
fn the_config_reference_names_every_key_and_only_keys_that_exist() {
    let reference = doc("docs/config.md");
    let mut printed = std::collections::BTreeMap::new();
    for preset in ["femu", "femu-fdp", "hexa", "validation-uniform"] {
        let (ok, stdout, stderr) = ftlab(&["config", "--preset", preset]);
        assert!(ok, "{stderr}");
        let config: toml::Table = stdout.parse().expect("`ftlab config` prints TOML");
        for (table, keys) in &config {
            let documented = rows(section(&reference, &format!("## `[{table}]`")))
                .into_iter()
                .flat_map(|(k, _)| k)
                .collect::<BTreeSet<_>>();
            for (key, value) in keys.as_table().expect("a table per section") {
                assert!(
                    documented.contains(key.as_str()),
                    "`{table}.{key}` (preset {preset}) is not in docs/config.md"
                );
                printed
                    .entry(format!("{table}.{key}"))
                    .or_insert_with(|| value.to_string());
            }
        }
    }
    // Each documented key is one the configuration takes (an unknown key is an error).
    let tables: Vec<&str> = reference
        .lines()
        .filter_map(|l| l.strip_prefix("## `[")?.split_once("]`").map(|(t, _)| t))
        .collect();
    assert_eq!(
        tables,
        ["flash", "capacity", "ftl", "workload", "fdp", "report"],
        "the sections of docs/config.md"
    );
    for table in tables {
        for (keys, _) in rows(section(&reference, &format!("## `[{table}]`"))) {
            for key in keys {
                let name = format!("{table}.{key}");
                let value = printed.get(&name).cloned().unwrap_or_else(|| {
                    let (_, v) = NOT_IN_PRESETS
                        .iter()
                        .find(|(n, _)| *n == name)
                        .unwrap_or_else(|| panic!("no value to try for documented `{name}`"));
                    v.to_string()
                });
                let (ok, _, stderr) = ftlab(&["config", "--set", &format!("{name}={value}")]);
                assert!(ok, "documented `{name}` = {value}: {stderr}");
            }
        }
    }
}

#[test]
fn the_report_schema_names_every_key_of_a_replays_report() {
    let dir = temp_dir("docs-report");
    // A replay (so the report has its `trace` object) with reads, writes, trims and a flush.
    let trace = dir.join("t.nbdlog");
    std::fs::write(
        &trace,
        "2026-11-21 23:08:11.750000 connection=1 Write id=1 offset=0x0 count=0x10000 fua=0 ...\n\
         2026-11-21 23:08:11.750100 connection=1 ...Write id=1 return=0\n\
         2026-11-21 23:08:11.751000 connection=1 Read id=2 offset=0x2000 count=0x4000 ...\n\
         2026-11-21 23:08:11.751100 connection=1 ...Read id=2 return=0\n\
         2026-11-21 23:08:11.752000 connection=1 Trim id=3 offset=0x8000 count=0x8000 fua=0 ...\n\
         2026-11-21 23:08:11.752100 connection=1 ...Trim id=3 return=0\n\
         2026-11-21 23:08:11.753000 connection=1 Flush id=4 ...\n\
         2026-11-21 23:08:11.753100 connection=1 ...Flush id=4 return=0\n",
    )
    .unwrap();
    let json = dir.join("r.json");
    let (ok, _, stderr) = ftlab(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--set",
        "ftl.mapping=\"learned\"",
        // Past the trace's end: the run is whole, and the report has its `power_cut`.
        "--power-cut-at",
        "1000000000",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let report = read_json(&json);
    assert!(report["trace"].is_object(), "{report}");
    let schema = doc("docs/report-schema.md");
    let top = section(&schema, "# JSON report schema");
    // `config` is docs/config.md's, checked above.
    assert_documented(&report, top, "ftlab sim --json", &["config"]);
}

/// `ftlab serve --stats`: `stats` (a device's `stats_json()`) has the keys docs/report-schema.md
/// lists for it (the report's, and the live device's own), and its `store` the fields of docs/store.md's statistics table (`config` is
/// docs/config.md's, checked above).
pub fn assert_serve_stats_documented(stats: &Value) {
    let schema = doc("docs/report-schema.md");
    // The report's keys (but a replay's `trace` and a cut run's `power_cut`), then the live
    // device's own.
    let report: Vec<&str> = section(&schema, "# JSON report schema")
        .lines()
        .filter(|l| !l.starts_with("| `trace`") && !l.starts_with("| `power_cut`"))
        .collect();
    let table = section(&schema, "## `ftlab serve --stats FILE`");
    let table = format!("{}\n{table}", report.join("\n"));
    assert_documented(stats, &table, "ftlab serve --stats", &["store", "config"]);
    let store = doc("docs/store.md");
    let fields = section(&store, "## Statistics (`stats()`)");
    assert_documented(&stats["store"], fields, "the store's stats()", &[]);
}

#[test]
fn the_mapbench_json_example_has_the_keys_mapbench_writes() {
    let dir = temp_dir("docs-mapbench");
    let json = dir.join("m.json");
    let t = crate::support::trace("files.msr.csv.gz");
    let (ok, _, stderr) = ftlab(&[
        "mapbench",
        "--ppns",
        "simulator",
        "--precondition",
        "--tables",
        "flat-u64,learned",
        "--repeat",
        "1",
        "--json",
        json.to_str().unwrap(),
        t.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let written = read_json(&json);
    // The fill (every LPN once) comes first, and on the full drive the GC moves pages.
    assert_eq!(
        written["fill_updates"], written["logical_pages"],
        "{written}"
    );
    assert!(written["simulator"]["gc_write_pages"].as_u64().unwrap() > 0);
    let mapping = doc("docs/mapping.md");
    let example = mapping
        .split("`--json FILE` writes")
        .nth(1)
        .and_then(|s| s.split("```json\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("docs/mapping.md has the --json example");
    let example: Value = serde_json::from_str(example).expect("the example is JSON");
    let keys = |v: &Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&example), keys(&written), "top level");
    assert_eq!(
        keys(&example["simulator"]),
        keys(&written["simulator"]),
        "simulator"
    );
    let learned = &written["tables"][1];
    assert_eq!(learned["name"], "learned");
    assert_eq!(keys(&example["tables"][0]), keys(learned), "a table");
    assert_eq!(
        keys(&example["tables"][0]["vs_flat_u64"]),
        keys(&learned["vs_flat_u64"]),
        "vs_flat_u64"
    );
}

#[test]
fn docs_serve_documents_every_flag_of_serve() {
    let (ok, help, stderr) = ftlab(&["serve", "--help"]);
    assert!(ok, "{stderr}");
    let in_help: BTreeSet<&str> = help
        .lines()
        .filter_map(|l| {
            l.trim_start()
                .trim_start_matches("-h, ")
                .split_whitespace()
                .next()
        })
        .filter(|w| w.starts_with("--"))
        .collect();
    assert!(in_help.contains("--listen"), "{help}");
    let reference = doc("docs/serve.md");
    let in_readme: BTreeSet<&str> = rows(section(&reference, "## Flags"))
        .into_iter()
        .flat_map(|(names, _)| names)
        .filter_map(|n| n.split_whitespace().next())
        .filter(|w| w.starts_with("--"))
        .collect();
    // The configuration flags are the simulator's, described with it.
    let shared = ["--help", "--preset", "--config", "--set"];
    let undocumented: Vec<_> = in_help
        .iter()
        .filter(|f| !in_readme.contains(*f) && !shared.contains(f))
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/serve.md's table of flags: {undocumented:?}"
    );
    let unknown: Vec<_> = in_readme.difference(&in_help).collect();
    assert!(
        unknown.is_empty(),
        "in docs/serve.md but not `ftlab serve --help`: {unknown:?}"
    );
}

#[test]
fn the_examples_of_sim_help_run() {
    let (ok, help, stderr) = ftlab(&["sim", "--help"]);
    assert!(ok, "{stderr}");
    let examples: Vec<Vec<&str>> = help
        .split("Examples:")
        .nth(1)
        .expect("`ftlab sim --help` has examples")
        .lines()
        .skip(1)
        .map(|l| l.split(" #").next().unwrap().trim())
        .take_while(|l| l.starts_with("ftlab sim"))
        .map(|l| l.split_whitespace().skip(1).collect())
        .collect();
    assert!(examples.len() >= 3, "{help}");
    assert!(
        examples.iter().any(|e| e.contains(&"ftl.mapping=learned")),
        "the help shows how to choose a mapping table: {help}"
    );
    let dir = temp_dir("sim-help-examples");
    for example in &examples {
        // Paths under ../shared are the project root's; outputs go to the test's directory.
        let args: Vec<String> = example
            .iter()
            .map(|a| match a.strip_prefix("../shared/") {
                Some(rest) => crate::support::shared().join(rest).display().to_string(),
                None => a.to_string(),
            })
            .collect();
        // A few thousand requests on a fresh drive (a trace is replayed whole either way).
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ftlab"))
            .args(&args)
            .args([
                "-q",
                "--set",
                "workload.requests=3000",
                "--set",
                "workload.precondition=false",
            ])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ftlab {}: {}",
            example.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        for (flag, file) in example.iter().zip(example.iter().skip(1)) {
            if ["--json", "--csv"].contains(flag) {
                let written = dir.path().join(file);
                assert!(written.is_file(), "ftlab {}: no {file}", example.join(" "));
            }
        }
    }
    assert!(read_json(dir.path().join("r.json"))["host_write_pages"].as_u64() > Some(0));
}

/// docs/serve.md's policy example, run: the documented `ftlab policy check` commands on the
/// documented file print what the page says, and exit 3 for a denial.
#[test]
fn the_access_policy_example_decides_as_documented() {
    let serve = doc("docs/serve.md");
    let text = section(&serve, "## Access policies");
    let block = |fence: &str| {
        text.split(fence)
            .nth(1)
            .and_then(|b| b.split("```").next())
            .unwrap_or_else(|| panic!("a {fence} block"))
    };
    let dir = temp_dir("docs-policy");
    let file = dir.join("policy.toml");
    std::fs::write(&file, block("```toml\n")).unwrap();
    let lines: Vec<&str> = block("```text\n").lines().collect();
    let mut checked = 0;
    for pair in lines.windows(2) {
        let Some(command) = pair[0].strip_prefix("$ ftlab ") else {
            continue;
        };
        let args: Vec<String> = command
            .split_whitespace()
            .map(|a| {
                if a == "policy.toml" {
                    file.display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ftlab"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            pair[1],
            "{command}"
        );
        let denied = pair[1].contains("denied");
        assert_eq!(
            out.status.code(),
            Some(if denied { 3 } else { 0 }),
            "{command}"
        );
        checked += 1;
    }
    assert!(checked >= 2, "{checked} documented decisions");
    // A refused file: exit 1 and the line named.
    std::fs::write(&file, "[[statement]]\neffect = \"permit\"\n").unwrap();
    let (ok, _, err) = ftlab(&[
        "policy",
        "check",
        file.to_str().unwrap(),
        "--action",
        "read",
        "--export",
        "x",
    ]);
    assert!(!ok && err.contains("policy.toml:2:"), "{err}");
}

/// `ftlab --help` gives each command its own description (a doc comment once sat on the wrong
/// command, so `snapshot` showed `check`'s and `check` showed none).
#[test]
fn every_command_in_the_help_has_its_own_description() {
    let (ok, help, stderr) = ftlab(&["--help"]);
    assert!(ok, "{stderr}");
    let line = |command: &str| {
        help.lines()
            .find(|l| l.trim_start().starts_with(&format!("{command} ")))
            .unwrap_or_else(|| panic!("no `{command}` line in\n{help}"))
            .to_string()
    };
    assert!(line("check").contains("Verify"), "{help}");
    assert!(line("snapshot").contains("snapshots and clones"), "{help}");
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .expect("a Commands section")
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .collect();
    for l in &commands {
        let mut words = l.split_whitespace();
        let name = words.next().unwrap();
        assert!(words.next().is_some(), "`{name}` has no description: {l:?}");
    }
}
