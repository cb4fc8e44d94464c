//! The binary as users run it.

use crate::support::{ftlab, read_json, temp_dir, trace};
use std::process::Command;

#[test]
fn sim_writes_a_json_report_with_the_documented_keys() {
    let dir = temp_dir("cli-json");
    let json = dir.join("r.json");
    let csv = dir.join("r.csv");
    let (ok, stdout, stderr) = ftlab(&[
        "sim",
        "--set",
        "workload.requests=20000",
        "--set",
        "workload.precondition=false",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("WAF"));
    let v = crate::support::read_json(&json);
    for key in [
        "waf",
        "host_write_pages",
        "nand_write_pages",
        "gc_write_pages",
        "erases",
        "sim_time_ns",
        "latency_ns",
        "config",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for op in ["read", "write"] {
        for q in ["p50", "p99", "p999", "max"] {
            assert!(v["latency_ns"][op][q].is_u64(), "latency_ns.{op}.{q}");
        }
    }
    assert_eq!(v["host_write_pages"], 20000);
    assert_eq!(v["config"]["flash"]["channels"], 8);
    assert!(std::fs::read_to_string(&csv)
        .unwrap()
        .starts_with("end_ns,host_write_pages"));
    // Into a pipe (`--json /dev/stdout | jq`): written in place, not truncated nor replaced.
    let (ok, stdout, stderr) = ftlab(&[
        "sim",
        "-q",
        "--set",
        "workload.requests=2000",
        "--json",
        "/dev/stdout",
    ]);
    assert!(ok, "{stderr}");
    let start = stdout.find('{').expect("the report on stdout");
    let v: serde_json::Value = serde_json::from_str(&stdout[start..]).unwrap();
    assert_eq!(v["host_write_pages"], 2000);
}

#[test]
fn the_summary_gives_a_small_tables_bytes_in_a_unit_that_shows_them() {
    // The learned table holds rocksdb's trace in a few KB, which the summary once printed as
    // "0.0 MiB"; its compacted bytes per live mapping (what mapbench and docs/mapping.md
    // compare) are printed beside those as the run ended.
    let dir = temp_dir("cli-summary-units");
    let json = dir.join("r.json");
    let rocksdb = trace("rocksdb.nbdlog.gz");
    let (ok, stdout, stderr) = ftlab(&[
        "sim",
        "--set",
        "ftl.mapping=learned",
        "--trace",
        rocksdb.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let v = read_json(&json);
    let m = &v["mapping"];
    let (bytes, compacted, live) = (
        m["bytes"].as_u64().unwrap(),
        m["bytes_compacted"].as_u64().unwrap(),
        m["live_mappings"].as_u64().unwrap(),
    );
    assert!(bytes < 1 << 20 && compacted < bytes, "{m}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("mapping "))
        .expect("a mapping line");
    assert!(!line.contains("0.0 MiB"), "{line}");
    let kib = |b: u64| format!("{:.1} KiB", b as f64 / 1024.0);
    assert!(
        line.contains(&format!("learned table {}", kib(bytes))),
        "{line}"
    );
    assert!(
        line.contains(&format!("{} compacted", kib(compacted))),
        "{line}"
    );
    assert!(
        line.contains(&format!(
            ", {:.2} compacted; {live} live",
            compacted as f64 / live as f64
        )),
        "{line}"
    );
}

#[test]
fn errors_name_what_is_wrong_and_nothing_panics() {
    let dir = temp_dir("cli-errors");
    let (ok, _, err) = ftlab(&["sim", "--set", "flash.chanels=4"]);
    assert!(!ok && err.contains("chanels"), "{err}");
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "1,h,0,Write,0,4096,1\n2,h,0,Wrote,0,4096,1\n").unwrap();
    let (ok, _, err) = ftlab(&["sim", "--trace", bad.to_str().unwrap()]);
    assert!(!ok && err.contains(":2: field `Type`"), "{err}");
    assert!(!err.contains("panicked"));
    let (ok, out, err) = ftlab(&["sim", "--trace", bad.to_str().unwrap(), "--skip-bad-lines"]);
    assert!(ok, "{err}");
    assert!(out.contains("1 bad lines skipped"), "{out}");
    let far = dir.join("far.csv");
    std::fs::write(
        &far,
        "1,h,0,Write,0,4096,1\n2,h,0,Write,99999999999999,8192,1\n",
    )
    .unwrap();
    let (ok, _, err) = ftlab(&["sim", "--trace", far.to_str().unwrap()]);
    assert!(
        !ok && err.contains("--wrap") && err.contains("far.csv:2"),
        "{err}"
    );
    let (ok, _, err) = ftlab(&["sim", "--trace", far.to_str().unwrap(), "--wrap"]);
    assert!(ok, "{err}");
    let (ok, _, err) = ftlab(&["sim", "--trace", dir.join("missing.csv").to_str().unwrap()]);
    assert!(!ok && err.contains("missing.csv"), "{err}");
    // The OS's reason is said once, not once more as the error's cause.
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    let (ok, _, err) = ftlab(&[
        "sim",
        "--config",
        dir.join("missing.toml").to_str().unwrap(),
    ]);
    assert!(!ok && err.matches("os error 2").count() == 1, "{err}");
    let (ok, _, err) = ftlab(&["mapbench", dir.join("missing.csv").to_str().unwrap()]);
    assert!(!ok && err.matches("missing.csv").count() == 1, "{err}");
    // An empty trace (or one of blank lines only) is called empty, not of an unknown format; one
    // whose first 32 lines are blank is read on.
    for (name, text) in [("empty.csv", ""), ("blank.csv", "\n \n")] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        for cmd in [&["sim", "--trace"][..], &["mapbench"][..]] {
            let (ok, _, err) = ftlab(&[cmd, &[path.to_str().unwrap()][..]].concat());
            assert!(
                !ok && err.contains(&format!("{name}: the trace is empty")),
                "{err}"
            );
        }
    }
    // A seed a config file could not hold (TOML integers are i64) is refused with the range.
    let (ok, _, err) = ftlab(&["sim", "--seed", "18446744073709551615"]);
    assert!(
        !ok && err.contains("is not in 0..=9223372036854775807"),
        "{err}"
    );
    let late = dir.join("late.csv");
    std::fs::write(
        &late,
        format!(
            "{}128166372003061629,hm,0,Write,0,4096,100\n",
            "\n".repeat(40)
        ),
    )
    .unwrap();
    let (ok, out, err) = ftlab(&["sim", "--trace", late.to_str().unwrap()]);
    assert!(ok && out.contains("WAF"), "{err}");
    // A trace that yields no request is an error with the format named too: an empty file (it
    // exited 0 with "WAF 0.000"), or a file of another format with --skip-bad-lines.
    let empty = dir.join("e.csv");
    std::fs::write(&empty, "").unwrap();
    let (ok, _, err) = ftlab(&["sim", "--trace", empty.to_str().unwrap(), "--format", "msr"]);
    assert!(
        !ok && err.contains("e.csv: no request in its 0 line(s)"),
        "{err}"
    );
    let (ok, _, err) = ftlab(&[
        "sim",
        "--trace",
        bad.to_str().unwrap(),
        "--format",
        "nbdkit",
        "--skip-bad-lines",
    ]);
    assert!(
        !ok && err.contains("bad.csv: no request in its 2 line(s) (2 bad and skipped"),
        "{err}"
    );
}

/// WAF with no host writes is no ratio: `n/a` in the summary, `null` in the JSON (it read
/// "WAF 0.000").
#[test]
fn a_run_without_host_writes_shows_no_waf() {
    let dir = temp_dir("cli-no-writes");
    let reads = dir.join("reads.csv");
    std::fs::write(&reads, "1,h,0,Read,0,4096,1\n2,h,0,Read,8192,4096,1\n").unwrap();
    let json = dir.join("r.json");
    let (ok, out, err) = ftlab(&[
        "sim",
        "--trace",
        reads.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("WAF        n/a (no host writes)"), "{out}");
    let report = read_json(&json);
    assert!(report["waf"].is_null(), "{report}");
    assert_eq!(report["host_write_pages"], 0);
}

#[test]
fn config_prints_the_resolved_preset() {
    let (ok, out, _) = ftlab(&["config", "--preset", "hexa"]);
    assert!(ok);
    assert!(out.contains("page_size_bytes = 8192"));
    let (ok, out, _) = ftlab(&["presets"]);
    assert!(ok && out.contains("validation-uniform"));
}

#[test]
fn mapbench_compares_every_table_and_writes_the_documented_json() {
    let dir = temp_dir("cli-mapbench");
    let json = dir.join("m.json");
    let t = crate::support::trace("files.msr.csv.gz");
    let (ok, stdout, stderr) = ftlab(&[
        "mapbench",
        "--json",
        json.to_str().unwrap(),
        t.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("| learned |"), "{stdout}");
    assert!(stdout.contains("| throughput / flat-u64's |"), "{stdout}");
    let v = crate::support::read_json(&json);
    assert!(v["live_mappings"].as_u64().unwrap() > 100_000);
    let fraction = v["compressed_get_fraction"].as_f64().unwrap();
    assert!(fraction > 0.5 && fraction <= 1.0, "{fraction}");
    // Files' lookups are mostly of long runs, which the cursor's span holds.
    let cursor = v["cursor_get_fraction"].as_f64().unwrap();
    assert!(cursor > 0.5 && cursor < 1.0, "{cursor}");
    let tables = v["tables"].as_array().unwrap();
    let names: Vec<&str> = tables.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["flat-u64", "flat-u32", "hash", "extent", "learned"]);
    for t in tables {
        for key in [
            "bytes",
            "bytes_per_live_mapping",
            "get_mops",
            "set_mops",
            "get_p99_ns",
            "set_p99_ns",
            "set_p9999_ns",
            "get_random_p50_ns",
            "get_random_p99_ns",
        ] {
            assert!(t[key].as_f64().is_some(), "{key} in {t}");
        }
        assert_eq!(t["lossless_verified"], true, "{t}");
        // A median of percentiles: p50 <= p99 holds pass by pass, so for the medians too.
        assert!(
            t["get_random_p50_ns"].as_f64() <= t["get_random_p99_ns"].as_f64()
                && t["set_p99_ns"].as_f64() <= t["set_p9999_ns"].as_f64(),
            "{t}"
        );
        // Ratios to the flat u64 array of the same run, as printed.
        for (ratio, mops) in [("get", "get_mops"), ("set", "set_mops")] {
            let want = t[mops].as_f64().unwrap() / tables[0][mops].as_f64().unwrap();
            let got = t["vs_flat_u64"][ratio].as_f64().unwrap();
            assert!((got - want).abs() < 1e-3 * want.max(1.0), "{ratio} in {t}");
        }
        // Exact accounting agrees with glibc's statistics (chunk headers aside).
        if let Some(a) = t["allocator_bytes"].as_f64() {
            let b = t["bytes"].as_f64().unwrap();
            assert!((a - b).abs() <= 0.1 * b + 16_384.0, "{t}");
        }
    }

    assert_eq!(v["learned_buffer_divisor"], 16);

    // A buffer as large as the live mappings answers lookups the compressed layer answered.
    let (ok, stdout, stderr) = ftlab(&[
        "mapbench",
        "--tables",
        "learned",
        "--repeat",
        "1",
        "--learned-buffer-divisor",
        "1",
        "--json",
        json.to_str().unwrap(),
        t.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("up to 1/1 of the live mappings"),
        "{stdout}"
    );
    let big = crate::support::read_json(&json);
    assert_eq!(big["learned_buffer_divisor"], 1);
    assert_eq!(big["tables"][0]["lossless_verified"], true);
    let big_fraction = big["compressed_get_fraction"].as_f64().unwrap();
    assert!(big_fraction < fraction, "{big_fraction} vs {fraction}");
    let (ok, _, stderr) = ftlab(&[
        "mapbench",
        "--learned-buffer-divisor",
        "3",
        t.to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("3 is not a power of two"),
        "{stderr}"
    );

    // A trace that only reads has no SET rate to compare: `null`, not 0.
    let reads = dir.join("reads.csv");
    std::fs::write(
        &reads,
        "128166372003061629,hm,0,Read,0,4096,100\n128166372003061630,hm,0,Read,8192,4096,100\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = ftlab(&[
        "mapbench",
        "--tables",
        "flat-u64,learned",
        "--repeat",
        "1",
        "--json",
        json.to_str().unwrap(),
        reads.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("| learned | ") && stdout.contains(" | - | - |"),
        "{stdout}"
    );
    // Nor SET percentiles (printed `- / -`), where the GET phase has its own.
    assert!(stdout.contains(" | - / - | "), "{stdout}");
    // Nor bytes per live mapping: a table's fixed bytes over no mappings is no figure.
    let learned = stdout
        .lines()
        .find(|l| l.starts_with("| learned | "))
        .unwrap();
    let cells: Vec<&str> = learned.split(" | ").collect();
    // ... | B/live mapping | peak bytes | lossless |
    assert_eq!(
        cells[cells.len() - 3..],
        ["-", cells[cells.len() - 2], "yes |"],
        "{learned}"
    );
    assert!(cells[cells.len() - 2].parse::<u64>().is_ok(), "{learned}");
    let r = crate::support::read_json(&json);
    let ratios = &r["tables"][1]["vs_flat_u64"];
    assert!(ratios["get"].as_f64().unwrap() > 0.0, "{ratios}");
    assert!(
        ratios["set"].is_null() && ratios["get_random"].is_null(),
        "{ratios}"
    );
    for t in r["tables"].as_array().unwrap() {
        assert!(
            t["set_mops"].is_null() && t["get_mops"].as_f64().unwrap() > 0.0,
            "{t}"
        );
        // Nothing is mapped, so there is no live LPN to look up at random either.
        assert!(
            t["set_p50_ns"].is_null()
                && t["set_p99_ns"].is_null()
                && t["set_p9999_ns"].is_null()
                && t["get_random_p99_ns"].is_null(),
            "{t}"
        );
        assert!(t["get_p99_ns"].as_f64().unwrap() >= 1.0, "{t}");
    }

    let (ok, _, stderr) = ftlab(&["mapbench", "--tables", "flat,btree", t.to_str().unwrap()]);
    assert!(!ok && stderr.contains("unknown table `flat`"), "{stderr}");
    // No run at all would have no throughput to report (it used to run once regardless).
    let (ok, _, stderr) = ftlab(&["mapbench", "--repeat", "0", t.to_str().unwrap()]);
    assert!(!ok && stderr.contains("'--repeat <REPEAT>'"), "{stderr}");
    let (ok, _, stderr) = ftlab(&["mapbench", "/nonexistent/trace.csv"]);
    assert!(!ok && stderr.contains("/nonexistent/trace.csv"), "{stderr}");
    // The simulated drive's options need the simulator, and sound values.
    let trace = t.to_str().unwrap();
    let (ok, _, stderr) = ftlab(&["mapbench", "--sim-set", "ftl.streams=2", trace]);
    assert!(!ok && stderr.contains("need --ppns simulator"), "{stderr}");
    let (ok, _, stderr) = ftlab(&["mapbench", "--ppns", "both", "--spare-factor", "1.5", trace]);
    assert!(
        !ok && stderr.contains("1.5 is not between 0 and 1"),
        "{stderr}"
    );
    // A spare too small for the GC's reserve says which option sets it.
    let (ok, _, stderr) = ftlab(&[
        "mapbench",
        "--ppns",
        "simulator",
        "--spare-factor",
        "0.0001",
        trace,
    ]);
    assert!(
        !ok && stderr.contains("gc_thres_pcent_high") && stderr.contains("--spare-factor"),
        "{stderr}"
    );
    let (ok, _, stderr) = ftlab(&[
        "mapbench",
        "--ppns",
        "simulator",
        "--sim-set",
        "capacity.over_provisioning=0.28",
        trace,
    ]);
    assert!(!ok && stderr.contains("--spare-factor"), "{stderr}");
}

/// `scripts/mapping_speed.sh`, which the README's speed table cites, still reads what `mapbench
/// --json` writes: rounds of separate runs summed up as medians and ranges.
#[test]
fn the_speed_table_script_summarises_rounds_of_mapbench() {
    let dir = temp_dir("cli-mapping-speed");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/mapping_speed.sh"
    );
    let sample = trace("msr-hm0-sample.csv");
    let run = |rounds: &str| {
        Command::new(script)
            .arg(rounds)
            .arg(&sample)
            .env("FTLAB", env!("CARGO_BIN_EXE_ftlab"))
            .env("WORK", dir.path())
            .output()
            .unwrap()
    };
    let out = run("2");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("over 2 round(s)"), "{stdout}");
    // Each of the three tables (ratios, rates, bytes) has a row for the trace; the first's
    // ratios are log-head / simulator.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| msr-hm0-sample.csv | "))
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    // Each round's learned table, log-head PPNs (the first of each JSON file's two runs).
    let learned: Vec<serde_json::Value> = ["r1-t0.json", "r2-t0.json"]
        .iter()
        .map(|f| {
            let json = read_json(dir.join(f));
            let tables = json[0]["tables"].as_array().unwrap().clone();
            tables.into_iter().find(|t| t["name"] == "learned").unwrap()
        })
        .collect();
    // The GET ratio's median is the two rounds' mean, to two places.
    let median = (learned[0]["vs_flat_u64"]["get"].as_f64().unwrap()
        + learned[1]["vs_flat_u64"]["get"].as_f64().unwrap())
        / 2.0;
    let get = rows[0].split(" | ").nth(1).unwrap();
    assert!(
        get.starts_with(&format!("{median:.2}x")),
        "{median} in {get}"
    );
    // The bytes are mapbench's own (they do not depend on timing).
    let bytes = learned[0]["bytes_per_live_mapping"].as_f64().unwrap();
    assert!(
        rows[2].contains(&format!(" | {bytes:.3} | ")),
        "{}",
        rows[2]
    );
    // Two rounds: a JSON file (both PPN sources) and mapbench's printed tables each.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 4);
    let out = run("0");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ROUNDS"));
}

/// `--tile-to`: the trace's pattern repeated over a device a whole number of times its size,
/// every mapping read back; memory grows with the tiles, not with the device.
#[test]
fn mapbench_tiles_a_trace_over_a_larger_device() {
    let dir = temp_dir("cli-mapbench-tiles");
    let json = dir.join("t.json");
    let t = crate::support::trace("files.msr.csv.gz");
    let t = t.to_str().unwrap();
    let (ok, _, stderr) = ftlab(&[
        "mapbench",
        "--tables",
        "learned",
        "--repeat",
        "1",
        "--json",
        json.to_str().unwrap(),
        t,
    ]);
    assert!(ok, "{stderr}");
    let one = crate::support::read_json(&json);
    let (one_lpns, one_live) = (
        one["logical_pages"].as_u64().unwrap(),
        one["live_mappings"].as_u64().unwrap(),
    );
    let one_bytes = one["tables"][0]["bytes"].as_u64().unwrap();

    // 4.5 devices' worth: four whole tiles.
    let size = (one_lpns * 4096 * 9 / 2).to_string();
    let (ok, stdout, stderr) = ftlab(&[
        "mapbench",
        "--tile-to",
        &size,
        "--json",
        json.to_str().unwrap(),
        t,
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("repeated 4 times") && stdout.contains("lossless: yes"),
        "{stdout}"
    );
    let v = crate::support::read_json(&json);
    assert_eq!(v["tiles"], 4);
    assert_eq!(v["logical_pages"].as_u64().unwrap(), 4 * one_lpns);
    assert_eq!(v["live_mappings"].as_u64().unwrap(), 4 * one_live);
    assert_eq!(v["lossless_verified"], true);
    assert_eq!(v["flat_u32_bytes"].as_u64().unwrap(), 16 * one_lpns);
    let bytes = v["bytes"].as_u64().unwrap();
    assert!(
        bytes > 2 * one_bytes && bytes < 8 * one_bytes,
        "{bytes} vs one tile's {one_bytes}"
    );
    // The process held the table, and more, at its peak (Linux reports it).
    let peak = v["peak_resident_bytes"].as_u64().expect("a peak on Linux");
    assert!(peak > bytes, "peak {peak} vs the table's {bytes}");
    assert!(stdout.contains("process peak resident: "), "{stdout}");
    // The table's own peak lies between what it ends with and what the process held.
    let table_peak = v["bytes_peak"].as_u64().unwrap();
    assert!(
        table_peak > bytes && table_peak < peak,
        "{bytes} < {table_peak} < {peak}"
    );
    assert!(stdout.contains("learned table at its peak: "), "{stdout}");

    let (ok, _, stderr) = ftlab(&["mapbench", "--tile-to", "1M", t]);
    assert!(
        !ok && stderr.contains("smaller than the trace's device"),
        "{stderr}"
    );
    let (ok, _, stderr) = ftlab(&["mapbench", "--tile-to", &size, "--ppns", "simulator", t]);
    assert!(
        !ok && stderr.contains("one trace and log-head PPNs"),
        "{stderr}"
    );
    let (ok, _, stderr) = ftlab(&["mapbench", "--tile-to", &size, "--precondition", t]);
    assert!(!ok && stderr.contains("without --precondition"), "{stderr}");
}

#[test]
fn serve_refuses_an_image_it_could_not_save_before_taking_data() {
    // Otherwise the mistake would surface only at shutdown, with the clients' data in hand.
    let dir = temp_dir("cli-image");
    let image = dir.join("no-such-dir").join("ssd.img");
    let sock = dir.join("sock");
    let (ok, err) = serve_until_exit(&[
        "--no-tcp".as_ref(),
        "--unix".as_ref(),
        sock.as_ref(),
        "--image".as_ref(),
        image.as_ref(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("ssd.img.tmp") && err.contains("--image"),
        "{err}"
    );
}

/// `ftlab serve` as the tests start it: stdout dropped (the summary), stderr kept for
/// `exit_of`; the caller adds the arguments and spawns it.
fn serve_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ftlab"));
    command
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    command
}

/// Runs `ftlab serve ARGS` until it exits (it must, within 30 s); its status and stderr.
fn serve_until_exit(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ftlab"));
    command.arg("serve").args(args);
    let (status, err) = run_until_exit(command);
    (status.success(), err)
}

/// Runs `command` until it exits (it must, within 30 s); its status and stderr.
fn run_until_exit(mut command: Command) -> (std::process::ExitStatus, String) {
    let mut child = command
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{command:?} kept running");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// Under a file-size limit (`ulimit -f`) below the export's size, the image could never be
/// saved (and SIGXFSZ used to end the server silently while it tried, report and all): the
/// server refuses to start.
#[test]
fn serve_refuses_an_image_its_file_size_limit_could_not_hold() {
    let dir = temp_dir("cli-fsize");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"ulimit -f 1024 && exec "$0" serve --no-tcp --unix "$1" --image "$2" --set capacity.logical_bytes=67108864"#)
        .arg(env!("CARGO_BIN_EXE_ftlab"))
        .arg(dir.join("s.sock"))
        .arg(dir.join("d.img"));
    let (status, err) = run_until_exit(command);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("ulimit -f") && err.contains("67108864 bytes"),
        "{err}"
    );
}

/// A report larger than the file-size limit is an error naming the file, not a process ended
/// by SIGXFSZ.
#[test]
fn a_report_past_the_file_size_limit_is_an_error_naming_the_file() {
    let dir = temp_dir("cli-fsize-report");
    let json = dir.join("r.json");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -f 1 && exec "$0" sim -q --set workload.requests=2000 --set workload.precondition=false --json "$1""#)
        .arg(env!("CARGO_BIN_EXE_ftlab"))
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("r.json") && err.contains("File too large"),
        "{err}"
    );
}

#[test]
fn serve_never_deletes_a_file_it_was_given_as_its_socket() {
    let dir = temp_dir("cli-unix");
    // `--unix disk.img`, typed for `--image disk.img`: refused, the file left as it was.
    let file = dir.join("disk.img");
    std::fs::write(&file, b"the user's data").unwrap();
    let (ok, err) = serve_until_exit(&["--no-tcp".as_ref(), "--unix".as_ref(), file.as_ref()]);
    assert!(!ok && err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"the user's data");
    // A live server's socket is not taken over either.
    let live = dir.join("live.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let (ok, err) = serve_until_exit(&["--no-tcp".as_ref(), "--unix".as_ref(), live.as_ref()]);
    assert!(!ok && err.contains("another server"), "{err}");
    drop(_listener);
}

/// Connects to a `serve` starting on `sock` and enters transmission (fixed newstyle, no
/// zeroes, `NBD_OPT_EXPORT_NAME ""`); the export's size.
fn nbd_connect(sock: &std::path::Path) -> (std::os::unix::net::UnixStream, u64) {
    use ftlab_nbd::protocol as p;
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut s = loop {
        match std::os::unix::net::UnixStream::connect(sock) {
            Ok(s) => break s,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => panic!("serve did not listen: {e}"),
        }
    };
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&(p::CLIENT_FIXED_NEWSTYLE | p::CLIENT_NO_ZEROES).to_be_bytes())
        .unwrap();
    let mut option = p::IHAVEOPT.to_be_bytes().to_vec();
    option.extend_from_slice(&p::OPT_EXPORT_NAME.to_be_bytes());
    option.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&option).unwrap();
    let mut export = [0u8; 10];
    s.read_exact(&mut export).unwrap();
    (s, u64::from_be_bytes(export[..8].try_into().unwrap()))
}

/// An NBD write request of `data` at `offset`, `cookie` naming it.
fn nbd_write(cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    use ftlab_nbd::protocol as p;
    let mut m = p::REQUEST_MAGIC.to_be_bytes().to_vec();
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&p::CMD_WRITE.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    m
}

/// Waits (60 s at most) for `server` to exit: its status and stderr.
fn exit_of(server: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "serve did not exit");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    server
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

/// The bytes a page-write test writes to page `page`: its number, then bytes that differ from
/// page to page (not one same-filled word).
fn page_pattern(page: u64) -> Vec<u8> {
    let mut rng = ftlab_core::rng::SplitMix64::new(page);
    let mut data: Vec<u8> = (0..512)
        .flat_map(|_| rng.next_u64().to_le_bytes())
        .collect();
    data[..8].copy_from_slice(&page.to_le_bytes());
    data
}

#[test]
fn sigint_drains_connections_so_the_image_holds_every_acknowledged_write() {
    use ftlab_nbd::protocol as p;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    const PAGES: u64 = 32768; // a 128 MiB device, 4 KiB pages
    const IN_FLIGHT: u64 = 32;
    let dir = temp_dir("cli-drain");
    let (sock, image) = (dir.join("sock"), dir.join("ssd.img"));
    let mut server = serve_command()
        .args(["--no-tcp", "--set"])
        .arg(format!("capacity.logical_bytes={}", PAGES * 4096))
        .arg("--unix")
        .arg(&sock)
        .arg("--image")
        .arg(&image)
        .spawn()
        .unwrap();
    let (mut s, size) = nbd_connect(&sock);
    assert_eq!(size, PAGES * 4096);

    // Page after page, up to IN_FLIGHT writes outstanding, until the server ends the connection;
    // SIGINT arrives once 2000 are acknowledged.
    let acked = AtomicU64::new(0);
    let acknowledged: Vec<u64> = std::thread::scope(|scope| {
        let mut replies = s.try_clone().unwrap();
        let acked = &acked;
        let reader = scope.spawn(move || {
            let mut ok = Vec::new();
            let mut h = [0u8; 16];
            while replies.read_exact(&mut h).is_ok() {
                assert_eq!(
                    u32::from_be_bytes(h[..4].try_into().unwrap()),
                    p::SIMPLE_REPLY_MAGIC
                );
                match u32::from_be_bytes(h[4..8].try_into().unwrap()) {
                    0 => ok.push(u64::from_be_bytes(h[8..].try_into().unwrap())),
                    // Read after the signal: not executed, and said so.
                    p::ESHUTDOWN => {}
                    other => panic!("error {other}"),
                }
                acked.fetch_add(1, Ordering::SeqCst);
            }
            ok
        });
        let mut signalled = false;
        for page in 0..PAGES {
            while page >= acked.load(Ordering::SeqCst) + IN_FLIGHT && !reader.is_finished() {
                std::thread::yield_now();
            }
            if !signalled && acked.load(Ordering::SeqCst) >= 2000 {
                // SAFETY: kill(2) on our own child's pid.
                assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGINT) }, 0);
                signalled = true;
            }
            // The cookie names the page.
            if s.write_all(&nbd_write(page, page * 4096, &page_pattern(page)))
                .is_err()
            {
                break;
            }
        }
        assert!(
            signalled,
            "the client wrote the whole device before 2000 replies"
        );
        reader.join().unwrap()
    });
    let (status, err) = exit_of(&mut server);
    assert!(status.success(), "{err}");
    assert!(acknowledged.len() >= 2000, "{err}");
    let saved = std::fs::read(&image).unwrap();
    for &page in &acknowledged {
        let at = (page * 4096) as usize;
        assert!(
            saved[at..at + 4096] == page_pattern(page)[..],
            "page {page} was acknowledged but is not in the image ({} acknowledged); serve said:\n{err}",
            acknowledged.len()
        );
    }
}

#[test]
fn output_files_are_checked_before_the_run_and_kept_when_it_fails() {
    let dir = temp_dir("cli-output");
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "1,h,0,Write,0,4096,1\n2,h,0,Wrote,0,4096,1\n").unwrap();
    let trace = bad.to_str().unwrap();
    // An output that cannot be written is the error, before the trace is read.
    let nowhere = dir.join("no-such-dir").join("r.json");
    let (ok, _, err) = ftlab(&["sim", "--trace", trace, "--json", nowhere.to_str().unwrap()]);
    assert!(
        !ok && err.contains("no-such-dir/r.json") && !err.contains("Wrote"),
        "{err}"
    );
    let (ok, _, err) = ftlab(&["mapbench", trace, "--json", nowhere.to_str().unwrap()]);
    assert!(
        !ok && err.contains("no-such-dir/r.json") && !err.contains("Wrote"),
        "{err}"
    );
    // A failed run leaves an earlier report as it was and creates no empty one.
    let old = dir.join("old.json");
    std::fs::write(&old, "an earlier report").unwrap();
    let fresh = dir.join("fresh.csv");
    let (ok, _, err) = ftlab(&[
        "sim",
        "--trace",
        trace,
        "--json",
        old.to_str().unwrap(),
        "--csv",
        fresh.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains(":2: field `Type`"), "{err}");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "an earlier report");
    assert!(!fresh.exists());
    // A run that succeeds replaces it.
    let (ok, _, err) = ftlab(&[
        "sim",
        "--trace",
        trace,
        "--skip-bad-lines",
        "-q",
        "--json",
        old.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let report = crate::support::read_json(&old);
    assert_eq!(report["host_write_pages"], 1);
}

#[test]
fn a_stats_file_that_stops_working_does_not_end_the_device_nor_lose_its_image() {
    use std::io::{Read, Write};
    let dir = temp_dir("cli-stats");
    let (sock, image) = (dir.join("sock"), dir.join("ssd.img"));
    let stats_dir = dir.join("stats");
    std::fs::create_dir(&stats_dir).unwrap();
    let mut server = serve_command()
        .args(["--no-tcp", "--set", "capacity.logical_bytes=16777216"])
        .arg("--unix")
        .arg(&sock)
        .arg("--image")
        .arg(&image)
        .arg("--stats")
        .arg(stats_dir.join("s.json"))
        .args(["--stats-interval", "0.05"])
        .spawn()
        .unwrap();
    let (mut s, _) = nbd_connect(&sock);
    // The statistics' directory goes away while the device runs (a full disk, a cleanup).
    std::fs::remove_dir_all(&stats_dir).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.write_all(&nbd_write(1, 8192, &page_pattern(2))).unwrap();
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..8], &[0, 0, 0, 0], "the write succeeded");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let (status, err) = exit_of(&mut server);
    // The failed statistics are said (and make the exit status an error); the image is saved.
    assert!(!status.success() && err.contains("s.json"), "{err}");
    assert!(err.contains("saved the device"), "{err}");
    let saved = std::fs::read(&image).unwrap();
    assert!(saved[8192..12288] == page_pattern(2)[..]);
}

