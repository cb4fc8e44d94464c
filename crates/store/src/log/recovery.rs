//! Recovery: what a directory of segments holds after a crash (the records up to the last
//! whole commit, a torn tail dropped, damage before a commit refused), and repair, which
//! salvages what verifies and sets the rest aside.

use super::*;

/// What recovery found in a directory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Collected by `recover` only.
    pub records: Vec<Record>,
    /// Segments read, in order.
    pub segments: u64,
    /// Records read up to and including the last commit (everything a FLUSH acknowledged).
    pub committed: usize,
    /// Bytes dropped from the end of the last segment (a torn or corrupt tail, never
    /// acknowledged by a FLUSH), and why the first of them was refused.
    pub dropped_bytes: u64,
    pub dropped_why: Option<String>,
    /// Where appending resumes: the last segment and its valid length.
    pub tail: Option<(u64, usize)>,
    /// The sequence number of the next record.
    pub next_seq: u64,
    /// Records read (from the position recovery started at).
    pub replayed: u64,
}

pub fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("seg-{index:016x}.log"))
}

/// The segment indices in `dir`, sorted; other files are ignored.
pub fn segment_indices(dir: &Path) -> Result<Vec<u64>, LogError> {
    let io = |cause| LogError::Io {
        path: dir.to_path_buf(),
        cause,
    };
    let mut indices = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let name = entry.map_err(io)?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(hex) = name
            .strip_prefix("seg-")
            .and_then(|n| n.strip_suffix(".log"))
        {
            if let (16, Ok(i)) = (hex.len(), u64::from_str_radix(hex, 16)) {
                indices.push(i);
            }
        }
    }
    indices.sort_unstable();
    Ok(indices)
}

/// Reads every segment of `dir` in order and decides what the device holds: the records up to
/// the first bad one, when nothing acknowledged lies beyond it; an error naming the damage
/// otherwise.
pub fn recover(dir: &Path) -> Result<Recovered, LogError> {
    let mut records = Vec::new();
    let mut out = recover_from(dir, Position::START, &mut |r| {
        records.push(r.clone());
        Ok::<(), std::convert::Infallible>(())
    })?;
    out.records = records;
    Ok(out)
}

/// Where appending resumes after `recover_from`.
pub fn tail_position(r: &Recovered) -> Position {
    match r.tail {
        Some((segment, offset)) => Position {
            segment,
            offset,
            seq: r.next_seq,
        },
        None => Position::START,
    }
}

/// As `recover`, from `from` (a checkpoint's position): segments before it are not read, and
/// those from it on must be consecutive. Each valid record is handed to `visit` (its `offset`
/// set) instead of collected; `visit` refusing one ends recovery with its reason. A log that
/// ends before `from` (a checkpoint from the future: records it counted are gone) is refused.
pub fn recover_from<E: std::fmt::Display>(
    dir: &Path,
    from: Position,
    visit: &mut dyn FnMut(&Record) -> Result<(), E>,
) -> Result<Recovered, LogError> {
    let indices: Vec<u64> = segment_indices(dir)?
        .into_iter()
        .filter(|&i| i >= from.segment)
        .collect();
    let mut out = Recovered {
        segments: indices.len() as u64,
        next_seq: from.seq,
        ..Default::default()
    };
    let future = |why: String| LogError::Damaged {
        path: segment_path(dir, from.segment),
        why: format!(
            "the checkpoint counts records up to byte {} (sequence {}) but {why}: records a \
             checkpoint covered are gone (a checkpoint from the future, or a lost segment)",
            from.offset, from.seq
        ),
    };
    if indices.first() != Some(&from.segment) && from != Position::START {
        return Err(future("the segment is missing".into()));
    }
    let mut since_commit = 0usize;
    for (k, &index) in indices.iter().enumerate() {
        if index != from.segment + k as u64 {
            return Err(LogError::MissingSegment {
                dir: dir.to_path_buf(),
                missing: from.segment + k as u64,
                before: k.checked_sub(1).map_or(0, |p| indices[p]),
                after: index,
            });
        }
        let path = segment_path(dir, index);
        let bytes = std::fs::read(&path).map_err(|cause| LogError::Io {
            path: path.clone(),
            cause,
        })?;
        let start = if k == 0 {
            from.offset
        } else {
            SEGMENT_HEADER_BYTES
        };
        if bytes.len() < start {
            return Err(future(format!("it holds {} bytes", bytes.len())));
        }
        let scan = scan_segment_from(&bytes, index, start, Some(out.next_seq)).map_err(|why| {
            LogError::BadSegment {
                path: path.clone(),
                why: why.to_string(),
            }
        })?;
        let last = k + 1 == indices.len();
        for r in &scan.records {
            visit(r).map_err(|why| LogError::Damaged {
                path: path.clone(),
                why: format!("record {} at byte {}: {why}", r.seq, r.offset),
            })?;
            out.next_seq += 1;
            since_commit += 1;
            if r.kind == Kind::Commit {
                out.committed += since_commit;
                since_commit = 0;
            }
        }
        out.replayed += scan.records.len() as u64;
        if let Some((offset, why)) = scan.stopped {
            // Damage with a commit after it, or in any segment but the last (whose successors
            // were written after it was complete), lost acknowledged data.
            let after = match scan.commit_after_stop {
                Some(c) => Some(format!("a commit follows it at byte {c}")),
                None if !last => Some("later segments follow it".to_string()),
                None => None,
            };
            if let Some(after) = after {
                return Err(LogError::CorruptBeforeCommit {
                    path,
                    offset,
                    why: why.to_string(),
                    after,
                });
            }
            out.dropped_bytes = (bytes.len() - scan.valid_bytes) as u64;
            out.dropped_why = Some(format!("{}: byte {offset}: {why}", path.display()));
        }
        if last {
            out.tail = Some((index, scan.valid_bytes));
        }
    }
    // Records after the last commit were not acknowledged as durable; they are kept (a write
    // is acknowledged before its FLUSH), but nothing promised them.
    Ok(out)
}

