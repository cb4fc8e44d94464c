use crate::support::{config, run, trace};

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
