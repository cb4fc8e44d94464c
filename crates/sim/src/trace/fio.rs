//! fio iolog (`write_iolog`): header `fio version 2 iolog` or `fio version 3 iolog`, then
//! `[TIMESTAMP_US] FILENAME ACTION [OFFSET LENGTH]`, the timestamp present in version 3 only
//! (microseconds since the job started). Actions: read, write, trim, sync/datasync (flush),
//! wait (v2: OFFSET microseconds pass), add/open/close (file bookkeeping). All files are taken
//! as the one device.

use super::{clip, dec, FieldError, ParserState};
use ftlab_core::request::{Op, Request};

pub fn parse(line: &str, state: &mut ParserState) -> Result<Option<Request>, FieldError> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    if let Some(v) = line.strip_prefix("fio version ") {
        state.fio_version = match v.trim() {
            "2 iolog" => 2,
            "3 iolog" => 3,
            other => {
                return Err(FieldError::new(
                    "header",
                    format!("unsupported iolog version `{}` (2 and 3 are)", clip(other)),
                ))
            }
        };
        return Ok(None);
    }
    if state.fio_version == 0 {
        return Err(FieldError::new(
            "header",
            "missing `fio version 2 iolog` or `fio version 3 iolog` first line",
        ));
    }
    let mut tokens = line.split_ascii_whitespace();
    let arrival_ns = if state.fio_version == 3 {
        let us = dec(tokens.next().unwrap_or(""), "timestamp")?;
        us.checked_mul(1000)
            .ok_or_else(|| FieldError::new("timestamp", "overflows 64-bit nanoseconds"))?
    } else {
        state.fio_clock_ns
    };
    let _file = tokens
        .next()
        .ok_or_else(|| FieldError::new("filename", "missing"))?;
    let action = tokens
        .next()
        .ok_or_else(|| FieldError::new("action", "missing"))?;
    let op = match action {
        "read" => Op::Read,
        "write" => Op::Write,
        "trim" => Op::Trim,
        "sync" | "datasync" => Op::Flush,
        "add" | "open" | "close" => return Ok(None),
        "wait" => {
            let us = dec(tokens.next().unwrap_or(""), "offset")?;
            state.fio_clock_ns = state.fio_clock_ns.saturating_add(us.saturating_mul(1000));
            return Ok(None);
        }
        other => {
            return Err(FieldError::new(
                "action",
                format!("unknown action `{}`", clip(other)),
            ))
        }
    };
    let (offset_bytes, length_bytes) = if op == Op::Flush {
        (0, 0)
    } else {
        (
            dec(tokens.next().unwrap_or(""), "offset")?,
            dec(tokens.next().unwrap_or(""), "length")?,
        )
    };
    Ok(Some(Request::new(
        arrival_ns,
        op,
        offset_bytes,
        length_bytes,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v2_and_v3() {
        let mut s = ParserState::default();
        assert!(parse("/dev/x write 0 4096", &mut s).is_err());
        parse("fio version 2 iolog", &mut s).unwrap();
        assert_eq!(parse("/dev/x add", &mut s).unwrap(), None);
        parse("/dev/x wait 250", &mut s).unwrap();
        let r = parse("/dev/x write 8192 4096", &mut s).unwrap().unwrap();
        assert_eq!(
            (r.op, r.offset_bytes, r.length_bytes, r.arrival_ns),
            (Op::Write, 8192, 4096, 250_000)
        );
        let mut s = ParserState::default();
        parse("fio version 3 iolog", &mut s).unwrap();
        let r = parse("878 Nvme1n1 read 0 16384", &mut s).unwrap().unwrap();
        assert_eq!((r.op, r.arrival_ns), (Op::Read, 878_000));
        assert_eq!(parse("9 f sync", &mut s).unwrap().unwrap().op, Op::Flush);
        assert_eq!(parse("9 f write 0", &mut s).unwrap_err().field, "length");
        assert_eq!(parse("9 f erase 0 1", &mut s).unwrap_err().field, "action");
    }
}