/// A device node, FIFO, socket or directory given as `--image` is refused at start, and left as
/// it was: the save replaced whatever was at the path with a regular file (as root, `--image
/// /dev/null` replaced the system's /dev/null). A FIFO stands for the special files here, since
/// making a device node needs root.
#[test]
fn serve_refuses_an_image_that_is_not_a_regular_file() {
    use std::os::unix::fs::FileTypeExt;
    let dir = temp_dir("cli-image-kind");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) reads the NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let sub = dir.join("subdir");
    std::fs::create_dir(&sub).unwrap();
    let socket = dir.join("other.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let link = dir.join("link-to-fifo");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for (path, kind) in [
        (&fifo, "FIFO"),
        (&sub, "directory"),
        (&socket, "socket"),
        (&link, "FIFO"),
    ] {
        let sock = dir.join("s.sock");
        let (ok, err) = serve_until_exit(&[
            "--no-tcp".as_ref(),
            "--unix".as_ref(),
            sock.as_ref(),
            "--image".as_ref(),
            path.as_ref(),
        ]);
        assert!(!ok, "{err}");
        assert!(
            err.contains(&format!("is a {kind}, not a regular file")),
            "{}: {err}",
            path.display()
        );
        assert!(!sock.exists(), "refused before listening: {err}");
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::metadata(&sub).unwrap().is_dir());
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// `--image LINK`: the target is loaded, and the save replaces the target (the link stays a
/// link). It used to load the target and then replace the link with a regular file, leaving
/// the target stale.
#[test]
fn serve_saves_an_image_given_as_a_symbolic_link_to_its_target() {
    use std::io::{Read, Write};
    const SIZE: u64 = 1 << 20;
    let dir = temp_dir("cli-image-link");
    let target = dir.join("target.img");
    let mut before = vec![0u8; SIZE as usize];
    before[..4096].copy_from_slice(&page_pattern(0));
    std::fs::write(&target, &before).unwrap();
    let link = dir.join("link.img");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let sock = dir.join("sock");
    let mut server = serve_command()
        .args(["--no-tcp", "--set"])
        .arg(format!("capacity.logical_bytes={SIZE}"))
        .arg("--unix")
        .arg(&sock)
        .arg("--image")
        .arg(&link)
        .spawn()
        .unwrap();
    let (mut s, size) = nbd_connect(&sock);
    assert_eq!(size, SIZE);
    s.write_all(&nbd_write(1, 4096, &page_pattern(1))).unwrap();
    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..8], &[0, 0, 0, 0], "the write succeeded");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let (status, err) = exit_of(&mut server);
    assert!(status.success(), "{err}");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced: {err}"
    );
    let saved = std::fs::read(&target).unwrap();
    assert_eq!(saved.len() as u64, SIZE);
    assert!(saved[..4096] == page_pattern(0)[..], "the loaded page kept");
    assert!(
        saved[4096..8192] == page_pattern(1)[..],
        "the new write saved"
    );
    assert!(!dir.join("link.img.tmp").exists() && !dir.join("target.img.tmp").exists());
}