/// What `repair` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// Records that verify and are kept.
    pub kept_records: u64,
    /// Files set aside (renamed to `NAME.damaged`, never deleted): the damaged segment's
    /// original and every segment after it.
    pub set_aside: Vec<PathBuf>,
    /// Bytes cut from the damaged segment (its copy is among `set_aside`).
    pub cut_bytes: u64,
}

/// Salvages what verifies: the records before the first damage (a bad record, a missing or
/// misnamed segment). The damaged segment is copied to `NAME.damaged` and cut at its last good
/// record; every later segment is renamed to `NAME.damaged`. Nothing is deleted. Afterwards
/// `recover` succeeds.
pub fn repair(dir: &Path) -> Result<Repaired, LogError> {
    repair_from(dir, Position::START)
}

/// As `repair`, for the log from `from` (a checkpoint's position) on; earlier segments are
/// left alone.
pub fn repair_from(dir: &Path, from: Position) -> Result<Repaired, LogError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| LogError::Io { path, cause }
    };
    let indices: Vec<u64> = segment_indices(dir)?
        .into_iter()
        .filter(|&i| i >= from.segment)
        .collect();
    let mut out = Repaired::default();
    let mut damaged_from = None;
    let mut first_seq = from.seq;
    for (k, &index) in indices.iter().enumerate() {
        let path = segment_path(dir, index);
        if index != from.segment + k as u64 {
            damaged_from = Some(k);
            break;
        }
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let start = if k == 0 {
            from.offset
        } else {
            SEGMENT_HEADER_BYTES
        };
        match scan_segment_from(&bytes, index, start, Some(first_seq)) {
            Err(_) => {
                damaged_from = Some(k);
                break;
            }
            Ok(scan) => {
                out.kept_records += scan.records.len() as u64;
                first_seq += scan.records.len() as u64;
                if scan.stopped.is_some() {
                    let aside = aside_path(&path);
                    std::fs::copy(&path, &aside).map_err(io(&aside))?;
                    out.set_aside.push(aside);
                    let file = OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(io(&path))?;
                    file.set_len(scan.valid_bytes as u64).map_err(io(&path))?;
                    file.sync_all().map_err(io(&path))?;
                    out.cut_bytes = (bytes.len() - scan.valid_bytes) as u64;
                    damaged_from = Some(k + 1);
                    break;
                }
            }
        }
    }
    if let Some(from) = damaged_from {
        for &index in &indices[from..] {
            let path = segment_path(dir, index);
            let aside = aside_path(&path);
            std::fs::rename(&path, &aside).map_err(io(&path))?;
            out.set_aside.push(aside);
        }
        sync_dir(dir)?;
    }
    Ok(out)
}

/// `PATH.damaged`, or `PATH.damaged.N` for the first N free: an earlier repair's copy is kept.
fn aside_path(path: &Path) -> PathBuf {
    let base = path.with_extension("log.damaged");
    (1..)
        .map(|n| match n {
            1 => base.clone(),
            n => PathBuf::from(format!("{}.{n}", base.display())),
        })
        .find(|p| !p.exists())
        .expect("some name is free")
}
