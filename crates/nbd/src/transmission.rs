//! The transmission phase: requests read by a connection's workers in turn, each executed on
//! the device (or answered from its block status) and its reply handed on.

use crate::error::{read_error, read_exact, ConnectionError};
use crate::protocol as p;
use crate::{
    device_command, errno, Incoming, Negotiated, ALLOCATION_CONTEXT_ID, MAX_STATUS_DESCRIPTORS,
    MAX_STATUS_SCAN_BYTES,
};
use ftlab_core::request::Op;
use ftlab_device::{budget, policy, Allocation, Device, Latency, Target, BATCH_PAGES};
use std::io::{BufReader, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Threads per connection, each reading and executing requests in turn: enough to keep both
/// cores busy.
const WORKERS_PER_CONNECTION: usize = 2;
/// A request counts as alone (and may use the store's thread pool) only after this many requests
/// in a row were read alone: a client with several requests in flight is often briefly alone
/// (its next request still on the way), and the pool's hand-offs then cost more than they save.
const QUIET_REQUESTS: u32 = 8;

/// A worker keeps a write payload buffer up to this size for the next request (1 MiB requests
/// reuse one: a fresh buffer per request would cost the kernel a page clear per 4 KiB); a larger
/// one is freed after its request, so an idle connection holds little.
const KEEP_PAYLOAD_BYTES: usize = (1 << 20) + (64 << 10);

/// A write's payload is read in pieces of this size, its buffer grown as they arrive: a header
/// announcing 32 MiB costs no memory until the bytes come.
const PAYLOAD_PIECE_BYTES: usize = 256 << 10;

/// Reads requests until DISC or end of stream and executes them, several in flight at once
/// (NBD replies carry the request's cookie, so they may leave in any order); hands each reply to
/// `deliver` with how long to hold it and the count of requests read and not yet delivered,
/// which `deliver` decrements. Returns once every request read has been answered.
///
/// Leader/follower, as nbdkit's threads: each worker takes the reader, reads one request and its
/// payload, lets go, executes it and delivers the reply. A dedicated reader thread handing
/// requests to workers over a channel cost a thread wake-up per request, which for 4 KiB
/// requests was a fifth of the server's time.
///
/// Each request is charged to the connection's `share` of the memory budget before its payload
/// or reply exists, and `deliver` drops the charge once the reply has left.
pub(crate) fn transmission<'d, R: Incoming + Send>(
    device: &'d Device,
    share: &'d budget::ConnectionShare,
    principal: &'d policy::Principal,
    negotiated: Negotiated,
    r: &mut BufReader<R>,
    deliver: impl Fn(
            Vec<u8>,
            Duration,
            Timing,
            &AtomicUsize,
            budget::Charge<'d>,
        ) -> Result<(), ConnectionError>
        + Sync,
) -> Result<(), ConnectionError> {
    // (reader, done, requests read alone in a row).
    let reader = Mutex::new((r, false, 0u32));
    let in_flight = AtomicUsize::new(0);
    let failed: Mutex<Option<ConnectionError>> = Mutex::new(None);
    let fail = |e: ConnectionError| {
        failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    };
    std::thread::scope(|scope| {
        for _ in 0..WORKERS_PER_CONNECTION {
            scope.spawn(|| {
                let mut payload = Vec::new();
                loop {
                    let (request, charge, alone, read_at) = {
                        let mut guard = reader.lock().unwrap_or_else(|p| p.into_inner());
                        let (r, done, quiet) = &mut *guard;
                        if *done {
                            return;
                        }
                        match read_request(r, &mut payload, device.budget(), share) {
                            Ok(Some((request, charge, arrived))) => {
                                let in_flight = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                                // Asked only where the answer is used (a syscall).
                                let big =
                                    request.length as usize >= BATCH_PAGES * device.page_bytes();
                                let alone_now = in_flight == 1
                                    && !(big
                                        && (!r.buffer().is_empty() || r.get_ref().bytes_waiting()));
                                *quiet = if alone_now {
                                    quiet.saturating_add(1)
                                } else {
                                    0
                                };
                                // A nonzero count already says this request is alone.
                                (request, charge, *quiet >= QUIET_REQUESTS, arrived)
                            }
                            Ok(None) => {
                                *done = true;
                                return;
                            }
                            Err(e) => {
                                *done = true;
                                fail(e);
                                return;
                            }
                        }
                    };
                    let length = match request.command {
                        p::CMD_WRITE => request.length as usize,
                        _ => 0,
                    };
                    let reply = answer(
                        device,
                        principal,
                        negotiated,
                        &request,
                        &payload[..length],
                        alone,
                        read_at,
                    );
                    // An idle connection keeps no large buffer (its charge is returned with the
                    // reply; this memory would otherwise stay with the connection).
                    if payload.capacity() > KEEP_PAYLOAD_BYTES {
                        payload = Vec::new();
                    }
                    let timing = Timing {
                        read_at,
                        op: match request.command {
                            p::CMD_READ => Some(Op::Read),
                            p::CMD_WRITE | p::CMD_WRITE_ZEROES => Some(Op::Write),
                            p::CMD_TRIM => Some(Op::Trim),
                            p::CMD_FLUSH => Some(Op::Flush),
                            _ => None,
                        },
                    };
                    if let Err(e) = deliver(reply.0, reply.1, timing, &in_flight, charge) {
                        reader.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
                        fail(e);
                        return;
                    }
                }
            });
        }
    });
    failed
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .map_or(Ok(()), Err)
}

