//! MSR Cambridge CSV: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`, Timestamp in
//! Windows FILETIME ticks (100 ns), Offset and Size in bytes, Type `Read` or `Write`. A header row
//! (as some public copies have) is skipped. An optional eighth field is the write's FDP placement
//! ID (`H` or `G:H`; ftlab's extension, empty = none).

use super::{clip, dec, parse_pid, FieldError};
use ftlab_core::request::{Op, Request};

pub fn parse(line: &str) -> Result<Option<Request>, FieldError> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() || line.starts_with("Timestamp,") {
        return Ok(None);
    }
    let mut fields = line.split(',');
    let mut next = |name: &'static str| {
        fields
            .next()
            .ok_or_else(|| FieldError::new(name, "missing (expected 7 comma-separated fields)"))
    };
    let ticks = dec(next("Timestamp")?, "Timestamp")?;
    let _host = next("Hostname")?;
    let _disk = next("DiskNumber")?;
    let kind = next("Type")?.trim();
    let offset = dec(next("Offset")?, "Offset")?;
    let size = dec(next("Size")?, "Size")?;
    let _response = next("ResponseTime")?;
    let op = if kind.eq_ignore_ascii_case("write") {
        Op::Write
    } else if kind.eq_ignore_ascii_case("read") {
        Op::Read
    } else {
        return Err(FieldError::new(
            "Type",
            format!("`{}` is neither Read nor Write", clip(kind)),
        ));
    };
    let arrival_ns = ticks
        .checked_mul(100)
        .ok_or_else(|| FieldError::new("Timestamp", "overflows 64-bit nanoseconds"))?;
    let mut request = Request::new(arrival_ns, op, offset, size);
    if let Some(pid) = fields.next().filter(|f| !f.trim().is_empty()) {
        request.placement = parse_pid(pid, "PlacementID")?;
    }
    Ok(Some(request))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rows_and_skips_the_header() {
        assert_eq!(
            parse("Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime").unwrap(),
            None
        );
        let r = parse("128166385295514663,hm,0,Write,9056014336,2048,2833\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.op, Op::Write);
        assert_eq!(r.offset_bytes, 9_056_014_336);
        assert_eq!(r.length_bytes, 2048);
        assert_eq!(r.arrival_ns, 12_816_638_529_551_466_300);
    }

    #[test]
    fn names_the_broken_field() {
        assert_eq!(parse("1,h,0,Erase,0,4096,1").unwrap_err().field, "Type");
        assert_eq!(parse("1,h,0,Read,-5,4096,1").unwrap_err().field, "Offset");
        assert_eq!(parse("1,h,0,Read,0").unwrap_err().field, "Size");
        assert_eq!(
            parse("1,h,0,Write,0,4096,1,x").unwrap_err().field,
            "PlacementID"
        );
    }

    #[test]
    fn an_eighth_field_is_the_placement_id() {
        let r = parse("1,h,0,Write,0,4096,1,3").unwrap().unwrap();
        assert_eq!(r.placement, ftlab_core::request::Placement::handle(3));
        let r = parse("1,h,0,Write,0,4096,1,1:2").unwrap().unwrap();
        assert_eq!((r.placement.reclaim_group, r.placement.handle), (1, 2));
        let r = parse("1,h,0,Write,0,4096,1,").unwrap().unwrap();
        assert_eq!(r.placement, Default::default());
    }
}
