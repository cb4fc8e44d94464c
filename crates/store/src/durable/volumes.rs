//! Volumes: the device, its snapshots and clones, each a `LocMap`; what a log record does to
//! them, and their creation and deletion on a directory.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    /// The device itself (volume 0), served as the exports.
    Device,
    /// Read-only, frozen when made.
    Snapshot,
    /// Writable, sharing unchanged pages with what it was made from.
    Clone,
}

#[derive(Clone, Debug)]
pub struct Volume {
    pub id: u16,
    pub name: String,
    pub kind: VolumeKind,
    /// The volume it was made from (the device's is itself).
    pub parent: u16,
    /// The log record that made it.
    pub created_seq: u64,
    pub map: LocMap,
}

/// What `DataDir::volumes` lists.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    pub id: u16,
    pub name: String,
    pub kind: VolumeKind,
    pub parent: String,
    pub mapped_pages: u64,
}

/// The device and its snapshots and clones, and the bytes of live records per segment.
#[derive(Clone, Debug)]
pub struct Volumes {
    pub(super) pages: u64,
    pub(super) list: Vec<Volume>,
    pub(super) next_id: u16,
    /// Segment -> bytes of records some volume maps.
    pub(super) live_bytes: BTreeMap<u64, u64>,
}

impl Volumes {
    pub(super) fn new(pages: u64) -> Volumes {
        Volumes {
            pages,
            list: vec![Volume {
                id: DEVICE_VOLUME,
                name: String::new(),
                kind: VolumeKind::Device,
                parent: DEVICE_VOLUME,
                created_seq: 0,
                map: LocMap::new(pages),
            }],
            next_id: 1,
            live_bytes: BTreeMap::new(),
        }
    }

    /// The id the next volume gets: `next_id`, or the first free one after it (wrapping, never
    /// the device's 0 nor u16::MAX).
    pub(super) fn free_id(&self) -> Option<u16> {
        let start = self.next_id.clamp(1, u16::MAX - 1);
        (start..u16::MAX)
            .chain(1..start)
            .find(|&id| self.index(id).is_none())
    }

    pub(super) fn index(&self, id: u16) -> Option<usize> {
        self.list.iter().position(|v| v.id == id)
    }

    pub fn by_name(&self, name: &str) -> Option<&Volume> {
        self.list
            .iter()
            .find(|v| v.kind != VolumeKind::Device && v.name == name)
    }

    pub fn get(&self, id: u16) -> Option<&Volume> {
        self.index(id).map(|i| &self.list[i])
    }

    /// Maps `lpn` of volume `at` (an index) to `loc`, keeping the live bytes: the old record
    /// dies unless another volume maps the same LPN to it (records are shared only so).
    pub(super) fn set(&mut self, at: usize, lpn: u64, loc: Loc) {
        let old = self.list[at].map.set(lpn, loc);
        if old == loc {
            return;
        }
        if !old.is_none() && !self.shared(at, lpn, old) {
            let live = self.live_bytes.entry(old.segment()).or_default();
            *live -= old.bytes() as u64;
        }
        if !loc.is_none() && !self.shared(at, lpn, loc) {
            *self.live_bytes.entry(loc.segment()).or_default() += loc.bytes() as u64;
        }
    }

    pub(super) fn shared(&self, except: usize, lpn: u64, loc: Loc) -> bool {
        self.list
            .iter()
            .enumerate()
            .any(|(i, v)| i != except && v.map.get(lpn) == loc)
    }

    /// Applies a replayed or just appended record at `segment`.
    pub(super) fn apply(&mut self, r: &Record, segment: u64) -> Result<(), ReplayError> {
        let at = || self.index(r.volume).ok_or(ReplayError::NoVolume(r.volume));
        match r.kind {
            Kind::Page => {
                let at = at()?;
                if r.lpn >= self.pages {
                    return Err(ReplayError::PageBeyond {
                        lpn: r.lpn,
                        pages: self.pages,
                    });
                }
                self.set(at, r.lpn, Loc::new(segment, r.offset, r.bytes));
            }
            Kind::Trim => {
                let at = at()?;
                let end = r
                    .lpn
                    .checked_add(u64::from(r.pages))
                    .filter(|&e| e <= self.pages)
                    .ok_or(ReplayError::TrimBeyond { pages: self.pages })?;
                for lpn in r.lpn..end {
                    self.set(at, lpn, Loc::NONE);
                }
            }
            Kind::Volume => {
                let parent = u16::try_from(r.lpn)
                    .ok()
                    .and_then(|p| self.index(p))
                    .ok_or(ReplayError::NoParent(r.lpn))?;
                let name =
                    String::from_utf8(r.payload.clone()).map_err(|_| ReplayError::NameNotUtf8)?;
                if self.index(r.volume).is_some() || self.by_name(&name).is_some() {
                    return Err(ReplayError::VolumeExists { id: r.volume, name });
                }
                if self.list.len() >= MAX_VOLUMES {
                    return Err(ReplayError::TooManyVolumes);
                }
                let kind = if r.codec == 1 {
                    VolumeKind::Clone
                } else {
                    VolumeKind::Snapshot
                };
                let map = self.list[parent].map.clone();
                self.list.push(Volume {
                    id: r.volume,
                    name,
                    kind,
                    parent: self.list[parent].id,
                    created_seq: r.seq,
                    map,
                });
                // Ids are handed out in turn and reused once free (`free_id`): a device made
                // 65,534 snapshots over its life can make more.
                self.next_id = match r.volume.wrapping_add(1) {
                    u16::MAX | 0 => 1,
                    next => next,
                };
            }
            Kind::Unvolume => {
                let at = at()?;
                if at == 0 {
                    return Err(ReplayError::DeviceVolumeDeleted);
                }
                for lpn in 0..self.pages {
                    self.set(at, lpn, Loc::NONE);
                }
                let gone = self.list.remove(at);
                // Its id may be reused: its children name its parent as theirs from now on.
                for v in &mut self.list {
                    if v.parent == gone.id {
                        v.parent = gone.parent;
                    }
                }
            }
            Kind::Commit | Kind::Request => {}
        }
        Ok(())
    }

