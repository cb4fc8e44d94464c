//! A request's two phases: the data phase (pages read from and written to the page store, or
//! to a durable device's log, outside the device lock) and the model phase (the FTL model and
//! the request archive, under it); and requests on snapshots and clones, which the model does
//! not see.

use crate::durable::{model_code, Durable};
use crate::{
    store_errno, Allocation, Command, CommandKind, Device, IoError, LocalCommand, Target,
    BATCH_PAGES,
};
use ftlab_core::request::{Op, PageSpan, Request as FtlRequest};
use ftlab_store::durable::ModelRequest;
use std::sync::atomic::Ordering;

impl Device {
    /// Applies one command of a client in this process (the SQLite VFS) to the first export,
    /// as a connection's request: the FTL model, the store or the durable log, FLUSH per the
    /// durability. A read's bytes are appended to `out`.
    pub fn local(
        &self,
        command: LocalCommand,
        offset: u64,
        data: &[u8],
        length: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), IoError> {
        let (kind, length) = match command {
            LocalCommand::Read => (CommandKind::Read, length),
            LocalCommand::Write => (CommandKind::Write, data.len() as u32),
            LocalCommand::Trim => (CommandKind::Trim, length),
            LocalCommand::Flush => (CommandKind::Flush, 0),
        };
        let request = Command {
            kind,
            offset,
            length,
            fua: false,
            no_hole: false,
            arrival: None,
        };
        // Not `alone`: the caller's thread does the pages (a hand-off to the store's pool and
        // back costs more than the pages of a SQLite write).
        self.execute(&request, data, out, false, Target::default())
            .map(|_latency_ns| ())
    }

