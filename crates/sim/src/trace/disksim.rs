//! DiskSim/MQSim/SSDSim ASCII: `arrival_ns device lba_sectors size_sectors type`, whitespace
//! separated, type 1 = read and 0 = write (MQSim's ASCIITraceReadCode/WriteCode). The arrival
//! time is nanoseconds as MQSim uses it; a fractional part is ignored. An optional sixth field is
//! the write's FDP placement ID (`H` or `G:H`; ftlab's extension).

use super::{clip, dec, parse_pid, sectors, FieldError};
use ftlab_core::request::{Op, Request};

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
