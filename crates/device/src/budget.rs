//! Memory held by requests in flight, bounded per connection and for the whole server.
//!
//! A request is charged before its buffer exists: a write for its payload, a read for its reply,
//! anything else a small fixed cost (its reply still queues). The charge is returned when the
//! reply has been handed to the socket. Each connection first draws on an allowance of its own,
//! so that a client with small requests is served however much of the shared budget others
//! hold; larger requests draw on the shared budget (`--max-inflight-bytes`) and wait while it is
//! spent. A connection waiting so reads nothing more: back-pressure reaches its client through
//! TCP instead of through the server's memory.
//!
//! Owns: the accounting. Does not know: sockets or the protocol (the caller names the cost).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// What any request costs besides its data: its reply's bytes and bookkeeping while it waits to
/// be sent. Keeps a client that pipelines data-less requests without reading the replies from
/// queueing without bound.
pub const REQUEST_OVERHEAD_BYTES: u64 = 512;

/// Bytes in flight a connection may hold without touching the shared budget: 32 requests of
/// 64 KiB, or two of 1 MiB, as fio and qemu send them.
pub const CONNECTION_ALLOWANCE_BYTES: u64 = 2 << 20;

/// The most one connection may hold in all: its allowance and two requests of the largest size
/// (one per worker). With latency emulation, replies wait for their simulated completion while
/// the workers read on; this stops one client from queueing the shared budget away.
pub const CONNECTION_MAX_BYTES: u64 =
    CONNECTION_ALLOWANCE_BYTES + 2 * (crate::MAX_REQUEST_BYTES as u64 + REQUEST_OVERHEAD_BYTES);

/// The smallest shared budget: one request of the largest size must fit in it.
pub const MIN_INFLIGHT_BYTES: u64 = crate::MAX_REQUEST_BYTES as u64 + REQUEST_OVERHEAD_BYTES;

/// The server's shared budget.
pub struct InflightBudget {
    max_bytes: u64,
    /// (shared bytes in use, workers waiting), and every connection's counters are changed only
    /// under this lock, so a waiter's check sees one consistent state.
    state: Mutex<(u64, u32)>,
    returned: Condvar,
}

/// One connection's share of what is in flight.
#[derive(Default, Debug)]
pub struct ConnectionShare {
    allowance_bytes: AtomicU64,
    shared_bytes: AtomicU64,
}

impl ConnectionShare {
    /// Bytes this connection holds now.
    pub fn held_bytes(&self) -> u64 {
        self.allowance_bytes.load(Ordering::Relaxed) + self.shared_bytes.load(Ordering::Relaxed)
    }
}

/// Bytes charged to a request, returned when it is dropped (its reply sent, or the connection
/// gone).
pub struct Charge<'a> {
    budget: &'a InflightBudget,
    share: &'a ConnectionShare,
    allowance_bytes: u64,
    shared_bytes: u64,
}

impl InflightBudget {
    pub fn new(max_bytes: u64) -> Self {
        assert!(max_bytes >= MIN_INFLIGHT_BYTES, "checked by the options");
        Self {
            max_bytes,
            state: Mutex::new((0, 0)),
            returned: Condvar::new(),
        }
    }

    /// Shared bytes in use now.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// Charges `bytes` to `share`, from its allowance when they fit there, else from the shared
    /// budget; waits until one of them has room (and the connection is under its maximum).
    pub fn charge<'a>(&'a self, share: &'a ConnectionShare, bytes: u64) -> Charge<'a> {
        debug_assert!(
            bytes <= MIN_INFLIGHT_BYTES,
            "a request is at most the largest size"
        );
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let allowance = share.allowance_bytes.load(Ordering::Relaxed);
            let shared = share.shared_bytes.load(Ordering::Relaxed);
            if allowance + shared + bytes <= CONNECTION_MAX_BYTES {
                if allowance + bytes <= CONNECTION_ALLOWANCE_BYTES {
                    share
                        .allowance_bytes
                        .store(allowance + bytes, Ordering::Relaxed);
                    return Charge {
                        budget: self,
                        share,
                        allowance_bytes: bytes,
                        shared_bytes: 0,
                    };
                }
                if state.0 + bytes <= self.max_bytes {
                    state.0 += bytes;
                    share.shared_bytes.store(shared + bytes, Ordering::Relaxed);
                    return Charge {
                        budget: self,
                        share,
                        allowance_bytes: 0,
                        shared_bytes: bytes,
                    };
                }
            }
            state.1 += 1;
            state = self.returned.wait(state).unwrap_or_else(|p| p.into_inner());
            state.1 -= 1;
        }
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        let mut state = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        let share = self.share;
        share
            .allowance_bytes
            .fetch_sub(self.allowance_bytes, Ordering::Relaxed);
        share
            .shared_bytes
            .fetch_sub(self.shared_bytes, Ordering::Relaxed);
        state.0 -= self.shared_bytes;
        // A wake-up is a system call: only when somebody waits.
        if state.1 > 0 {
            self.budget.returned.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_requests_use_the_allowance_and_large_ones_the_shared_budget() {
        let budget = InflightBudget::new(MIN_INFLIGHT_BYTES);
        let (a, b) = (ConnectionShare::default(), ConnectionShare::default());
        let big = budget.charge(&a, MIN_INFLIGHT_BYTES);
        assert_eq!(budget.used_bytes(), MIN_INFLIGHT_BYTES);
        // The shared budget is spent, yet b's small requests go on.
        let small: Vec<_> = (0..4).map(|_| budget.charge(&b, 64 << 10)).collect();
        assert_eq!(b.held_bytes(), 4 * (64 << 10));
        assert_eq!(budget.used_bytes(), MIN_INFLIGHT_BYTES);
        drop(small);
        assert_eq!(b.held_bytes(), 0);
        // A large request of b waits until a's returns its bytes.
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let _charge = budget.charge(&b, 8 << 20);
                b.held_bytes()
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "it waited");
            drop(big);
            assert_eq!(waiter.join().unwrap(), 8 << 20);
        });
        assert_eq!(budget.used_bytes(), 0);
        assert_eq!(a.held_bytes() + b.held_bytes(), 0);
    }

    #[test]
    fn one_connection_cannot_take_more_than_its_maximum() {
        let budget = InflightBudget::new(8 * MIN_INFLIGHT_BYTES);
        let a = ConnectionShare::default();
        let held: Vec<_> = (0..2)
            .map(|_| budget.charge(&a, MIN_INFLIGHT_BYTES))
            .collect();
        let small = budget.charge(&a, CONNECTION_ALLOWANCE_BYTES);
        assert_eq!(a.held_bytes(), CONNECTION_MAX_BYTES);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| drop(budget.charge(&a, 4096)));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "over its maximum, it waits");
            drop(small);
            waiter.join().unwrap();
        });
        drop(held);
        assert_eq!(budget.used_bytes(), 0);
    }
}
