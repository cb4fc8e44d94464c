//! Property tests: random writes, trims, reads and flushes on small devices of many shapes; after
//! every operation the FTL's invariants hold, which LPNs hold data matches a HashMap oracle, and
//! no GC move ever puts a persistently isolated handle's data beside another handle's.

use crate::support::cases;
use ftlab_core::addr::Lpn;
use ftlab_core::config::ConfigBuilder;
use ftlab_core::ftl::mapping::FlatMapping;
use ftlab_core::ftl::Ftl;
use ftlab_core::request::{Op, Placement, Request};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

#[derive(Clone, Debug)]
enum Action {
    Write { page: u64, pages: u64, stream: u8 },
    PartialWrite { byte: u64, len: u64 },
    Trim { page: u64, pages: u64 },
    Read { page: u64 },
    Flush,
}

fn action(logical_pages: u64) -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..logical_pages, 1..8u64, 0..3u8).prop_map(|(page, pages, stream)| Action::Write { page, pages, stream }),
        1 => (0..logical_pages * 4096, 1..6000u64).prop_map(|(byte, len)| Action::PartialWrite { byte, len }),
        2 => (0..logical_pages, 1..16u64).prop_map(|(page, pages)| Action::Trim { page, pages }),
        1 => (0..logical_pages).prop_map(|page| Action::Read { page }),
        1 => Just(Action::Flush),
    ]
}

#[derive(Clone, Debug)]
struct Shape {
    channels: u32,
    superblock_dies: u32,
    /// Handle types (true: persistently isolated); one entry: `ftl.streams = 1`.
    handles: Vec<bool>,
    separate_gc: bool,
    buffer_pages: u32,
    rho: f64,
    reclaim_groups: u32,
    gc_by_handle: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        1..=2u32,
        any::<bool>(),
        prop::collection::vec(any::<bool>(), 1..=3),
        any::<bool>(),
        prop_oneof![Just(0u32), Just(4), Just(32)],
        0.15..0.6f64,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                channels,
                stripe,
                handles,
                separate_gc,
                buffer_pages,
                rho,
                two_groups,
                gc_by_handle,
            )| {
                let superblock_dies = if stripe { channels } else { 1 };
                Shape {
                    channels,
                    superblock_dies,
                    handles,
                    separate_gc,
                    buffer_pages,
                    rho,
                    // Two reclaim groups where there are two die groups.
                    reclaim_groups: if two_groups && channels / superblock_dies == 2 {
                        2
                    } else {
                        1
                    },
                    gc_by_handle,
                }
            },
        )
}

