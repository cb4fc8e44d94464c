//! Per-operation latency: the time-stamp counter, calibrated, its own cost measured.

use std::time::Instant;

/// Per-operation timing with the time-stamp counter: `rdtscp` waits for earlier instructions,
/// its own cost (measured) is subtracted, and ticks are converted with a rate calibrated against
/// the OS clock. One op per sample, so a slow op is seen as slow (no averaging inside batches).
pub struct Clock {
    pub(super) ticks_per_ns: f64,
    pub(super) overhead_ticks: u64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn ticks() -> u64 {
    let mut aux = 0u32;
    // SAFETY: rdtscp has no memory effects; every x86_64 CPU this runs on has it.
    unsafe { core::arch::x86_64::__rdtscp(&mut aux) }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn ticks() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Clock {
    pub fn calibrate() -> Self {
        let (t0, i0) = (ticks(), Instant::now());
        while i0.elapsed().as_millis() < 20 {
            std::hint::spin_loop();
        }
        let ticks_per_ns = (ticks() - t0) as f64 / i0.elapsed().as_nanos() as f64;
        let mut overhead = u64::MAX;
        for _ in 0..10_000 {
            let a = ticks();
            let b = ticks();
            overhead = overhead.min(b - a);
        }
        Clock {
            ticks_per_ns,
            overhead_ticks: overhead,
        }
    }
    pub(super) fn method(&self) -> String {
        format!(
            "{}: one sample per operation, timer cost ({} ticks) subtracted, {:.3} ticks/ns",
            if cfg!(target_arch = "x86_64") {
                "rdtscp"
            } else {
                "monotonic clock"
            },
            self.overhead_ticks,
            self.ticks_per_ns
        )
    }
}

pub(super) fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}
