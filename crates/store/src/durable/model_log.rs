//! The archive of the FTL model's requests: each as the model took it, so that a replay
//! rebuilds the model exactly.

use super::*;

/// `ModelRequest::op` codes (the server maps its ops to these and back).
pub mod model_op {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const TRIM: u8 = 2;
    pub const FLUSH: u8 = 3;
    /// The write buffer drained at a clean shutdown.
    pub const DRAIN: u8 = 255;
}

/// A request the FTL model saw, as logged: the server maps `op` to its own and back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelRequest {
    pub op: u8,
    pub offset_bytes: u64,
    pub length_bytes: u32,
    pub arrival_ns: u64,
    pub reclaim_group: u8,
    pub handle: u8,
}

impl ModelRequest {
    pub(super) fn payload(&self) -> [u8; 10] {
        let mut p = [0u8; 10];
        p[..8].copy_from_slice(&self.arrival_ns.to_le_bytes());
        p[8] = self.reclaim_group;
        p[9] = self.handle;
        p
    }

    pub(super) fn of(r: &Record) -> Result<ModelRequest, ReplayError> {
        if r.payload.len() != 10 {
            return Err(ReplayError::RequestBytes(r.payload.len()));
        }
        Ok(ModelRequest {
            op: r.codec,
            offset_bytes: r.lpn,
            length_bytes: r.pages,
            arrival_ns: u64::from_le_bytes(r.payload[..8].try_into().expect("8 bytes")),
            reclaim_group: r.payload[8],
            handle: r.payload[9],
        })
    }
}
