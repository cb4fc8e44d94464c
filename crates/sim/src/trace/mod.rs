//! Trace replay input: five block-trace formats, gzip or plain, guessed from content or named.
//!
//! Owns: turning lines of a file into [`Request`]s with arrival times relative to the first
//! request, and errors that name file, line and field. Does not know: the device (capacity checks
//! and `--wrap` are the simulator's), or timing. docs/trace-formats.md describes each format.

mod blkparse;
pub mod disksim;
mod fio;
mod msr;
pub mod nbdkit;

use ftlab_core::request::{Op, Placement, Request};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

pub use ftlab_core::config::TraceFormat;

/// What is wrong with one field of one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    // Not named `source`: thiserror would make it the error's cause as well, and `{:#}` would
    // print it twice.
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error("{path}:{line}: field `{field}`: {reason}")]
    BadLine {
        path: String,
        line: u64,
        field: &'static str,
        reason: String,
    },
    #[error("{path}: cannot tell the trace format from its first lines; name it with --format msr|nbdkit|disksim|blkparse|fio")]
    UnknownFormat { path: String },
    #[error("{path}: the trace is empty (no line but blank ones), so it has no requests and no format to tell")]
    Empty { path: String },
    #[error("{path}: no request in its {lines} line(s){}", if *bad_lines > 0 { format!(" ({bad_lines} bad and skipped: is --format right?)") } else { String::new() })]
    NoRequests {
        path: String,
        lines: u64,
        bad_lines: u64,
    },
}

/// How a recorded request is written (`ftlab serve --record`): the one place a request becomes a
/// trace line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordFormat {
    /// nbdkit log lines: reads, writes, trims and flushes; a replay reproduces the counters.
    Nbdkit,
    /// MSR Cambridge CSV: reads and writes only (the format has no trim or flush), so a replay
    /// differs wherever trims mattered.
    Msr,
}

/// 100 ns ticks from 1601-01-01 (Windows FILETIME, MSR's clock) to 1970-01-01.
const FILETIME_UNIX_EPOCH_TICKS: u64 = 116_444_736_000_000_000;

impl RecordFormat {
    pub fn parse(name: &str) -> Result<Self, ftlab_core::units::UnknownChoice> {
        match name {
            "nbdkit" => Ok(Self::Nbdkit),
            "msr" => Ok(Self::Msr),
            other => Err(ftlab_core::units::UnknownChoice::new(
                other,
                "the record format",
                "nbdkit or msr",
            )),
        }
    }

    /// `request`, made at `unix_ns` wall-clock time and numbered `id`, as a line of this format;
    /// None where the format cannot say it (a trim or flush in MSR).
    pub fn line(self, request: &Request, unix_ns: u64, id: u64) -> Option<String> {
        let verb = match request.op {
            Op::Read => "Read",
            Op::Write => "Write",
            Op::Trim => "Trim",
            Op::Flush => "Flush",
        };
        match self {
            Self::Nbdkit => Some(nbdkit::format_line(
                unix_ns,
                1,
                verb,
                id,
                request.offset_bytes,
                request.length_bytes,
                (request.op == Op::Write && request.placement != Placement::default())
                    .then_some(request.placement),
            )),
            // A write with a placement gets the optional eighth column.
            Self::Msr if matches!(request.op, Op::Read | Op::Write) => Some(format!(
                "{},ftlab,0,{verb},{},{},0{}",
                FILETIME_UNIX_EPOCH_TICKS + unix_ns / 100,
                request.offset_bytes,
                request.length_bytes,
                if request.op == Op::Write && request.placement != Placement::default() {
                    format!(",{}", format_pid(request.placement))
                } else {
                    String::new()
                }
            )),
            Self::Msr => None,
        }
    }
}

/// Simulated time stays far from u64 overflow: no trace may span more than this.
pub const MAX_TRACE_SPAN_NS: u64 = 1 << 60;

/// Per-format state carried from line to line.
#[derive(Default, Debug)]
pub struct ParserState {
    /// fio: iolog version from the header (2 or 3); 0 before the header.
    fio_version: u8,
    /// fio v2: time accumulated from `wait` lines.
    fio_clock_ns: u64,
    /// blkparse: the per-CPU summary has begun; nothing after it is an event.
    blkparse_in_summary: bool,
}