/// An image smaller than the export (a truncated copy, an empty file) is refused with both
/// sizes, unless `--grow-image` asks for it; it used to be loaded with its missing part read as
/// zeros, and the next save made that loss permanent.
#[test]
fn serve_refuses_a_truncated_image_unless_asked_to_grow_it() {
    let dir = temp_dir("cli-image-size");
    let image = dir.join("half.img");
    let sock = dir.join("s.sock");
    for len in [1u64 << 19, 0] {
        std::fs::write(&image, vec![7u8; len as usize]).unwrap();
        let (ok, err) = serve_until_exit(&[
            "--no-tcp".as_ref(),
            "--unix".as_ref(),
            sock.as_ref(),
            "--set".as_ref(),
            "capacity.logical_bytes=1048576".as_ref(),
            "--image".as_ref(),
            image.as_ref(),
        ]);
        assert!(!ok, "{err}");
        assert!(
            err.contains(&format!(
                "{len} bytes, smaller than the 1048576-byte export"
            )) && err.contains("--grow-image"),
            "{err}"
        );
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            len,
            "left as it was"
        );
    }
    // Asked for, the half image is taken: its pages loaded, the rest zeros, the save full-size.
    std::fs::write(&image, vec![7u8; 1 << 19]).unwrap();
    let mut server = serve_command()
        .args(["--no-tcp", "--grow-image", "--set"])
        .arg("capacity.logical_bytes=1048576")
        .arg("--unix")
        .arg(&sock)
        .arg("--image")
        .arg(&image)
        .spawn()
        .unwrap();
    let (_s, size) = nbd_connect(&sock);
    assert_eq!(size, 1 << 20);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let (status, err) = exit_of(&mut server);
    assert!(status.success(), "{err}");
    assert!(err.contains("loaded 128 non-zero pages"), "{err}");
    let saved = std::fs::read(&image).unwrap();
    assert_eq!(saved.len(), 1 << 20);
    assert!(saved[..1 << 19].iter().all(|&b| b == 7));
    assert!(saved[1 << 19..].iter().all(|&b| b == 0));
}