    /// Applies one command; fills `out` for reads. Returns the simulated latency in ns: from the
    /// command's arrival (`Command::arrival`, else now) to its modelled completion.
    ///
    /// The data phase runs without the device lock (the store is thread-safe per page), so
    /// requests in flight compress and decompress in parallel; only partial pages take the
    /// read-modify-write lock. As NBD allows, overlapping requests in flight at the same time
    /// are not ordered. The model phase (FTL and record) runs under the device lock. `alone`:
    /// no other request of this connection is in flight or already waiting to be read, nor was
    /// for the last few requests (a front end's judgement: the NBD server's `QUIET_REQUESTS`).
    ///
    /// `payload` is a write's data (`command.length` bytes); a read's bytes are appended to
    /// `out`, whose earlier bytes (room for a reply header) are left as they are.
    pub fn execute(
        &self,
        r: &Command,
        payload: &[u8],
        out: &mut Vec<u8>,
        alone: bool,
        target: Target,
    ) -> Result<u64, IoError> {
        let e = &self.exports[target.export];
        // A load first: a swap on every request would be a locked instruction each.
        if self.panic_next_request.load(Ordering::Relaxed)
            && self.panic_next_request.swap(false, Ordering::SeqCst)
        {
            panic!("panic_next_request_for_test");
        }
        let ps = self.page_bytes as u64;
        // A flush names no range (clients send zeros; the spec asks nothing of a server that
        // gets more), so whatever it carries is ignored rather than added up: a large offset
        // overflowed the page arithmetic below (found by the `nbd_connection` fuzz target).
        let (offset, length) = if r.kind == CommandKind::Flush {
            (0, 0)
        } else {
            (r.offset, u64::from(r.length))
        };
        let in_range = offset
            .checked_add(length)
            .is_some_and(|end| end <= e.size_bytes);
        let read_only = self.options.read_only || e.spec.read_only || target.snapshot;
        match r.kind {
            kind if kind.changes_data() && read_only => return Err(IoError::ReadOnly),
            // A hint to bring data near: there is no nearer than RAM, so nothing to do.
            CommandKind::Cache if in_range => return Ok(0),
            CommandKind::Read | CommandKind::Trim | CommandKind::Cache if !in_range => {
                return Err(IoError::Invalid)
            }
            CommandKind::Write | CommandKind::WriteZeroes if !in_range => {
                return Err(IoError::NoSpace)
            }
            _ => {}
        }
        e.requests.fetch_add(1, Ordering::Relaxed);
        let counter = match r.kind {
            CommandKind::Read => Some(&e.read_bytes),
            CommandKind::Write | CommandKind::WriteZeroes => Some(&e.written_bytes),
            CommandKind::Trim => Some(&e.trimmed_bytes),
            _ => None,
        };
        if let Some(c) = counter {
            c.fetch_add(length, Ordering::Relaxed);
        }
        if target.volume != 0 {
            return self.execute_volume(r, payload, out, target, offset, length);
        }
        // The export's placement, then its offset on the device.
        let placement = e.placement_of(offset);
        let offset = e.base_bytes + offset;
        let span = PageSpan::new(offset, length, ps);
        let touched = span.touched();
        let std::ops::Range {
            start: whole_first,
            end: whole_end,
        } = span.whole();
        // A request alone in flight hands its whole pages to the store as one batch, which the
        // store's thread pool compresses in parallel. When the client keeps more requests in
        // flight, the connection's workers already keep the cores busy and the hand-off to the
        // pool and back (two thread switches per request) costs more than it saves. Measured
        // with fio, 1 MiB sequential writes: at QD 32, ~680 us of server CPU per MiB through
        // the pool and ~580 without; at QD 1, 1.5-1.8 GB/s through the pool, 1.1-1.4 without.
        // At QD 8 a request was often alone for a moment; requiring `QUIET_REQUESTS` alone in a
        // row took 16 runs (8 each, in ABBA order) from a mean 2.82 to 2.96 GB/s, server CPU
        // 320-392 -> 309-348 us/MiB; QD 1 stayed at 2.1-2.4 GB/s, QD 32 within its noise.
        let batched = alone && whole_end - whole_first >= BATCH_PAGES as u64;
        // Only partial pages need it: most requests don't pay for a page of zeros.
        let mut page = Vec::new();
        // Data phase: a durable device's pages are in its log (the host's page cache and the
        // cache of decompressed pages serve reads), not in the page store.
        if let Some(d) = &self.durable {
            self.volume_data(d, r, payload, out, 0, &span)?;
        } else {
            match r.kind {
                CommandKind::Read => {
                    // Behind the reply header `answer` left room for, reserved already.
                    for lpn in touched {
                        if batched && lpn == whole_first {
                            // Whole pages in one parallel batch, straight into the reply.
                            let lpns: Vec<u64> = (whole_first..whole_end).collect();
                            let at = out.len();
                            out.resize(at + lpns.len() * self.page_bytes, 0);
                            self.store
                                .read_batch(&lpns, &mut out[at..])
                                .map_err(store_errno)?;
                        } else if !batched || lpn < whole_first || lpn >= whole_end {
                            let (a, b) = span.covered(lpn);
                            if b - a == self.page_bytes {
                                let at = out.len();
                                out.resize(at + self.page_bytes, 0);
                                self.store.read(lpn, &mut out[at..]).map_err(store_errno)?;
                            } else {
                                page.resize(self.page_bytes, 0);
                                self.store.read(lpn, &mut page).map_err(store_errno)?;
                                out.extend_from_slice(&page[a..b]);
                            }
                        }
                    }
                }
                CommandKind::Write | CommandKind::WriteZeroes => {
                    let zeroes = r.kind == CommandKind::WriteZeroes;
                    let mut at = 0usize;
                    for lpn in touched {
                        let (a, b) = span.covered(lpn);
                        if b - a == self.page_bytes {
                            if zeroes {
                                self.store.trim(lpn);
                            } else if !batched {
                                let bytes = &payload[at..at + self.page_bytes];
                                self.store.write(lpn, bytes).map_err(store_errno)?;
                            } else if lpn == whole_first {
                                // The whole pages go as one batch, compressed in parallel.
                                let lpns: Vec<u64> = (whole_first..whole_end).collect();
                                let bytes = lpns.len() * self.page_bytes;
                                let pages = &payload[at..at + bytes];
                                self.store.write_batch(&lpns, pages).map_err(store_errno)?;
                            }
                        } else {
                            let _rmw = self.rmw.lock().unwrap_or_else(|p| p.into_inner());
                            page.resize(self.page_bytes, 0);
                            self.store.read(lpn, &mut page).map_err(store_errno)?;
                            if zeroes {
                                page[a..b].fill(0);
                            } else {
                                page[a..b].copy_from_slice(&payload[at..at + (b - a)]);
                            }
                            self.store.write(lpn, &page).map_err(store_errno)?;
                        }
                        at += b - a;
                    }
                }
                CommandKind::Trim => {
                    for lpn in whole_first..whole_end {
                        self.store.trim(lpn);
                    }
                }
                _ => {}
            }
        }

        // Model phase.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.requests += 1;
        // The model takes requests in the order they reach its lock, its clock never going
        // back: a request that arrived before the last one taken arrives with it.
        let arrived_ns = r.arrival.map_or_else(|| self.now_ns(), |at| self.ns_at(at));
        let now = arrived_ns.max(state.clock_ns);
        let piece = |op: Op, offset: u64, length: u64| FtlRequest {
            arrival_ns: now,
            op,
            offset_bytes: offset,
            length_bytes: length,
            placement,
        };
        let pieces = match r.kind {
            CommandKind::Read => vec![piece(Op::Read, offset, length)],
            CommandKind::Trim => vec![piece(Op::Trim, offset, length)],
            CommandKind::Flush => vec![piece(Op::Flush, 0, 0)],
            // Zeroes deallocate whole pages in the FTL (as TRIM) unless NO_HOLE asks for them
            // to be written; partial pages at the ends are written either way.
            CommandKind::WriteZeroes if !r.no_hole && whole_first < whole_end => {
                let (a, b) = (whole_first * ps, whole_end * ps);
                vec![
                    piece(Op::Write, offset, a - offset),
                    piece(Op::Trim, a, b - a),
                    piece(Op::Write, b, offset + length - b),
                ]
            }
            _ => vec![piece(Op::Write, offset, length)],
        };
        let mut done = now;
        let writes = matches!(r.kind, CommandKind::Write | CommandKind::WriteZeroes);
        let fua = writes && r.fua;
        for request in pieces
            .into_iter()
            .filter(|q| q.op == Op::Flush || q.length_bytes > 0)
            .chain(fua.then(|| piece(Op::Flush, 0, 0)))
        {
            done = done.max(state.submit(request, self.unix_start_ns)?);
            // The model's input, logged in the order the model took it (under its lock), so
            // that a replay rebuilds it exactly.
            if let Some(d) = self.durable.as_ref().filter(|_| !self.options.read_only) {
                d.lock()
                    .request(ModelRequest {
                        op: model_code(request.op),
                        offset_bytes: request.offset_bytes,
                        // Within u32: a request is at most MAX_REQUEST_BYTES.
                        length_bytes: request.length_bytes as u32,
                        arrival_ns: request.arrival_ns,
                        reclaim_group: request.placement.reclaim_group,
                        handle: request.placement.handle,
                    })
                    .map_err(|e| d.refused(&e))?;
            }
        }
        drop(state);
        if let Some(d) = &self.durable {
            d.sync_if_due(r.kind, fua)?;
        }
        Ok(done - arrived_ns)
    }

