//! Serde helpers for the FTL model's saved state (`ConfiguredFtl::save`): arrays longer than 32
//! (serde derives them up to 32 only), as a sequence whose length is checked when read; and
//! vectors whose capacity is part of the model (the report's DRAM figures count capacities,
//! and the tables account for growth by them), saved with it so a restored model reports and
//! grows as the saved one would.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `#[serde(with = "ftlab_core::serde_state::boxed")]` on a `Box<[T; N]>`.
pub mod boxed {
    use super::*;

    pub fn serialize<S: Serializer, T: Serialize, const N: usize>(
        a: &[T; N],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        a.as_slice().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>, const N: usize>(
        d: D,
    ) -> Result<Box<[T; N]>, D::Error> {
        let v = Vec::<T>::deserialize(d)?;
        let n = v.len();
        v.into_boxed_slice()
            .try_into()
            .map_err(|_| D::Error::invalid_length(n, &"the array's length"))
    }
}

/// `#[serde(with = "ftlab_core::serde_state::inline")]` on a `[T; N]`.
pub mod inline {
    use super::*;

    pub use super::boxed::serialize;

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>, const N: usize>(
        d: D,
    ) -> Result<[T; N], D::Error> {
        let v = Vec::<T>::deserialize(d)?;
        let n = v.len();
        v.try_into()
            .map_err(|_| D::Error::invalid_length(n, &"the array's length"))
    }
}

/// `#[serde(with = "ftlab_core::serde_state::boxed_options")]` on a `Vec<Option<Box<[T; N]>>>`.
pub mod boxed_options {
    use super::*;

    /// Chunks that may be absent, each boxed.
    type Chunks<T, const N: usize> = Vec<Option<Box<[T; N]>>>;

    #[derive(Serialize)]
    struct Out<'a, T: Serialize, const N: usize>(#[serde(with = "super::boxed")] &'a [T; N]);

    pub fn serialize<S: Serializer, T: Serialize, const N: usize>(
        v: &Chunks<T, N>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let items: Vec<Option<Out<'_, T, N>>> = v.iter().map(|o| o.as_deref().map(Out)).collect();
        (v.capacity(), items).serialize(s)
    }

    #[derive(Deserialize)]
    #[serde(bound = "T: Deserialize<'de>")]
    struct In<T, const N: usize>(#[serde(with = "super::boxed")] Box<[T; N]>);

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>, const N: usize>(
        d: D,
    ) -> Result<Chunks<T, N>, D::Error> {
        let (capacity, v) = <(usize, Vec<Option<In<T, N>>>)>::deserialize(d)?;
        Ok(with_capacity(
            capacity,
            v.into_iter().map(|o| o.map(|In(b)| b)),
        ))
    }
}

/// `#[serde(with = "ftlab_core::serde_state::vec_inline")]` on a `Vec<[T; N]>`, its capacity
/// kept.
pub mod vec_inline {
    use super::*;

    #[derive(Serialize)]
    struct Out<'a, T: Serialize, const N: usize>(#[serde(with = "super::inline")] &'a [T; N]);

    /// With its capacity, as `keep_capacity`.
    #[allow(clippy::ptr_arg)]
    pub fn serialize<S: Serializer, T: Serialize, const N: usize>(
        v: &Vec<[T; N]>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let items: Vec<Out<'_, T, N>> = v.iter().map(Out).collect();
        (v.capacity(), items).serialize(s)
    }

    #[derive(Deserialize)]
    #[serde(bound = "T: Deserialize<'de>")]
    struct In<T, const N: usize>(#[serde(with = "super::inline")] [T; N]);

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>, const N: usize>(
        d: D,
    ) -> Result<Vec<[T; N]>, D::Error> {
        let (capacity, v) = <(usize, Vec<In<T, N>>)>::deserialize(d)?;
        Ok(with_capacity(capacity, v.into_iter().map(|In(a)| a)))
    }
}

/// A vector of `items` with `capacity` (at least the items'), as the saved one had.
fn with_capacity<T>(capacity: usize, items: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    let mut v = Vec::with_capacity(bounded(capacity, items.len()));
    v.extend(items);
    v
}

/// A saved capacity, at least the items' and at most a few times more: a damaged one does
/// not allocate more.
fn bounded(capacity: usize, items: usize) -> usize {
    capacity.clamp(items, items.max(16) * 64)
}

/// A growable sequence whose capacity is saved (`Vec`, `VecDeque`).
pub trait Growable: Sized {
    type Item;
    fn capacity_of(&self) -> usize;
    fn items(&self) -> impl Iterator<Item = &Self::Item>;
    fn len_of(&self) -> usize;
    fn with_items(capacity: usize, items: Vec<Self::Item>) -> Self;
}

impl<T> Growable for Vec<T> {
    type Item = T;
    fn capacity_of(&self) -> usize {
        self.capacity()
    }
    fn items(&self) -> impl Iterator<Item = &T> {
        self.iter()
    }
    fn len_of(&self) -> usize {
        self.len()
    }
    fn with_items(capacity: usize, items: Vec<T>) -> Self {
        with_capacity(capacity, items.into_iter())
    }
}

impl<T> Growable for std::collections::VecDeque<T> {
    type Item = T;
    fn capacity_of(&self) -> usize {
        self.capacity()
    }
    fn items(&self) -> impl Iterator<Item = &T> {
        self.iter()
    }
    fn len_of(&self) -> usize {
        self.len()
    }
    fn with_items(capacity: usize, items: Vec<T>) -> Self {
        let mut v = std::collections::VecDeque::with_capacity(bounded(capacity, items.len()));
        v.extend(items);
        v
    }
}

/// `#[serde(with = "ftlab_core::serde_state::keep_capacity")]` on a `Vec<T>` or `VecDeque<T>`.
pub mod keep_capacity {
    use super::*;

