//! WAF against independent references: exact results for sequential overwrite, published greedy
//! simulations for uniform random writes, and Desnoyers' analytical large-block limit.

use crate::support::{config, run};

use ftlab_sim::analytic::desnoyers_greedy_waf as desnoyers_limit;

fn check_uniform(rho: f64, expected: f64) {
    let c = config(
        "validation-uniform",
        &[&format!("capacity.over_provisioning={rho}")],
    );
    let r = run(&c);
    let limit = desnoyers_limit(rho);
    println!(
        "rho {rho}: WAF {} (reference {expected}, limit {limit:.3})",
        r.waf.unwrap()
    );
    assert!(
        (r.waf.unwrap() - expected).abs() <= 0.03 * expected,
        "rho {rho}: WAF {} not within 3 % of {expected}",
        r.waf.unwrap()
    );
    assert!(
        r.waf.unwrap() <= limit * 1.01,
        "WAF {} exceeds the model limit {limit}",
        r.waf.unwrap()
    );
    assert_eq!(
        r.host_write_pages,
        (2.0 * r.device.logical_bytes as f64 / 4096.0).round() as u64
    );
    assert_eq!(r.nand_write_pages, r.host_program_pages + r.gc_write_pages);
}

#[test]
fn uniform_random_waf_matches_greedy_reference_at_rho_7() {
    check_uniform(0.07, 7.62);
}

#[test]
fn uniform_random_waf_matches_greedy_reference_at_rho_28() {
    check_uniform(0.28, 2.46);
}

#[test]
fn sequential_overwrite_has_waf_one() {
    let c = config(
        "validation-uniform",
        &[
            "flash.blocks_per_die=1024",
            "workload.kind=sequential",
            "workload.request_size_bytes=131072",
            "workload.overwrites=3",
            "workload.precondition=false",
        ],
    );
    let r = run(&c);
    assert_eq!(r.waf, Some(1.0));
    assert_eq!(r.gc_write_pages, 0);
    assert!(
        r.erases > 0,
        "GC must have run and found only invalid blocks"
    );
}

#[test]
fn separating_hot_and_cold_streams_lowers_waf() {
    let base = [
        "flash.blocks_per_die=1024",
        "capacity.over_provisioning=0.15",
        "workload.kind=hotcold",
        "workload.hot_access_pcent=90",
        "workload.hot_space_pcent=10",
        "workload.overwrites=6",
        "workload.precondition_overwrites=2",
        "ftl.streams=2",
    ];
    let mixed = run(&config("validation-uniform", &base));
    let mut sets = base.to_vec();
    sets.push("workload.stream_by_temperature=true");
    let separated = run(&config("validation-uniform", &sets));
    println!(
        "hot/cold WAF: one stream {} two streams {}",
        mixed.waf.unwrap(),
        separated.waf.unwrap()
    );
    assert!(separated.waf.unwrap() < mixed.waf.unwrap() * 0.8);
}

#[test]
fn a_write_buffer_absorbs_rewrites_of_hot_pages() {
    let sets = [
        "flash.blocks_per_die=1024",
        "workload.kind=zipf",
        "workload.requests=200000",
        "workload.precondition=false",
    ];
    let direct = run(&config("validation-uniform", &sets));
    let mut with = sets.to_vec();
    with.push("ftl.write_buffer_mib=16");
    let buffered = run(&config("validation-uniform", &with));
    assert_eq!(direct.host_write_pages, buffered.host_write_pages);
    assert!(buffered.counters.buffer_coalesced_pages > 0);
    assert_eq!(
        buffered.host_program_pages + buffered.counters.buffer_coalesced_pages,
        buffered.host_write_pages
    );
    assert!(buffered.waf.unwrap() < direct.waf.unwrap());
}

/// The FDP statistics agree with the page counters: MBMW is every program's bytes, HBMW the
/// host's, MBE the erased blocks'; the placements' shares add up to the totals, and their valid
/// pages to the live mappings.
#[test]
fn fdp_statistics_agree_with_the_page_counters() {
    let r = crate::support::run(&crate::support::config(
        "femu",
        &[
            "flash.blocks_per_die=16",
            "flash.superblock_dies=1",
            "capacity.over_provisioning=0.25",
            "workload.kind=hotcold",
            "workload.requests=200000",
            "ftl.streams=2",
            "workload.stream_by_temperature=true",
        ],
    ));
    let page = r.config.flash.page_size_bytes as u64;
    let block = page * r.config.flash.pages_per_block as u64;
    let f = &r.fdp;
    assert_eq!(
        f.media_bytes_with_metadata_written,
        r.nand_write_pages * page
    );
    assert_eq!(
        f.host_bytes_with_metadata_written,
        r.host_write_pages * page
    );
    assert_eq!(f.media_bytes_erased, r.erases * block);
    assert_eq!(f.placements.len(), 2, "{f:?}");
    let sum =
        |x: fn(&ftlab_sim::report::PlacementStats) -> u64| f.placements.iter().map(x).sum::<u64>();
    assert_eq!(sum(|p| p.media_pages), r.nand_write_pages);
    assert_eq!(sum(|p| p.host_pages), r.host_program_pages);
    assert_eq!(sum(|p| p.erased_blocks), r.erases);
    assert_eq!(sum(|p| p.valid_pages), r.mapping.live_mappings);
    assert!(
        f.placements
            .iter()
            .all(|p| p.reclaim_units_written > 0 && p.media_pages > p.host_pages),
        "{f:?}"
    );
}
