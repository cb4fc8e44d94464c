//! What people write on a command line or in a file name's options: sizes (`64M`, `4k`,
//! `1G`), with the one parser every front end shares, and named choices (`--latency real`).

/// Why a size did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("`{0}` is not a size (bytes, or a number with K, M, G or T)")]
    NotASize(String),
    #[error("`{0}`: the size must be between 1 byte and 2^64")]
    OutOfRange(String),
}

/// A name that is none of the choices a setting takes: "`{value}`: {what} is {choices}".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{value}`: {what} is {choices}")]
pub struct UnknownChoice {
    pub value: String,
    /// The setting, as a sentence names it ("the cache policy").
    pub what: &'static str,
    /// The choices, as a sentence lists them ("arc or lru").
    pub choices: &'static str,
}

impl UnknownChoice {
    pub fn new(value: &str, what: &'static str, choices: &'static str) -> Self {
        Self {
            value: value.to_string(),
            what,
            choices,
        }
    }
}

/// Bytes, or a whole number with a binary suffix `K`, `M`, `G` or `T` (either case): `64M` is
/// 64 MiB. Surrounding spaces are ignored; zero is refused.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| SizeError::NotASize(text.to_string()))?;
    n.checked_mul(1 << shift)
        .filter(|&b| b > 0)
        .ok_or_else(|| SizeError::OutOfRange(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes_and_nonsense_is_named() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4 << 10));
        assert_eq!(parse_size(" 64M "), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("0"), Err(SizeError::OutOfRange("0".into())));
        assert_eq!(
            parse_size("16777216T"),
            Err(SizeError::OutOfRange("16777216T".into()))
        );
        for bad in ["", "M", "1.5G", "-1", "12Q", "1 G"] {
            assert_eq!(
                parse_size(bad),
                Err(SizeError::NotASize(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            parse_size("12Q").unwrap_err().to_string(),
            "`12Q` is not a size (bytes, or a number with K, M, G or T)"
        );
    }
}
