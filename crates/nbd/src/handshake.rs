//! The handshake: the greeting, option haggling (STARTTLS, LIST, STRUCTURED_REPLY, meta
//! contexts, INFO and GO, EXPORT_NAME, ABORT) and the export it ends on.

use crate::error::{read_exact, send, write_error};
use crate::protocol as p;
use crate::{
    tls, transmission_flags, ConnectionError, Incoming, NbdOptions, Negotiated, Peer,
    ALLOCATION_CONTEXT_ID,
};
use ftlab_device::{policy, Device};
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
    let mut principal = peer.principal.clone();
    let principal = &mut principal;
    let tls_mode = options.tls.as_ref().map_or(tls::TlsMode::Off, |t| t.mode);
    let mut tls_on = false;
    send(w, &p::greeting())?;
    w.flush().map_err(write_error)?;
    let mut flags = [0u8; 4];
    read_exact(r, &mut flags, "client flags")?;
    let client_flags = u32::from_be_bytes(flags);
    if client_flags & p::CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(ConnectionError::NotFixedNewstyle);
    }
    let no_zeroes = client_flags & p::CLIENT_NO_ZEROES != 0;
    let mut structured = false;
    let mut allocation = false;
    let name_ok = |name: &str| device.export_named(name).is_some();
    // The export chosen by OPT_EXPORT_NAME or OPT_GO, either of which ends the haggling.
    let export;
    let io_allowed;
    // Option haggling.
    loop {
        let mut h = [0u8; 16];
        read_exact(r, &mut h, "option header")?;
        let header = p::parse_option_header(&h)?;
        if header.length > p::MAX_OPTION_BYTES {
            return Err(ConnectionError::OptionTooLong {
                option: header.option,
                length: header.length,
            });
        }
        let mut data = vec![0u8; header.length as usize];
        read_exact(r, &mut data, "option data")?;
        // FORCEDTLS: before TLS, only STARTTLS and ABORT are answered.
        if tls_mode == tls::TlsMode::Require
            && !tls_on
            && header.option != p::OPT_STARTTLS
            && header.option != p::OPT_ABORT
        {
            if header.option == p::OPT_EXPORT_NAME {
                return Err(ConnectionError::TlsRequired(
                    String::from_utf8_lossy(&data).into_owned(),
                ));
            }
            send(
                w,
                &p::option_reply(
                    header.option,
                    p::REP_ERR_TLS_REQD,
                    b"this server requires TLS: start it with NBD_OPT_STARTTLS",
                ),
            )?;
            w.flush().map_err(write_error)?;
            continue;
        }
        match header.option {
            p::OPT_STARTTLS => {
                let refusal: Option<(u32, &[u8])> = match &options.tls {
                    None => Some((
                        p::REP_ERR_POLICY,
                        b"TLS is not configured on this server (ftlab serve --tls-cert)",
                    )),
                    Some(t) if t.mode == tls::TlsMode::Off => Some((
                        p::REP_ERR_POLICY,
                        b"TLS is switched off on this server (--tls off)",
                    )),
                    Some(_) if tls_on => Some((p::REP_ERR_INVALID, b"TLS is on already")),
                    Some(_) if !data.is_empty() => {
                        Some((p::REP_ERR_INVALID, b"STARTTLS takes no data"))
                    }
                    Some(_) => None,
                };
                if let Some((error, message)) = refusal {
                    send(w, &p::option_reply(header.option, error, message))?;
                } else {
                    let setup = options.tls.as_ref().expect("checked above");
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                    w.flush().map_err(write_error)?;
                    // A client should wait for the ACK, but what it sent on is TLS already.
                    let early = r.buffer().to_vec();
                    std::io::BufRead::consume(r, early.len());
                    let slot = r.get_ref().inner.slot.clone();
                    let raw_w = &mut w.get_mut().inner;
                    match tls::start(setup, &slot, &early, r.get_mut(), raw_w) {
                        Ok(established) => {
                            tls_on = true;
                            principal.names.extend(established.names);
                            device.audit(
                                "tls",
                                serde_json::json!({
                                    "principal": principal.describe(),
                                    "address": peer.address,
                                    "version": established.version,
                                    "cipher": established.cipher,
                                }),
                            );
                        }
                        Err(why) => {
                            device.audit(
                                "tls_refused",
                                serde_json::json!({
                                    "principal": principal.describe(),
                                    "address": peer.address,
                                    "reason": why.to_string(),
                                }),
                            );
                            return Err(ConnectionError::Tls(why));
                        }
                    }
                    continue;
                }
            }
            p::OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                let Some(named) = device.export_named(&name) else {
                    return Err(ConnectionError::UnknownExport(name.into_owned()));
                };
                // This old option has no error reply: a denied client is disconnected.
                io_allowed = device.io_allowed(principal, named);
                if io_allowed == 0 {
                    return Err(ConnectionError::Denied(name.into_owned()));
                }
                export = named;
                send(w, &device.export_size_bytes(export).to_be_bytes())?;
                send(
                    w,
                    &transmission_flags(device, structured, export).to_be_bytes(),
                )?;
                if !no_zeroes {
                    send(w, &[0u8; 124])?;
                }
                break;
            }
            p::OPT_ABORT => {
                // The spec lets the client close without waiting for this ACK: a failed send
                // is no error.
                let _ = send(w, &p::option_reply(header.option, p::REP_ACK, &[]));
                let _ = w.flush();
                return Ok(None);
            }
            p::OPT_LIST => {
                if !data.is_empty() {
                    send(
                        w,
                        &p::option_reply(header.option, p::REP_ERR_INVALID, b"LIST takes no data"),
                    )?;
                } else {
                    // Each export, then each on every snapshot and clone.
                    let volumes = device.volumes();
                    let on = std::iter::once(None).chain(volumes.iter().skip(1).map(Some));
                    for v in on {
                        for (export, _) in device.export_sizes() {
                            let name = match v {
                                None => export,
                                Some(v) => format!("{export}@{}", v.name),
                            };
                            if !device.allows(principal, "list", &name) {
                                continue;
                            }
                            let mut d = (name.len() as u32).to_be_bytes().to_vec();
                            d.extend_from_slice(name.as_bytes());
                            send(w, &p::option_reply(header.option, p::REP_SERVER, &d))?;
                        }
                    }
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                }
            }
            p::OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    structured = true;
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                } else {
                    send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_INVALID,
                            b"STRUCTURED_REPLY takes no data",
                        ),
                    )?;
                }
            }
            p::OPT_LIST_META_CONTEXT | p::OPT_SET_META_CONTEXT => {
                let set = header.option == p::OPT_SET_META_CONTEXT;
                match p::parse_meta_context(&data) {
                    Err(e) => send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_INVALID,
                            e.to_string().as_bytes(),
                        ),
                    )?,
                    // Block status replies are structured: the spec asks for them first.
                    Ok(_) if !structured => send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_INVALID,
                            b"negotiate structured replies first",
                        ),
                    )?,
                    Ok(m) if !name_ok(&m.name) => send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_UNKNOWN,
                            format!("no export `{}`", m.name).as_bytes(),
                        ),
                    )?,
                    Ok(m) => {
                        // LIST with no query lists every context, and "base:" every one of
                        // that namespace; SET selects exact names (and replaces an earlier SET).
                        let matched = if set {
                            m.queries.iter().any(|q| q == p::BASE_ALLOCATION)
                        } else {
                            m.queries.is_empty()
                                || m.queries
                                    .iter()
                                    .any(|q| q == p::BASE_ALLOCATION || q == "base:")
                        };
                        if set {
                            allocation = matched;
                        }
                        if matched {
                            // LIST gives id 0: the ids mean something only after SET.
                            let id = if set { ALLOCATION_CONTEXT_ID } else { 0 };
                            let mut d = id.to_be_bytes().to_vec();
                            d.extend_from_slice(p::BASE_ALLOCATION.as_bytes());
                            send(w, &p::option_reply(header.option, p::REP_META_CONTEXT, &d))?;
                        }
                        send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                    }
                }
            }
            p::OPT_INFO | p::OPT_GO => match p::parse_go(&data) {
                Err(e) => send(
                    w,
                    &p::option_reply(header.option, p::REP_ERR_INVALID, e.to_string().as_bytes()),
                )?,
                Ok(go) if !name_ok(&go.name) => send(
                    w,
                    &p::option_reply(
                        header.option,
                        p::REP_ERR_UNKNOWN,
                        format!("no export `{}`", go.name).as_bytes(),
                    ),
                )?,
                Ok(go)
                    if device.io_allowed(
                        principal,
                        device.export_named(&go.name).expect("checked by name_ok"),
                    ) == 0 =>
                {
                    send(
                        w,
                        &p::option_reply(
                            header.option,
                            p::REP_ERR_POLICY,
                            format!(
                                "the access policy allows {} nothing on `{}`",
                                principal.describe(),
                                go.name
                            )
                            .as_bytes(),
                        ),
                    )?
                }
                Ok(go) => {
                    let named = device.export_named(&go.name).expect("checked by name_ok");
                    let info = p::info_export(
                        device.export_size_bytes(named),
                        transmission_flags(device, structured, named),
                    );
                    send(w, &p::option_reply(header.option, p::REP_INFO, &info))?;
                    // Any byte range works (partial pages are read-modify-writes); whole
                    // pages are what the device prefers.
                    let bs =
                        p::info_block_size(1, device.page_bytes() as u32, p::MAX_REQUEST_BYTES);
                    send(w, &p::option_reply(header.option, p::REP_INFO, &bs))?;
                    send(w, &p::option_reply(header.option, p::REP_ACK, &[]))?;
                    if header.option == p::OPT_GO {
                        export = named;
                        io_allowed = device.io_allowed(principal, named);
                        break;
                    }
                }
            },
            _ => send(
                w,
                &p::option_reply(header.option, p::REP_ERR_UNSUP, b"not supported by ftlab"),
            )?,
        }
        w.flush().map_err(write_error)?;
    }
    w.flush().map_err(write_error)?;
    Ok(Some((
        Negotiated {
            export,
            io_allowed,
            structured,
            allocation,
        },
        principal.clone(),
    )))
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
