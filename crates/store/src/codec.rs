//! Page codecs: LZ4 (lz4_flex), Zstandard at a level, and Zstandard with a dictionary trained
//! from the device's own pages. Compression contexts live per thread, created once, because
//! setting one up (and loading a dictionary into it) costs more than compressing a page.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// No compression: every page not filled with one word is kept as it is (zram's huge
    /// pages). For measuring the FTL model without the codec's CPU.
    None,
    Lz4,
    Zstd {
        level: i32,
    },
    /// Zstandard with the store's current dictionary (plain Zstandard until one is trained).
    ZstdDict {
        level: i32,
    },
}

/// Why a codec or cache policy name did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    #[error("`{0}` is not a zstd level")]
    NotALevel(String),
    #[error("zstd level {0} is outside 1..=22")]
    LevelRange(i32),
    #[error("`{value}`: {what} is {choices}")]
    Unknown {
        value: String,
        what: &'static str,
        choices: &'static str,
    },
}

impl Codec {
    /// `lz4`, `zstd`, `zstd:LEVEL`, `zstd-dict`, `zstd-dict:LEVEL`.
    pub fn parse(s: &str) -> Result<Codec, ChoiceError> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (
                n,
                Some(
                    l.parse::<i32>()
                        .map_err(|_| ChoiceError::NotALevel(l.to_string()))?,
                ),
            ),
            None => (s, None),
        };
        let level = level.unwrap_or(3);
        if !(1..=22).contains(&level) {
            return Err(ChoiceError::LevelRange(level));
        }
        match name {
            "none" => Ok(Codec::None),
            "lz4" => Ok(Codec::Lz4),
            "zstd" => Ok(Codec::Zstd { level }),
            "zstd-dict" => Ok(Codec::ZstdDict { level }),
            other => Err(ChoiceError::Unknown {
                value: other.to_string(),
                what: "the codec",
                choices: "none, lz4, zstd[:LEVEL] or zstd-dict[:LEVEL]",
            }),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Codec::None => "none".into(),
            Codec::Lz4 => "lz4".into(),
            Codec::Zstd { level } => format!("zstd:{level}"),
            Codec::ZstdDict { level } => format!("zstd-dict:{level}"),
        }
    }
}

/// A trained dictionary; `id` is what entries record (0 = no dictionary).
#[derive(Debug)]
pub struct Dictionary {
    pub id: u32,
    pub bytes: Vec<u8>,
}

/// How a stored page was encoded; kept in its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Lz4,
    Zstd,
    ZstdDict(u32),
}

struct ThreadCodecs {
    zstd: HashMap<i32, zstd::bulk::Compressor<'static>>,
    zstd_dict: HashMap<(u32, i32), zstd::bulk::Compressor<'static>>,
    unzstd: Option<zstd::bulk::Decompressor<'static>>,
    unzstd_dict: HashMap<u32, zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    static CODECS: RefCell<ThreadCodecs> = RefCell::new(ThreadCodecs {
        zstd: HashMap::new(),
        zstd_dict: HashMap::new(),
        unzstd: None,
        unzstd_dict: HashMap::new(),
    });
}

/// What a codec could not do. The libraries' own errors are kept as their messages: the store's
/// errors compare equal in tests, and io::Error does not.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("{0}")]
    Lz4(String),
    #[error("{0}")]
    Zstd(String),
    /// A page names a dictionary the store no longer holds.
    #[error("dictionary {0} is gone")]
    DictionaryGone(u32),
    #[error("decoded {decoded} bytes, expected {expected}")]
    Length { decoded: usize, expected: usize },
}

fn zstd_error(e: std::io::Error) -> CodecError {
    CodecError::Zstd(e.to_string())
}

