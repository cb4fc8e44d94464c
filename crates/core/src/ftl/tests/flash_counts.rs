use crate::config::ConfigBuilder;
use crate::flash::Cause;
use crate::ftl::mapping::FlatMapping;
use crate::ftl::*;

/// Every program, read and erase lands under its cause and placement: host pages under the
/// stream that wrote them, GC's under the stream of the victim it cleaned, and the report's
/// totals are the sums.
#[test]
fn flash_work_is_counted_by_cause_and_placement() {
    let mut b = ConfigBuilder::from_preset("femu").unwrap();
    for s in [
        "flash.channels=2",
        "flash.dies_per_channel=2",
        "flash.blocks_per_die=32",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.25",
        "ftl.streams=2",
    ] {
        b.set(s).unwrap();
    }
    let config = b.build().unwrap();
    let g = config.geometry().unwrap();
    let mut ftl = Ftl::new(&config, g.clone(), FlatMapping::new(g.logical_pages));
    let page = u64::from(g.page_size_bytes);
    let pages = g.logical_pages;
    // Stream 1 fills the device once, then stream 0 overwrites it three times (GC runs), a
    // partial write reads its old page, and a read reads one.
    let mut now = 0;
    for lpn in 0..pages {
        let mut r = Request::new(now, Op::Write, lpn * page, page);
        r.placement = Placement::handle(1);
        now = ftl.submit(&r, now).unwrap();
    }
    let mut rng = crate::rng::SplitMix64::new(7);
    for _ in 0..3 * pages {
        let lpn = rng.bounded(pages);
        now = ftl
            .submit(&Request::new(now, Op::Write, lpn * page, page), now)
            .unwrap();
    }
    now = ftl
        .submit(&Request::new(now, Op::Write, 512, 512), now)
        .unwrap();
    ftl.submit(&Request::new(now, Op::Read, page, page), now)
        .unwrap();
    ftl.check_invariants();

    let s = ftl.stats();
    let f = &s.flash;
    let at = |p: usize| &f.placements()[p];
    assert_eq!(at(1).program_pages[Cause::Host as usize], pages);
    assert_eq!(at(0).program_pages[Cause::Host as usize], 3 * pages + 1);
    assert!(s.gc_write_pages() > 0 && s.erases() > 0, "{s:?}");
    // GC moved pages of both streams' superblocks, and erased blocks of both.
    for p in 0..2 {
        assert!(at(p).program_pages[Cause::Gc as usize] > 0, "{s:?}");
        assert!(at(p).erased_blocks[Cause::Gc as usize] > 0, "{s:?}");
    }
    assert_eq!(s.gc_read_pages(), s.gc_write_pages());
    assert_eq!(s.rmw_read_pages(), 1);
    assert_eq!(s.host_flash_read_pages(), 1);
    assert_eq!(s.mapping_write_pages(), 0);
    assert_eq!(
        s.erases() % u64::from(g.superblock_dies),
        0,
        "a superblock erase is one block per die"
    );
    assert_eq!(
        s.nand_write_pages(),
        s.host_program_pages() + s.gc_write_pages() + s.mapping_write_pages()
    );
    assert_eq!(s.host_program_pages(), s.host_write_pages);
}
