//! The handshake: the greeting, option haggling (STARTTLS, LIST, STRUCTURED_REPLY, meta
//! contexts, INFO and GO, EXPORT_NAME, ABORT) and the export it ends on.

use crate::error::{read_exact, send, write_error};
use crate::protocol as p;
use crate::{
    tls, transmission_flags, ConnectionError, Incoming, NbdOptions, Negotiated, Peer,
    ALLOCATION_CONTEXT_ID,
};
use ftlab_device::{policy, Device, Target};
use std::io::{BufReader, BufWriter, Read, Write};
use std::time::{Duration, Instant};

/// The handshake, from the greeting to the option that starts transmission: what was negotiated
/// and the client's principal (its TLS certificate's names added), or None when the client
/// ended it in order (`NBD_OPT_ABORT`).
pub(crate) fn handshake<R: Incoming, W: Write>(
    device: &Device,
    options: &NbdOptions,
    peer: &Peer,
    r: &mut BufReader<Deadlined<tls::TlsReader<R>>>,
    w: &mut BufWriter<tls::TlsWriter<W>>,
) -> Result<Option<(Negotiated, policy::Principal)>, ConnectionError> {
    send(w, &p::greeting())?;
    w.flush().map_err(write_error)?;
    let mut flags = [0u8; 4];
    read_exact(r, &mut flags, "client flags")?;
    let client_flags = u32::from_be_bytes(flags);
    if client_flags & p::CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(ConnectionError::NotFixedNewstyle);
    }
    let mut h = Haggling {
        device,
        options,
        peer,
        r,
        w,
        principal: peer.principal.clone(),
        tls_mode: options.tls.as_ref().map_or(tls::TlsMode::Off, |t| t.mode),
        tls_on: false,
        no_zeroes: client_flags & p::CLIENT_NO_ZEROES != 0,
        structured: false,
        allocation: false,
    };
    let mut options_read = 0u32;
    loop {
        let mut header = [0u8; 16];
        // "No option header" would mislead once options came: the deadline ended a handshake
        // that went on too long, not one that never began.
        let what = if options_read == 0 {
            "option header"
        } else {
            "further option header (the handshake went on past its deadline)"
        };
        read_exact(h.r, &mut header, what)?;
        options_read += 1;
        let header = p::parse_option_header(&header)?;
        if header.length > p::MAX_OPTION_BYTES {
            return Err(ConnectionError::OptionTooLong {
                option: header.option,
                length: header.length,
            });
        }
        let mut data = vec![0u8; header.length as usize];
        read_exact(h.r, &mut data, "option data")?;
        let option = header.option;
        // FORCEDTLS: before TLS, only STARTTLS and ABORT are answered.
        let next = if h.tls_mode == tls::TlsMode::Require
            && !h.tls_on
            && option != p::OPT_STARTTLS
            && option != p::OPT_ABORT
        {
            h.before_tls(option, &data)?
        } else {
            match option {
                p::OPT_STARTTLS => h.starttls(&data)?,
                p::OPT_EXPORT_NAME => h.export_name(&data)?,
                p::OPT_ABORT => h.abort(),
                p::OPT_LIST => h.list(&data)?,
                p::OPT_STRUCTURED_REPLY => h.structured_reply(&data)?,
                p::OPT_LIST_META_CONTEXT | p::OPT_SET_META_CONTEXT => {
                    h.meta_context(option, &data)?
                }
                p::OPT_INFO | p::OPT_GO => h.info_or_go(option, &data)?,
                _ => h.reply(option, p::REP_ERR_UNSUP, b"not supported by ftlab")?,
            }
        };
        match next {
            Next::Haggle => h.w.flush().map_err(write_error)?,
            Next::Abort => return Ok(None),
            Next::Transmit { export, io_allowed } => {
                h.w.flush().map_err(write_error)?;
                return Ok(Some((
                    Negotiated {
                        export,
                        io_allowed,
                        structured: h.structured,
                        allocation: h.allocation,
                    },
                    h.principal,
                )));
            }
        }
    }
}

/// What the handshake does after an option.
enum Next {
    /// Reads the next option.
    Haggle,
    /// Ends in order, without an export (`NBD_OPT_ABORT`).
    Abort,
    /// Starts transmission on `export`, with the operations the policy allows there.
    Transmit { export: Target, io_allowed: u8 },
}

/// The handshake's state between options: one method per option.
struct Haggling<'a, R, W: Write> {
    device: &'a Device,
    options: &'a NbdOptions,
    peer: &'a Peer,
    r: &'a mut BufReader<Deadlined<tls::TlsReader<R>>>,
    w: &'a mut BufWriter<tls::TlsWriter<W>>,
    principal: policy::Principal,
    tls_mode: tls::TlsMode,
    tls_on: bool,
    /// The client asked for no 124 zero bytes after `NBD_OPT_EXPORT_NAME`'s reply.
    no_zeroes: bool,
    structured: bool,
    allocation: bool,
}