/// Compresses `page` into the front of `out`, which is grown (never shrunk, so a reused buffer
/// is not cleared page after page). Returns the encoding and the compressed length.
pub fn compress(
    codec: Codec,
    dictionary: Option<&Arc<Dictionary>>,
    page: &[u8],
    out: &mut Vec<u8>,
) -> Result<(Encoding, usize), CodecError> {
    match codec {
        // The store keeps every page raw under `none` and never asks.
        Codec::None => Err(CodecError::Lz4(
            "the codec `none` compresses nothing".into(),
        )),
        Codec::Lz4 => {
            let bound = lz4_flex::block::get_maximum_output_size(page.len());
            if out.len() < bound {
                out.resize(bound, 0);
            }
            let n = lz4_flex::block::compress_into(page, &mut out[..bound])
                .map_err(|e| CodecError::Lz4(e.to_string()))?;
            Ok((Encoding::Lz4, n))
        }
        Codec::Zstd { level } | Codec::ZstdDict { level } => {
            let dict = match codec {
                Codec::ZstdDict { .. } => dictionary,
                _ => None,
            };
            let bound = zstd::zstd_safe::compress_bound(page.len());
            if out.len() < bound {
                out.resize(bound, 0);
            }
            let n = CODECS.with(|c| -> Result<usize, CodecError> {
                let mut c = c.borrow_mut();
                let compressor = match dict {
                    None => match c.zstd.entry(level) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(zstd::bulk::Compressor::new(level).map_err(zstd_error)?)
                        }
                    },
                    Some(d) => {
                        // Contexts of older dictionaries are dropped as a new one arrives.
                        if !c.zstd_dict.contains_key(&(d.id, level)) {
                            c.zstd_dict.retain(|(id, _), _| *id > d.id);
                        }
                        match c.zstd_dict.entry((d.id, level)) {
                            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                            std::collections::hash_map::Entry::Vacant(v) => v.insert(
                                zstd::bulk::Compressor::with_dictionary(level, &d.bytes)
                                    .map_err(zstd_error)?,
                            ),
                        }
                    }
                };
                compressor
                    .compress_to_buffer(page, &mut out[..bound])
                    .map_err(zstd_error)
            })?;
            let encoding = match dict {
                Some(d) => Encoding::ZstdDict(d.id),
                None => Encoding::Zstd,
            };
            Ok((encoding, n))
        }
    }
}

/// Decompresses `stored` into `out` (exactly one page).
pub fn decompress(
    encoding: Encoding,
    dictionaries: &dyn Fn(u32) -> Option<Arc<Dictionary>>,
    stored: &[u8],
    out: &mut [u8],
) -> Result<(), CodecError> {
    let n = match encoding {
        Encoding::Lz4 => lz4_flex::block::decompress_into(stored, out)
            .map_err(|e| CodecError::Lz4(e.to_string()))?,
        Encoding::Zstd => CODECS.with(|c| -> Result<usize, CodecError> {
            let mut c = c.borrow_mut();
            if c.unzstd.is_none() {
                c.unzstd = Some(zstd::bulk::Decompressor::new().map_err(zstd_error)?);
            }
            c.unzstd
                .as_mut()
                .expect("set above")
                .decompress_to_buffer(stored, out)
                .map_err(zstd_error)
        })?,
        Encoding::ZstdDict(id) => CODECS.with(|c| -> Result<usize, CodecError> {
            let mut c = c.borrow_mut();
            // Keep a few dictionaries' contexts per thread, the newest: old pages are rarer.
            if !c.unzstd_dict.contains_key(&id) && c.unzstd_dict.len() >= 4 {
                let oldest = *c.unzstd_dict.keys().min().expect("non-empty");
                c.unzstd_dict.remove(&oldest);
            }
            let decompressor = match c.unzstd_dict.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let d = dictionaries(id).ok_or(CodecError::DictionaryGone(id))?;
                    v.insert(
                        zstd::bulk::Decompressor::with_dictionary(&d.bytes).map_err(zstd_error)?,
                    )
                }
            };
            decompressor
                .decompress_to_buffer(stored, out)
                .map_err(zstd_error)
        })?,
    };
    if n != out.len() {
        return Err(CodecError::Length {
            decoded: n,
            expected: out.len(),
        });
    }
    Ok(())
}

/// Trains a dictionary of up to `max_bytes` from sample pages.
pub fn train(samples: &[u8], page_bytes: usize, max_bytes: usize) -> Result<Vec<u8>, CodecError> {
    let sizes = vec![page_bytes; samples.len() / page_bytes];
    zstd::dict::from_continuous(samples, &sizes, max_bytes).map_err(zstd_error)
}