/// Parses one line: `Ok(None)` for lines that carry no request (headers, completions, comments).
/// Arrival times are absolute in the trace's own clock, in nanoseconds.
pub fn parse_line(
    format: TraceFormat,
    line: &str,
    state: &mut ParserState,
) -> Result<Option<Request>, FieldError> {
    match format {
        TraceFormat::Msr => msr::parse(line),
        TraceFormat::Nbdkit => nbdkit::parse(line),
        TraceFormat::Disksim => disksim::parse(line),
        TraceFormat::Blkparse => blkparse::parse(line, state),
        TraceFormat::Fio => fio::parse(line, state),
    }
}

/// Guesses the format from the first meaningful lines.
pub fn guess_format(lines: &[&str]) -> Option<TraceFormat> {
    for line in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        if line.starts_with("fio version ") {
            return Some(TraceFormat::Fio);
        }
        if line.starts_with("Timestamp,Hostname") {
            return Some(TraceFormat::Msr);
        }
        if nbdkit::looks_like(line) {
            return Some(TraceFormat::Nbdkit);
        }
        let commas: Vec<&str> = line.split(',').collect();
        // Seven fields, or eight with a placement ID.
        if (commas.len() == 7 || commas.len() == 8) && msr::parse(line).is_ok() {
            return Some(TraceFormat::Msr);
        }
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() >= 6 && blkparse::is_device(tokens[0]) {
            return Some(TraceFormat::Blkparse);
        }
        // Five fields, or six with a placement ID.
        if (tokens.len() == 5 || tokens.len() == 6) && disksim::parse(line).is_ok() {
            return Some(TraceFormat::Disksim);
        }
        if line.starts_with('#') {
            continue;
        }
        return None;
    }
    None
}

/// The format of the trace `head` reads, guessed from its first 32 lines that are not blank
/// (blank ones do not count, up to a point: a file of nothing else is not read to its end here).
/// `path` names the trace in errors.
pub fn detect_format(head: &mut dyn BufRead, path: &Path) -> Result<TraceFormat, TraceError> {
    let path_text = || path.display().to_string();
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    let mut ended = false;
    let mut read = 0;
    while lines.len() < 32 && read < 65_536 {
        read += 1;
        buf.clear();
        let n = head
            .read_until(b'\n', &mut buf)
            .map_err(|cause| TraceError::Io {
                path: path_text(),
                cause,
            })?;
        if n == 0 {
            ended = true;
            break;
        }
        if !buf.trim_ascii().is_empty() {
            lines.push(String::from_utf8_lossy(&buf).into_owned());
        }
    }
    if ended && lines.is_empty() {
        return Err(TraceError::Empty { path: path_text() });
    }
    let refs: Vec<&str> = lines.iter().map(|s| s.as_str()).collect();
    guess_format(&refs).ok_or_else(|| TraceError::UnknownFormat { path: path_text() })
}

fn open_maybe_gzip(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let io = |cause| TraceError::Io {
        path: path.display().to_string(),
        cause,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(io)?;
    drop(file);
    let file = File::open(path).map_err(io)?;
    const BUF: usize = 1 << 20;
    if n == 2 && magic == [0x1f, 0x8b] {
        Ok(Box::new(BufReader::with_capacity(
            BUF,
            flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUF, file)),
        )))
    } else {
        Ok(Box::new(BufReader::with_capacity(BUF, file)))
    }
}

/// Reads a trace file request by request.
pub struct TraceReader {
    path: PathBuf,
    format: TraceFormat,
    reader: Box<dyn BufRead>,
    buf: Vec<u8>,
    line_no: u64,
    state: ParserState,
    skip_bad_lines: bool,
    bad_lines: u64,
    first_arrival_ns: Option<u64>,
    last_arrival_ns: u64,
    /// Requests seen so far (including those later rejected by the device).
    pub requests: u64,
    finished: bool,
}

impl TraceReader {
    pub fn open(
        path: &Path,
        format: Option<TraceFormat>,
        skip_bad_lines: bool,
    ) -> Result<Self, TraceError> {
        let format = match format {
            Some(f) => f,
            None => detect_format(&mut *open_maybe_gzip(path)?, path)?,
        };
        Ok(Self::from_reader(
            path,
            format,
            open_maybe_gzip(path)?,
            skip_bad_lines,
        ))
    }

    /// A reader of the lines `reader` gives (decompressed already), in `format`; `path` names
    /// them in errors.
    pub fn from_reader(
        path: &Path,
        format: TraceFormat,
        reader: Box<dyn BufRead>,
        skip_bad_lines: bool,
    ) -> Self {
        Self {
            path: path.to_path_buf(),
            format,
            reader,
            buf: Vec::with_capacity(256),
            line_no: 0,
            state: ParserState::default(),
            skip_bad_lines,
            bad_lines: 0,
            first_arrival_ns: None,
            last_arrival_ns: 0,
            requests: 0,
            finished: false,
        }
    }

