//! What a durable device tells its log of the changes it refuses: a full disk's start (once,
//! not once a write) and its end with how long it lasted and how much was refused, and a log
//! that takes no more records (a failed sync), once. Clients get `ENOSPC` or EIO for each.

use crate::IoError;
use ftlab_store::log::LogError;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(crate) struct Refusals {
    /// A full disk is refusing changes now (a load per accepted change: the fast path).
    full: AtomicBool,
    told: Mutex<Told>,
    broken_told: AtomicBool,
}

/// A disk that stays nearly full starts and ends an episode at every checkpoint that frees a
/// little: one line a minute at most, the rest counted.
#[derive(Default)]
struct Told {
    /// The episode now: since when, the changes refused, whether its start was told.
    episode: Option<(Instant, u64, bool)>,
    last_told: Option<Instant>,
    /// Episodes not told, and the changes they refused.
    quiet_episodes: u64,
    quiet_refused: u64,
}

/// A full disk's start is told at most this often.
const RETELL_AFTER: Duration = Duration::from_secs(60);

impl Refusals {
    /// The client's error for a failed append (`ENOSPC` for a full disk, else EIO), told in
    /// the log when it starts something.
    pub(crate) fn refused(&self, dir: &Path, e: &LogError) -> IoError {
        if e.is_no_space() {
            let mut t = self.told.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, refused, _)) = t.episode.as_mut() {
                *refused += 1;
                return IoError::NoSpace;
            }
            self.full.store(true, Ordering::Release);
            let now = Instant::now();
            let tell = t
                .last_told
                .is_none_or(|at| now.duration_since(at) >= RETELL_AFTER);
            t.episode = Some((now, 1, tell));
            if tell {
                let quiet = if t.quiet_episodes > 0 {
                    format!(
                        " (since the last such line, {} shorter episode(s) refused {} request(s))",
                        t.quiet_episodes, t.quiet_refused
                    )
                } else {
                    String::new()
                };
                (t.quiet_episodes, t.quiet_refused, t.last_told) = (0, 0, Some(now));
                eprintln!(
                    "ftlab: {}: the disk is full ({e}): writes, trims and FLUSHes that need the \
                     log are answered ENOSPC, reads go on; checkpoints and the cleaner make room \
                     where the log holds overwritten pages, and writing resumes by itself when \
                     there is room{quiet}",
                    dir.display()
                );
            }
            return IoError::NoSpace;
        }
        if e.is_broken() && !self.broken_told.swap(true, Ordering::AcqRel) {
            eprintln!(
                "ftlab: {}: {e}: every change is answered EIO from now on, reads go on; stop \
                 the server and start it again (what every acknowledged FLUSH covered is on the \
                 disk)",
                dir.display()
            );
        }
        IoError::Io
    }

    /// A change was appended: a full disk's end is told (when its start was).
    pub(crate) fn accepted(&self, dir: &Path) {
        if !self.full.load(Ordering::Acquire) {
            return;
        }
        let mut t = self.told.lock().unwrap_or_else(|p| p.into_inner());
        let Some((since, refused, told)) = t.episode.take() else {
            return;
        };
        self.full.store(false, Ordering::Release);
        if told {
            eprintln!(
                "ftlab: {}: there is room on the disk again: writing resumed after {:.1} s \
                 ({refused} request(s) refused meanwhile)",
                dir.display(),
                since.elapsed().as_secs_f64()
            );
        } else {
            t.quiet_episodes += 1;
            t.quiet_refused += refused;
        }
    }

    /// Whether a full disk is refusing changes now.
    pub(crate) fn full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }
}