/// With its Unix socket taken by another server, `serve --listen` exits before saying it
/// serves anything: it used to print the TCP export line, then fail on the socket.
#[test]
fn serve_says_nothing_is_served_until_every_listener_is_bound() {
    let dir = temp_dir("cli-banner");
    let live = dir.join("live.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let pidfile = dir.join("serve.pid");
    let (ok, err) = serve_until_exit(&[
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--unix".as_ref(),
        live.as_ref(),
        "--pidfile".as_ref(),
        pidfile.as_ref(),
    ]);
    assert!(!ok && err.contains("another server"), "{err}");
    assert!(!err.contains("export `"), "a ready line was printed: {err}");
    assert!(!pidfile.exists());
}

/// `--pidfile` appears, and systemd's `READY=1` arrives on `NOTIFY_SOCKET`, once the export can
/// be reached; at exit the server says `STOPPING=1` and removes the pidfile.
#[test]
fn serve_tells_a_script_or_service_manager_when_it_is_ready() {
    let dir = temp_dir("cli-ready");
    let notify_path = dir.join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let (sock, pidfile) = (dir.join("s.sock"), dir.join("serve.pid"));
    // A crashed run's pidfile (no such process) is replaced.
    std::fs::write(&pidfile, "2147483000\n").unwrap();
    let mut server = serve_command()
        .args(["--listen", "127.0.0.1:0", "--unix"])
        .arg(&sock)
        .args(["--set", "capacity.logical_bytes=1073741824"])
        .arg("--pidfile")
        .arg(&pidfile)
        .env("NOTIFY_SOCKET", &notify_path)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within 60 s");
    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        message.contains("READY=1") && message.contains(&format!("MAINPID={}", server.id())),
        "{message}"
    );
    // Ready means reachable, and the pidfile is there.
    std::os::unix::net::UnixStream::connect(&sock).expect("the socket is bound");
    assert_eq!(
        std::fs::read_to_string(&pidfile).unwrap(),
        format!("{}\n", server.id())
    );
    // A second server with the same pidfile refuses: it names a running process.
    let other = dir.join("other.sock");
    let (ok, err) = serve_until_exit(&[
        "--no-tcp".as_ref(),
        "--unix".as_ref(),
        other.as_ref(),
        "--pidfile".as_ref(),
        pidfile.as_ref(),
    ]);
    assert!(!ok && err.contains("which is running"), "{err}");
    assert!(!other.exists(), "its socket is removed: {err}");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let n = notify.recv(&mut buf).expect("STOPPING=1");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    let (status, err) = exit_of(&mut server);
    assert!(status.success(), "{err}");
    assert!(
        err.contains("(1073741824 bytes) on nbd://127.0.0.1:"),
        "{err}"
    );
    assert!(
        !err.contains("127.0.0.1:0 "),
        "the bound port is named: {err}"
    );
    assert!(!pidfile.exists() && !sock.exists());
}