/// A request read: the request, what it is charged, and when its header arrived.
type RequestRead<'d> = (p::Request, budget::Charge<'d>, Instant);

/// The next request, its payload (of a write) at the front of `payload`, what it is charged
/// (its payload or reply bytes, charged before they are read or made: `budget`) and when its
/// header was read (the host's submission: a write's payload transfer is the device's time, as
/// a DMA is); None at DISC or end of stream.
fn read_request<'d, R: Read>(
    r: &mut BufReader<R>,
    payload: &mut Vec<u8>,
    budget: &'d budget::InflightBudget,
    share: &'d budget::ConnectionShare,
) -> Result<Option<RequestRead<'d>>, ConnectionError> {
    let mut h = [0u8; 28];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(read_error(e, "request")),
    }
    let arrived = Instant::now();
    let request = p::parse_request(&h)?;
    let data_bytes = match request.command {
        p::CMD_DISC => return Ok(None),
        p::CMD_WRITE if request.length > p::MAX_REQUEST_BYTES => {
            return Err(ConnectionError::WriteTooLong(request.length))
        }
        p::CMD_WRITE => request.length,
        // A longer read is refused, with no data.
        p::CMD_READ if request.length <= p::MAX_REQUEST_BYTES => request.length,
        p::CMD_BLOCK_STATUS => 8 * MAX_STATUS_DESCRIPTORS as u32,
        _ => 0,
    };
    // May wait: while it does, this connection reads nothing more.
    let charge = budget.charge(
        share,
        u64::from(data_bytes) + budget::REQUEST_OVERHEAD_BYTES,
    );
    if request.command == p::CMD_WRITE {
        // The buffer is reused request after request (and never cleared): a fresh megabyte
        // per request would come from mmap and cost the kernel a page clear per 4 KiB. It grows
        // piece by piece as the bytes arrive, so a header alone costs no memory.
        let length = request.length as usize;
        let mut at = 0;
        while at < length {
            let end = (at + PAYLOAD_PIECE_BYTES).min(length);
            if payload.len() < end {
                payload.resize(end, 0);
            }
            read_exact(r, &mut payload[at..end], "write payload")?;
            at = end;
        }
    }
    Ok(Some((request, charge, arrived)))
}

/// Executes one request: the reply bytes and how long to hold them. With structured replies
/// negotiated, a read's data goes in one final OFFSET_DATA chunk and every error in an ERROR
/// chunk carrying a message; other successes keep the simple reply, as the spec allows. A read's
/// data is written behind room for its reply header, so the reply is that one buffer (charged to
/// the request before it exists: `budget`).
fn answer(
    device: &Device,
    principal: &policy::Principal,
    negotiated: Negotiated,
    request: &p::Request,
    payload: &[u8],
    alone: bool,
    arrived: Instant,
) -> (Vec<u8>, Duration) {
    let structured = negotiated.structured;
    if request.command == p::CMD_BLOCK_STATUS && !device.draining() {
        // Allowed only with the context negotiated (so structured replies too).
        let status = if negotiated.allocation {
            block_status(device, request, negotiated.export)
        } else {
            Err(p::EINVAL)
        };
        let reply = match status {
            Ok(descriptors) => {
                p::block_status_reply(request.cookie, ALLOCATION_CONTEXT_ID, &descriptors)
            }
            Err(errno) => error_reply(device, structured, request, errno),
        };
        return (reply, Duration::ZERO);
    }
    // Structured: the chunk header and the data's offset; simple: the reply header.
    let head = if structured { 20 + 8 } else { 16 };
    let mut out = Vec::new();
    // The maximum block size bounds payloads (a read's reply; a longer write never gets here).
    // TRIM and WRITE_ZEROES carry none and may be longer, as the spec lets clients send them:
    // mkfs discards the whole device in one request, and refusing it kept that trim from the
    // FTL model.
    let command = device_command(request, arrived);
    let result = if device.draining() {
        Err(p::ESHUTDOWN)
    } else if device.failure().is_some() {
        Err(p::EIO)
    } else if request.command == p::CMD_READ && request.length > p::MAX_REQUEST_BYTES {
        Err(p::EINVAL)
    } else if io_bit(request.command) & negotiated.io_allowed == 0 {
        // Decided again, for the audit line and its reason.
        let name = device.target_name(negotiated.export);
        let action = policy::IO_ACTIONS
            .iter()
            .find(|(_, bit)| bit & io_bit(request.command) != 0)
            .map_or("read", |(a, _)| a);
        device.allows(principal, action, &name);
        Err(p::EPERM)
    } else if let Some(command) = command {
        if request.command == p::CMD_READ {
            out.reserve_exact(head + request.length as usize);
            out.resize(head, 0);
        }
        // Unwind safety: after a panic nothing of the device is executed again (`failure`),
        // and only its counters and store are read, for the statistics and the image.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            device.execute(&command, payload, &mut out, alone, negotiated.export)
        }))
        .unwrap_or_else(|panic| Err(device.fail(&command, &*panic)))
        .map_err(errno)
    } else {
        Err(p::EINVAL)
    };
    match result {
        Ok(latency_ns) => {
            let hold_ns = match device.latency() {
                Latency::None => 0.0,
                Latency::Real => latency_ns as f64,
                Latency::Scaled(x) => latency_ns as f64 * x,
            };
            let reply = match (structured, request.command) {
                (true, p::CMD_READ) if out.len() == head => p::structured_reply_header(
                    p::REPLY_FLAG_DONE,
                    p::REPLY_TYPE_NONE,
                    request.cookie,
                    0,
                )
                .to_vec(),
                (true, p::CMD_READ) => {
                    let h = p::structured_reply_header(
                        p::REPLY_FLAG_DONE,
                        p::REPLY_TYPE_OFFSET_DATA,
                        request.cookie,
                        (8 + out.len() - head) as u32,
                    );
                    out[..20].copy_from_slice(&h);
                    out[20..28].copy_from_slice(&request.offset.to_be_bytes());
                    out
                }
                (false, p::CMD_READ) => {
                    out[..16].copy_from_slice(&p::simple_reply_header(0, request.cookie));
                    out
                }
                _ => p::simple_reply_header(0, request.cookie).to_vec(),
            };
            (reply, Duration::from_nanos(hold_ns as u64))
        }
        Err(errno) => (
            error_reply(device, structured, request, errno),
            Duration::ZERO,
        ),
    }
}

