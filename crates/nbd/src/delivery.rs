//! Latency emulation's writer: each reply held until its simulated completion is due.

use crate::error::{send, write_error, ConnectionError};
use crate::transmission::Timing;
use ftlab_device::{budget, Device};
use std::io::{BufWriter, Write};
use std::time::{Duration, Instant};

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

/// The wake-up margin's bounds: the delivery sleeps until this much before a reply is due,
/// then spins. A futex wait overshoots by the timer slack (50 us by default, 1 ns here) plus the
/// scheduler's wake-up (a few us on a quiet host, far more on a busy one).
const MIN_MARGIN: Duration = Duration::from_micros(2);
const MAX_MARGIN: Duration = Duration::from_micros(200);
const FIRST_MARGIN: Duration = Duration::from_micros(20);

/// How early to wake before a deadline: the largest recent oversleep, decaying by 1/32 per
/// sleep, so one slow wake-up widens the margin for a while and a quiet host narrows it again.
/// Spinning costs CPU for the margin's length per reply; sleeping past a deadline makes a reply
/// late, which the emulation exists to avoid.
struct Margin(Duration);

impl Margin {
    fn observe(&mut self, overslept: Duration) {
        let decayed = self.0 - self.0 / 32;
        self.0 = (overslept + MIN_MARGIN)
            .max(decayed)
            .clamp(MIN_MARGIN, MAX_MARGIN);
    }
}

/// Writes each reply when it is due (earliest first), until the sender is gone and every
/// reply is out. Sleeps until `Margin` before the earliest deadline, then spins to it, taking
/// new replies meanwhile; each reply leaves within a few microseconds of its deadline unless
/// the host cannot run this thread then.
pub(crate) fn deliver_when_due<W: Write>(
    device: &Device,
    rx: std::sync::mpsc::Receiver<Due<'_>>,
    mut w: BufWriter<W>,
) -> Result<BufWriter<W>, ConnectionError> {
    use std::cmp::Reverse;
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    // The default slack (50 us) would be added to every timed wait of this thread.
    // SAFETY: prctl on the calling thread, with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let mut margin = Margin(FIRST_MARGIN);
    let mut due: std::collections::BinaryHeap<Reverse<Due>> = std::collections::BinaryHeap::new();
    let mut written = Vec::new();
    let mut seq = 0u64;
    let mut open = true;
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
            let Reverse(d) = due.pop().expect("peeked");
            written.push((d.timing, d.at, Instant::now()));
            send(&mut w, &d.reply)?;
            drop(d);
        }
        if !written.is_empty() {
            w.flush().map_err(write_error)?;
            device.replied(
                written
                    .drain(..)
                    .map(|(t, at, sent): (Timing, Instant, Instant)| {
                        (t.op, t.read_at, Some((at, sent)))
                    }),
            );
        }
        let received = match due.peek().map(|Reverse(d)| d.at) {
            None if !open => return Ok(w),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left > margin.0 {
                    let asked = left - margin.0;
                    let slept = Instant::now();
                    let got = if open {
                        rx.recv_timeout(asked)
                    } else {
                        std::thread::sleep(asked);
                        Err(RecvTimeoutError::Timeout)
                    };
                    if matches!(got, Err(RecvTimeoutError::Timeout)) {
                        margin.observe(slept.elapsed().saturating_sub(asked));
                    }
                    got
                } else {
                    std::hint::spin_loop();
                    match open.then(|| rx.try_recv()) {
                        Some(Ok(d)) => Ok(d),
                        Some(Err(TryRecvError::Disconnected)) => {
                            Err(RecvTimeoutError::Disconnected)
                        }
                        Some(Err(TryRecvError::Empty)) | None => Err(RecvTimeoutError::Timeout),
                    }
                }
            }
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
