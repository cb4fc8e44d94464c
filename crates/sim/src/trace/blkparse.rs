//! blkparse default text output: `MAJ,MIN CPU SEQ SECONDS PID ACTION RWBS SECTOR + COUNT [PROC]`.
//! Only Q (queued) events become requests, so a request is counted once however many other
//! events (G, I, D, C ...) follow it. RWBS: D = discard (trim), W = write, R = read, F with no
//! sector = flush. The per-CPU summary blkparse prints at the end is skipped.

use super::{clip, dec, seconds_to_ns, sectors, FieldError, ParserState};
use ftlab_core::request::{Op, Request};

pub fn is_device(token: &str) -> bool {
    token.split_once(',').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

pub fn parse(line: &str, state: &mut ParserState) -> Result<Option<Request>, FieldError> {
    let trimmed = line.trim();
    if trimmed.is_empty() || state.blkparse_in_summary {
        return Ok(None);
    }
    if trimmed.starts_with("CPU") || trimmed.starts_with("Total") {
        state.blkparse_in_summary = true;
        return Ok(None);
    }
    let mut tokens = trimmed.split_ascii_whitespace();
    let device = tokens.next().unwrap_or("");
    if !is_device(device) {
        return Err(FieldError::new(
            "device",
            format!("`{}` is not MAJ,MIN", clip(device)),
        ));
    }
    let mut next = |name: &'static str| {
        tokens
            .next()
            .ok_or_else(|| FieldError::new(name, "missing"))
    };
    dec(next("cpu")?, "cpu")?;
    dec(next("sequence")?, "sequence")?;
    let arrival_ns = seconds_to_ns(next("time")?, "time")?;
    let _pid = next("pid")?;
    let action = next("action")?;
    if action != "Q" {
        return Ok(None);
    }
    let rwbs = next("rwbs")?;
    if !rwbs.bytes().all(|c| b"RWDFNSMAB".contains(&c)) {
        return Err(FieldError::new(
            "rwbs",
            format!("`{}` is not an RWBS string", clip(rwbs)),
        ));
    }
    let sector = tokens.next().filter(|s| !s.starts_with('['));
    let op = if sector.is_none() && rwbs.contains('F') {
        Op::Flush
    } else if rwbs.contains('D') {
        Op::Trim
    } else if rwbs.contains('W') {
        Op::Write
    } else if rwbs.contains('R') {
        Op::Read
    } else {
        return Ok(None);
    };
    let (offset_bytes, length_bytes) = match sector {
        Some(s) => {
            let start = dec(s, "sector")?;
            if tokens.next() != Some("+") {
                return Err(FieldError::new(
                    "count",
                    "expected `+ COUNT` after the sector",
                ));
            }
            let count = dec(tokens.next().unwrap_or(""), "count")?;
            (sectors(start, "sector")?, sectors(count, "count")?)
        }
        None if op == Op::Flush => (0, 0),
        None => return Err(FieldError::new("sector", "missing")),
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
    fn takes_queue_events_only() {
        let mut s = ParserState::default();
        let r = parse(
            "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]",
            &mut s,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.op, r.offset_bytes, r.length_bytes),
            (Op::Write, 223_490 * 512, 4096)
        );
        assert_eq!(
            parse(
                "  8,0    3        2     0.000001000   697  G   W 223490 + 8 [kjournald]",
                &mut s
            )
            .unwrap(),
            None
        );
        let t = parse("259,0 1 9 1.5 100 Q DS 2048 + 2048 [fstrim]", &mut s)
            .unwrap()
            .unwrap();
        assert_eq!((t.op, t.arrival_ns), (Op::Trim, 1_500_000_000));
        let f = parse("8,0 0 5 2.0 123 Q FWS [jbd2/sda1-8]", &mut s)
            .unwrap()
            .unwrap();
        assert_eq!(f.op, Op::Flush);
        assert_eq!(
            parse("8,0 0 6 2.0 123 Q W 10 - 8 [x]", &mut s)
                .unwrap_err()
                .field,
            "count"
        );
        assert_eq!(
            parse("garbage line here", &mut s).unwrap_err().field,
            "device"
        );
        assert_eq!(parse("CPU0 (8,0):", &mut s).unwrap(), None);
        assert_eq!(parse(" Reads Queued:  0,  0KiB", &mut s).unwrap(), None);
    }
}
