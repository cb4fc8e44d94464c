use crate::config::ConfigBuilder;
use crate::flash::{Cause, SHARED_GC_PLACEMENT};
use crate::ftl::mapping::FlatMapping;
use crate::ftl::*;

/// A device of 2 channels x 32 blocks of 8 pages, one die per superblock, with `extra`.
fn device(extra: &[&str]) -> Ftl<FlatMapping> {
    let mut b = ConfigBuilder::from_preset("femu").unwrap();
    let base = [
        "flash.channels=2",
        "flash.dies_per_channel=1",
        "flash.blocks_per_die=32",
        "flash.pages_per_block=8",
        "flash.superblock_dies=1",
        "capacity.over_provisioning=0.5",
    ];
    for s in base.iter().chain(extra) {
        b.set(s).unwrap();
    }
    let config = b.build().unwrap();
    let g = config.geometry().unwrap();
    Ftl::new(&config, g.clone(), FlatMapping::new(g.logical_pages))
}

fn write(ftl: &mut Ftl<FlatMapping>, lpn: u64, placement: Placement, now: u64) -> u64 {
    let mut r = Request::new(now, Op::Write, lpn * 4096, 4096);
    r.placement = placement;
    ftl.submit(&r, now).unwrap()
}

/// Handle 0 (initially isolated) and handle 1 (persistently isolated) churn: GC moves
/// handle 0's data into the shared GC reclaim units (254), handle 1's only into its own,
/// and the FDP counts (media relocated) see it.
#[test]
fn gc_mixes_only_initially_isolated_handles() {
    let mut ftl = device(&["fdp.handles=[\"initial\", \"persistent\"]"]);
    let logical = ftl.geometry().logical_pages;
    let mut rng = crate::rng::SplitMix64::new(11);
    let mut now = 0;
    let mut handle_of = vec![0u8; logical as usize];
    for _ in 0..8 * logical {
        let lpn = rng.bounded(logical);
        let h = (lpn % 2) as u8;
        handle_of[lpn as usize] = h;
        now = write(&mut ftl, lpn, Placement::handle(h), now);
    }
    ftl.check_invariants();
    ftl.check_isolation(|lpn| handle_of[lpn.index()]);
    let p = ftl.stats().flash.placements();
    assert!(p[usize::from(SHARED_GC_PLACEMENT)].program_pages[Cause::Gc as usize] > 0);
    assert_eq!(
        p[0].program_pages[Cause::Gc as usize],
        0,
        "handle 0's GC goes to 254"
    );
    assert!(
        p[1].program_pages[Cause::Gc as usize] > 0,
        "handle 1's GC stays in it"
    );
    assert!(p[0].relocations > 0 && p[1].relocations > 0);
    assert!(ftl.stats().fdp_events.len() <= stats::FDP_EVENT_LOG);
    assert!(ftl
        .stats()
        .fdp_events
        .iter()
        .any(|e| e.kind == FdpEventKind::MediaRelocated));
}

/// Two reclaim groups: each write's data stays in its group's superblocks through GC.
#[test]
fn reclaim_groups_keep_their_data() {
    let mut ftl = device(&["fdp.reclaim_groups=2"]);
    let logical = ftl.geometry().logical_pages;
    let mut rng = crate::rng::SplitMix64::new(12);
    let mut now = 0;
    for _ in 0..6 * logical {
        let lpn = rng.bounded(logical);
        let placement = Placement {
            reclaim_group: (lpn % 2) as u8,
            handle: 0,
        };
        now = write(&mut ftl, lpn, placement, now);
    }
    ftl.check_invariants();
    assert!(ftl.stats().gc_write_pages() > 0);
    let g = ftl.geometry().clone();
    for lpn in 0..logical {
        if let Some(ppn) = ftl.lookup(Lpn::new(lpn as u32)) {
            assert_eq!(
                u64::from(ftl.blocks().group_of(g.superblock_of(ppn))),
                lpn % 2,
                "lpn {lpn}"
            );
        }
    }
    // A group that does not exist is refused.
    let mut r = Request::new(now, Op::Write, 0, 4096);
    r.placement.reclaim_group = 2;
    assert_eq!(
        ftl.submit(&r, now),
        Err(FtlError::NoSuchReclaimGroup {
            group: 2,
            groups: 2
        })
    );
}

/// A reclaim unit open past the time limit is closed unfilled at its handle's next write:
/// an event, counted, with the pages it left unwritten.
#[test]
fn the_ru_time_limit_closes_a_slow_reclaim_unit() {
    let mut ftl = device(&["fdp.ru_time_limit_ns=1000000"]);
    write(&mut ftl, 0, Placement::default(), 0);
    write(&mut ftl, 1, Placement::default(), 10);
    // 2 ms later: the unit opened at 0 is past its 1 ms.
    write(&mut ftl, 2, Placement::default(), 2_000_000);
    let s = ftl.stats();
    assert_eq!(s.flash.placements()[0].units_closed_unfilled, 1);
    assert_eq!(s.flash.placements()[0].units_opened, 2);
    let e = s.fdp_events.back().unwrap();
    assert_eq!(e.kind, FdpEventKind::RuTimeLimitExceeded);
    assert_eq!(e.pages, 8 - 2);
    ftl.check_invariants();
}