/// An NBD request header: `command` over [offset, offset + length), `cookie` naming it.
fn nbd_request(command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    use ftlab_nbd::protocol as p;
    let mut m = p::REQUEST_MAGIC.to_be_bytes().to_vec();
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&command.to_be_bytes());
    m.extend_from_slice(&cookie.to_be_bytes());
    m.extend_from_slice(&offset.to_be_bytes());
    m.extend_from_slice(&length.to_be_bytes());
    m
}

/// A field of /proc/PID/status in bytes (VmRSS, VmHWM).
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// Slow and greedy clients cannot take the server's memory, and a well-behaved client keeps
/// being served among them. 20 clients ask for four 32 MiB reads each and read none of the
/// replies; 25 announce a 32 MiB write and send 100 bytes of it. Before the bounds, each header
/// cost its 32 MiB at once (50 such clients took the server from 25 to 1,627 MiB, and 50 not
/// reading 32 MiB replies to 3,842 MiB). Now the peak stays within the documented bound: the
/// shared budget, plus per connection its allowance, its two kept payload buffers and its socket
/// buffers.
#[test]
fn greedy_and_slow_clients_cannot_take_the_servers_memory() {
    use ftlab_nbd::protocol as p;
    use std::io::{Read, Write};
    const MIB: u64 = 1 << 20;
    const SHARED: u64 = 64 * MIB;
    let dir = temp_dir("cli-greedy");
    let sock = dir.join("sock");
    let mut server = serve_command()
        .args(["--no-tcp", "--set", "capacity.logical_bytes=1073741824"])
        .arg("--unix")
        .arg(&sock)
        .args(["--max-inflight-bytes", "64M", "--max-connections", "100"])
        .spawn()
        .unwrap();
    let pid = server.id();
    let (mut good, _) = nbd_connect(&sock);
    good.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let base_rss = proc_status_bytes(pid, "VmRSS:");

    let mut hostile = Vec::new();
    // The readers first: the first of them take the shared budget and fill their replies.
    for i in 0..20u64 {
        let (mut s, _) = nbd_connect(&sock);
        for j in 0..4 {
            s.write_all(&nbd_request(
                p::CMD_READ,
                j,
                i * 32 * MIB % (1 << 30),
                p::MAX_REQUEST_BYTES,
            ))
            .unwrap();
        }
        hostile.push(s);
    }
    for i in 0..25u64 {
        let (mut s, _) = nbd_connect(&sock);
        let mut m = nbd_request(p::CMD_WRITE, i, 0, p::MAX_REQUEST_BYTES);
        m.extend_from_slice(&[0xa5; 100]);
        s.write_all(&m).unwrap();
        hostile.push(s);
    }
    // Time for the server to take what it would (it used to allocate each request at once).
    std::thread::sleep(std::time::Duration::from_secs(2));
    // The good client writes pages and reads them back, small requests among the greedy ones.
    for page in 0..200u64 {
        good.write_all(&nbd_write(page, page * 4096, &page_pattern(page)))
            .unwrap();
        let mut h = [0u8; 16];
        good.read_exact(&mut h).expect("the write is answered");
        assert_eq!(&h[4..8], &[0, 0, 0, 0], "page {page} written");
        good.write_all(&nbd_request(p::CMD_READ, page, page * 4096, 4096))
            .unwrap();
        let mut reply = vec![0u8; 16 + 4096];
        good.read_exact(&mut reply).expect("the read is answered");
        assert_eq!(&reply[4..8], &[0, 0, 0, 0]);
        assert!(
            reply[16..] == page_pattern(page)[..],
            "page {page} read back"
        );
    }
    let peak = proc_status_bytes(pid, "VmHWM:");
    let connections = hostile.len() as u64 + 1;
    // Per connection: its 2 MiB allowance, two payload buffers kept up to 1.06 MiB, 512 KiB of
    // socket buffers; 1 MiB of slack each for threads and the allocator.
    let bound = base_rss + SHARED + connections * (2 * MIB + 2 * (MIB + MIB / 16) + MIB / 2 + MIB);
    assert!(
        peak <= bound,
        "peak resident {} MiB, over the bound {} MiB (started at {} MiB)",
        peak / MIB,
        bound / MIB,
        base_rss / MIB
    );
    drop(hostile);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let (status, err) = exit_of(&mut server);
    assert!(status.success(), "{err}");
    eprintln!(
        "peak resident {} MiB, bound {} MiB, started at {} MiB",
        peak / MIB,
        bound / MIB,
        base_rss / MIB
    );
}

