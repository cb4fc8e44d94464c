//! Where a host write's placement handle comes from (`fdp.placement`): the host, the device's
//! guess from each LPN's rewrite interval, or ideal placement from lifetimes a first pass
//! recorded. One enum, matched here.
//!
//! Owns: the auto policy's per-LPN history, ideal placement's handles, the first pass's log.
//! Does not know: flash, frontiers or GC (the FTL turns a placement into a frontier).

use crate::addr::Lpn;
use crate::config::PlacementPolicy;
use crate::geometry::Geometry;
use crate::request::Placement;

/// In a write log, marks a trim.
pub(crate) const TRIMMED: u64 = 1 << 63;

/// No write yet (the auto policy's history).
const NEVER: u32 = u32::MAX;

#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Placer {
    policy: Policy,
    handles: u32,
    logical_pages: u64,
}

#[derive(serde::Serialize, serde::Deserialize)]
enum Policy {
    Host,
    /// Per LPN, the host page write counter at its last write (`NEVER` if none), and the
    /// counter.
    Auto {
        last_write: Vec<u32>,
        now: u64,
    },
    /// Per host page write, in order, the handle its lifetime puts it in ([`ideal_handles`]),
    /// and how many have been placed.
    Ideal {
        handles: Vec<u8>,
        next: usize,
    },
    /// The host's placement, recording each host page write's LPN and each trimmed LPN
    /// (`TRIMMED` set) in order: the first pass of ideal placement.
    Record {
        log: Vec<u64>,
    },
}

impl Placer {
    pub(crate) fn new(policy: PlacementPolicy, geometry: &Geometry) -> Self {
        let policy = match policy {
            PlacementPolicy::Host => Policy::Host,
            PlacementPolicy::Auto => Policy::Auto {
                last_write: vec![NEVER; geometry.logical_pages as usize],
                now: 0,
            },
            // The handles come later, from whoever knows the requests (`use_lifetimes`).
            PlacementPolicy::Ideal => Policy::Ideal {
                handles: Vec::new(),
                next: 0,
            },
        };
        Self {
            policy,
            handles: geometry.handles,
            logical_pages: geometry.logical_pages,
        }
    }

    /// The first pass of ideal placement: the host's placements, every write and trim logged.
    pub(crate) fn record(geometry: &Geometry) -> Self {
        Self {
            policy: Policy::Record { log: Vec::new() },
            ..Self::new(PlacementPolicy::Host, geometry)
        }
    }

    /// Whether writes go where the host asks (the FTL then skips the per-page call).
    #[inline]
    pub(crate) fn is_host(&self) -> bool {
        matches!(self.policy, Policy::Host)
    }

    /// DRAM the device spends on it (ideal placement's table is the simulator's knowledge).
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.policy {
            Policy::Auto { last_write, .. } => last_write.capacity() * 4,
            Policy::Host | Policy::Ideal { .. } | Policy::Record { .. } => 0,
        }
    }

    /// Ideal placement's handles from the lifetimes of the writes to come.
    pub(crate) fn use_lifetimes(&mut self, lifetimes: &[u64]) {
        if let Policy::Ideal { handles, next } = &mut self.policy {
            *handles = ideal_handles(lifetimes, self.handles);
            *next = 0;
        }
    }

    pub(crate) fn take_write_log(&mut self) -> Vec<u64> {
        match &mut self.policy {
            Policy::Record { log } => std::mem::take(log),
            _ => Vec::new(),
        }
    }

    /// `lpn` was trimmed (logged in the first pass).
    #[inline]
    pub(crate) fn trimmed(&mut self, lpn: Lpn) {
        if let Policy::Record { log } = &mut self.policy {
            log.push(u64::from(lpn.get()) | TRIMMED);
        }
    }

    /// The placement of a host write of `lpn` the host asked to place at `asked`.
    #[inline]
    pub(crate) fn place(&mut self, asked: Placement, lpn: Lpn) -> Placement {
        let handle = match &mut self.policy {
            Policy::Host => return asked,
            Policy::Record { log } => {
                log.push(u64::from(lpn.get()));
                return asked;
            }
            Policy::Auto { last_write, now } => {
                let last = std::mem::replace(&mut last_write[lpn.index()], *now as u32);
                let interval = if last == NEVER {
                    u64::MAX
                } else {
                    u64::from((*now as u32).wrapping_sub(last))
                };
                *now += 1;
                temperature_handle(interval, self.handles, self.logical_pages)
            }
            Policy::Ideal { handles, next } => {
                // Beyond the first pass's writes (a run cut at another time): the coldest.
                let handle = handles
                    .get(*next)
                    .copied()
                    .unwrap_or((self.handles - 1) as u8);
                *next += 1;
                handle
            }
        };
        Placement {
            reclaim_group: asked.reclaim_group,
            handle,
        }
    }
}