/// Auto placement: pages rewritten often go to the hot handle, pages written once to the
/// coldest; the host's placement is ignored.
#[test]
fn auto_placement_separates_by_rewrite_interval() {
    let mut ftl = device(&["ftl.streams=2", "fdp.placement=\"auto\""]);
    let logical = ftl.geometry().logical_pages;
    let mut now = 0;
    // LPN 0 rewritten every other write; LPNs 1.. written once each.
    for lpn in 1..logical / 2 {
        now = write(&mut ftl, 0, Placement::handle(1), now);
        now = write(&mut ftl, lpn, Placement::handle(0), now);
    }
    let p = ftl.stats().flash.placements();
    let hot = p[0].program_pages[Cause::Host as usize];
    let cold = p[1].program_pages[Cause::Host as usize];
    // Every rewrite of LPN 0 (all but its first write) is hot; every other page is cold.
    assert_eq!(hot, logical / 2 - 2);
    assert_eq!(cold, logical / 2);
}

/// Handle-scoped GC: writes of handle 1 that need room collect handle 1's superblocks,
/// and take handle 0's (emptier, all invalid) only when handle 1 has none to give; with
/// device scope they take handle 0's first.
#[test]
fn handle_scoped_gc_collects_the_writers_own_superblocks() {
    let mut erased_in_phase_two = Vec::new();
    for scope in ["device", "handle"] {
        let mut ftl = device(&["ftl.streams=2", &format!("fdp.gc_scope=\"{scope}\"")]);
        let logical = ftl.geometry().logical_pages;
        let mut now = 0;
        // Handle 0 writes the first half twice (its first copies become garbage); then
        // handle 1 fills and rewrites the second half.
        let half = logical / 2;
        for _ in 0..2 {
            for lpn in 0..half {
                now = write(&mut ftl, lpn, Placement::handle(0), now);
            }
        }
        let erased = |ftl: &Ftl<FlatMapping>| {
            ftl.stats().flash.placements()[0].erased_blocks[Cause::Gc as usize]
        };
        let before = erased(&ftl);
        let mut rng = crate::rng::SplitMix64::new(3);
        for _ in 0..4 * half {
            let lpn = half + rng.bounded(half);
            now = write(&mut ftl, lpn, Placement::handle(1), now);
        }
        ftl.check_invariants();
        erased_in_phase_two.push(erased(&ftl) - before);
    }
    let (device, handle) = (erased_in_phase_two[0], erased_in_phase_two[1]);
    assert!(handle < device, "handle 0's superblocks erased by handle 1's writes: device scope {device}, handle scope {handle}");
}

/// Lifetimes from a log: a write's lifetime ends at its LPN's next write or trim.
#[test]
fn lifetimes_count_host_writes_to_the_next_write_or_trim() {
    // Writes: 0:a, 1:b, 2:a, (trim b), 3:c, 4:a.
    let (a, b, c) = (0u64, 1u64, 2u64);
    let log = [a, b, a, b | placer::TRIMMED, c, a];
    assert_eq!(
        lifetimes_from_log(&log, 3),
        vec![2, 2, 2, u64::MAX, u64::MAX]
    );
}

/// Ideal placement on two handles, fed the lifetimes of its own run, puts the pages that
/// die soon in handle 0 and the long-lived in handle 1, and beats host placement that
/// knows nothing (everything in handle 0).
#[test]
fn ideal_placement_uses_the_recorded_lifetimes() {
    let run = |ideal: Option<Vec<u64>>| {
        let mut ftl = device(&["ftl.streams=2", "fdp.placement=\"ideal\""]);
        match ideal {
            Some(l) => ftl.use_lifetimes(l),
            None => ftl.record_writes(),
        }
        let logical = ftl.geometry().logical_pages;
        let mut rng = crate::rng::SplitMix64::new(9);
        let mut now = 0;
        // A hot tenth of the space takes 90 % of the writes.
        for lpn in 0..logical {
            now = write(&mut ftl, lpn, Placement::default(), now);
        }
        for _ in 0..10 * logical {
            let lpn = if rng.bounded(10) < 9 {
                rng.bounded(logical / 10)
            } else {
                rng.bounded(logical)
            };
            now = write(&mut ftl, lpn, Placement::default(), now);
        }
        ftl.check_invariants();
        let log = ftl.take_write_log();
        (ftl.stats().waf().unwrap(), log, logical)
    };
    let (host_waf, log, logical) = run(None);
    assert_eq!(log.len() as u64, 11 * logical);
    let (ideal_waf, _, _) = run(Some(lifetimes_from_log(&log, logical)));
    assert!(
        ideal_waf < host_waf,
        "ideal {ideal_waf} against host {host_waf}"
    );
}

/// Ideal bins hold equal shares of the writes, shortest lifetimes first; equal lifetimes
/// share a bin; never-overwritten data lands in the last.
#[test]
fn ideal_bins_are_quantiles_of_the_lifetimes() {
    let lifetimes = [5, 1, 100, u64::MAX, 7, 2, 50, u64::MAX];
    assert_eq!(ideal_handles(&lifetimes, 4), vec![1, 0, 2, 3, 1, 0, 2, 3]);
    assert_eq!(ideal_handles(&lifetimes, 1), vec![0; 8]);
    assert_eq!(ideal_handles(&[3, 3, 3, 3], 2), vec![1; 4]);
}
