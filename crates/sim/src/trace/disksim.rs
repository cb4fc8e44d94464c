//! DiskSim/MQSim/SSDSim ASCII: `arrival_ns device lba_sectors size_sectors type`, whitespace
//! separated, type 1 = read and 0 = write (MQSim's ASCIITraceReadCode/WriteCode). The arrival
//! time is nanoseconds as MQSim uses it; a fractional part is ignored. An optional sixth field is
//! the write's FDP placement ID (`H` or `G:H`; ftlab's extension).

use super::{clip, dec, parse_pid, sectors, FieldError};
use ftlab_core::request::{Op, Request};
use ftlab_core::rng::{Range, SplitMix64};
use std::io::Write;

/// Writes the peer-baseline trace `../shared/tools/gen_disksim_trace.py --kind rand4k` writes,
/// byte for byte: a sequential fill of `span_bytes` in 4 KiB writes, then `random_writes`
/// 4 KiB writes at pages drawn by SplitMix64(`seed`)'s `bounded`, request i arriving at
/// i x `interarrival_ns`. In the binary so that `ftlab bench` needs neither Python nor the
/// project's directory; the script stays the definition another simulator regenerates from.
pub fn write_rand4k(
    out: &mut impl Write,
    span_bytes: u64,
    random_writes: u64,
    seed: u64,
    interarrival_ns: u64,
) -> std::io::Result<()> {
    const PAGE_BYTES: u64 = 4096;
    const SECTORS_PER_PAGE: u64 = PAGE_BYTES / 512;
    assert!(span_bytes >= PAGE_BYTES && span_bytes.is_multiple_of(PAGE_BYTES));
    let span_pages = span_bytes / PAGE_BYTES;
    let mut arrival_ns = 0u64;
    let mut emit = |out: &mut dyn Write, page: u64| {
        let line = writeln!(
            out,
            "{arrival_ns} 0 {} {SECTORS_PER_PAGE} 0",
            page * SECTORS_PER_PAGE
        );
        arrival_ns += interarrival_ns;
        line
    };
    for page in 0..span_pages {
        emit(out, page)?;
    }
    let mut rng = SplitMix64::new(seed);
    let range = Range::new(span_pages);
    for _ in 0..random_writes {
        emit(out, rng.below(range))?;
    }
    Ok(())
}

pub fn parse(line: &str) -> Result<Option<Request>, FieldError> {
    let mut tokens = line.split_ascii_whitespace();
    let Some(time) = tokens.next() else {
        return Ok(None);
    };
    if time.starts_with('#') {
        return Ok(None);
    }
    let mut next = |name: &'static str| {
        tokens
            .next()
            .ok_or_else(|| FieldError::new(name, "missing (expected 5 fields)"))
    };
    let time_int = time.split_once('.').map_or(time, |(w, _)| w);
    let arrival_ns = dec(time_int, "arrival_ns")?;
    let _device = dec(next("device")?, "device")?;
    let lba = dec(next("lba_sectors")?, "lba_sectors")?;
    let size = dec(next("size_sectors")?, "size_sectors")?;
    let op = match next("type")? {
        "0" => Op::Write,
        "1" => Op::Read,
        other => {
            return Err(FieldError::new(
                "type",
                format!("`{}` is neither 0 (write) nor 1 (read)", clip(other)),
            ))
        }
    };
    let placement = tokens.next().map(|p| parse_pid(p, "pid")).transpose()?;
    if let Some(extra) = tokens.next() {
        return Err(FieldError::new(
            "line",
            format!("unexpected seventh field `{}`", clip(extra)),
        ));
    }
    let mut request = Request::new(
        arrival_ns,
        op,
        sectors(lba, "lba_sectors")?,
        sectors(size, "size_sectors")?,
    );
    request.placement = placement.unwrap_or_default();
    Ok(Some(request))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let r = parse("10000 0 16 8 0\n").unwrap().unwrap();
        assert_eq!(
            (r.arrival_ns, r.op, r.offset_bytes, r.length_bytes),
            (10000, Op::Write, 8192, 4096)
        );
        assert_eq!(parse("5 0 0 8 1").unwrap().unwrap().op, Op::Read);
        assert_eq!(parse("5 0 0 8 2").unwrap_err().field, "type");
        assert_eq!(parse("5 0 x 8 0").unwrap_err().field, "lba_sectors");
        assert_eq!(parse("5 0 0").unwrap_err().field, "size_sectors");
        assert_eq!(parse("   ").unwrap(), None);
        let r = parse("5 0 0 8 0 2").unwrap().unwrap();
        assert_eq!(r.placement, ftlab_core::request::Placement::handle(2));
        assert_eq!(parse("5 0 0 8 0 300").unwrap_err().field, "pid");
        assert_eq!(parse("5 0 0 8 0 1 9").unwrap_err().field, "line");
    }
}
