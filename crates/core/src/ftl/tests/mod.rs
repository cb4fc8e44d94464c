//! The FTL core's unit tests, one file a concern.

mod fdp;
mod flash_counts;
mod translation;