    /// `base:allocation` extents from the request's offset: pages never written or trimmed are
    /// holes reading as zeros, pages stored as zeros read as zeros, the rest is data. Adjacent
    /// pages of one kind make one extent; with `NBD_CMD_FLAG_REQ_ONE` the first extent alone is
    /// given (`first_only`). At most `max_extents` extents over `max_scan_bytes`.
    pub fn allocation(
        &self,
        target: Target,
        offset: u64,
        length: u32,
        first_only: bool,
        max_extents: usize,
        max_scan_bytes: u64,
    ) -> Result<Vec<(u32, Allocation)>, IoError> {
        // Each extent's length is a u32.
        assert!(
            max_scan_bytes <= u64::from(u32::MAX),
            "a scan of {max_scan_bytes} bytes"
        );
        let e = &self.exports[target.export];
        let end = offset
            .checked_add(u64::from(length))
            .filter(|&end| end <= e.size_bytes && length > 0)
            .ok_or(IoError::Invalid)?;
        // On the device: the export's base added.
        let end = e.base_bytes + end.min(offset + max_scan_bytes);
        let one = first_only;
        let ps = self.page_bytes as u64;
        let mut descriptors: Vec<(u32, Allocation)> = Vec::new();
        let mut at = e.base_bytes + offset;
        while at < end {
            let lpn = at / ps;
            let len = ((lpn + 1) * ps).min(end) - at;
            let state = match (target.volume, &self.durable) {
                (_, None) => self.store.page_state(lpn),
                (v, Some(d)) => match d.lock().locate(v, lpn) {
                    Ok(None) => ftlab_store::PageState::Absent,
                    _ => ftlab_store::PageState::Data,
                },
            };
            let flags = match state {
                ftlab_store::PageState::Absent => Allocation::Hole,
                ftlab_store::PageState::Zeros => Allocation::Zeros,
                ftlab_store::PageState::Data => Allocation::Data,
            };
            let full = one || descriptors.len() == max_extents;
            match descriptors.last_mut() {
                // Within u32: the scan covers at most `max_scan_bytes` (asserted above).
                Some(last) if last.1 == flags => last.0 += len as u32,
                Some(_) if full => break,
                _ => descriptors.push((len as u32, flags)),
            }
            at += len;
        }
        Ok(descriptors)
    }
}

