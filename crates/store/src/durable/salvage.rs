//! Reading every mapped page back (`ftlab check`, `ftlab image export`), and what is done with
//! a page whose record does not verify: named (page, volume, file, byte), skipped when asked,
//! and zeroed by a repair. One damaged record costs its page, never the others.

use super::*;

/// A mapped page whose record cannot be read back as its page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedPage {
    /// The volume's id and name ("" for the device itself).
    pub volume: u16,
    pub volume_name: String,
    pub lpn: u64,
    pub loc: Loc,
    /// The segment file and why its record is not the page.
    pub path: PathBuf,
    pub why: String,
}

impl DamagedPage {
    /// "page N of the device" or "page N of `NAME`".
    pub fn page_name(&self) -> String {
        if self.volume_name.is_empty() {
            format!("page {} of the device", self.lpn)
        } else {
            format!("page {} of `{}`", self.lpn, self.volume_name)
        }
    }
}

impl std::fmt::Display for DamagedPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}: the record at byte {}: {}",
            self.page_name(),
            self.path.display(),
            self.loc.offset(),
            self.why
        )
    }
}

/// What `verify` found.
#[derive(Debug, Default)]
pub struct Verified {
    /// Mapped page records that read back and verify.
    pub pages: u64,
    pub damaged: Vec<DamagedPage>,
}

impl DataDir {
    /// Reads the records at `pages` (sorted by `Loc`) of `volume`, each segment read once, and
    /// hands each page to `visit`. A record that does not read back as its page is an error
    /// naming it, or with `damaged` given, is pushed there and skipped (the others still read).
    pub fn load_pages(
        &self,
        volume: u16,
        pages: &[(Loc, u64)],
        visit: &mut PageVisitor,
        mut damaged: Option<&mut Vec<DamagedPage>>,
    ) -> Result<(), LogError> {
        let volume_name = self
            .volumes
            .get(volume)
            .map_or_else(String::new, |v| v.name.clone());
        let mut page = vec![0u8; self.page_bytes];
        let mut k = 0;
        while k < pages.len() {
            let segment = pages[k].0.segment();
            let path = segment_path(&self.dir, segment);
            let bytes = std::fs::read(&path);
            while k < pages.len() && pages[k].0.segment() == segment {
                let (loc, lpn) = pages[k];
                k += 1;
                let decoded = match &bytes {
                    Ok(bytes) => self.decode_page(bytes, loc, lpn, &mut page),
                    Err(e) => Err(e.to_string()),
                };
                let why = match decoded {
                    Ok(()) => {
                        visit(lpn, &page).map_err(|cause| LogError::Visit { lpn, cause })?;
                        continue;
                    }
                    Err(why) => why,
                };
                let d = DamagedPage {
                    volume,
                    volume_name: volume_name.clone(),
                    lpn,
                    loc,
                    path: path.clone(),
                    why,
                };
                match damaged.as_mut() {
                    Some(list) => list.push(d),
                    None => return Err(damaged_page(&d)),
                }
            }
        }
        Ok(())
    }

    /// The page record `loc` of `bytes` (its segment) into `page`, when it is page `lpn`.
    fn decode_page(&self, bytes: &[u8], loc: Loc, lpn: u64, page: &mut [u8]) -> Result<(), String> {
        let r = bytes
            .get(loc.offset()..loc.offset() + loc.bytes())
            .ok_or_else(|| "beyond the end of the segment".to_string())
            .and_then(|b| log::decode_any(b).map_err(|why| why.to_string()))?;
        if r.kind != Kind::Page || r.lpn != lpn {
            return Err(format!(
                "a {:?} record of page {}, where page {lpn} was mapped",
                r.kind, r.lpn
            ));
        }
        let p = r
            .page(self.page_bytes)
            .ok_or_else(|| "does not decode to a page".to_string())?;
        page.copy_from_slice(&p);
        Ok(())
    }

    /// Checks every volume's map against the log: each mapped record reads back, verifies and
    /// is a page of its LPN. Every page that does not is named; the others are all read. A
    /// record shared by snapshots is read once (1,023 snapshots of a device cost one read of
    /// each distinct record, not 1,024).
    pub fn verify(&self) -> Result<Verified, LogError> {
        let mut out = Verified::default();
        // Each record read, and whether it was damaged (its first DamagedPage).
        let mut seen: HashMap<Loc, Option<usize>> = HashMap::new();
        for v in &self.volumes.list {
            let mut pages: Vec<(Loc, u64)> = Vec::new();
            for (lpn, loc) in v.map.mapped() {
                match seen.get(&loc) {
                    None => pages.push((loc, lpn)),
                    Some(None) => out.pages += 1,
                    Some(&Some(k)) => {
                        let d = DamagedPage {
                            volume: v.id,
                            volume_name: v.name.clone(),
                            lpn,
                            ..out.damaged[k].clone()
                        };
                        out.damaged.push(d);
                    }
                }
            }
            pages.sort_unstable();
            let first_new = out.damaged.len();
            let mut count = 0;
            self.load_pages(
                v.id,
                &pages,
                &mut |_, _| {
                    count += 1;
                    Ok(())
                },
                Some(&mut out.damaged),
            )?;
            out.pages += count;
            for (k, d) in out.damaged.iter().enumerate().skip(first_new) {
                seen.insert(d.loc, Some(k));
            }
            for (loc, _) in pages {
                seen.entry(loc).or_insert(None);
            }
        }
        Ok(out)
    }

    /// Zeroes each of `pages` that its volume still maps to the damaged record (a trim: it
    /// reads as zeros from then on), then checkpoints. What cannot be read is lost already; this
    /// makes the loss explicit and lets the rest of the device be served and exported whole.
    /// Returns the pages zeroed.
    pub fn zero_damaged(&mut self, pages: &[DamagedPage]) -> Result<u64, LogError> {
        let mut zeroed = 0;
        for d in pages {
            let still = self
                .volumes
                .get(d.volume)
                .is_some_and(|v| v.map.get(d.lpn) == d.loc);
            if still {
                self.trim(d.volume, d.lpn, 1)?;
                zeroed += 1;
            }
        }
        self.checkpoint()?;
        Ok(zeroed)
    }
}

/// The error of a damaged page read without `damaged` given: it names the page and the volume.
pub(super) fn damaged_page(d: &DamagedPage) -> LogError {
    LogError::Damaged {
        path: d.path.clone(),
        why: format!(
            "the record at byte {} ({}): {}",
            d.loc.offset(),
            d.page_name(),
            d.why
        ),
    }
}
