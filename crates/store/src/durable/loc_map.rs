//! A volume's map from LPN to the log record holding its page, in chunks shared copy-on-write
//! with its snapshots.

use super::*;

/// A volume's map from LPN to record, in chunks shared copy-on-write with its snapshots.
#[derive(Clone, Debug)]
pub struct LocMap {
    pub(super) pages: u64,
    /// None: every page of the chunk unmapped.
    pub(super) chunks: Vec<Option<Arc<Vec<Loc>>>>,
}

impl LocMap {
    pub fn new(pages: u64) -> LocMap {
        LocMap {
            pages,
            chunks: vec![None; (pages as usize).div_ceil(CHUNK_PAGES)],
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    pub fn get(&self, lpn: u64) -> Loc {
        match &self.chunks[lpn as usize / CHUNK_PAGES] {
            Some(c) => c[lpn as usize % CHUNK_PAGES],
            None => Loc::NONE,
        }
    }

    /// Maps `lpn` to `loc`; returns what it mapped to.
    pub fn set(&mut self, lpn: u64, loc: Loc) -> Loc {
        let chunk = &mut self.chunks[lpn as usize / CHUNK_PAGES];
        if chunk.is_none() && loc.is_none() {
            return Loc::NONE;
        }
        let c = Arc::make_mut(chunk.get_or_insert_with(|| Arc::new(vec![Loc::NONE; CHUNK_PAGES])));
        std::mem::replace(&mut c[lpn as usize % CHUNK_PAGES], loc)
    }

    /// Every mapped page: (lpn, loc).
    pub fn mapped(&self) -> impl Iterator<Item = (u64, Loc)> + '_ {
        self.chunks.iter().enumerate().flat_map(|(k, c)| {
            c.iter().flat_map(move |c| {
                c.iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_none())
                    .map(move |(i, &l)| ((k * CHUNK_PAGES + i) as u64, l))
            })
        })
    }
}