    pub fn format(&self) -> TraceFormat {
        self.format
    }

    pub fn bad_lines(&self) -> u64 {
        self.bad_lines
    }

    pub fn line_number(&self) -> u64 {
        self.line_no
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bad_line(&self, e: FieldError) -> TraceError {
        TraceError::BadLine {
            path: self.path.display().to_string(),
            line: self.line_no,
            field: e.field,
            reason: e.reason,
        }
    }

    /// The next request, arrival relative to the trace's first request and never going back in
    /// time (interleaved connections may log slightly out of order).
    pub fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        if self.finished {
            return Ok(None);
        }
        loop {
            self.buf.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|cause| TraceError::Io {
                    path: self.path.display().to_string(),
                    cause,
                })?;
            if n == 0 {
                self.finished = true;
                // A trace that gave nothing to replay is a mistake (an empty file, the wrong
                // format with --skip-bad-lines), not a run with a WAF to report.
                if self.requests == 0 {
                    return Err(TraceError::NoRequests {
                        path: self.path.display().to_string(),
                        lines: self.line_no,
                        bad_lines: self.bad_lines,
                    });
                }
                return Ok(None);
            }
            self.line_no += 1;
            let parsed = match std::str::from_utf8(&self.buf) {
                Ok(line) => parse_line(self.format, line, &mut self.state),
                Err(_) => Err(FieldError::new("line", "not valid UTF-8 text")),
            };
            match parsed {
                Ok(Some(mut request)) => {
                    let first = *self.first_arrival_ns.get_or_insert(request.arrival_ns);
                    let relative = request.arrival_ns.saturating_sub(first);
                    if relative > MAX_TRACE_SPAN_NS {
                        let e = FieldError::new(
                            "time",
                            "more than 2^60 ns (36 years) after the first request",
                        );
                        if self.skip_bad_lines {
                            self.bad_lines += 1;
                            continue;
                        }
                        return Err(self.bad_line(e));
                    }
                    self.last_arrival_ns = self.last_arrival_ns.max(relative);
                    request.arrival_ns = self.last_arrival_ns;
                    self.requests += 1;
                    return Ok(Some(request));
                }
                Ok(None) => continue,
                Err(e) if self.skip_bad_lines => {
                    let _ = e;
                    self.bad_lines += 1;
                }
                Err(e) => return Err(self.bad_line(e)),
            }
        }
    }
}

// Small field parsers shared by the formats.

pub(crate) fn dec(s: &str, field: &'static str) -> Result<u64, FieldError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(FieldError::new(field, "missing"));
    }
    s.parse::<u64>().map_err(|_| {
        FieldError::new(
            field,
            format!("`{}` is not a non-negative integer", clip(s)),
        )
    })
}

pub(crate) fn hex(s: &str, field: &'static str) -> Result<u64, FieldError> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .ok_or_else(|| FieldError::new(field, format!("`{}` is not a 0x hex number", clip(s))))?;
    u64::from_str_radix(digits, 16)
        .map_err(|_| FieldError::new(field, format!("`{}` is not a 0x hex number", clip(s))))
}

/// Seconds with an optional fraction ("12.000345678") to nanoseconds, exactly.
pub(crate) fn seconds_to_ns(s: &str, field: &'static str) -> Result<u64, FieldError> {
    let bad = || FieldError::new(field, format!("`{}` is not a time in seconds", clip(s)));
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let mut frac_ns: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| bad())?
    };
    for _ in frac.len()..9 {
        frac_ns *= 10;
    }
    whole
        .checked_mul(1_000_000_000)
        .and_then(|w| w.checked_add(frac_ns))
        .ok_or_else(bad)
}

/// A placement ID as trace columns and range files write it: `H` (placement handle H in
/// reclaim group 0) or `G:H` (reclaim group G, handle H), each 0..=255.
pub fn parse_pid(s: &str, field: &'static str) -> Result<Placement, FieldError> {
    let s = s.trim();
    let bad = || {
        FieldError::new(
            field,
            format!(
                "`{}` is not a placement ID (HANDLE or GROUP:HANDLE, each 0..=255)",
                clip(s)
            ),
        )
    };
    let (group, handle) = match s.split_once(':') {
        Some((g, h)) => (g, h),
        None => ("0", s),
    };
    Ok(Placement {
        reclaim_group: group.parse().map_err(|_| bad())?,
        handle: handle.parse().map_err(|_| bad())?,
    })
}