/// The reply to a request that failed with `errno`: an ERROR chunk with a message when
/// structured replies were negotiated, a simple reply otherwise.
fn error_reply(device: &Device, structured: bool, request: &p::Request, errno: u32) -> Vec<u8> {
    if structured {
        p::structured_error(
            request.cookie,
            errno,
            &error_message(request, errno, device.failure()),
        )
    } else {
        p::simple_reply_header(errno, request.cookie).to_vec()
    }
}

/// What a structured error chunk tells the human behind the client.
fn error_message(request: &p::Request, errno: u32, failure: Option<&str>) -> String {
    let failed;
    let what = match (errno, failure) {
        (p::EINVAL, _) => "invalid request (out of range, too long, or an unknown command)",
        (p::ENOSPC, _) => "no space: beyond the device, or the page store is at --mem-limit",
        (p::EIO, Some(why)) => {
            failed = format!("the device has failed: {why}");
            &failed
        }
        (p::EIO, None) => "I/O error in the page store",
        (p::ESHUTDOWN, _) => "the server is shutting down",
        _ => "error",
    };
    format!(
        "ftlab: {} at offset {} length {}: {what}",
        p::command_name(request.command),
        request.offset,
        request.length
    )
}

/// When a request's header was read and which operation it was (None: a command that is not
/// one), for the client latency.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) read_at: Instant,
    pub(crate) op: Option<Op>,
}

/// The bit of `IO_ACTIONS` an NBD command needs (block status and cache are reads; write
/// zeroes is a write); a command with none of its own is let through to be refused as unknown.
pub fn io_bit(command: u16) -> u8 {
    match command {
        p::CMD_READ | p::CMD_CACHE | p::CMD_BLOCK_STATUS => 1,
        p::CMD_WRITE | p::CMD_WRITE_ZEROES => 2,
        p::CMD_TRIM => 4,
        p::CMD_FLUSH => 8,
        _ => policy::IO_ALL,
    }
}

/// `base:allocation` extents from the request's offset, as (length, NBD state flags): pages
/// never written or trimmed are holes reading as zeros, pages stored as zeros read as zeros.
/// With `NBD_CMD_FLAG_REQ_ONE` the first extent alone; at most `MAX_STATUS_DESCRIPTORS` over
/// `MAX_STATUS_SCAN_BYTES`.
fn block_status(device: &Device, r: &p::Request, target: Target) -> Result<Vec<(u32, u32)>, u32> {
    let extents = device
        .allocation(
            target,
            r.offset,
            r.length,
            r.flags & p::CMD_FLAG_REQ_ONE != 0,
            MAX_STATUS_DESCRIPTORS,
            MAX_STATUS_SCAN_BYTES,
        )
        .map_err(errno)?;
    Ok(extents
        .into_iter()
        .map(|(length, allocation)| {
            let flags = match allocation {
                Allocation::Hole => p::STATE_HOLE | p::STATE_ZERO,
                Allocation::Zeros => p::STATE_ZERO,
                Allocation::Data => 0,
            };
            (length, flags)
        })
        .collect())
}
