//! One capture worker: a thread that takes batches from its source into
//! its output (buffered locally, written in chunks), shares the `-c` count
//! with the other workers, and answers stop and report requests.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{OwnedPacket, ThreadReport};
use crate::error::{CaptureError, Result};
use crate::filter::LinkType;
use crate::output::{Encoding, FileOutput};
use crate::print::Printer;
use crate::source::{Flow, PacketView, Source};
use crate::sys;

/// How much a worker encodes before it writes to the shared output: the
/// output's lock is taken per chunk, not per packet.
pub(super) const FLUSH_AT: usize = 256 << 10;

/// What the workers of one run share.
pub(super) struct Shared {
    /// Packets taken by all workers (the `-c` count is shared).
    pub(super) taken: AtomicU64,
    pub(super) limit: u64,
    pub(super) deadline: Option<Instant>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) abort: Arc<AtomicBool>,
    /// Bumped by the monitor to ask every worker for a snapshot.
    pub(super) epoch: AtomicU64,
    pub(super) failed: AtomicBool,
}

/// A worker's end of the output.
pub(super) enum Out {
    Count,
    Summary(String, Printer),
    /// Shared file, local encoded records (and how many packets they
    /// hold), scratch for VLAN re-insertion, and the lines to print too
    /// (`--print`).
    File(Arc<Mutex<FileOutput>>, Vec<u8>, u64, Vec<u8>, Option<(String, Printer)>),
    Collect(Arc<Mutex<Vec<OwnedPacket>>>, Vec<OwnedPacket>),
}

impl Out {
    fn flush(&mut self) -> Result<()> {
        match self {
            Out::Count => {}
            Out::Summary(s, _) => print_lines(s)?,
            Out::File(f, buf, packets, _, print) => {
                if let Some((s, _)) = print {
                    print_lines(s)?;
                }
                let mut g = f
                    .lock()
                    .map_err(|_| CaptureError::Config("output lock poisoned by a failed thread".into()))?;
                if !buf.is_empty() {
                    g.write_chunk(buf)?;
                    buf.clear();
                    *packets = 0;
                }
                // Also when idle: what was written less than a second ago
                // reaches the file within the second, and -G's next file is
                // opened on time.
                g.sync_if_due(false)?;
                g.rotate_if_due()?;
            }
            Out::Collect(all, local) => {
                if !local.is_empty() {
                    if let Ok(mut g) = all.lock() {
                        g.append(local);
                    }
                }
            }
        }
        Ok(())
    }

    /// Drops what is encoded but not written (stopping at once); returns
    /// how many packets that was. Other outputs are cheap: flushed.
    fn discard(&mut self) -> Result<u64> {
        match self {
            Out::File(_, buf, packets, _, print) => {
                buf.clear();
                if let Some((s, _)) = print {
                    s.clear();
                }
                Ok(std::mem::take(packets))
            }
            _ => self.flush().map(|()| 0),
        }
    }

    /// The rotating output has written its last file (`-G` with `-W`).
    fn exhausted(&self) -> bool {
        matches!(self, Out::File(f, ..) if f.lock().is_ok_and(|g| g.exhausted()))
    }

    fn pending(&self) -> usize {
        match self {
            Out::Count => 0,
            Out::Summary(s, _) => s.len(),
            Out::File(_, b, _, _, print) => b.len() + print.as_ref().map_or(0, |(s, _)| s.len()),
            Out::Collect(_, v) => v.len() * 64,
        }
    }
}

/// Writes the printed lines to stdout. A closed stdout (e.g. `| head`)
/// ends the capture quietly.
pub(crate) fn print_lines(s: &mut String) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    let mut o = std::io::stdout().lock();
    let r = o.write_all(s.as_bytes()).and_then(|_| o.flush());
    s.clear();
    r.map_err(|e| CaptureError::Output {
        path: "stdout".into(),
        source: e,
    })
}

pub(super) fn worker(
    mut src: Source,
    cpu: Option<usize>,
    mut out: Out,
    link: LinkType,
    shared: &Shared,
    snap: &Mutex<(u64, ThreadReport)>,
) -> Result<ThreadReport> {
    let r = worker_loop(&mut src, cpu, &mut out, link, shared, snap);
    if r.is_err() {
        // Let the other workers end too; the run reports the first error.
        shared.failed.store(true, Ordering::Relaxed);
    }
    r
}

