//! A host request, as every front end (trace parser, generator, live server) hands it to the FTL.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    /// Deallocate (TRIM / discard / NBD write-zeroes).
    Trim,
    /// Make buffered writes durable.
    Flush,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// When the host issues it (open-loop replay); generators leave 0.
    pub arrival_ns: u64,
    pub op: Op,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// Placement stream (multi-stream / FDP placement handle); 0 by default.
    pub stream: u8,
}

impl Request {
    /// A request on the default stream, as every trace format gives them.
    pub fn new(arrival_ns: u64, op: Op, offset_bytes: u64, length_bytes: u64) -> Self {
        Self {
            arrival_ns,
            op,
            offset_bytes,
            length_bytes,
            stream: 0,
        }
    }
}
