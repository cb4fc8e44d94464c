//! DiskSim/MQSim/SSDSim ASCII: `arrival_ns device lba_sectors size_sectors type`, whitespace
//! separated, type 1 = read and 0 = write (MQSim's ASCIITraceReadCode/WriteCode). The arrival
//! time is nanoseconds as MQSim uses it; a fractional part is ignored.

use super::{clip, dec, sectors, FieldError};
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
    if let Some(extra) = tokens.next() {
        return Err(FieldError::new(
            "line",
            format!("unexpected sixth field `{}`", clip(extra)),
        ));
    }
    Ok(Some(Request::new(
        arrival_ns,
        op,
        sectors(lba, "lba_sectors")?,
        sectors(size, "size_sectors")?,
    )))
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
    }
}
