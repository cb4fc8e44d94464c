//! The table of files in the device's first page: which of a database's files exist and
//! their sizes, each in its fixed range of the device.

use crate::{HEADER_BYTES, MAGIC};

/// The files of a database that live on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Main = 0,
    Journal = 1,
    Wal = 2,
}

impl Kind {
    /// The file `name` is to its database: (kind, the database's name).
    pub(crate) fn of(name: &str) -> (Kind, &str) {
        if let Some(db) = name.strip_suffix("-journal") {
            (Kind::Journal, db)
        } else if let Some(db) = name.strip_suffix("-wal") {
            (Kind::Wal, db)
        } else {
            (Kind::Main, name)
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FileMeta {
    pub(crate) exists: bool,
    pub(crate) size_bytes: u64,
}

/// The table in page 0.
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    pub(crate) name: String,
    pub(crate) files: [FileMeta; 3],
    /// Changed since last written.
    pub(crate) dirty: bool,
}

impl Table {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; HEADER_BYTES as usize];
        page[..16].copy_from_slice(MAGIC);
        let mut at = 16;
        for f in &self.files {
            page[at] = u8::from(f.exists);
            page[at + 1..at + 9].copy_from_slice(&f.size_bytes.to_le_bytes());
            at += 9;
        }
        let name = &self.name.as_bytes()[..self.name.len().min(1024)];
        page[at..at + 2].copy_from_slice(&(name.len() as u16).to_le_bytes());
        page[at + 2..at + 2 + name.len()].copy_from_slice(name);
        page
    }

    /// None for a page that is no table (a fresh device reads zeros).
    pub(crate) fn decode(page: &[u8]) -> Option<Table> {
        if page.len() < HEADER_BYTES as usize || &page[..16] != MAGIC {
            return None;
        }
        let mut t = Table::default();
        let mut at = 16;
        for f in &mut t.files {
            f.exists = page[at] != 0;
            f.size_bytes = u64::from_le_bytes(page[at + 1..at + 9].try_into().ok()?);
            at += 9;
        }
        let len = u16::from_le_bytes([page[at], page[at + 1]]) as usize;
        t.name = String::from_utf8(page.get(at + 2..at + 2 + len)?.to_vec()).ok()?;
        Some(t)
    }
}
