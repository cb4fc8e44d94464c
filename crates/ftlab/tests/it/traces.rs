//! Every parser on real traces (../shared/traces), cross-checked between formats, and broken lines
//! rejected with file, line and field.

use crate::support::{config, run, temp_dir, trace};
use ftlab_core::request::{Op, Request};
use ftlab_core::rng::SplitMix64;
use ftlab_sim::trace::{TraceFormat, TraceReader};
use std::io::Read;
use std::path::Path;

fn read_all(path: &Path, format: Option<TraceFormat>) -> (TraceFormat, Vec<Request>) {
    let mut r = TraceReader::open(path, format, false).expect("opens");
    let mut out = Vec::new();
    while let Some(req) = r.next_request().expect("parses") {
        out.push(req);
    }
    (r.format(), out)
}

fn count(reqs: &[Request], op: Op) -> usize {
    reqs.iter().filter(|r| r.op == op).count()
}

fn gunzip(path: &Path) -> String {
    let mut s = String::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut s)
        .unwrap();
    s
}

#[test]
fn nbdkit_logs_parse_with_the_counts_their_readme_gives() {
    // (trace, writes, trims, reads) from ../shared/traces/README.md.
    for (name, writes, trims, reads) in [
        ("rocksdb", 4996, 194, 145),
        ("pgbench", 225_514, 72, 2620),
        ("files", 9496, 758, 71),
    ] {
        let (format, reqs) = read_all(&trace(&format!("{name}.nbdlog.gz")), None);
        assert_eq!(format, TraceFormat::Nbdkit);
        assert_eq!(count(&reqs, Op::Write), writes, "{name} writes");
        assert_eq!(count(&reqs, Op::Read), reads, "{name} reads");
        // Independent count of request lines by plain text matching; Zero is replayed as a trim.
        let text = gunzip(&trace(&format!("{name}.nbdlog.gz")));
        let lines = |verb: &str| {
            text.lines()
                .filter(|l| l.contains(&format!(" {verb} id=")))
                .count()
        };
        assert_eq!(lines("Trim"), trims, "{name} trims");
        assert_eq!(
            count(&reqs, Op::Trim),
            trims + lines("Zero"),
            "{name} trims + zeroes"
        );
        let flushes = text
            .lines()
            .filter(|l| l.contains(" Flush id=") && !l.contains("...Flush"))
            .count();
        assert_eq!(count(&reqs, Op::Flush), flushes, "{name} flushes");
        assert!(reqs.windows(2).all(|w| w[0].arrival_ns <= w[1].arrival_ns));
    }
}

#[test]
fn msr_conversions_carry_the_same_reads_and_writes_as_the_nbdkit_logs() {
    for name in ["rocksdb", "pgbench", "files"] {
        let (_, nbd) = read_all(&trace(&format!("{name}.nbdlog.gz")), None);
        let (format, msr) = read_all(&trace(&format!("{name}.msr.csv.gz")), None);
        assert_eq!(format, TraceFormat::Msr);
        let key = |v: &[Request], op| -> (usize, u64) {
            let sel: Vec<_> = v.iter().filter(|r| r.op == op).collect();
            (sel.len(), sel.iter().map(|r| r.length_bytes).sum())
        };
        assert_eq!(key(&nbd, Op::Write), key(&msr, Op::Write), "{name}");
        assert_eq!(key(&nbd, Op::Read), key(&msr, Op::Read), "{name}");
        assert_eq!(count(&msr, Op::Trim), 0);
    }
}