fn worker_loop(
    src: &mut Source,
    cpu: Option<usize>,
    out: &mut Out,
    link: LinkType,
    shared: &Shared,
    snap: &Mutex<(u64, ThreadReport)>,
) -> Result<ThreadReport> {
    if let Some(c) = cpu {
        oskit::cpu::pin_this_thread(c).map_err(|e| CaptureError::Config(format!("--cpus: {e}")))?;
    }
    let cpu0 = sys::thread_cpu_time();
    let mut rep = ThreadReport {
        cpu,
        ..Default::default()
    };
    let mut seen_epoch = 0u64;
    let has_limit = shared.limit != u64::MAX;
    // Ring modes can leave a packet in place; recv has read it already.
    let in_ring = !src.reads_before_sink();
    // -U: one packet per batch, so each is written and synced on its own
    // (recv takes one per call anyway).
    let per_packet = matches!(out, Out::File(f, ..) if f.lock().is_ok_and(|g| g.packet_buffered));
    let encoding = match out {
        Out::File(f, ..) => f.lock().ok().map(|g| g.encoding),
        _ => None,
    };
    loop {
        if shared.stop.load(Ordering::Relaxed)
            || shared.failed.load(Ordering::Relaxed)
            || shared.taken.load(Ordering::Relaxed) >= shared.limit
        {
            break;
        }
        // Bounds how long a stop request or a report request waits.
        let mut timeout = Duration::from_millis(200);
        if let Some(d) = shared.deadline {
            let now = Instant::now();
            if now >= d {
                break;
            }
            timeout = timeout.min(d - now);
        }
        let mut beyond = 0u64;
        let mut bytes = 0u64;
        let n = src.next_batch(timeout, &mut |p: &PacketView<'_>| {
            // One call can hand over a whole ring of blocks: leave the rest
            // in the ring once a flush is due, so what is encoded but not
            // written stays bounded (a second Ctrl-C drops at most that).
            if in_ring && (out.pending() >= FLUSH_AT || (per_packet && out.pending() > 0)) {
                return Flow::Stop;
            }
            // Without -c there is nothing to share per packet.
            if has_limit && shared.taken.fetch_add(1, Ordering::Relaxed) >= shared.limit {
                beyond += 1;
                return Flow::Stop;
            }
            bytes += p.data.len() as u64;
            take(out, link, encoding.as_ref(), p);
            Flow::Continue
        })?;
        rep.captured += n as u64;
        rep.bytes += bytes;
        // In ring modes a declined packet stays in the ring; only recv has read it.
        if !in_ring {
            rep.beyond_limit += beyond;
        }
        // Every batch the kernel hands over goes to the file (a sync point
        // follows at the latest within a second; see FileOutput).
        out.flush()?;
        // -G with -W: the last file's time is up; the capture ends, as
        // tcpdump's does.
        if out.exhausted() {
            shared.stop.store(true, Ordering::Relaxed);
        }
        let e = shared.epoch.load(Ordering::Acquire);
        if e != seen_epoch {
            seen_epoch = e;
            fill_final(&mut rep, src, cpu0)?;
            if let Ok(mut g) = snap.lock() {
                *g = (e, rep.clone());
            }
        }
    }
    if shared.stop.load(Ordering::Relaxed) && !shared.failed.load(Ordering::Relaxed) {
        // Asked to stop: take what is already queued (including a partly
        // filled v3 block, visible after its retire timeout), so a stop after
        // the traffic leaves nothing uncounted; bounded for endless traffic,
        // written in FLUSH_AT steps, and cut short by a second signal.
        let until = Instant::now() + Duration::from_millis(500);
        let has_limit = shared.limit != u64::MAX;
        while !shared.abort.load(Ordering::Relaxed) {
            let n = src.next_batch(src.visibility_delay(), &mut |p: &PacketView<'_>| {
                if in_ring && out.pending() >= FLUSH_AT {
                    return Flow::Stop;
                }
                if has_limit && shared.taken.fetch_add(1, Ordering::Relaxed) >= shared.limit {
                    return Flow::Stop;
                }
                rep.bytes += p.data.len() as u64;
                take(out, link, encoding.as_ref(), p);
                Flow::Continue
            })?;
            rep.captured += n as u64;
            if out.pending() >= FLUSH_AT && !shared.abort.load(Ordering::Relaxed) {
                out.flush()?;
            }
            if n == 0 || Instant::now() >= until {
                break;
            }
        }
    }
    if shared.abort.load(Ordering::Relaxed) {
        rep.not_written = out.discard()?;
    }
    out.flush()?;
    fill_final(&mut rep, src, cpu0)?;
    Ok(rep)
}

/// Hands one packet to the output.
fn take(out: &mut Out, link: LinkType, encoding: Option<&Encoding>, p: &PacketView<'_>) {
    match out {
        Out::Count => {}
        Out::Summary(s, printer) => printer.line(s, link, p),
        Out::File(_, buf, packets, scratch, print) => {
            if let Some(e) = encoding {
                e.record(buf, p, scratch);
                *packets += 1;
            }
            if let Some((s, printer)) = print {
                printer.line(s, link, p);
            }
        }
        Out::Collect(_, v) => v.push(match p.cooked {
            Some(h) => OwnedPacket {
                ts_ns: p.ts_ns,
                wire_len: p.wire_len + h.len() as u32,
                data: [&h[..], p.data].concat(),
            },
            None => OwnedPacket {
                ts_ns: p.ts_ns,
                wire_len: p.wire_len,
                data: p.data.to_vec(),
            },
        }),
    }
}

fn fill_final(rep: &mut ThreadReport, src: &mut Source, cpu0: (Duration, Duration)) -> Result<()> {
    rep.kernel = src.kernel_stats()?;
    rep.malformed = src.malformed();
    rep.truncated = src.truncated();
    let (u, s) = sys::thread_cpu_time();
    rep.cpu_user = u.saturating_sub(cpu0.0);
    rep.cpu_sys = s.saturating_sub(cpu0.1);
    Ok(())
}