    pub fn serialize<S: Serializer, C: Growable>(v: &C, s: S) -> Result<S::Ok, S::Error>
    where
        C::Item: Serialize,
    {
        use serde::ser::SerializeTuple;
        struct Items<'a, C: Growable>(&'a C);
        impl<C: Growable> Serialize for Items<'_, C>
        where
            C::Item: Serialize,
        {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.items())
            }
        }
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&v.capacity_of())?;
        t.serialize_element(&Items(v))?;
        t.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>, C: Growable>(d: D) -> Result<C, D::Error>
    where
        C::Item: Deserialize<'de>,
    {
        let (capacity, v) = <(usize, Vec<C::Item>)>::deserialize(d)?;
        Ok(C::with_items(capacity, v))
    }
}

/// `#[serde(with = "ftlab_core::serde_state::keep_capacity_nested")]` on a `Vec` of `Vec`s or
/// `VecDeque`s: each capacity kept.
pub mod keep_capacity_nested {
    use super::*;

    struct Out<'a, C: Growable>(&'a C);
    impl<C: Growable> Serialize for Out<'_, C>
    where
        C::Item: Serialize,
    {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            super::keep_capacity::serialize(self.0, s)
        }
    }

    struct In<C>(C);
    impl<'de, C: Growable> Deserialize<'de> for In<C>
    where
        C::Item: Deserialize<'de>,
    {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            super::keep_capacity::deserialize(d).map(In)
        }
    }

    #[allow(clippy::ptr_arg)]
    pub fn serialize<S: Serializer, C: Growable>(v: &Vec<C>, s: S) -> Result<S::Ok, S::Error>
    where
        C::Item: Serialize,
    {
        let items: Vec<Out<'_, C>> = v.iter().map(Out).collect();
        (v.capacity(), items).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, C: Growable>(d: D) -> Result<Vec<C>, D::Error>
    where
        C::Item: Deserialize<'de>,
    {
        let (capacity, v) = <(usize, Vec<In<C>>)>::deserialize(d)?;
        Ok(with_capacity(capacity, v.into_iter().map(|In(x)| x)))
    }
}

/// A fixed-width number an array of which is saved as one byte string (`words`).
pub trait Word: Copy {
    const BYTES: usize;
    /// Into exactly `BYTES` bytes.
    fn put(self, out: &mut [u8]);
    fn take(bytes: &[u8]) -> Self;
}

macro_rules! word {
    ($t:ty, $n:literal, $to:expr, $from:expr) => {
        impl Word for $t {
            const BYTES: usize = $n;
            #[inline(always)]
            fn put(self, out: &mut [u8]) {
                out.copy_from_slice(&$to(self));
            }
            #[inline(always)]
            fn take(bytes: &[u8]) -> Self {
                $from(bytes.try_into().expect("a word's bytes"))
            }
        }
    };
}
word!(u32, 4, u32::to_le_bytes, u32::from_le_bytes);
word!(u64, 8, u64::to_le_bytes, u64::from_le_bytes);
word!(
    crate::addr::Lpn,
    4,
    |l: crate::addr::Lpn| l.get().to_le_bytes(),
    |b| crate::addr::Lpn::new(u32::from_le_bytes(b))
);
word!(
    crate::addr::Ppn,
    4,
    |p: crate::addr::Ppn| p.get().to_le_bytes(),
    |b| crate::addr::Ppn::new(u32::from_le_bytes(b))
);

/// `#[serde(with = "ftlab_core::serde_state::words")]` on a large `Vec` of numbers (a table of
/// every physical or logical page): saved as its capacity and one little-endian byte string,
/// which a binary format copies whole. Element by element, the reverse map of a 16 GiB device
/// took most of a checkpoint's time.
pub mod words {
    use super::*;

    #[allow(clippy::ptr_arg)]
    pub fn serialize<S: Serializer, T: Word>(v: &Vec<T>, s: S) -> Result<S::Ok, S::Error> {
        struct Bytes<'a, T>(&'a [T]);
        impl<T: Word> Serialize for Bytes<'_, T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                // Into chunks of a buffer made whole first: a loop the compiler turns into copies.
                let mut out = vec![0u8; self.0.len() * T::BYTES];
                for (&w, chunk) in self.0.iter().zip(out.chunks_exact_mut(T::BYTES)) {
                    w.put(chunk);
                }
                s.serialize_bytes(&out)
            }
        }
        (v.capacity(), Bytes(v)).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Word>(d: D) -> Result<Vec<T>, D::Error> {
        struct Bytes(Vec<u8>);
        impl<'de> Deserialize<'de> for Bytes {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = Vec<u8>;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("bytes")
                    }
                    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                        Ok(v.to_vec())
                    }
                    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                        Ok(v)
                    }
                }
                d.deserialize_byte_buf(V).map(Bytes)
            }
        }
        let (capacity, Bytes(bytes)) = <(usize, Bytes)>::deserialize(d)?;
        if !bytes.len().is_multiple_of(T::BYTES) {
            return Err(D::Error::invalid_length(bytes.len(), &"whole words"));
        }
        Ok(with_capacity(
            capacity,
            bytes.chunks_exact(T::BYTES).map(T::take),
        ))
    }
}