/// A placement ID as the trace formats write it (the inverse of [`parse_pid`]).
pub fn format_pid(p: Placement) -> String {
    if p.reclaim_group == 0 {
        p.handle.to_string()
    } else {
        format!("{}:{}", p.reclaim_group, p.handle)
    }
}

pub(crate) fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Sector (512 B) counts to bytes, without overflow.
pub(crate) fn sectors(n: u64, field: &'static str) -> Result<u64, FieldError> {
    n.checked_mul(512)
        .ok_or_else(|| FieldError::new(field, "sector number overflows 64-bit bytes"))
}

/// Feeds arbitrary bytes through the whole reader (`TraceReader`, which hands every line to the
/// format's parser in order, with one `ParserState`), in `format` and in the format guessed from
/// them, if any. Used by the cargo fuzz targets (`fuzz/`) and the garbage tests; it must never
/// panic.
pub fn fuzz_one(format: TraceFormat, data: &[u8]) {
    let path = Path::new("fuzz-input");
    let guessed = detect_format(&mut &data[..], path).ok();
    let runs = [(format, false), (format, true)]
        .into_iter()
        .chain(guessed.map(|g| (g, true)));
    for (format, skip_bad_lines) in runs {
        let bytes = Box::new(std::io::Cursor::new(data.to_vec()));
        let mut reader = TraceReader::from_reader(path, format, bytes, skip_bad_lines);
        let mut last_ns = 0;
        // Skipping bad lines, the reader parses every line; otherwise it stops at the first bad
        // one.
        while let Ok(Some(r)) = reader.next_request() {
            // Whatever a parser accepts is a well-formed request, and arrivals are relative to
            // the first request, never go back and stay in range.
            assert!(r.arrival_ns >= last_ns && r.arrival_ns <= MAX_TRACE_SPAN_NS);
            last_ns = r.arrival_ns;
            if r.op == ftlab_core::request::Op::Flush {
                assert_eq!(r.length_bytes, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded request reads back as itself: nbdkit keeps trims and flushes, MSR cannot say
    /// them and leaves them out.
    #[test]
    fn recorded_lines_parse_back_to_their_requests() {
        let write = Request {
            arrival_ns: 0,
            op: Op::Write,
            offset_bytes: 8192,
            length_bytes: 4096,
            placement: ftlab_core::request::Placement::default(),
        };
        let trim = Request {
            op: Op::Trim,
            ..write
        };
        let unix_ns = 1_764_300_000_123_456_700;
        let line = RecordFormat::Msr.line(&write, unix_ns, 1).unwrap();
        let back = msr::parse(&line).unwrap().unwrap();
        assert_eq!(
            (back.op, back.offset_bytes, back.length_bytes),
            (Op::Write, 8192, 4096)
        );
        assert_eq!(RecordFormat::Msr.line(&trim, unix_ns, 2), None);
        let line = RecordFormat::Nbdkit.line(&trim, unix_ns, 3).unwrap();
        let back = nbdkit::parse(&line).unwrap().unwrap();
        assert_eq!(
            (back.op, back.offset_bytes, back.length_bytes),
            (Op::Trim, 8192, 4096)
        );
        assert!(RecordFormat::parse("csv").is_err());
    }

    #[test]
    fn formats_parse_by_their_names_and_aliases() {
        for f in TraceFormat::ALL {
            assert_eq!(TraceFormat::parse(f.name()), Ok(f));
        }
        assert_eq!(TraceFormat::parse("mqsim"), Ok(TraceFormat::Disksim));
        assert!(TraceFormat::parse("csv")
            .unwrap_err()
            .to_string()
            .contains("csv"));
    }

    #[test]
    fn seconds_parse_exactly() {
        assert_eq!(seconds_to_ns("1.5", "t").unwrap(), 1_500_000_000);
        assert_eq!(seconds_to_ns("0.000000001", "t").unwrap(), 1);
        assert_eq!(seconds_to_ns("3", "t").unwrap(), 3_000_000_000);
        assert!(seconds_to_ns("x", "t").is_err());
        assert!(seconds_to_ns("1.0000000001", "t").is_err());
        assert!(seconds_to_ns("99999999999999999999", "t").is_err());
    }
}