impl<R: Incoming, W: Write> Haggling<'_, R, W> {
    fn reply(&mut self, option: u32, kind: u32, data: &[u8]) -> Result<Next, ConnectionError> {
        send(self.w, &p::option_reply(option, kind, data))?;
        Ok(Next::Haggle)
    }

    fn name_ok(&self, name: &str) -> bool {
        self.device.export_named(name).is_some()
    }

    /// An option other than STARTTLS and ABORT while TLS is required and not on.
    fn before_tls(&mut self, option: u32, data: &[u8]) -> Result<Next, ConnectionError> {
        // A denial like any other: counted, and audited (once a minute per principal).
        self.device.denied(
            &self.principal,
            "connect",
            "-",
            &format!(
                "--tls require: option {option} in plaintext from {} before STARTTLS",
                self.peer.address
            ),
        );
        if option == p::OPT_EXPORT_NAME {
            // No error reply exists for it: the client is disconnected.
            return Err(ConnectionError::TlsRequired(
                String::from_utf8_lossy(data).into_owned(),
            ));
        }
        self.reply(
            option,
            p::REP_ERR_TLS_REQD,
            b"this server requires TLS: start it with NBD_OPT_STARTTLS",
        )
    }

    fn starttls(&mut self, data: &[u8]) -> Result<Next, ConnectionError> {
        let option = p::OPT_STARTTLS;
        let refusal: Option<(u32, &[u8])> = match &self.options.tls {
            None => Some((
                p::REP_ERR_POLICY,
                b"TLS is not configured on this server (ftlab serve --tls-cert)",
            )),
            Some(t) if t.mode == tls::TlsMode::Off => Some((
                p::REP_ERR_POLICY,
                b"TLS is switched off on this server (--tls off)",
            )),
            Some(_) if self.tls_on => Some((p::REP_ERR_INVALID, b"TLS is on already")),
            Some(_) if !data.is_empty() => Some((p::REP_ERR_INVALID, b"STARTTLS takes no data")),
            Some(_) => None,
        };
        if let Some((error, message)) = refusal {
            return self.reply(option, error, message);
        }
        let setup = self.options.tls.as_ref().expect("checked above");
        send(self.w, &p::option_reply(option, p::REP_ACK, &[]))?;
        self.w.flush().map_err(write_error)?;
        // A client should wait for the ACK, but what it sent on is TLS already.
        let early = self.r.buffer().to_vec();
        std::io::BufRead::consume(self.r, early.len());
        let slot = self.r.get_ref().inner.slot.clone();
        let raw_w = &mut self.w.get_mut().inner;
        match tls::start(setup, &slot, &early, self.r.get_mut(), raw_w) {
            Ok(established) => {
                self.tls_on = true;
                self.principal.names.extend(established.names);
                self.device.audit(
                    "tls",
                    serde_json::json!({
                        "principal": self.principal.to_json(),
                        "address": self.peer.address,
                        "version": established.version,
                        "cipher": established.cipher,
                    }),
                );
                Ok(Next::Haggle)
            }
            Err(why) => {
                self.device.audit(
                    "tls_refused",
                    serde_json::json!({
                        "principal": self.principal.to_json(),
                        "address": self.peer.address,
                        "reason": why.to_string(),
                    }),
                );
                Err(ConnectionError::Tls(why))
            }
        }
    }

    fn export_name(&mut self, data: &[u8]) -> Result<Next, ConnectionError> {
        let name = String::from_utf8_lossy(data);
        let Some(export) = self.device.export_named(&name) else {
            return Err(ConnectionError::UnknownExport(name.into_owned()));
        };
        // This old option has no error reply: a denied client is disconnected.
        let io_allowed = self.device.io_allowed(&self.principal, export);
        if io_allowed == 0 {
            return Err(ConnectionError::Denied(name.into_owned()));
        }
        send(self.w, &self.device.export_size_bytes(export).to_be_bytes())?;
        send(
            self.w,
            &transmission_flags(self.device, self.structured, export).to_be_bytes(),
        )?;
        if !self.no_zeroes {
            send(self.w, &[0u8; 124])?;
        }
        Ok(Next::Transmit { export, io_allowed })
    }

    fn abort(&mut self) -> Next {
        // The spec lets the client close without waiting for this ACK: a failed send is no
        // error.
        let _ = send(self.w, &p::option_reply(p::OPT_ABORT, p::REP_ACK, &[]));
        let _ = self.w.flush();
        Next::Abort
    }

    fn list(&mut self, data: &[u8]) -> Result<Next, ConnectionError> {
        let option = p::OPT_LIST;
        if !data.is_empty() {
            return self.reply(option, p::REP_ERR_INVALID, b"LIST takes no data");
        }
        // Each export, then each on every snapshot and clone.
        let volumes = self.device.volumes();
        let on = std::iter::once(None).chain(volumes.iter().skip(1).map(Some));
        for v in on {
            for (export, _) in self.device.export_sizes() {
                let name = match v {
                    None => export,
                    Some(v) => format!("{export}@{}", v.name),
                };
                if !self.device.allows(&self.principal, "list", &name) {
                    continue;
                }
                let mut d = (name.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(name.as_bytes());
                self.reply(option, p::REP_SERVER, &d)?;
            }
        }
        self.reply(option, p::REP_ACK, &[])
    }

    fn structured_reply(&mut self, data: &[u8]) -> Result<Next, ConnectionError> {
        let option = p::OPT_STRUCTURED_REPLY;
        if !data.is_empty() {
            return self.reply(
                option,
                p::REP_ERR_INVALID,
                b"STRUCTURED_REPLY takes no data",
            );
        }
        self.structured = true;
        self.reply(option, p::REP_ACK, &[])
    }

    /// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
    fn meta_context(&mut self, option: u32, data: &[u8]) -> Result<Next, ConnectionError> {
        let set = option == p::OPT_SET_META_CONTEXT;
        let m = match p::parse_meta_context(data) {
            Err(e) => return self.reply(option, p::REP_ERR_INVALID, e.to_string().as_bytes()),
            Ok(m) => m,
        };
        // Block status replies are structured: the spec asks for them first.
        if !self.structured {
            return self.reply(
                option,
                p::REP_ERR_INVALID,
                b"negotiate structured replies first",
            );
        }
        if !self.name_ok(&m.name) {
            let message = format!("no export `{}`", m.name);
            return self.reply(option, p::REP_ERR_UNKNOWN, message.as_bytes());
        }
        // LIST with no query lists every context, and "base:" every one of that namespace;
        // SET selects exact names (and replaces an earlier SET).
        let matched = if set {
            m.queries.iter().any(|q| q == p::BASE_ALLOCATION)
        } else {
            m.queries.is_empty()
                || m.queries
                    .iter()
                    .any(|q| q == p::BASE_ALLOCATION || q == "base:")
        };
        if set {
            self.allocation = matched;
        }
        if matched {
            // LIST gives id 0: the ids mean something only after SET.
            let id = if set { ALLOCATION_CONTEXT_ID } else { 0 };
            let mut d = id.to_be_bytes().to_vec();
            d.extend_from_slice(p::BASE_ALLOCATION.as_bytes());
            self.reply(option, p::REP_META_CONTEXT, &d)?;
        }
        self.reply(option, p::REP_ACK, &[])
    }

    /// `NBD_OPT_INFO` and `NBD_OPT_GO` (which then starts transmission).
    fn info_or_go(&mut self, option: u32, data: &[u8]) -> Result<Next, ConnectionError> {
        let go = match p::parse_go(data) {
            Err(e) => return self.reply(option, p::REP_ERR_INVALID, e.to_string().as_bytes()),
            Ok(go) => go,
        };
        let Some(export) = self.device.export_named(&go.name) else {
            let message = format!("no export `{}`", go.name);
            return self.reply(option, p::REP_ERR_UNKNOWN, message.as_bytes());
        };
        let io_allowed = self.device.io_allowed(&self.principal, export);
        if io_allowed == 0 {
            let message = format!(
                "the access policy allows {} nothing on `{}`",
                self.principal.describe(),
                go.name
            );
            return self.reply(option, p::REP_ERR_POLICY, message.as_bytes());
        }
        let info = p::info_export(
            self.device.export_size_bytes(export),
            transmission_flags(self.device, self.structured, export),
        );
        self.reply(option, p::REP_INFO, &info)?;
        // Any byte range works (partial pages are read-modify-writes); whole pages are what
        // the device prefers.
        let bs = p::info_block_size(1, self.device.page_bytes() as u32, p::MAX_REQUEST_BYTES);
        self.reply(option, p::REP_INFO, &bs)?;
        self.reply(option, p::REP_ACK, &[])?;
        Ok(if option == p::OPT_GO {
            Next::Transmit { export, io_allowed }
        } else {
            Next::Haggle
        })
    }
}

/// A connection's read side whose every read waits at most until `deadline`, while one is set
/// (the handshake's). The socket's timeout is set before each read to the time left, so a client
/// trickling a byte at a time cannot stretch the deadline.
pub(crate) struct Deadlined<R> {
    pub(crate) inner: R,
    pub(crate) deadline: Option<Instant>,
}

impl<R: Incoming> Read for Deadlined<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.inner.set_read_timeout(Some(left))?;
        }
        self.inner.read(buf)
    }
}

impl<R: Incoming> Incoming for Deadlined<R> {
    fn bytes_waiting(&self) -> bool {
        self.inner.bytes_waiting()
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.inner.set_read_timeout(timeout)
    }
}
