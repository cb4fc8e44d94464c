//! nbdkit log filter (`nbdkit --filter=log`): a request line is
//! `DATE TIME connection=N Read|Write|Trim|Zero|Flush id=K offset=0xHEX count=0xHEX ...`; its
//! completion (`...Write id=K return=0`), connection events and other verbs (Extents, Cache) carry
//! no I/O and are skipped. Zero is replayed as a trim (deallocate), as SSDs serve Write Zeroes.
//! DATE TIME is wall-clock UTC with microseconds. ftlab's own lines may add `pid=H` or
//! `pid=G:H` to a write: its FDP placement ID (nbdkit never writes it).

use super::{clip, hex, parse_pid, FieldError};
use ftlab_core::request::{Op, Request};

pub fn looks_like(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 27
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b' '
        && b[13] == b':'
        && (line.contains(" connection=") || line.contains(" Ready ") || line.ends_with("Fork"))
}

pub fn parse(line: &str) -> Result<Option<Request>, FieldError> {
    let mut tokens = line.split_ascii_whitespace();
    let Some(date) = tokens.next() else {
        return Ok(None);
    };
    let time = tokens
        .next()
        .ok_or_else(|| FieldError::new("time", "missing"))?;
    let Some(conn) = tokens.next() else {
        return Ok(None);
    };
    if !conn.starts_with("connection=") {
        // Ready, Fork, Preconnect ...: server events.
        return Ok(None);
    }
    let verb = tokens
        .next()
        .ok_or_else(|| FieldError::new("verb", "missing after connection="))?;
    let op = match verb {
        "Read" => Op::Read,
        "Write" => Op::Write,
        "Trim" | "Zero" => Op::Trim,
        "Flush" => Op::Flush,
        _ => return Ok(None),
    };
    let arrival_ns = wall_clock_ns(date, time)?;
    let mut offset = None;
    let mut count = None;
    let mut placement = None;
    for t in tokens {
        if let Some(v) = t.strip_prefix("offset=") {
            offset = Some(hex(v, "offset")?);
        } else if let Some(v) = t.strip_prefix("count=") {
            count = Some(hex(v, "count")?);
        } else if let Some(v) = t.strip_prefix("pid=") {
            placement = Some(parse_pid(v, "pid")?);
        }
    }
    let (offset_bytes, length_bytes) = if op == Op::Flush {
        (0, 0)
    } else {
        (
            offset.ok_or_else(|| FieldError::new("offset", "missing"))?,
            count.ok_or_else(|| FieldError::new("count", "missing"))?,
        )
    };
    let mut request = Request::new(arrival_ns, op, offset_bytes, length_bytes);
    request.placement = placement.unwrap_or_default();
    Ok(Some(request))
}