/// Past `--max-connections` a client is closed at once (with a log line); a handshake not
/// finished within `--handshake-timeout`, and a client silent for `--idle-timeout`, are closed.
/// 1,200 idle connections used to hold 1,201 threads, and half an option header for ever.
#[test]
fn connections_are_limited_in_number_and_in_time() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let dir = temp_dir("cli-limits");
    let sock = dir.join("sock");
    let mut server = serve_command()
        .args(["--no-tcp", "--set", "capacity.logical_bytes=67108864"])
        .arg("--unix")
        .arg(&sock)
        .args(["--max-connections", "3", "--handshake-timeout", "3"])
        .args(["--idle-timeout", "2"])
        .spawn()
        .unwrap();
    let (good, _) = nbd_connect(&sock);
    let connect = || {
        let s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    };
    // Two connections that never finish the handshake: one silent, one sending half an option
    // header after the client flags.
    let mut silent = connect();
    let mut half = connect();
    let mut greeting = [0u8; 18];
    half.read_exact(&mut greeting).unwrap();
    half.write_all(&ftlab_nbd::protocol::CLIENT_FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    half.write_all(&ftlab_nbd::protocol::IHAVEOPT.to_be_bytes()[..5])
        .unwrap();
    let opened = Instant::now();
    // A fourth is one too many: closed before the greeting.
    let mut extra = connect();
    let mut byte = [0u8; 1];
    assert_eq!(extra.read(&mut byte).unwrap(), 0, "closed at once");
    assert!(opened.elapsed() < Duration::from_secs(3));
    // The two handshakes end at their deadline, not before.
    for s in [&mut silent, &mut half] {
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    // The good client, silent all along past --idle-timeout, was closed too.
    let mut good = good;
    good.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(good.read(&mut byte).unwrap_or(0), 0);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let (status, err) = exit_of(&mut server);
    assert!(status.success(), "{err}");
    assert!(
        err.contains("refused: 3 connections already (--max-connections)"),
        "{err}"
    );
    assert!(err.contains("handshake not finished within 3 s"), "{err}");
    assert!(err.contains("--idle-timeout"), "{err}");
}

/// A device whose tables do not fit in the memory the process may use is refused with the
/// estimate and the keys behind it; it used to abort (exit 134) on a failed 16 GiB allocation.
/// `ftlab config` prints the estimate.
#[test]
fn a_device_too_large_for_the_host_is_refused_with_the_estimate() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 4000000 && exec "$0" sim -q --set flash.blocks_per_die=262143 --set workload.requests=1000"#)
        .arg(env!("CARGO_BIN_EXE_ftlab"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("need about 16.5 GiB")
            && err.contains("reverse map 16.0 GiB")
            && err.contains("flash.blocks_per_die"),
        "{err}"
    );
    // The limit named is the address-space one set here, unless the machine has even less
    // (its cgroup's limit or MemAvailable).
    assert!(
        ["ulimit -v", "memory.max", "MemAvailable"]
            .iter()
            .any(|source| err.contains(source)),
        "{err}"
    );
    let (ok, out, err) = ftlab(&["config", "--set", "flash.blocks_per_die=262143"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("#   reverse map") && out.contains("16.0 GiB"),
        "{out}"
    );
    assert!(out.contains("#   total"), "{out}");
}

/// Plots a reader can trust: a spike of per-interval WAF is clipped and counted instead of
/// flattening the cumulative curve; requests that took no time are said in the legend instead of
/// drawing a diagonal from the log axis's edge; the mapping panel's lines are in a legend; an
/// empty report says it is empty instead of labelling every tick 0.0.
#[test]
fn plots_clip_spikes_say_zero_latencies_and_empty_reports() {
    let dir = temp_dir("cli-plot");
    let json = dir.join("z.json");
    let (ok, _, err) = ftlab(&[
        "sim",
        "-q",
        "--set",
        "workload.kind=zipf",
        "--set",
        "workload.requests=300000",
        "--set",
        "workload.read_pcent=30",
        "--set",
        "ftl.write_buffer_mib=64",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let report = read_json(&json);
    assert!(
        report["latency_cdf"]["read_at_zero"].as_f64().unwrap() > 0.1,
        "buffer hits"
    );
    let (ok, _, err) = ftlab(&["plot", json.to_str().unwrap()]);
    assert!(ok, "{err}");
    let waf = std::fs::read_to_string(dir.join("z-waf.svg")).unwrap();
    assert!(
        waf.contains("above the axis, up to"),
        "a spike clipped and counted"
    );
    assert!(waf.contains("its peak, preconditioning included"));
    let latency = std::fs::read_to_string(dir.join("z-latency.svg")).unwrap();
    assert!(latency.contains("% took 0 us, not on the log axis"));
    // The same report emptied: no series, no latencies.
    let mut empty = report.clone();
    empty["series"] = serde_json::json!([]);
    empty["latency_cdf"]["read"] = serde_json::json!([]);
    empty["latency_cdf"]["write"] = serde_json::json!([]);
    let empty_path = dir.join("e.json");
    std::fs::write(&empty_path, serde_json::to_string(&empty).unwrap()).unwrap();
    let (ok, _, err) = ftlab(&["plot", empty_path.to_str().unwrap()]);
    assert!(ok, "{err}");
    let waf = std::fs::read_to_string(dir.join("e-waf.svg")).unwrap();
    assert!(waf.contains("no time series"), "{waf}");
    assert!(!waf.contains(">0.0<"), "no axis of zeros");
    let latency = std::fs::read_to_string(dir.join("e-latency.svg")).unwrap();
    assert!(latency.contains("no reads or writes"));
}

/// `--power-cut-at`: the run stops at the cut, the write buffer and the dirty translation pages
/// are programmed on capacitor power (no more than the protected budget of the latter), and the
/// durable state maps every LPN as the table does.
#[test]
fn a_power_cut_loses_no_acknowledged_write() {
    let dir = temp_dir("cli-power-cut");
    let json = dir.join("r.json");
    let (ok, stdout, stderr) = ftlab(&[
        "sim",
        "--set",
        "flash.blocks_per_die=64",
        "--set",
        "capacity.over_provisioning=0.25",
        "--set",
        "ftl.protected_ratio=0.01",
        "--set",
        "ftl.write_buffer_mib=16",
        "--set",
        "workload.requests=100000",
        "--power-cut-at",
        "20000000",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("power cut"), "{stdout}");
    let r = read_json(&json);
    let cut = &r["power_cut"];
    assert_eq!(cut["at_ns"], 20_000_000);
    assert!(
        r["requests"]["write"].as_u64().unwrap() < 100_000,
        "the run stopped: {cut}"
    );
    assert!(cut["buffered_pages"].as_u64().unwrap() > 0, "{cut}");
    let protected = r["power_loss"]["protected_translation_pages"]
        .as_u64()
        .unwrap();
    assert!(cut["dirty_translation_pages"].as_u64().unwrap() <= protected);
    let logical = r["device"]["logical_bytes"].as_u64().unwrap() / 4096;
    assert_eq!(cut["lpns_checked"].as_u64().unwrap(), logical);
    assert_eq!(cut["lpns_not_durable"], 0, "{cut}");
    assert!(r["traffic"]["mapping_pages"].as_u64().unwrap() > 0);
}

/// `ftlab experiment hexa` on a small grid: every point reported in the CSV, Hexa's reordering
/// cutting mapping writes where little is protected, the figure drawn, and a second run keeping
/// the points it finds instead of simulating them again.
#[test]
fn the_hexa_experiment_runs_its_grid_and_resumes() {
    let dir = temp_dir("cli-experiment");
    let out = dir.join("exp");
    // The paper's grid cut down: one buffer, two ratios, random writes only, 0.25 GiB a point.
    let sweep = dir.join("hexa.toml");
    std::fs::write(
        &sweep,
        "[base]\npreset = \"hexa\"\n[grid]\n\"ftl.write_buffer_mib\" = [64]\n\
         \"ftl.buffer_policy\" = [\"fifo\", \"hexa\"]\n\"ftl.protected_ratio\" = [0.01, 1.0]\n\
         [cases.workload]\nrandom = { \"workload.kind\" = \"uniform\", \"workload.requests\" = 65536, \
         \"workload.span_bytes\" = 4294967296, \"workload.precondition\" = false }\n",
    )
    .unwrap();
    let args = [
        "experiment",
        "hexa",
        "--sweep",
        sweep.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--jobs",
        "2",
    ];
    let (ok, _, stderr) = ftlab(&args);
    assert!(ok, "{stderr}");
    let csv = std::fs::read_to_string(out.join("hexa.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 4, "{csv}");
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let md = |policy: &str, pct: &str| -> u64 {
        let r = rows
            .iter()
            .find(|r| r[col("policy")] == policy && r[col("protected_pct")] == pct)
            .unwrap();
        r[col("mapping_pages")].parse().unwrap()
    };
    assert_eq!(md("fifo", "100"), 0);
    assert_eq!(md("hexa", "100"), 0);
    assert!(md("hexa", "1") * 2 < md("fifo", "1"), "{csv}");
    for f in ["hexa.png", "hexa.svg"] {
        assert!(std::fs::metadata(out.join(f)).unwrap().len() > 1000, "{f}");
    }
    let (ok, _, stderr) = ftlab(&args);
    assert!(ok, "{stderr}");
    assert_eq!(
        stderr.matches("kept from an earlier run").count(),
        4,
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(out.join("hexa.csv")).unwrap(), csv);
}
