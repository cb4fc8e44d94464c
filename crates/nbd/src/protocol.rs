//! The NBD wire protocol (fixed newstyle handshake, simple and structured replies), as pure functions over
//! bytes so that the parsers can be fuzzed and tested without sockets.
//! Reference: NetworkBlockDevice/nbd doc/proto.md.

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1;
pub const CLIENT_NO_ZEROES: u32 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// The server will not go on before TLS is started (FORCEDTLS).
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// The server's policy does not allow it (the NBD spec's NBD_REP_ERR_POLICY).
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TF_HAS_FLAGS: u16 = 1;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// The spec's name of a command, for messages.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_CACHE => "CACHE",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "an unknown command",
    }
}

pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// `base:allocation` block status flags: the range is a hole (not allocated), and reads as zeros.
pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;
/// The one metadata context ftlab offers.
pub const BASE_ALLOCATION: &str = "base:allocation";

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
/// The server is shutting down (the client must then disconnect).
pub const ESHUTDOWN: u32 = 108;

/// Options longer than this are refused by closing the connection (no option needs more).
pub const MAX_OPTION_BYTES: u32 = 64 << 10;
/// Largest request payload accepted (the advertised maximum block size).
pub const MAX_REQUEST_BYTES: u32 = 32 << 20;

/// The server's opening: magic, IHAVEOPT, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut g = [0u8; 18];
    g[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    g[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// What is wrong with bytes a client sent (a violation of the protocol: the connection ends).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("option magic {0:#x} is not IHAVEOPT")]
    OptionMagic(u64),
    #[error("request magic {0:#x} is not {REQUEST_MAGIC:#x}")]
    RequestMagic(u32),
    /// Option data shorter than its fields say.
    #[error("option data ends at byte {len} of {needed}")]
    Truncated { len: usize, needed: usize },
    /// Option data longer than its fields.
    #[error("option data is {len} bytes, its fields {fields}")]
    TrailingBytes { len: usize, fields: usize },
    #[error("export name of {0} bytes (at most 4096)")]
    NameTooLong(usize),
    #[error("export name is not UTF-8")]
    NameNotUtf8,
    #[error("a query of {0} bytes (at most 4096)")]
    QueryTooLong(usize),
    #[error("a query is not UTF-8")]
    QueryNotUtf8,
}

/// An option header: IHAVEOPT, option, length.
#[derive(Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

pub fn parse_option_header(b: &[u8; 16]) -> Result<OptionHeader, ProtocolError> {
    let magic = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
    if magic != IHAVEOPT {
        return Err(ProtocolError::OptionMagic(magic));
    }
    Ok(OptionHeader {
        option: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
        length: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
    })
}

/// An option reply: magic, option, type, length, data.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&reply.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// NBD_OPT_GO / NBD_OPT_INFO data: the export name and the information requests.
#[derive(Debug, PartialEq, Eq)]
pub struct GoRequest {
    pub name: String,
    pub info_requests: Vec<u16>,
}

pub fn parse_go(data: &[u8]) -> Result<GoRequest, ProtocolError> {
    let take = |at: usize, n: usize| -> Result<&[u8], ProtocolError> {
        data.get(at..at + n).ok_or(ProtocolError::Truncated {
            len: data.len(),
            needed: at + n,
        })
    };
    let name_len = u32::from_be_bytes(take(0, 4)?.try_into().expect("4 bytes")) as usize;
    if name_len > 4096 {
        return Err(ProtocolError::NameTooLong(name_len));
    }
    let name = std::str::from_utf8(take(4, name_len)?)
        .map_err(|_| ProtocolError::NameNotUtf8)?
        .to_string();
    let n = u16::from_be_bytes(take(4 + name_len, 2)?.try_into().expect("2 bytes")) as usize;
    let mut info_requests = Vec::with_capacity(n);
    for i in 0..n {
        let at = 6 + name_len + 2 * i;
        info_requests.push(u16::from_be_bytes(
            take(at, 2)?.try_into().expect("2 bytes"),
        ));
    }
    if data.len() != 6 + name_len + 2 * n {
        return Err(ProtocolError::TrailingBytes {
            len: data.len(),
            fields: 6 + name_len + 2 * n,
        });
    }
    Ok(GoRequest {
        name,
        info_requests,
    })
}

/// `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` data: the export and the queries.
#[derive(Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub name: String,
    pub queries: Vec<String>,
}

