//! FDP placement from every source: trace PID columns, range files, and the device's own
//! (auto, ideal); a single-handle FDP device is today's device; the CSV series and the plot show
//! each handle.

use crate::support::{config, ftlab, read_json, run, temp_dir};

const SMALL: [&str; 3] = [
    "flash.blocks_per_die=16",
    "flash.superblock_dies=1",
    "capacity.over_provisioning=0.25",
];

fn with(extra: &[&str]) -> Vec<String> {
    SMALL.iter().chain(extra).map(|s| s.to_string()).collect()
}

/// A DiskSim trace whose PID column sends the first half of the LBAs to handle 1 and the rest to
/// handle 0 gives the same placements as the same trace without PIDs and a range file saying
/// so; and a PID the device does not have stops the run naming the line.
#[test]
fn trace_pids_and_range_files_place_writes_alike() {
    let dir = temp_dir("fdp-pids");
    let (plain, tagged) = (dir.path().join("plain.txt"), dir.path().join("tagged.txt"));
    let mut rng = ftlab_core::rng::SplitMix64::new(4);
    let sectors = 32u64 << 20 >> 9; // 32 MiB
    let (mut a, mut b) = (String::new(), String::new());
    for i in 0..20_000u64 {
        let lba = rng.bounded(sectors / 8) * 8;
        let pid = u64::from(lba < sectors / 2);
        a.push_str(&format!("{} 0 {lba} 8 0\n", i * 1000));
        b.push_str(&format!("{} 0 {lba} 8 0 {pid}\n", i * 1000));
    }
    std::fs::write(&plain, a).unwrap();
    std::fs::write(&tagged, b).unwrap();
    let ranges = dir.path().join("ranges.csv");
    std::fs::write(
        &ranges,
        format!("# first half on handle 1\n0, {}, 1\n", sectors / 2 * 512),
    )
    .unwrap();
    let sets = with(&["ftl.streams=2", "capacity.logical_bytes=33554432"]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let by_column = run(&config(
        "femu",
        &[
            &sets[..],
            &[&format!("workload.trace=\"{}\"", tagged.display())],
        ]
        .concat(),
    ));
    let by_ranges = run(&config(
        "femu",
        &[
            &sets[..],
            &[
                &format!("workload.trace=\"{}\"", plain.display()),
                &format!("workload.placement_ranges=\"{}\"", ranges.display()),
            ],
        ]
        .concat(),
    ));
    let host = |r: &ftlab_sim::Report| -> Vec<u64> {
        r.fdp.placements.iter().map(|p| p.host_pages).collect()
    };
    assert_eq!(host(&by_column), host(&by_ranges));
    assert_eq!(by_column.waf, by_ranges.waf);
    let h = host(&by_column);
    assert!(h[0] > 5000 && h[1] > 5000, "{h:?}");
    // Without the column, everything is on handle 0.
    let none = run(&config(
        "femu",
        &[
            &sets[..],
            &[&format!("workload.trace=\"{}\"", plain.display())],
        ]
        .concat(),
    ));
    assert_eq!(host(&none)[1], 0);

    // Handle 5 of 2: the run stops at the line.
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "0 0 0 8 0 1\n1000 0 8 8 0 5\n").unwrap();
    let bad_arg = format!("workload.trace=\"{}\"", bad.display());
    let (ok, _, stderr) = ftlab(&[
        "sim",
        "-q",
        "--set",
        "ftl.streams=2",
        "--set",
        &bad_arg,
        "--set",
        "capacity.logical_bytes=33554432",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("bad.txt:2") && stderr.contains("placement handle 5"),
        "{stderr}"
    );
    // A bad range file names its line and field.
    std::fs::write(&ranges, "0, 4096, 1\n8192, 4096, 1\n").unwrap();
    let (ok, _, stderr) = ftlab(&[
        "sim",
        "-q",
        "--set",
        "ftl.streams=2",
        "--set",
        &format!("workload.placement_ranges=\"{}\"", ranges.display()),
        "--set",
        "workload.requests=10",
    ]);
    assert!(!ok);
    assert!(stderr.contains("ranges.csv:2: field `end`"), "{stderr}");
}

/// One handle through `fdp.handles` is the same device as one stream: the same report.
#[test]
fn a_single_handle_fdp_device_is_todays_device() {
    let base = with(&["workload.kind=hotcold", "workload.requests=100000"]);
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let stream = run(&config("femu", &base));
    let fdp = run(&config(
        "femu",
        &[&base[..], &["fdp.handles=[\"persistent\"]"]].concat(),
    ));
    // Everything but the configuration that says it two ways.
    let json = |r: &ftlab_sim::Report| {
        let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        v.as_object_mut().unwrap().remove("config");
        v
    };
    assert_eq!(json(&stream), json(&fdp));
}

/// Hot/cold traffic on four handles: ideal placement (lifetimes known) writes less than auto
/// placement (guessed from history), which writes less than everything on one handle; the
/// CSV series has each handle's columns and `ftlab plot` draws the per-handle chart.
#[test]
fn auto_and_ideal_placement_separate_hot_from_cold() {
    let base = with(&[
        "workload.kind=hotcold",
        "workload.hot_access_pcent=90",
        "workload.hot_space_pcent=10",
        "workload.requests=300000",
        "ftl.streams=4",
        // GC only as space runs out: the spare is what separation saves work in.
        "ftl.gc_thres_pcent=95",
        "ftl.gc_thres_pcent_high=98",
    ]);
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let waf = |placement: &str| {
        run(&config(
            "femu",
            &[&base[..], &[&format!("fdp.placement=\"{placement}\"")]].concat(),
        ))
    };
    let (host, auto, ideal) = (waf("host"), waf("auto"), waf("ideal"));
    let (h, a, i) = (host.waf.unwrap(), auto.waf.unwrap(), ideal.waf.unwrap());
    assert!(i < a && a < h, "ideal {i}, auto {a}, one handle {h}");
    // Auto used more than one handle.
    let used = auto
        .fdp
        .placements
        .iter()
        .filter(|p| p.host_pages > 0)
        .count();
    assert!(used >= 2, "{:?}", auto.fdp.placements);

    let dir = temp_dir("fdp-plot");
    let (json, csv) = (dir.path().join("r.json"), dir.path().join("r.csv"));
    let mut args = vec!["sim", "-q", "--json", json.to_str().unwrap()];
    args.extend(["--csv", csv.to_str().unwrap()]);
    for set in [
        "ftl.streams=4",
        "fdp.placement=\"auto\"",
        "workload.kind=hotcold",
        "workload.requests=100000",
    ]
    .iter()
    .chain(&SMALL)
    {
        args.extend(["--set", set]);
    }
    let (ok, _, stderr) = ftlab(&args);
    assert!(ok, "{stderr}");
    let header = std::fs::read_to_string(&csv).unwrap();
    let header = header.lines().next().unwrap();
    assert!(header.contains(",p0_host_pages,p0_media_pages"), "{header}");
    let r = read_json(&json);
    assert!(r["series"][0]["placements"].is_array());
    let (ok, stdout, stderr) = ftlab(&["plot", json.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("r-handles.png"), "{stdout}");
    assert!(dir.path().join("r-handles.png").exists());
}

/// The LSM workload on a small device: placing its tiers on their own handles writes less
/// than one handle for all; and its record (`sim --record`, nbdkit format with `pid=`) replays
/// to the same flash work, placement for placement.
#[test]
fn the_lsm_workload_separates_tiers_and_records_a_replayable_trace() {
    let device = [
        "flash.blocks_per_die=16",
        "flash.superblock_dies=8",
        "capacity.over_provisioning=0.3",
        "ftl.streams=5",
        "ftl.gc_thres_pcent=60",
    ];
    let lsm = [
        "workload.kind=lsm",
        "workload.precondition=false",
        "workload.overwrites=4",
        "workload.lsm_key_space_bytes=440401920",
        "workload.lsm_memtable_bytes=1048576",
        "workload.lsm_sst_bytes=1048576",
    ];
    let dir = temp_dir("fdp-lsm");
    let (json, record) = (dir.path().join("lsm.json"), dir.path().join("lsm.nbdlog"));
    let mut args = vec!["sim", "-q", "--json", json.to_str().unwrap()];
    args.extend(["--record", record.to_str().unwrap()]);
    for s in device.iter().chain(&lsm) {
        args.extend(["--set", s]);
    }
    let (ok, _, stderr) = ftlab(&args);
    assert!(ok, "{stderr}");
    let tiers = read_json(&json);
    let one = run(&config(
        "femu",
        &[&device[..], &lsm[..], &["workload.lsm_placement=\"one\""]].concat(),
    ));
    let tiers_waf = tiers["waf"].as_f64().unwrap();
    assert!(
        tiers_waf < one.waf.unwrap(),
        "tiers {tiers_waf}, one handle {}",
        one.waf.unwrap()
    );
    // Every tier wrote on its handle.
    let placements = tiers["fdp"]["placements"].as_array().unwrap();
    for h in 0..5 {
        assert!(
            placements[h]["host_pages"].as_u64().unwrap() > 0,
            "{placements:?}"
        );
    }

    let replay = run(&config(
        "femu",
        &[
            &device[..],
            &[&format!("workload.trace=\"{}\"", record.display())],
        ]
        .concat(),
    ));
    assert_eq!(
        replay.host_write_pages,
        tiers["host_write_pages"].as_u64().unwrap()
    );
    assert_eq!(
        replay.nand_write_pages,
        tiers["nand_write_pages"].as_u64().unwrap()
    );
    for (p, q) in replay.fdp.placements.iter().zip(placements) {
        assert_eq!(p.host_pages, q["host_pages"].as_u64().unwrap());
    }
}

/// `ftlab experiment fdp` on a small device: a CSV row per placement and threshold, the
/// figure, FDP tiers below one PID; run again, every point is kept, not rerun.
#[test]
fn the_fdp_experiment_runs_resumes_and_draws() {
    let dir = temp_dir("fdp-experiment");
    let out = dir.path().to_str().unwrap();
    // The benchmark's grid on a small device: 3 capacities written, GC at 60 % only.
    let sweep = dir.path().join("fdp.toml");
    std::fs::write(
        &sweep,
        "[base]\npreset = \"femu\"\nset = { \"workload.kind\" = \"lsm\", \"workload.precondition\" = false, \
         \"workload.overwrites\" = 3, \"workload.lsm_key_space_bytes\" = 440234147, \"ftl.streams\" = 5, \
         \"flash.blocks_per_die\" = 16, \"flash.superblock_dies\" = 8, \"capacity.over_provisioning\" = 0.3, \
         \"workload.lsm_memtable_bytes\" = 1048576, \"workload.lsm_sst_bytes\" = 1048576 }\n\
         [grid]\n\"ftl.gc_thres_pcent\" = [60]\n\
         [zip]\n\"workload.lsm_placement\" = [\"tiers\", \"one\", \"one\", \"one\"]\n\
         \"fdp.placement\" = [\"host\", \"host\", \"auto\", \"ideal\"]\n",
    )
    .unwrap();
    let args = vec![
        "experiment",
        "fdp",
        "--sweep",
        sweep.to_str().unwrap(),
        "--out",
        out,
    ];
    let (ok, _, stderr) = ftlab(&args);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("gc 60 %: steady WAF one PID"), "{stderr}");
    let csv = std::fs::read_to_string(dir.path().join("fdp.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 4, "{csv}");
    let steady = |name: &str| -> f64 {
        rows.iter().find(|r| r[0] == name).unwrap()[3]
            .parse()
            .unwrap()
    };
    assert!(steady("tiers") < steady("one"), "{csv}");
    for ext in ["png", "svg"] {
        assert!(dir.path().join(format!("fdp.{ext}")).exists());
    }
    let (ok, _, stderr) = ftlab(&args);
    assert!(ok, "{stderr}");
    assert_eq!(
        stderr.matches("kept from an earlier run").count(),
        4,
        "{stderr}"
    );
}
