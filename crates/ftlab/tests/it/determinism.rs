use crate::support::{config, run, trace};
use ftlab_learned::GROUP_LPNS;

#[test]
fn same_config_and_seed_give_byte_identical_reports() {
    let sets = [
        "flash.blocks_per_die=16",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.25",
        "workload.kind=jesd219",
        "workload.read_pcent=40",
        "workload.requests=200000",
        "workload.queue_depth=16",
        "workload.precondition=true",
        "workload.precondition_overwrites=1",
        "ftl.write_buffer_mib=8",
    ];
    let a = run(&config("femu", &sets)).to_json();
    let b = run(&config("femu", &sets)).to_json();
    assert_eq!(a, b);
    let mut other_seed = sets.to_vec();
    other_seed.push("workload.seed=7");
    assert_ne!(
        a,
        run(&config("femu", &other_seed)).to_json(),
        "the seed must matter"
    );
}

#[test]
fn trace_replay_is_deterministic() {
    let t = trace("rocksdb.nbdlog.gz");
    let set = format!("workload.trace=\"{}\"", t.display());
    let sets = [set.as_str(), "workload.precondition=false"];
    let a = run(&config("femu", &sets)).to_json();
    let b = run(&config("femu", &sets)).to_json();
    assert_eq!(a, b);
}

/// The report without what a mapping table may change: its own section and its settings.
fn without_mapping(r: &ftlab_sim::Report) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    v.as_object_mut().unwrap().remove("mapping");
    // The time series' table size too, which differs by table as `mapping.bytes` does.
    for row in v["series"].as_array_mut().unwrap() {
        row.as_object_mut().unwrap().remove("mapping_bytes");
    }
    let ftl = v["config"]["ftl"].as_object_mut().unwrap();
    ftl.remove("mapping");
    ftl.remove("learned_buffer_divisor");
    v
}

/// Runs `sets` with the flat array and then with each `(table, buffer divisor)`: every report
/// must be the flat one's apart from the mapping section. Returns the flat run's report and each
/// table's (in `tables`' order).
fn assert_lossless(
    sets: &[&str],
    tables: &[(&str, u32)],
) -> (ftlab_sim::Report, Vec<ftlab_sim::Report>) {
    let flat = run(&config("femu", sets));
    let flat_stripped = without_mapping(&flat);
    let mut reports = Vec::new();
    for &(table, divisor) in tables {
        let mut with = sets.to_vec();
        let set = format!("ftl.mapping=\"{table}\"");
        let set_divisor = format!("ftl.learned_buffer_divisor={divisor}");
        with.push(&set);
        with.push(&set_divisor);
        let report = run(&config("femu", &with));
        assert_eq!(report.mapping.table, table);
        assert!(
            without_mapping(&report) == flat_stripped,
            "{table} (buffer divisor {divisor}) changed the simulation of {sets:?}"
        );
        reports.push(report);
    }
    (flat, reports)
}

/// The learned, extent and hash tables are lossless: a simulation with any of them reports exactly
/// what the flat array's does (GC, WAF, latencies), only the mapping section differs.
#[test]
fn every_mapping_table_gives_the_flat_tables_results() {
    let sets = [
        "flash.blocks_per_die=16",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.15",
        "workload.kind=hotcold",
        "workload.requests=150000",
        // Host reads: the GETs whose compressed fraction the learned table reports.
        "workload.read_pcent=20",
        "workload.precondition=true",
        "ftl.write_buffer_mib=1",
    ];
    // The learned table also with a buffer as large as the live mappings (divisor 1).
    let (flat, reports) = assert_lossless(
        &sets,
        &[
            ("learned", 16),
            ("learned", 1),
            ("extent", 16),
            ("hash", 16),
        ],
    );
    assert!(flat.gc.write_pages > 0, "the comparison must include GC");
    let mut fractions = Vec::new();
    for report in reports.iter().filter(|r| r.mapping.table == "learned") {
        let f = report
            .mapping
            .compressed_get_fraction
            .expect("learned reports it");
        fractions.push(f);
        // The FTL notes each lookup it makes (`note_gets`): one per host page read the
        // write buffer did not answer (whole-page writes read nothing back).
        let a = report.mapping.learned().expect("learned's activity");
        assert_eq!(
            a.gets,
            report.host_read_pages - report.counters.buffer_read_hits,
            "learned's GETs against the FTL's host lookups"
        );
        assert!(a.get_cursor_misses <= a.gets && a.gets > 0, "{a:?}");
        // The report compacts the table after reading what its buffer held at the end, and
        // the compacted table is smaller: no buffer, garbage or spare capacity.
        let m = &report.mapping;
        assert!(a.buffered_entries > 0, "{a:?}");
        assert!(m.bytes_compacted < m.bytes, "{m:?}");
        // Its size rises and falls over the run (buffer, garbage), never above its peak, which
        // counts preconditioning too.
        let sizes: Vec<u64> = report.series.iter().map(|r| r.mapping_bytes).collect();
        let (low, high) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(low < high && *high <= m.bytes_peak, "{low} {high} {m:?}");
        assert!(m.bytes <= m.bytes_peak, "{m:?}");
    }
    // The flat array's never changes.
    assert!(flat
        .series
        .iter()
        .all(|r| r.mapping_bytes == flat.mapping.bytes));
    assert_eq!(flat.mapping.bytes_peak, flat.mapping.bytes);
    // More lookups answered by the larger buffer, and most by the compressed layer by default.
    assert!(
        fractions[0] > 0.5,
        "compressed layer answered {}",
        fractions[0]
    );
    assert!(fractions[1] < fractions[0], "{fractions:?}");
}

