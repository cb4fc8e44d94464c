//! Page addresses: [`Lpn`], a logical page (the host's byte offset / page size), and [`Ppn`], a
//! physical page (superblock x pages per superblock + slot, `geometry.rs`).
//!
//! Both are 32 bits: the geometry refuses a device of 2^32 physical pages or more (16 TiB of
//! 4 KiB pages), and a device has no more logical pages than physical ones, so every LPN and PPN
//! fits, and `u32::MAX` is free to mean "none" (`Lpn::NONE`, `Ppn::NONE`). The two are distinct
//! types so that an LPN cannot be stored where a PPN belongs (the reverse map holds LPNs indexed
//! by PPN, the mapping table the other way round). Mapping tables take the raw numbers
//! (`MappingTable`): their encodings are arithmetic on them (runs, offsets, fitted lines), and
//! the FTL converts at that one boundary.

use std::fmt;

macro_rules! page_number {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
        #[repr(transparent)]
        pub struct $name(u32);

        impl $name {
            #[doc = concat!("No ", $what, ": an empty slot.")]
            pub const NONE: $name = $name(u32::MAX);

            #[inline(always)]
            pub const fn new(n: u32) -> Self {
                Self(n)
            }

            /// The number, as tables and files hold it.
            #[inline(always)]
            pub const fn get(self) -> u32 {
                self.0
            }

            /// The number as an index into a table of every page.
            #[inline(always)]
            pub const fn index(self) -> usize {
                self.0 as usize
            }

            #[inline(always)]
            pub const fn is_none(self) -> bool {
                self.0 == u32::MAX
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

page_number!(
    /// A logical page number: what the host addresses, byte offset / page size.
    Lpn,
    "logical page"
);
page_number!(
    /// A physical page number: where a page lives in flash.
    Ppn,
    "physical page"
);

/// No superblock (a frontier with none open, the end of a list of superblocks).
pub const NO_SUPERBLOCK: u32 = u32::MAX;
