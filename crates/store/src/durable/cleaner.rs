//! The cleaner: live records copied out of mostly dead segments, which are deleted once a
//! checkpoint that no longer references them is durable; and the directory's disk figures.

use super::*;

impl DataDir {
    /// Cleans: segments wholly before the checkpoint whose live records fill at most
    /// `max_live_fraction` of them have those records copied to the log's end (the emptiest
    /// first, as many as the free space allows); then a checkpoint, then every segment before
    /// it no volume maps is deleted. Returns the segments deleted.
    pub fn clean(&mut self, max_live_fraction: f64) -> Result<u64, LogError> {
        let candidates: Vec<u64> = segment_indices(&self.dir)?
            .into_iter()
            .filter(|&s| s < self.checkpoint_at.segment)
            .collect();
        // The emptiest first, as many as the disk has room to copy (on a nearly full disk the
        // copies must leave the checkpoint that frees their segments its room).
        let mut to_copy = Vec::new();
        for &segment in &candidates {
            let path = segment_path(&self.dir, segment);
            let len = std::fs::metadata(&path).map_err(io(&path))?.len();
            let live = self.volumes.live_bytes.get(&segment).copied().unwrap_or(0);
            if live > 0 && live as f64 <= max_live_fraction * len as f64 {
                to_copy.push((live, segment));
            }
        }
        to_copy.sort_unstable();
        let mut budget = self.copy_budget_bytes().unwrap_or(u64::MAX);
        let mut copied_any = false;
        for (live, segment) in to_copy {
            // Records are copied as they are; now and then a new segment's header on top.
            let need = live + live / 64;
            if need > budget {
                break;
            }
            budget -= need;
            let path = segment_path(&self.dir, segment);
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let scan = scan_segment_from(&bytes, segment, log::SEGMENT_HEADER_BYTES, None)
                .map_err(|why| damaged(&path, why))?;
            for r in scan.records.iter().filter(|r| r.kind == Kind::Page) {
                let old = Loc::new(segment, r.offset, r.bytes);
                let holders: Vec<usize> = (0..self.volumes.list.len())
                    .filter(|&v| {
                        r.lpn < self.volumes.pages && self.volumes.list[v].map.get(r.lpn) == old
                    })
                    .collect();
                let Some(&first) = holders.first() else {
                    continue;
                };
                let volume = self.volumes.list[first].id;
                let (_, new) = self.writer().append_volume(
                    Kind::Page,
                    r.codec,
                    volume,
                    r.lpn,
                    0,
                    &r.payload,
                )?;
                self.stats.cleaner_copied_bytes += new.bytes() as u64;
                for v in holders {
                    self.volumes.set(v, r.lpn, new);
                }
                copied_any = true;
            }
        }
        let dead: Vec<u64> = candidates
            .iter()
            .copied()
            .filter(|s| self.volumes.live_bytes.get(s).copied().unwrap_or(0) == 0)
            .collect();
        if dead.is_empty() && !copied_any {
            return Ok(0);
        }
        // Durable before anything is deleted: no checkpoint on disk may reference a deleted
        // segment.
        self.checkpoint()?;
        for &segment in &dead {
            let path = segment_path(&self.dir, segment);
            std::fs::remove_file(&path).map_err(io(&path))?;
            self.files.forget(segment);
            self.volumes.live_bytes.remove(&segment);
        }
        sync_dir(&self.dir)?;
        self.space_changed();
        self.stats.cleaned_segments += dead.len() as u64;
        Ok(dead.len() as u64)
    }

    pub(super) fn refresh_disk_stats(&mut self) {
        let mut disk = 0;
        let mut segments = 0;
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("seg-") && name.ends_with(".log") {
                    segments += 1;
                }
                if name.starts_with("seg-")
                    || name == CHECKPOINT_FILE
                    || name == MODEL_FILE
                    || name == MODEL_STATE_FILE
                {
                    disk += e.metadata().map_or(0, |m| m.len());
                }
            }
        }
        self.stats.segments = segments;
        self.stats.disk_bytes = disk;
    }

    /// The host disk's account.
    pub fn disk_stats(&mut self) -> DiskStats {
        self.refresh_disk_stats();
        let mut s = self.stats.clone();
        s.live_bytes = self.volumes.live_bytes.values().sum();
        s.log_bytes = self.writer.as_ref().map_or(0, |w| w.appended_bytes());
        let written = s.log_bytes + s.checkpoint_bytes + s.model_bytes;
        s.host_waf = if s.client_bytes > 0 {
            written as f64 / s.client_bytes as f64
        } else {
            0.0
        };
        s
    }
}