    pub fn infos(&self) -> Vec<VolumeInfo> {
        self.list
            .iter()
            .map(|v| VolumeInfo {
                id: v.id,
                name: v.name.clone(),
                kind: v.kind,
                parent: self
                    .get(v.parent)
                    .map(|p| p.name.clone())
                    .unwrap_or_default(),
                mapped_pages: v.map.mapped().count() as u64,
            })
            .collect()
    }
}

impl DataDir {
    pub fn volumes(&self) -> Vec<VolumeInfo> {
        self.volumes.infos()
    }

    pub fn volume_named(&self, name: &str) -> Option<(u16, VolumeKind)> {
        self.volumes.by_name(name).map(|v| (v.id, v.kind))
    }

    /// The device's pages, each with where it is in the log, in log order (to load them
    /// segment by segment).
    pub fn device_pages(&self) -> Vec<(Loc, u64)> {
        self.volume_pages(DEVICE_VOLUME)
    }

    /// As `device_pages`, for volume `id` (none when it does not exist).
    pub fn volume_pages(&self, id: u16) -> Vec<(Loc, u64)> {
        let Some(v) = self.volumes.get(id) else {
            return Vec::new();
        };
        let mut pages: Vec<(Loc, u64)> = v.map.mapped().map(|(lpn, loc)| (loc, lpn)).collect();
        pages.sort_unstable();
        pages
    }

    /// Makes a snapshot (read-only) or clone (writable) of volume `parent` (None: the device)
    /// named `name`: a record and a commit, no data copied. Returns its id.
    pub fn create_volume(
        &mut self,
        parent: Option<&str>,
        name: &str,
        kind: VolumeKind,
    ) -> Result<u16, DurableError> {
        check_volume_name(name)?;
        if self.volumes.by_name(name).is_some() {
            return Err(DurableError::Exists(name.to_string()));
        }
        let parent = match parent {
            None => DEVICE_VOLUME,
            Some(p) => {
                self.volumes
                    .by_name(p)
                    .ok_or_else(|| DurableError::NoSuch(p.to_string()))?
                    .id
            }
        };
        if kind == VolumeKind::Device {
            return Err(DurableError::DeviceNotMade);
        }
        let id = match self.volumes.free_id() {
            Some(id) if self.volumes.list.len() < MAX_VOLUMES => id,
            _ => {
                return Err(DurableError::Full {
                    existing: self.volumes.list.len() - 1,
                })
            }
        };
        let codec = u8::from(kind == VolumeKind::Clone);
        let (seq, loc) = self.writer().append_volume(
            Kind::Volume,
            codec,
            id,
            u64::from(parent),
            0,
            name.as_bytes(),
        )?;
        let record = Record {
            kind: Kind::Volume,
            codec,
            volume: id,
            lpn: u64::from(parent),
            seq,
            pages: 0,
            payload: name.as_bytes().to_vec(),
            offset: loc.offset(),
            bytes: loc.bytes(),
            segment: loc.segment(),
        };
        self.volumes.apply(&record, loc.segment())?;
        self.commit()?;
        Ok(id)
    }

    /// Deletes a snapshot or clone: its records die unless another volume maps them.
    pub fn delete_volume(&mut self, name: &str) -> Result<(), DurableError> {
        let id = self
            .volumes
            .by_name(name)
            .ok_or_else(|| DurableError::NoSuch(name.to_string()))?
            .id;
        // Its children share records by LPN, not through it: they keep theirs.
        let (seq, loc) = self
            .writer()
            .append_volume(Kind::Unvolume, 0, id, 0, 0, &[])?;
        let record = Record {
            kind: Kind::Unvolume,
            codec: 0,
            volume: id,
            lpn: 0,
            seq,
            pages: 0,
            payload: Vec::new(),
            offset: loc.offset(),
            bytes: loc.bytes(),
            segment: loc.segment(),
        };
        self.volumes.apply(&record, loc.segment())?;
        self.commit()?;
        Ok(())
    }
}

/// The one rule for a snapshot's or clone's name, stated in `NAME_RULE`: checked by the
/// client before a request is sent, by the server before it runs, and here before a volume is
/// made.
pub fn check_volume_name(name: &str) -> Result<(), DurableError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(DurableError::BadName(name.to_string()))
    }
}

/// What `check_volume_name` accepts, for messages and help.
pub const NAME_RULE: &str = "1 to 200 of A-Z a-z 0-9 - _ . not starting with .";
