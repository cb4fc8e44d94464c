//! Checkpoints: the volumes' maps as of a log position, encoded, checked when read, and
//! replaced atomically (written beside, synced, renamed, the directory synced).

use super::*;

/// What a checkpoint file holds.
pub(super) struct Checkpoint {
    pub(super) at: Position,
    /// The model's requests before the first in `model.log`: those the model's saved state
    /// (`model.state`) covers (0 in version 1, which had no such state).
    pub(super) model_base: u64,
    /// Requests in `model.log`.
    pub(super) model_entries: u64,
    pub(super) volumes: Volumes,
}

/// Version 2: the distinct map chunks once (a chunk shared by a snapshot and its parent is one
/// `Arc`, so one entry), then each volume's chunks as indices into them. Version 1 wrote every
/// volume's whole map: 1,023 snapshots of a 64 MiB device made an 88 MB checkpoint. Size and
/// time are now proportional to the distinct chunks.
pub(super) fn encode_checkpoint(c: &Checkpoint, page_bytes: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [
        c.at.segment,
        c.at.offset as u64,
        c.at.seq,
        c.model_entries,
        c.volumes.pages,
        page_bytes as u64,
        c.model_base,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&c.volumes.next_id.to_le_bytes());
    out.extend_from_slice(&(c.volumes.list.len() as u16).to_le_bytes());
    // The distinct chunks, by identity, in first-seen order.
    let mut index: HashMap<*const Vec<Loc>, u32> = HashMap::new();
    let mut distinct: Vec<&Arc<Vec<Loc>>> = Vec::new();
    for v in &c.volumes.list {
        for chunk in v.map.chunks.iter().flatten() {
            index.entry(Arc::as_ptr(chunk)).or_insert_with(|| {
                distinct.push(chunk);
                distinct.len() as u32 - 1
            });
        }
    }
    out.extend_from_slice(&(distinct.len() as u32).to_le_bytes());
    let mut raw = Vec::with_capacity(CHUNK_PAGES * 8);
    for chunk in distinct {
        raw.clear();
        for loc in chunk.iter() {
            raw.extend_from_slice(&loc.0.to_le_bytes());
        }
        // Its length is known (CHUNK_PAGES x 8): no size is stored, so a crafted file cannot
        // make the reader allocate more.
        let packed = lz4_flex::block::compress(&raw);
        out.extend_from_slice(&(packed.len() as u32).to_le_bytes());
        out.extend_from_slice(&packed);
    }
    for v in &c.volumes.list {
        out.extend_from_slice(&v.id.to_le_bytes());
        out.push(v.kind as u8);
        out.extend_from_slice(&v.parent.to_le_bytes());
        out.extend_from_slice(&(v.name.len() as u16).to_le_bytes());
        out.extend_from_slice(v.name.as_bytes());
        out.extend_from_slice(&v.created_seq.to_le_bytes());
        for chunk in &v.map.chunks {
            let k = chunk.as_ref().map_or(NO_CHUNK, |c| index[&Arc::as_ptr(c)]);
            out.extend_from_slice(&k.to_le_bytes());
        }
    }
    let sum = twox_hash::XxHash3_64::oneshot(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A volume's chunk that maps no page, in a version 2 checkpoint.
const NO_CHUNK: u32 = u32::MAX;

/// Reads a checkpoint's bytes; never panics, whatever they are (a fuzz target feeds them).
pub fn decode_checkpoint_bytes(
    bytes: &[u8],
    pages: u64,
    page_bytes: usize,
) -> Result<(Position, u64, Vec<VolumeInfo>), CheckpointDamage> {
    decode_checkpoint(bytes, pages, page_bytes).map(|c| (c.at, c.model_entries, c.volumes.infos()))
}

pub(super) fn decode_checkpoint(
    bytes: &[u8],
    pages: u64,
    page_bytes: usize,
) -> Result<Checkpoint, CheckpointDamage> {
    if bytes.len() < 8 + 8 + 48 + 4 + 8 || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err(CheckpointDamage::NotACheckpoint);
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if twox_hash::XxHash3_64::oneshot(body).to_le_bytes() != sum {
        return Err(CheckpointDamage::Checksum);
    }
    let mut at = 8usize;
    let mut take = |n: usize| -> Result<&[u8], CheckpointDamage> {
        // A length read from the file may be anything: checked, never added blindly (found by
        // the `checkpoint` fuzz target).
        let end = at.checked_add(n).filter(|&end| end <= body.len()).ok_or(
            CheckpointDamage::Truncated {
                body: body.len(),
                field: n,
            },
        )?;
        let s = &body[at..end];
        at = end;
        Ok(s)
    };
    let u16_ = |s: &[u8]| u16::from_le_bytes(s.try_into().expect("2 bytes"));
    let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
    if version != CHECKPOINT_VERSION && version != 1 {
        return Err(CheckpointDamage::Version {
            found: version,
            reads: CHECKPOINT_VERSION,
        });
    }
    take(4)?;
    let mut h = [0u64; 6];
    for v in &mut h {
        *v = u64_(take(8)?);
    }
    let [segment, offset, seq, model_entries, ck_pages, ck_page_bytes] = h;
    let model_base = if version >= 2 { u64_(take(8)?) } else { 0 };
    if (ck_pages, ck_page_bytes) != (pages, page_bytes as u64) {
        return Err(CheckpointDamage::OtherDevice {
            pages: ck_pages,
            page_bytes: ck_page_bytes,
            want_pages: pages,
            want_page_bytes: page_bytes,
        });
    }
    if offset as usize >= log::MAX_SEGMENT_BYTES || offset % 8 != 0 || seq == 0 {
        return Err(CheckpointDamage::Position { offset, seq });
    }
    let next_id = u16_(take(2)?);
    let count = u16_(take(2)?);
    if count as usize > MAX_VOLUMES {
        return Err(CheckpointDamage::TooManyVolumes(count));
    }
    let chunks_per_map = (pages as usize).div_ceil(CHUNK_PAGES);
    // A decoded chunk: its locations checked (a mapped one names a record).
    let chunk_of = |raw: &[u8], id: u16, first_lpn: usize| {
        let mut c = vec![Loc::NONE; CHUNK_PAGES];
        for (i, w) in raw.chunks_exact(8).enumerate() {
            let loc = Loc(u64_(w));
            if !loc.is_none() && (loc.offset() == 0 || loc.bytes() == 0) {
                return Err(CheckpointDamage::NoRecord {
                    id,
                    lpn: first_lpn + i,
                });
            }
            c[i] = loc;
        }
        Ok(c)
    };
    let mut distinct: Vec<Arc<Vec<Loc>>> = Vec::new();
    if version >= 2 {
        let n = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        // No more distinct chunks than every volume's maps hold.
        if n > MAX_VOLUMES * chunks_per_map {
            return Err(CheckpointDamage::Chunks(n));
        }
        for k in 0..n {
            let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
            let raw = lz4_flex::block::decompress(take(len)?, CHUNK_PAGES * 8).map_err(|e| {
                CheckpointDamage::ChunkCompression {
                    chunk: k,
                    why: e.to_string(),
                }
            })?;
            if raw.len() != CHUNK_PAGES * 8 {
                return Err(CheckpointDamage::ChunkCompression {
                    chunk: k,
                    why: format!("{} bytes", raw.len()),
                });
            }
            distinct.push(Arc::new(chunk_of(&raw, 0, 0)?));
        }
    }
    let mut volumes = Volumes::new(pages);
    volumes.list.clear();
    volumes.next_id = next_id;
    for _ in 0..count {
        let id = u16_(take(2)?);
        let kind = match take(1)?[0] {
            0 => VolumeKind::Device,
            1 => VolumeKind::Snapshot,
            2 => VolumeKind::Clone,
            k => return Err(CheckpointDamage::VolumeKind { id, kind: k }),
        };
        let parent = u16_(take(2)?);
        let name_len = u16_(take(2)?) as usize;
        let name = String::from_utf8(take(name_len)?.to_vec())
            .map_err(|_| CheckpointDamage::NameNotUtf8(id))?;
        let created_seq = u64_(take(8)?);
        let mut map = LocMap::new(pages);
        if version >= 2 {
            for k in 0..chunks_per_map {
                let at = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
                if at == NO_CHUNK {
                    continue;
                }
                let chunk = distinct
                    .get(at as usize)
                    .ok_or(CheckpointDamage::NoChunk { id, chunk: at })?;
                // Pages past the device's end stay unmapped in its last chunk.
                let tail = (k + 1) * CHUNK_PAGES > pages as usize;
                if tail
                    && chunk[pages as usize - k * CHUNK_PAGES..]
                        .iter()
                        .any(|l| !l.is_none())
                {
                    return Err(CheckpointDamage::NoRecord {
                        id,
                        lpn: pages as usize,
                    });
                }
                map.chunks[k] = Some(chunk.clone());
            }
        } else {
            let packed_len = u64_(take(8)?) as usize;
            let packed = take(packed_len)?;
            let raw = lz4_flex::block::decompress(packed, pages as usize * 8).map_err(|e| {
                CheckpointDamage::MapCompression {
                    id,
                    why: e.to_string(),
                }
            })?;
            if raw.len() as u64 != pages * 8 {
                return Err(CheckpointDamage::MapBytes {
                    id,
                    bytes: raw.len(),
                });
            }
            for (k, part) in raw.chunks(CHUNK_PAGES * 8).enumerate() {
                let mut whole = part.to_vec();
                whole.resize(CHUNK_PAGES * 8, 0);
                let c = chunk_of(&whole, id, k * CHUNK_PAGES)?;
                if c.iter().any(|l| !l.is_none()) {
                    map.chunks[k] = Some(Arc::new(c));
                }
            }
        }
        volumes.list.push(Volume {
            id,
            name,
            kind,
            parent,
            created_seq,
            map,
        });
    }
    if volumes.list.first().map(|v| (v.id, v.kind)) != Some((DEVICE_VOLUME, VolumeKind::Device)) {
        return Err(CheckpointDamage::DeviceNotFirst);
    }
    volumes.live_bytes = live_bytes(&volumes.list, chunks_per_map);
    Ok(Checkpoint {
        at: Position {
            segment,
            offset: offset as usize,
            seq,
        },
        model_base,
        model_entries,
        volumes,
    })
}

/// Bytes of live records per segment, each record once however many volumes map it: per chunk
/// position, the distinct chunks there (a shared `Arc` once), and per page the distinct records
/// among them. Proportional to the distinct chunks, not to volumes x pages.
fn live_bytes(list: &[Volume], chunks_per_map: usize) -> BTreeMap<u64, u64> {
    let mut live = BTreeMap::new();
    let mut at_k: Vec<&Arc<Vec<Loc>>> = Vec::new();
    let mut locs: Vec<Loc> = Vec::new();
    for k in 0..chunks_per_map {
        at_k.clear();
        for v in list {
            if let Some(c) = &v.map.chunks[k] {
                if !at_k.iter().any(|d| Arc::ptr_eq(d, c)) {
                    at_k.push(c);
                }
            }
        }
        for i in 0..CHUNK_PAGES {
            locs.clear();
            locs.extend(at_k.iter().map(|c| c[i]).filter(|l| !l.is_none()));
            locs.sort_unstable();
            locs.dedup();
            for l in &locs {
                *live.entry(l.segment()).or_default() += l.bytes() as u64;
            }
        }
    }
    live
}

impl DataDir {
    /// Writes a checkpoint: commits the log, archives the model's requests since the last one
    /// in `model.log` (synced), then replaces `checkpoint` atomically.
    pub fn checkpoint(&mut self) -> Result<(), LogError> {
        self.commit()?;
        let at = self.writer().position();
        // The model's archive: cut back to what the checkpoint on disk counts (a crash may have
        // left more), then append.
        let model_path = self.dir.join(MODEL_FILE);
        let model = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&model_path)
            .map_err(io(&model_path))?;
        let mut buf = Vec::new();
        if self.model_entries == 0 {
            buf.extend_from_slice(&log::segment_header(0));
        }
        model
            .set_len(if self.model_entries == 0 {
                0
            } else {
                self.model_len
            })
            .map_err(io(&model_path))?;
        for (k, r) in self.pending.iter().enumerate() {
            buf.extend_from_slice(&log::encode(
                Kind::Request,
                r.op,
                r.offset_bytes,
                self.model_entries + 1 + k as u64,
                r.length_bytes,
                &r.payload(),
            ));
        }
        let start = if self.model_entries == 0 {
            0
        } else {
            self.model_len
        };
        model
            .write_all_at(&buf, start)
            .and_then(|_| model.sync_data())
            .map_err(io(&model_path))?;
        let ck = Checkpoint {
            at,
            model_base: self.model_base,
            model_entries: self.model_entries + self.pending.len() as u64,
            volumes: self.volumes.clone(),
        };
        let bytes = encode_checkpoint(&ck, self.page_bytes);
        write_atomically(&self.dir.join(CHECKPOINT_FILE), &bytes).map_err(atomic)?;
        self.model_len = start + buf.len() as u64;
        self.model_entries = ck.model_entries;
        self.pending.clear();
        self.checkpoint_at = at;
        self.stats.checkpoints += 1;
        self.stats.checkpoint_bytes += bytes.len() as u64;
        self.stats.model_bytes += buf.len() as u64;
        Ok(())
    }

    /// The model requests logged so far: what a model state saved now covers (read under the
    /// lock its owner logs requests under, then `checkpoint_with_model`).
    pub fn model_requests(&self) -> u64 {
        self.model_base + self.model_entries + self.pending.len() as u64
    }

    /// A checkpoint with the FTL model's saved state `state`, which covers the first `covered`
    /// model requests (`model_requests` when it was taken): `model.state` replaced first, then
    /// the archive begun anew with the requests after it and the checkpoint written. A restart
    /// restores the state and replays only what follows, and `model.log` no longer grows for
    /// ever. A crash between the two finds the state covering more than the old checkpoint's
    /// archive, and uses it (`model_log::choose`). Returns whether the state was saved: when a
    /// checkpoint since archived requests it covers, a plain checkpoint is written instead (the
    /// next state will be saved).
    pub fn checkpoint_with_model(
        &mut self,
        state: &PackedModel,
        covered: u64,
    ) -> Result<bool, LogError> {
        assert!(
            covered <= self.model_requests(),
            "a state of requests never logged"
        );
        self.commit()?;
        let Some(after) = covered.checked_sub(self.model_base + self.model_entries) else {
            self.checkpoint()?;
            return Ok(false);
        };
        let bytes = model_log::encode_model_state(covered, state);
        write_atomically(&self.dir.join(MODEL_STATE_FILE), &bytes).map_err(atomic)?;
        self.stats.model_bytes += bytes.len() as u64;
        self.model_base = covered;
        self.model_entries = 0;
        self.model_len = log::SEGMENT_HEADER_BYTES as u64;
        self.pending.drain(..after as usize);
        self.checkpoint()?;
        Ok(true)
    }

    /// Bytes appended to the log since the last checkpoint.
    pub fn since_checkpoint_bytes(&self) -> u64 {
        let w = self
            .writer
            .as_ref()
            .map_or(self.checkpoint_at, |w| w.position());
        let per = log::MAX_SEGMENT_BYTES as u64;
        (w.segment * per + w.offset as u64)
            .saturating_sub(self.checkpoint_at.segment * per + self.checkpoint_at.offset as u64)
    }
}