#[test]
fn msr_cambridge_samples_parse_with_their_header() {
    for name in ["msr-hm0-sample.csv", "msr-rsrch0-sample.csv"] {
        let (format, reqs) = read_all(&trace(name), None);
        assert_eq!(format, TraceFormat::Msr);
        assert_eq!(reqs.len(), 1000, "{name}");
        assert_eq!(reqs[0].arrival_ns, 0);
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn to_blkparse(reqs: &[Request]) -> String {
    let mut out = String::new();
    for (i, r) in reqs.iter().enumerate() {
        let t = format!(
            "{}.{:09}",
            r.arrival_ns / 1_000_000_000,
            r.arrival_ns % 1_000_000_000
        );
        let line = match r.op {
            Op::Flush => format!("  8,0    1 {:>8} {t} 4242  Q FWS [db_bench]\n", i + 1),
            op => {
                let rwbs = match op {
                    Op::Write => "WS",
                    Op::Read => "R",
                    _ => "D",
                };
                format!(
                    "  8,0    1 {:>8} {t} 4242  Q {rwbs} {} + {} [db_bench]\n  8,0    1 {:>8} {t} 4242  C {rwbs} {} + {} [0]\n",
                    i + 1, r.offset_bytes / 512, r.length_bytes / 512, i + 1, r.offset_bytes / 512, r.length_bytes / 512
                )
            }
        };
        out.push_str(&line);
    }
    out.push_str("CPU0 (8,0):\n Reads Queued:           0,        0KiB\n");
    out
}

fn to_fio(reqs: &[Request]) -> String {
    let mut out = String::from("fio version 3 iolog\n0 /dev/nbd0 add\n0 /dev/nbd0 open\n");
    for r in reqs {
        let us = r.arrival_ns / 1000;
        let line = match r.op {
            Op::Write => format!(
                "{us} /dev/nbd0 write {} {}\n",
                r.offset_bytes, r.length_bytes
            ),
            Op::Read => format!(
                "{us} /dev/nbd0 read {} {}\n",
                r.offset_bytes, r.length_bytes
            ),
            Op::Trim => format!(
                "{us} /dev/nbd0 trim {} {}\n",
                r.offset_bytes, r.length_bytes
            ),
            Op::Flush => format!("{us} /dev/nbd0 sync\n"),
        };
        out.push_str(&line);
    }
    out
}

#[test]
fn the_pgbench_trace_gives_one_waf_in_every_format() {
    let dir = temp_dir("formats");
    let nbd_path = trace("pgbench.nbdlog.gz");
    let (_, reqs) = read_all(&nbd_path, None);
    let blk = write(&dir, "pgbench.blkparse", &to_blkparse(&reqs));
    let fio = write(&dir, "pgbench.iolog", &to_fio(&reqs));
    // ext4 trims so much that GC on the trace's own 4 GiB device copies nothing; folding the
    // trace into 512 MiB (--wrap) makes GC work hard.
    let device = [
        "flash.blocks_per_die=10",
        "capacity.logical_bytes=536870912",
        "flash.superblock_dies=1",
        "workload.wrap=true",
        "workload.precondition=false",
    ];
    let replay = |path: &Path, expect: TraceFormat| {
        let (format, parsed) = read_all(path, None);
        assert_eq!(format, expect);
        assert_eq!(parsed.len(), reqs.len());
        let set = format!("workload.trace=\"{}\"", path.display());
        let mut sets = device.to_vec();
        sets.push(&set);
        run(&config("femu", &sets))
    };
    let a = replay(&nbd_path, TraceFormat::Nbdkit);
    let b = replay(&blk, TraceFormat::Blkparse);
    let c = replay(&fio, TraceFormat::Fio);
    println!(
        "pgbench: WAF {} erases {} GC writes {}",
        a.waf.unwrap(),
        a.erases,
        a.gc_write_pages
    );
    assert!(
        a.gc_write_pages > 0,
        "the device is small enough for GC to copy pages"
    );
    assert!(a.host_trim_pages > 0);
    for other in [&b, &c] {
        assert_eq!(other.host_write_pages, a.host_write_pages);
        assert_eq!(other.host_trim_pages, a.host_trim_pages);
        assert_eq!(other.waf, a.waf);
    }
    // `ftlab mapbench` takes the same update and lookup streams from every form.
    let ops = |path: &Path| {
        ftlab_mapbench::ops_from_trace(path, None, None, ftlab_mapbench::PpnSource::LogHead)
            .expect("the trace reads")
    };
    let want = ops(&nbd_path);
    assert!(want.updates.len() > 1_000_000 && want.gets.len() > 1_000_000);
    for path in [&blk, &fio] {
        let got = ops(path);
        assert_eq!(got.logical_pages, want.logical_pages);
        assert!(got.updates == want.updates, "{}: updates", path.display());
        assert!(got.gets == want.gets, "{}: lookups", path.display());
        assert!(got.random_gets == want.random_gets, "{}", path.display());
    }
}

#[test]
fn disksim_traces_from_the_shared_generator_parse_and_match_native_splitmix() {
    let dir = temp_dir("disksim");
    let out = dir.join("rand4k.trace");
    let status = std::process::Command::new("python3")
        .arg(crate::support::shared().join("tools/gen_disksim_trace.py"))
        .args([
            "--kind",
            "rand4k",
            "--span-bytes",
            "67108864",
            "--n",
            "20000",
            "--seed",
            "9",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("python3 runs the generator");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let (format, reqs) = read_all(&out, None);
    assert_eq!(format, TraceFormat::Disksim);
    let span_pages = 67_108_864 / 4096;
    assert_eq!(reqs.len() as u64, span_pages + 20_000);
    let mut rng = SplitMix64::new(9);
    for (i, r) in reqs[span_pages as usize..].iter().enumerate() {
        assert_eq!(
            r.offset_bytes,
            rng.bounded(span_pages) * 4096,
            "random write {i}"
        );
        assert_eq!((r.op, r.length_bytes), (Op::Write, 4096));
    }
    assert_eq!(reqs[1].arrival_ns, 10_000);
    // `ftlab bench`'s own writer (no Python, any directory) gives the script's file exactly.
    let mut native = Vec::new();
    ftlab_sim::trace::disksim::write_rand4k(&mut native, 67_108_864, 20_000, 9, 10_000).unwrap();
    assert!(
        native == std::fs::read(&out).unwrap(),
        "native trace differs"
    );
}

#[test]
fn broken_lines_are_rejected_with_file_line_and_field() {
    let dir = temp_dir("broken");
    let cases = [
        ("a.csv", "1,h,0,Write,0,4096,1\n2,h,0,Write,4096,4x,1\n", TraceFormat::Msr, "Size"),
        (
            "b.log",
            "2026-11-21 23:01:34.1 connection=1 Write id=1 offset=0x0 count=0x1000 ...\n2026-11-21 23:01:34.2 connection=1 Write id=2 offset=0x1000 ...\n",
            TraceFormat::Nbdkit,
            "count",
        ),
        ("c.trace", "0 0 0 8 0\n10 0 8 8 7\n", TraceFormat::Disksim, "type"),
        ("d.blk", "8,0 0 1 0.1 1 Q W 0 + 8 [x]\n8,0 0 2 0.2 1 Q W zz + 8 [x]\n", TraceFormat::Blkparse, "sector"),
        ("e.iolog", "fio version 2 iolog\n/dev/x write 0 4096\n/dev/x write -1 4096\n", TraceFormat::Fio, "offset"),
    ];
    for (name, text, format, field) in cases {
        let path = write(&dir, name, text);
        let mut r = TraceReader::open(&path, Some(format), false).unwrap();
        assert!(r.next_request().unwrap().is_some());
        let err = loop {
            match r.next_request() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("{name}: broken line accepted"),
                Err(e) => break e.to_string(),
            }
        };
        let line = text.lines().count();
        assert!(
            err.contains(&format!("{}:{line}: field `{field}`", path.display())),
            "{name}: {err}"
        );
        // The same file with --skip-bad-lines: one line counted, the good requests kept.
        let mut r = TraceReader::open(&path, Some(format), true).unwrap();
        let mut n = 0;
        while r.next_request().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(r.bad_lines(), 1, "{name}");
        assert!(n >= 1);
    }
}

#[test]
fn garbage_never_panics_any_parser() {
    use ftlab_sim::trace::{parse_line, ParserState};
    let mut rng = SplitMix64::new(1);
    let alphabet = b"0123456789abcdefx,. =+-:QWRDF\tconnectiRadWrtTimZzfiov\n";
    for _ in 0..20_000 {
        let len = rng.bounded(80) as usize;
        let line: String = (0..len)
            .map(|_| alphabet[rng.bounded(alphabet.len() as u64) as usize] as char)
            .collect();
        for format in TraceFormat::ALL {
            let mut state = ParserState::default();
            let _ = parse_line(format, "fio version 3 iolog", &mut state);
            let _ = parse_line(format, &line, &mut state);
        }
    }
    // Whole files of it (the alphabet has newlines), through the reader and the format's guess,
    // as the fuzz targets feed them; and lines of each format with garbage among them.
    let samples = [
        "128166372003061629,hm,0,Write,0,4096,100",
        "2024-01-01 00:00:00.000001 connection=1 Write id=1 offset=0x1000 count=0x1000 fua=0 ...",
        "0 0 8 8 0",
        "  8,0    1        1     0.000000000  1  Q  WS 2048 + 8 [fio]",
        "fio version 3 iolog",
        "10 /dev/nbd0 write 4096 4096",
    ];
    for _ in 0..2_000 {
        let mut text = String::new();
        for _ in 0..rng.bounded(6) {
            if rng.bounded(2) == 0 {
                text.push_str(samples[rng.bounded(samples.len() as u64) as usize]);
            } else {
                let len = rng.bounded(80) as usize;
                text.extend(
                    (0..len).map(|_| alphabet[rng.bounded(alphabet.len() as u64) as usize] as char),
                );
            }
            text.push('\n');
        }
        for format in TraceFormat::ALL {
            ftlab_sim::trace::fuzz_one(format, text.as_bytes());
        }
    }
}