/// The same with what that job leaves out: several write streams (by temperature, GC with a
/// frontier of its own) and large requests; and a replayed trace, whose trims the tables take
/// as removals, on a device small enough that GC moves pages.
#[test]
fn every_mapping_table_gives_the_flat_tables_results_with_streams_and_trims() {
    let (flat, _) = assert_lossless(
        &[
            "flash.blocks_per_die=16",
            "flash.superblock_dies=1",
            "capacity.over_provisioning=0.15",
            "workload.kind=hotcold",
            "workload.requests=60000",
            "workload.request_size_bytes=16384",
            "workload.read_pcent=30",
            "workload.precondition=true",
            "ftl.streams=4",
            "workload.stream_by_temperature=true",
            "ftl.gc_separate_frontier=true",
            "ftl.write_buffer_mib=2",
        ],
        &[("learned", 16), ("extent", 16), ("hash", 16)],
    );
    assert!(flat.gc.write_pages > 0, "the comparison must include GC");
    let t = trace("rocksdb.nbdlog.gz");
    let set = format!("workload.trace=\"{}\"", t.display());
    let (flat, _) = assert_lossless(
        &[
            set.as_str(),
            "workload.precondition=false",
            "capacity.logical_bytes=3221225472",
            "flash.blocks_per_die=56",
        ],
        &[("learned", 16), ("extent", 16), ("hash", 16)],
    );
    assert!(
        flat.host_trim_pages > 0 && flat.gc.write_pages > 0,
        "the replay must trim and move pages"
    );
}

/// The report's `mapping.learned` counts the measured phase only (the table's counts start over
/// with the FTL's after preconditioning) and sorts every group holding mappings by encoding;
/// the other tables have none.
#[test]
fn the_learned_tables_activity_counts_the_measured_phase() {
    let sets = [
        "flash.blocks_per_die=16",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.15",
        "workload.kind=uniform",
        "workload.requests=50000",
        "workload.precondition=true",
        "ftl.write_buffer_mib=0",
    ];
    let mut learned_sets = sets.to_vec();
    learned_sets.push("ftl.mapping=\"learned\"");
    let r = run(&config("femu", &learned_sets));
    let a = r
        .mapping
        .learned()
        .cloned()
        .expect("learned reports its activity");
    // The fill mapped every LPN, so every group of the device holds mappings.
    let g = &a.groups;
    assert_eq!(
        g.runs + g.segments + g.words + g.patched,
        r.mapping.live_mappings.div_ceil(GROUP_LPNS as u64),
        "{a:?}"
    );
    let c = &a.counts;
    assert!(c.merges > 0 && c.updates_in_place > 0, "{a:?}");
    // Each LPN merged, written in place or still buffered is an update of this phase (a host
    // write or a GC move), or one the buffer already held as the phase began (at most one in
    // 16 live mappings). Counting the preconditioning's (a full fill, then random overwrites)
    // would exceed that several times over.
    let updates = r.host_program_pages + r.gc_write_pages;
    assert!(
        c.updates_in_place + c.merged_entries + a.buffered_entries
            <= updates + r.mapping.live_mappings / 16,
        "{a:?} against {updates} updates"
    );
    let flat = run(&config("femu", &sets));
    assert_eq!(flat.mapping.learned(), None);
    assert!(!flat.to_json().contains("\"learned\""));
}

/// With the mapping persisted in translation pages and the Hexa buffer, reports are still
/// deterministic, and every table gives the flat one's figures, write-backs included:
/// persistence is the FTL's, not the table's.
#[test]
fn the_persisted_mapping_is_deterministic_and_the_same_under_every_table() {
    let sets = [
        "flash.blocks_per_die=16",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.25",
        "workload.kind=uniform",
        "workload.requests=100000",
        "workload.precondition=true",
        "ftl.write_buffer_mib=2",
        "ftl.buffer_policy=hexa",
        "ftl.protected_ratio=0.02",
    ];
    let a = run(&config("femu", &sets));
    assert_eq!(a.to_json(), run(&config("femu", &sets)).to_json());
    assert!(
        a.traffic.mapping_pages > 0 && a.traffic.gc_user_pages > 0,
        "{:?}",
        a.traffic
    );
    // The time series splits the run's traffic interval by interval.
    let md: u64 = a.series.iter().map(|r| r.traffic.mapping_pages).sum();
    let gud: u64 = a.series.iter().map(|r| r.traffic.gc_user_pages).sum();
    assert_eq!(
        (md, gud),
        (a.traffic.mapping_pages, a.traffic.gc_user_pages)
    );
    let (flat, _) = assert_lossless(&sets, &[("hash", 16), ("extent", 16), ("learned", 16)]);
    assert_eq!(flat.traffic, a.traffic);
}