/// "2026-11-21" "23:01:34.086555" to nanoseconds since the Unix epoch (UTC).
fn wall_clock_ns(date: &str, time: &str) -> Result<u64, FieldError> {
    let bad_date = || FieldError::new("date", format!("`{}` is not YYYY-MM-DD", clip(date)));
    let mut d = date.split('-');
    let mut part = |max: u64| -> Result<u64, FieldError> {
        let v: u64 = d.next().and_then(|s| s.parse().ok()).ok_or_else(bad_date)?;
        if v > max {
            return Err(bad_date());
        }
        Ok(v)
    };
    let (y, m, day) = (part(9999)?, part(12)?, part(31)?);
    if y < 1970 || m == 0 || day == 0 {
        return Err(bad_date());
    }
    let bad_time = || FieldError::new("time", format!("`{}` is not HH:MM:SS.ffffff", clip(time)));
    let mut t = time.splitn(3, ':');
    let h: u64 = t.next().and_then(|s| s.parse().ok()).ok_or_else(bad_time)?;
    let min: u64 = t.next().and_then(|s| s.parse().ok()).ok_or_else(bad_time)?;
    let sec_ns = super::seconds_to_ns(t.next().ok_or_else(bad_time)?, "time")?;
    if h > 23 || min > 59 || sec_ns >= 61_000_000_000 {
        return Err(bad_time());
    }
    let days = days_from_civil(y as i64, m as i64, day as i64) as u64;
    // Nanoseconds since 1970 fit in a u64 until mid-2554; a later date would wrap.
    ((days * 24 + h) * 60 + min)
        .checked_mul(60_000_000_000)
        .and_then(|ns| ns.checked_add(sec_ns))
        .ok_or_else(|| {
            FieldError::new(
                "date",
                format!(
                    "`{}` is too late: nanoseconds since 1970 fit in 64 bits until 2554",
                    clip(date)
                ),
            )
        })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`);
/// written out rather than pulling a date crate in for one conversion.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Proleptic Gregorian (year, month, day) of a day count since 1970-01-01, the inverse of
/// `days_from_civil` (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// One request line as nbdkit's log filter writes it, at `unix_ns` wall-clock time.
pub fn format_line(
    unix_ns: u64,
    connection: u64,
    verb: &str,
    id: u64,
    offset: u64,
    count: u64,
    placement: Option<ftlab_core::request::Placement>,
) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let head = format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:06} connection={connection} {verb} id={id}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ns % 1_000_000_000 / 1000
    );
    if verb == "Flush" {
        format!("{head} ...")
    } else if let Some(p) = placement {
        let pid = super::format_pid(p);
        format!("{head} offset={offset:#x} count={count:#x} pid={pid} ...")
    } else {
        format!("{head} offset={offset:#x} count={count:#x} ...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests_and_skips_the_rest() {
        let r =
            parse("2026-11-21 23:01:34.095415 connection=3 Read id=1 offset=0x0 count=0x4000 ...")
                .unwrap()
                .unwrap();
        assert_eq!(
            (r.op, r.offset_bytes, r.length_bytes),
            (Op::Read, 0, 0x4000)
        );
        assert_eq!(r.arrival_ns % 1_000_000_000, 95_415_000);
        assert_eq!(
            parse("2026-11-21 23:01:34.095432 connection=3 ...Read id=1 return=0").unwrap(),
            None
        );
        assert_eq!(parse("2026-11-21 23:01:33.870939 Fork").unwrap(), None);
        assert_eq!(
            parse("2026-11-21 23:01:34.1 connection=1 Zero id=2 offset=0x1000 count=0x1000 fast=0")
                .unwrap()
                .unwrap()
                .op,
            Op::Trim
        );
        assert_eq!(
            parse("2026-11-21 23:01:34.1 connection=1 Write id=2 offset=0xZZ count=0x1000")
                .unwrap_err()
                .field,
            "offset"
        );
        assert_eq!(
            parse("2026-13-21 23:01:34.1 connection=1 Write id=2 offset=0x0 count=0x1000")
                .unwrap_err()
                .field,
            "date"
        );
    }

    /// Found by the fuzzer (`parse_nbdkit` with debug assertions): a date past 2554 overflowed
    /// the nanosecond count (a panic in debug builds, a wrapped time in release).
    #[test]
    fn dates_past_the_nanosecond_range_are_errors() {
        let line = |date: &str| {
            format!("{date} 23:01:34.1 connection=1 Write id=2 offset=0x0 count=0x1000")
        };
        assert!(parse(&line("2554-01-01")).unwrap().is_some());
        let e = parse(&line("2555-01-01")).unwrap_err();
        assert_eq!(e.field, "date", "{e:?}");
        assert_eq!(parse(&line("2620-11-2")).unwrap_err().field, "date");
        assert_eq!(parse(&line("9999-12-31")).unwrap_err().field, "date");
    }

    #[test]
    fn formatted_lines_parse_back() {
        let ns = 1_795_000_000_123_456_000;
        let line = format_line(ns, 1, "Write", 9, 0x2000, 0x1000, None);
        let r = parse(&line).unwrap().unwrap();
        assert_eq!(
            (r.op, r.offset_bytes, r.length_bytes, r.arrival_ns),
            (Op::Write, 0x2000, 0x1000, ns)
        );
        let placed = ftlab_core::request::Placement {
            reclaim_group: 1,
            handle: 4,
        };
        let line = format_line(ns, 1, "Write", 9, 0x2000, 0x1000, Some(placed));
        assert!(line.contains(" pid=1:4 "), "{line}");
        assert_eq!(parse(&line).unwrap().unwrap().placement, placed);
        let bad = line.replace("pid=1:4", "pid=4:x");
        assert_eq!(parse(&bad).unwrap_err().field, "pid");
        for z in [-1000, 0, 11_017, 20_778, 100_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m.into(), d.into()), z);
        }
    }

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 11, 21), 20_778);
    }
}
