//! The disk's free space, and the reserve kept for checkpoints and the cleaner: client changes
//! are refused (`LogError::Reserve`, the client's `ENOSPC`) while the free space is under it,
//! so that a disk filled by the log always has the room to write a checkpoint and copy live
//! records out of mostly dead segments, which is what gives the space back. Without it a disk
//! filled to the last byte by overwrites (mostly garbage) stayed full for ever: the checkpoint
//! that would let the cleaner delete segments could not be written.

use super::*;

/// The free space is looked at again once this much was appended since the last look (or at
/// every change while it was under the reserve, so that writing resumes as soon as there is
/// room).
const LOOK_EVERY_BYTES: u64 = 256 << 10;

/// A model request in `model.log`, at most (record header and payload).
const MODEL_RECORD_BYTES: u64 = 64;

/// What was seen of the disk's free space.
#[derive(Debug, Default)]
pub(super) struct Space {
    /// Free bytes at the last look, and the writer's appended bytes then.
    free_bytes: u64,
    appended_at: u64,
    /// Whether a look was made (and the file system answers).
    known: bool,
    /// The last look found less than the reserve.
    low: bool,
}

impl DataDir {
    /// Bytes a checkpoint with the model's state needs: the pending records must reach the
    /// log first, the checkpoint and `model.state` are written beside the old ones before
    /// replacing them (the estimate: the old ones, twice, for the maps grow), and the requests
    /// since the last checkpoint are archived in `model.log`.
    pub(super) fn checkpoint_need_bytes(&self) -> u64 {
        let size = |name: &str| std::fs::metadata(self.dir.join(name)).map_or(0, |m| m.len());
        let pending = self.writer.as_ref().map_or(0, LogWriter::pending_bytes);
        pending as u64
            + 2 * (size(CHECKPOINT_FILE) + size(MODEL_STATE_FILE))
            + self.pending.len() as u64 * MODEL_RECORD_BYTES
    }

    /// The free space client changes leave alone: a whole pending batch and the largest record
    /// more, a checkpoint, and a segment's worth for the cleaner to copy the live records of
    /// one segment out before it is deleted (less would leave a disk whose segments are mostly
    /// live full for ever).
    pub fn reserve_bytes(&self) -> u64 {
        let segment = self.writer.as_ref().map_or(0, LogWriter::segment_bytes);
        (log::PENDING_BYTES + log::MAX_PAYLOAD_BYTES + segment) as u64
            + self.checkpoint_need_bytes()
    }

    /// Looks at the free space now.
    fn look_at_space(&mut self) {
        let Some(w) = self.writer.as_ref() else {
            return;
        };
        let appended = w.appended_bytes();
        match log::free_bytes(w.file()) {
            Some(free) => {
                let reserve = self.reserve_bytes();
                self.space = Space {
                    free_bytes: free,
                    appended_at: appended,
                    known: true,
                    low: free < reserve,
                };
            }
            None => self.space = Space::default(),
        }
    }

    /// Whether a client change may be appended: Err(`LogError::Reserve`) while the free space
    /// is under the reserve. Cheap: the file system is asked once per `LOOK_EVERY_BYTES`
    /// appended.
    pub(super) fn room_for_change(&mut self) -> Result<(), LogError> {
        let Some(w) = self.writer.as_ref() else {
            return Ok(());
        };
        let since = w.appended_bytes() - self.space.appended_at;
        if self.space.known && !self.space.low && since < LOOK_EVERY_BYTES {
            return Ok(());
        }
        self.look_at_space();
        if self.space.low {
            return Err(LogError::Reserve {
                dir: self.dir.clone(),
                free_bytes: self.space.free_bytes,
                reserve_bytes: self.reserve_bytes(),
            });
        }
        Ok(())
    }

    /// Whether the last look found the free space under the reserve (or the log's last write
    /// failed for want of space): a checkpoint and the cleaner are due, whatever was appended
    /// since the last.
    pub fn low_on_space(&self) -> bool {
        self.space.low || self.stalled()
    }

    /// Bytes the cleaner may copy before its checkpoint without eating into what that
    /// checkpoint needs; None: the file system does not say.
    pub(super) fn copy_budget_bytes(&mut self) -> Option<u64> {
        self.look_at_space();
        self.space.known.then(|| {
            self.space
                .free_bytes
                .saturating_sub(self.checkpoint_need_bytes())
        })
    }

    /// Segments were deleted: the next change looks at the free space again.
    pub(super) fn space_changed(&mut self) {
        self.space.known = false;
    }
}