pub fn parse_meta_context(data: &[u8]) -> Result<MetaContextRequest, ProtocolError> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], ProtocolError> {
        let bytes = data
            .get(at..at.saturating_add(n))
            .ok_or(ProtocolError::Truncated {
                len: data.len(),
                needed: at + n,
            })?;
        at += n;
        Ok(bytes)
    };
    let u32_at = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize;
    let name_len = u32_at(take(4)?);
    if name_len > 4096 {
        return Err(ProtocolError::NameTooLong(name_len));
    }
    let name = std::str::from_utf8(take(name_len)?)
        .map_err(|_| ProtocolError::NameNotUtf8)?
        .to_string();
    let n = u32_at(take(4)?);
    // Each query takes 4 bytes at least, so the option's bounded length bounds them.
    let mut queries = Vec::new();
    for _ in 0..n {
        let len = u32_at(take(4)?);
        if len > 4096 {
            return Err(ProtocolError::QueryTooLong(len));
        }
        let query = std::str::from_utf8(take(len)?).map_err(|_| ProtocolError::QueryNotUtf8)?;
        queries.push(query.to_string());
    }
    if at != data.len() {
        return Err(ProtocolError::TrailingBytes {
            len: data.len(),
            fields: at,
        });
    }
    Ok(MetaContextRequest { name, queries })
}

/// A block status chunk for context `id`: descriptors of (length, flags), the final chunk.
pub fn block_status_reply(cookie: u64, id: u32, descriptors: &[(u32, u32)]) -> Vec<u8> {
    let length = 4 + 8 * descriptors.len() as u32;
    let mut v =
        structured_reply_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, length).to_vec();
    v.extend_from_slice(&id.to_be_bytes());
    for &(len, flags) in descriptors {
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
    }
    v
}

pub fn info_export(size_bytes: u64, flags: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    v.extend_from_slice(&size_bytes.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    v
}

pub fn info_block_size(minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(14);
    v.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    v.extend_from_slice(&minimum.to_be_bytes());
    v.extend_from_slice(&preferred.to_be_bytes());
    v.extend_from_slice(&maximum.to_be_bytes());
    v
}

/// A transmission request header (28 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn parse_request(b: &[u8; 28]) -> Result<Request, ProtocolError> {
    let magic = u32::from_be_bytes(b[..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::RequestMagic(magic));
    }
    Ok(Request {
        flags: u16::from_be_bytes(b[4..6].try_into().expect("2 bytes")),
        command: u16::from_be_bytes(b[6..8].try_into().expect("2 bytes")),
        cookie: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        length: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
    })
}

pub fn simple_reply_header(error: u32, cookie: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..].copy_from_slice(&cookie.to_be_bytes());
    h
}

/// A structured reply chunk's header; `length` is the payload's.
pub fn structured_reply_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..].copy_from_slice(&length.to_be_bytes());
    h
}

/// A final NBD_REPLY_TYPE_ERROR chunk: the error and a message for humans.
pub fn structured_error(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(4096)];
    let mut v = structured_reply_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + message.len() as u32,
    )
    .to_vec();
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(message.len() as u16).to_be_bytes());
    v.extend_from_slice(message);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_data_round_trips_and_malformed_data_is_refused() {
        let mut d = Vec::new();
        d.extend_from_slice(&5u32.to_be_bytes());
        d.extend_from_slice(b"ftlab");
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(
            parse_go(&d).unwrap(),
            GoRequest {
                name: "ftlab".into(),
                info_requests: vec![3]
            }
        );
        assert!(parse_go(&d[..d.len() - 1]).is_err());
        let mut long = d.clone();
        long.push(0);
        assert!(parse_go(&long).is_err());
        assert!(parse_go(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn request_headers_parse_and_bad_magic_is_named() {
        let mut b = [0u8; 28];
        b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        b[8..16].copy_from_slice(&7u64.to_be_bytes());
        b[16..24].copy_from_slice(&4096u64.to_be_bytes());
        b[24..].copy_from_slice(&512u32.to_be_bytes());
        let r = parse_request(&b).unwrap();
        assert_eq!(
            (r.command, r.cookie, r.offset, r.length),
            (CMD_WRITE, 7, 4096, 512)
        );
        b[0] = 0;
        assert!(parse_request(&b).unwrap_err().to_string().contains("magic"));
    }
}
