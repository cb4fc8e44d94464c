use crate::config::ConfigBuilder;
use crate::ftl::mapping::FlatMapping;
use crate::ftl::*;

/// A device of 48 superblocks of 8 pages, translation pages of 8 entries, with `extra`
/// settings; its FTL keeps the durable copy.
fn small_device(extra: &[&str]) -> (Geometry, Ftl<FlatMapping>) {
    let mut b = ConfigBuilder::from_preset("femu").unwrap();
    let base = [
        "flash.channels=2",
        "flash.dies_per_channel=1",
        "flash.blocks_per_die=24",
        "flash.pages_per_block=8",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.5",
        "ftl.mapping_entry_bytes=512",
    ];
    for s in base.iter().chain(extra) {
        b.set(s).unwrap();
    }
    let config = b.build().unwrap();
    let g = config.geometry().unwrap();
    let mut ftl = Ftl::new(&config, g.clone(), FlatMapping::new(g.logical_pages));
    ftl.keep_durable_copy();
    (g, ftl)
}

/// A small device with a tiny protected budget, overwritten many times: translation pages
/// are written back (MD), their superblocks fill with stale copies and GC collects them
/// (GMD), and every invariant (the durable copy's included) holds throughout.
#[test]
fn translation_superblocks_are_collected_like_data() {
    let (g, mut ftl) = small_device(&["ftl.protected_ratio=0.1"]);
    let mut rng = crate::rng::SplitMix64::new(3);
    let mut now = 0;
    for i in 0..20 * g.logical_pages {
        let lpn = rng.bounded(g.logical_pages);
        let r = Request::new(now, Op::Write, lpn * 4096, 4096);
        now = ftl.submit(&r, now).unwrap();
        if i % 97 == 0 {
            ftl.check_invariants();
        }
    }
    ftl.check_invariants();
    let s = ftl.stats();
    assert!(s.mapping_write_pages() > 0, "{s:?}");
    assert!(
        s.gc_mapping_write_pages() > 0,
        "no translation superblock collected: {s:?}"
    );
    assert!(s.gc_user_write_pages() > 0, "{s:?}");
    let t = ftl.translation().unwrap();
    assert!(t.max_dirty() <= t.budget());
}

/// A cache of two translation pages: lookups of uncached pages read them from flash (map
/// reads), dropping others (written back when dirty), and the durable copy stays right.
#[test]
fn a_small_mapping_cache_reads_translation_pages_on_misses() {
    let (g, mut ftl) = small_device(&["ftl.mapping_cache_bytes=8192"]);
    assert_eq!(g.cached_translation_pages, Some(2));
    let mut rng = crate::rng::SplitMix64::new(5);
    let mut now = 0;
    for _ in 0..5 * g.logical_pages {
        let lpn = rng.bounded(g.logical_pages);
        let op = if rng.bounded(3) == 0 {
            Op::Read
        } else {
            Op::Write
        };
        now = ftl
            .submit(&Request::new(now, op, lpn * 4096, 4096), now)
            .unwrap();
        ftl.check_invariants();
    }
    let s = ftl.stats();
    assert!(s.flash.read_pages(Cause::Mapping) > 0, "no map read: {s:?}");
    assert!(s.mapping_write_pages() > 0, "{s:?}");
    ftl.power_cut(now);
    ftl.check_invariants();
}
