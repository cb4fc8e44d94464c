//! Latency emulation's writer: each reply held until its simulated completion is due.

use crate::error::{send, write_error, ConnectionError};
use crate::transmission::Timing;
use ftlab_device::{budget, Device};
use std::io::{BufWriter, Write};
use std::time::Instant;

/// A reply held until `at` (latency emulation); `seq` orders replies due at the same instant.
pub(crate) struct Due<'d> {
    pub(crate) at: Instant,
    pub(crate) seq: u64,
    pub(crate) reply: Vec<u8>,
    pub(crate) timing: Timing,
    /// Held until the reply has been written, then returned (dropped with the `Due`).
    pub(crate) _charge: budget::Charge<'d>,
}

impl PartialEq for Due<'_> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due<'_> {}
impl PartialOrd for Due<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Writes each reply when it is due (earliest first), until the sender is gone and every
/// reply is out.
pub(crate) fn deliver_when_due<W: Write>(
    device: &Device,
    rx: std::sync::mpsc::Receiver<Due<'_>>,
    mut w: BufWriter<W>,
) -> Result<BufWriter<W>, ConnectionError> {
    use std::cmp::Reverse;
    use std::sync::mpsc::RecvTimeoutError;
    let mut due: std::collections::BinaryHeap<Reverse<Due>> = std::collections::BinaryHeap::new();
    let mut written = Vec::new();
    let mut seq = 0u64;
    let mut open = true;
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
            let Reverse(d) = due.pop().expect("peeked");
            send(&mut w, &d.reply)?;
            written.push(d.timing);
            drop(d);
        }
        if !written.is_empty() {
            w.flush().map_err(write_error)?;
            device.replied(written.drain(..).map(|t: Timing| (t.op, t.read_at)));
        }
        let next = due
            .peek()
            .map(|Reverse(d)| d.at.saturating_duration_since(now));
        if !open {
            match next {
                None => return Ok(w),
                Some(wait) => {
                    std::thread::sleep(wait);
                    continue;
                }
            }
        }
        let received = match next {
            Some(wait) => rx.recv_timeout(wait),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(mut d) => {
                seq += 1;
                d.seq = seq;
                due.push(Reverse(d));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
    }
}