impl Device {
    /// A page of a snapshot or clone: from the cache of decompressed records, or read from the
    /// log (its record found under the directory's lock, read outside it). Records never
    /// change once written, so the cache is keyed by where they are and is never stale.
    fn volume_page(
        &self,
        d: &Durable,
        volume: u16,
        lpn: u64,
        out: &mut [u8],
    ) -> Result<(), IoError> {
        // Not in the `map_err`: the directory's lock is released first (`damaged_read` takes it).
        let located = d.lock().locate(volume, lpn);
        let located = located.map_err(|e| {
            d.damaged_read(volume, lpn, &e);
            IoError::Io
        })?;
        let Some(located) = located else {
            out.fill(0);
            return Ok(());
        };
        let key = located.loc().0;
        if let Some(page) = d.cache.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            out.copy_from_slice(page);
            return Ok(());
        }
        located.read_page(out).map_err(|e| {
            d.damaged_read(volume, lpn, &e);
            IoError::Io
        })?;
        d.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, out);
        Ok(())
    }

    /// A request on a snapshot or clone (checked, in range, writable when it writes). These
    /// are the host's copies, as qcow2's are: they live in the log and the cache, not in the
    /// page store, and the FTL model does not see them (docs/serve.md).
    fn execute_volume(
        &self,
        r: &Command,
        payload: &[u8],
        out: &mut Vec<u8>,
        target: Target,
        offset: u64,
        length: u64,
    ) -> Result<u64, IoError> {
        let d = self.durable.as_ref().ok_or(IoError::Invalid)?;
        let e = &self.exports[target.export];
        let span = PageSpan::new(e.base_bytes + offset, length, self.page_bytes as u64);
        self.volume_data(d, r, payload, out, target.volume, &span)?;
        d.sync_if_due(r.kind, r.fua)?;
        Ok(0)
    }

    /// The data phase of a request on a durable device's volume (the device itself: 0): pages
    /// read from the log through the cache, written to it (packed before the directory's lock
    /// is taken, then appended under it with the map updated in the same hold: the log's order
    /// is the volume's).
    fn volume_data(
        &self,
        d: &Durable,
        r: &Command,
        payload: &[u8],
        out: &mut Vec<u8>,
        volume: u16,
        span: &PageSpan,
    ) -> Result<(), IoError> {
        let ps = self.page_bytes;
        let mut page = vec![0u8; ps];
        let whole = span.whole();
        match r.kind {
            CommandKind::Read => {
                for lpn in span.touched() {
                    let (a, b) = span.covered(lpn);
                    self.volume_page(d, volume, lpn, &mut page)?;
                    out.extend_from_slice(&page[a..b]);
                }
            }
            CommandKind::Write | CommandKind::WriteZeroes => {
                let zeroes = r.kind == CommandKind::WriteZeroes;
                // The whole pages first: packed outside the lock, appended in one hold.
                if whole.start < whole.end && zeroes {
                    d.trim(&mut d.lock(), volume, whole.start, whole.end - whole.start)?;
                } else if whole.start < whole.end {
                    let first = span.touched().start;
                    let skip = if whole.start > first {
                        let (a, b) = span.covered(first);
                        b - a
                    } else {
                        0
                    };
                    let pages = &payload[skip..skip + (whole.end - whole.start) as usize * ps];
                    let packed: Vec<(u8, std::borrow::Cow<'_, [u8]>)> =
                        pages.chunks(ps).map(ftlab_store::log::pack_page).collect();
                    let mut data = d.lock();
                    for (lpn, (codec, bytes)) in whole.clone().zip(&packed) {
                        d.appended(data.write_packed(volume, lpn, ps, *codec, bytes))?;
                    }
                }
                // Then the partial pages at the ends: read, modified and written under the
                // read-modify-write lock (taken outside the directory's).
                let mut at = 0usize;
                for lpn in span.touched() {
                    let (a, b) = span.covered(lpn);
                    if b - a != ps {
                        let _rmw = self.volume_rmw.lock().unwrap_or_else(|p| p.into_inner());
                        self.volume_page(d, volume, lpn, &mut page)?;
                        if zeroes {
                            page[a..b].fill(0);
                        } else {
                            page[a..b].copy_from_slice(&payload[at..at + (b - a)]);
                        }
                        d.page(&mut d.lock(), volume, lpn, &page)?;
                    }
                    at += b - a;
                }
            }
            CommandKind::Trim if whole.start < whole.end => {
                d.trim(&mut d.lock(), volume, whole.start, whole.end - whole.start)?;
            }
            _ => {}
        }
        Ok(())
    }
}