/// The handle for data rewritten after `interval` host page writes: handle `h` of `handles`
/// takes intervals below `logical_pages / 4^(handles-1-h)`, the last handle the rest. Geometric
/// bins, so that two to eight handles span hot (a few percent of the device between rewrites)
/// to cold (never rewritten) on any device size.
fn temperature_handle(interval: u64, handles: u32, logical_pages: u64) -> u8 {
    let last = handles - 1;
    let mut handle = 0;
    while handle < last {
        let shift = (2 * (last - handle)).min(63);
        if interval < logical_pages >> shift {
            break;
        }
        handle += 1;
    }
    handle as u8
}

/// Each host page write's lifetime, from a write log (`Ftl::record_writes`): the host page
/// writes from it until its LPN is next written or trimmed (u64::MAX: never).
pub fn lifetimes_from_log(log: &[u64], logical_pages: u64) -> Vec<u64> {
    let writes = log.iter().filter(|&&e| e & TRIMMED == 0).count();
    let mut lifetimes = vec![u64::MAX; writes];
    // Backwards: the write count at each LPN's next event.
    let mut next_event = vec![u64::MAX; logical_pages as usize];
    let mut k = writes as u64;
    for &e in log.iter().rev() {
        let lpn = (e & !TRIMMED) as usize;
        if e & TRIMMED != 0 {
            next_event[lpn] = k;
        } else {
            k -= 1;
            let next = next_event[lpn];
            if next != u64::MAX {
                lifetimes[k as usize] = next - k;
            }
            next_event[lpn] = k;
        }
    }
    lifetimes
}

/// Ideal placement's handle for each write: the lifetimes split into `handles` bins of equal
/// numbers of writes (quantiles; ties kept together), the shortest-lived in handle 0, data never
/// overwritten in the last bin it reaches. Bins by the run's own distribution, so that every
/// handle separates something whatever the workload's time scale.
pub fn ideal_handles(lifetimes: &[u64], handles: u32) -> Vec<u8> {
    let mut sorted = lifetimes.to_vec();
    sorted.sort_unstable();
    let h = handles.max(1) as usize;
    // Bin i takes lifetimes at or above thresholds[i - 1] and below thresholds[i].
    let thresholds: Vec<u64> = (1..h)
        .map(|i| {
            sorted
                .get(sorted.len() * i / h)
                .copied()
                .unwrap_or(u64::MAX)
        })
        .collect();
    lifetimes
        .iter()
        .map(|&l| thresholds.iter().filter(|&&t| l >= t).count() as u8)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_bins_are_geometric_in_the_logical_space() {
        // Four handles over 4096 pages: below 64, below 256, below 1024, the rest.
        let h = |interval| temperature_handle(interval, 4, 4096);
        assert_eq!(
            [h(0), h(63), h(64), h(255), h(256), h(1023)],
            [0, 0, 1, 1, 2, 2]
        );
        assert_eq!([h(1024), h(u64::MAX)], [3, 3]);
        assert_eq!(temperature_handle(5, 1, 4096), 0);
    }
}