const BLOCKS_PER_DIE: u32 = 24;
const PAGES_PER_BLOCK: u32 = 8;

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    #[test]
    fn ftl_invariants_hold_under_random_operations(
        shape in shape(),
        actions in prop::collection::vec(action(64), 1..400),
    ) {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        for s in [
            format!("flash.channels={}", shape.channels),
            "flash.dies_per_channel=1".into(),
            format!("flash.blocks_per_die={BLOCKS_PER_DIE}"),
            format!("flash.pages_per_block={PAGES_PER_BLOCK}"),
            format!("flash.superblock_dies={}", shape.superblock_dies),
            format!("capacity.over_provisioning={}", shape.rho),
            format!("fdp.handles={:?}", shape.handles.iter()
                .map(|&p| if p { "persistent" } else { "initial" }).collect::<Vec<_>>()),
            format!("fdp.reclaim_groups={}", shape.reclaim_groups),
            format!("fdp.gc_scope={}", if shape.gc_by_handle { "handle" } else { "device" }),
            format!("ftl.gc_separate_frontier={}", shape.separate_gc),
            format!("ftl.write_buffer_mib={}", f64::from(shape.buffer_pages) * 4096.0 / 1048576.0),
        ] {
            b.set(&s).unwrap();
        }
        let config = match b.build() {
            Ok(c) => c,
            // Some shapes leave too little spare for the frontiers: a config error, not a bug.
            Err(_) => return Ok(()),
        };
        let geometry = config.geometry().unwrap();
        let logical = geometry.logical_pages;
        let mut ftl = Ftl::new(&config, config.geometry().unwrap(), FlatMapping::new(logical));
        let mut oracle: HashSet<u64> = HashSet::new();
        // The handle each LPN's data was last written with.
        let mut handle_of: HashMap<u64, u8> = HashMap::new();
        let mut now = 0u64;
        for (i, a) in actions.into_iter().enumerate() {
            let request = match a {
                Action::Write { page, pages, stream } => {
                    let page = page % logical;
                    let pages = pages.min(logical - page);
                    let handle = stream % shape.handles.len() as u8;
                    for p in page..page + pages {
                        oracle.insert(p);
                        handle_of.insert(p, handle);
                    }
                    let placement = Placement {
                        reclaim_group: (i as u32 % shape.reclaim_groups) as u8,
                        handle,
                    };
                    Request { arrival_ns: 0, op: Op::Write, offset_bytes: page * 4096, length_bytes: pages * 4096, placement }
                }
                Action::PartialWrite { byte, len } => {
                    let byte = byte % (logical * 4096);
                    let len = len.min(logical * 4096 - byte);
                    for p in byte / 4096..=(byte + len - 1) / 4096 {
                        oracle.insert(p);
                        handle_of.insert(p, 0);
                    }
                    Request { arrival_ns: 0, op: Op::Write, offset_bytes: byte, length_bytes: len, placement: Placement::default() }
                }
                Action::Trim { page, pages } => {
                    let page = page % logical;
                    let pages = pages.min(logical - page);
                    for p in page..page + pages { oracle.remove(&p); }
                    Request { arrival_ns: 0, op: Op::Trim, offset_bytes: page * 4096, length_bytes: pages * 4096, placement: Placement::default() }
                }
                Action::Read { page } => Request { arrival_ns: 0, op: Op::Read, offset_bytes: (page % logical) * 4096, length_bytes: 4096, placement: Placement::default() },
                Action::Flush => Request { arrival_ns: 0, op: Op::Flush, offset_bytes: 0, length_bytes: 0, placement: Placement::default() },
            };
            let done = ftl.submit(&request, now).unwrap();
            prop_assert!(done >= now);
            now += 1000;
            ftl.check_invariants();
            ftl.check_isolation(|lpn| handle_of[&u64::from(lpn.get())]);
            for lpn in 0..logical {
                let holds = ftl.lookup(Lpn::new(lpn as u32)).is_some() || ftl.is_buffered(Lpn::new(lpn as u32));
                prop_assert_eq!(holds, oracle.contains(&lpn), "lpn {}", lpn);
            }
        }
        ftl.flush(now);
        ftl.check_invariants();
        ftl.check_isolation(|lpn| handle_of[&u64::from(lpn.get())]);
        let (free, open, used, victim) = ftl.blocks().state_counts();
        prop_assert_eq!(free + open + used + victim, geometry.superblocks);
        prop_assert_eq!(victim, 0);
        for lpn in 0..logical {
            prop_assert_eq!(ftl.lookup(Lpn::new(lpn as u32)).is_some(), oracle.contains(&lpn));
        }
        let s = ftl.stats();
        prop_assert_eq!(s.nand_write_pages(), s.host_program_pages() + s.gc_write_pages());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// Any configuration is either refused with a message or simulated to the end: no panic, and
    /// the report's counters add up.
    #[test]
    fn random_configs_are_refused_or_run(
        channels in 1..4u32, dies in 1..3u32, blocks in 1..40u32, pages in 1..40u32,
        page_shift in 9..14u32, sb_dies in 0..3u32, rho in 0.01..1.5f64,
        streams in 1..4u32, separate in any::<bool>(), buffer_kib in 0..512u32,
        bg in 50.0..100.0f64, fg_extra in 0.0..50.0f64, free_min in 0..4u32,
        kind in 0..5usize, read_pcent in 0.0..100.0f64, size_sectors in 1..80u64, qd in 1..8u32,
        precondition in any::<bool>(), seed in 0..=i64::MAX as u64,
    ) {
        let kinds = ["sequential", "uniform", "zipf", "hotcold", "jesd219"];
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        for s in [
            format!("flash.channels={channels}"),
            format!("flash.dies_per_channel={dies}"),
            format!("flash.blocks_per_die={blocks}"),
            format!("flash.pages_per_block={pages}"),
            format!("flash.page_size_bytes={}", 1u32 << page_shift),
            format!("flash.superblock_dies={sb_dies}"),
            format!("capacity.over_provisioning={rho}"),
            format!("ftl.streams={streams}"),
            format!("ftl.gc_separate_frontier={separate}"),
            format!("ftl.write_buffer_mib={}", f64::from(buffer_kib) / 1024.0),
            format!("ftl.gc_thres_pcent={bg}"),
            format!("ftl.gc_thres_pcent_high={}", (bg + fg_extra).min(100.0)),
            format!("ftl.gc_free_superblocks_min={free_min}"),
            format!("workload.kind={}", kinds[kind]),
            format!("workload.read_pcent={read_pcent}"),
            format!("workload.request_size_bytes={}", size_sectors * 512),
            format!("workload.queue_depth={qd}"),
            "workload.requests=3000".to_string(),
            format!("workload.precondition={precondition}"),
            "workload.precondition_overwrites=1".to_string(),
            format!("workload.seed={seed}"),
        ] {
            b.set(&s).unwrap();
        }
        let Ok(config) = b.build() else { return Ok(()) };
        let r = ftlab_sim::sim::run(&config, &mut |_| {}).expect("a valid config runs");
        prop_assert_eq!(r.nand_write_pages, r.host_program_pages + r.gc_write_pages);
        prop_assert!(r.host_program_pages <= r.host_write_pages);
        prop_assert_eq!(r.requests.read + r.requests.write, 3000);
        // Every GC copy reads its page first, and GC never eats the reserve it copies into.
        prop_assert_eq!(r.gc.write_pages, r.gc.read_pages);
        prop_assert!(r.device.free_superblocks_end >= 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// The mapping persisted in translation pages (`ftl.protected_ratio` below 1), under random
    /// writes, trims, flushes, GC of data and of translation superblocks, and power cuts at random
    /// points: the dirty translation pages never exceed the protected budget, a clean page's
    /// durable copy is always the table's (checked in `check_invariants`), and after each cut the
    /// durable state alone (translation pages on flash) maps every acknowledged write and no
    /// trimmed page. Both write buffer policies, and a mapping cache of a few pages (map reads,
    /// dirty pages written back as the cache drops them) or of all; greedy or cost-benefit GC.
    #[test]
    fn the_persisted_mapping_survives_power_cuts(
        entry_bytes in prop_oneof![Just(256u32), Just(512), Just(1024)],
        ratio in prop_oneof![Just(0.05f64), Just(0.2), Just(0.5)],
        buffer_pages in prop_oneof![Just(0u32), Just(8)],
        lru in any::<bool>(),
        hexa in any::<bool>(),
        cached_pages in prop_oneof![Just(0u64), Just(2), Just(5)],
        cost_benefit in any::<bool>(),
        // Over the whole device (264 pages), its partial last translation page included.
        actions in prop::collection::vec((action(264), 0..40u8), 1..600),
    ) {
        let mut b = ConfigBuilder::from_preset("femu").unwrap();
        for s in [
            "flash.channels=2".to_string(),
            "flash.dies_per_channel=1".into(),
            format!("flash.blocks_per_die={BLOCKS_PER_DIE}"),
            format!("flash.pages_per_block={PAGES_PER_BLOCK}"),
            "flash.superblock_dies=1".into(),
            // 264 logical pages: the last translation page is partial.
            "capacity.over_provisioning=0.45".into(),
            format!("ftl.protected_ratio={ratio}"),
            format!("ftl.mapping_entry_bytes={entry_bytes}"),
            format!("ftl.dirty_victim={}", if lru { "lru" } else { "fifo" }),
            format!("ftl.buffer_policy={}", if hexa { "hexa" } else { "fifo" }),
            // A DFTL-style cache of a few translation pages, or all of them (0).
            format!("ftl.mapping_cache_bytes={}", cached_pages * 4096),
            format!("ftl.gc_policy={}", if cost_benefit { "cost_benefit" } else { "greedy" }),
            format!("ftl.write_buffer_mib={}", f64::from(buffer_pages) * 4096.0 / 1048576.0),
        ] {
            b.set(&s).unwrap();
        }
        let config = b.build().unwrap();
        let geometry = config.geometry().unwrap();
        let logical = geometry.logical_pages;
        let mut ftl = Ftl::new(&config, geometry.clone(), FlatMapping::new(logical));
        ftl.keep_durable_copy();
        let budget = ftl.translation().expect("persisted").budget();
        let mut oracle: HashSet<u64> = HashSet::new();
        let mut now = 0u64;
        let mut cuts = 0;
        for (a, cut) in actions {
            let request = match a {
                Action::Write { page, pages, .. } => {
                    let page = page % logical;
                    let pages = pages.min(logical - page);
                    for p in page..page + pages { oracle.insert(p); }
                    Request::new(0, Op::Write, page * 4096, pages * 4096)
                }
                Action::PartialWrite { byte, len } => {
                    let byte = byte % (logical * 4096);
                    let len = len.min(logical * 4096 - byte);
                    for p in byte / 4096..=(byte + len - 1) / 4096 { oracle.insert(p); }
                    Request::new(0, Op::Write, byte, len)
                }
                Action::Trim { page, pages } => {
                    let page = page % logical;
                    let pages = pages.min(logical - page);
                    for p in page..page + pages { oracle.remove(&p); }
                    Request::new(0, Op::Trim, page * 4096, pages * 4096)
                }
                Action::Read { page } => Request::new(0, Op::Read, (page % logical) * 4096, 4096),
                Action::Flush => Request::new(0, Op::Flush, 0, 0),
            };
            now = ftl.submit(&request, now).unwrap().max(now) + 1000;
            ftl.check_invariants();
            let t = ftl.translation().unwrap();
            prop_assert!(t.dirty_count() <= budget && t.max_dirty() <= budget);
            if cut == 0 {
                cuts += 1;
                let c = ftl.power_cut(now);
                now = c.done_ns.max(now);
                prop_assert!(c.dirty_translation_pages <= u64::from(budget));
                let t = ftl.translation().unwrap();
                prop_assert_eq!(t.dirty_count(), 0);
                for lpn in 0..logical {
                    let durable = t.durable(Lpn::new(lpn as u32)).unwrap();
                    prop_assert_eq!(durable != u32::MAX, oracle.contains(&lpn), "lpn {} after cut {}", lpn, cuts);
                    if durable != u32::MAX {
                        prop_assert_eq!(Some(durable), ftl.lookup(Lpn::new(lpn as u32)).map(|p| p.get()));
                    }
                }
                ftl.check_invariants();
            }
        }
        let s = ftl.stats();
        prop_assert_eq!(
            s.nand_write_pages(),
            s.host_program_pages() + s.gc_write_pages() + s.mapping_write_pages()
        );
    }
}
