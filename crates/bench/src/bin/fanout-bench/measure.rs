//! One run of one implementation: the paced delivery phase and the
//! saturated CPU phase, with the kernel counters that check them.

use crate::lab::{Clients, Lab, Sender, SINK_DEVICE};
use crate::probe::Probe;
use crate::stats::{cost_of, median};
use crate::{stopped, Args, STOP};

use bench::sink::Sink;
use nix::sys::socket::{sendmmsg, MsgFlags, MultiHeaders, SockaddrIn};
use reflector_proto::protocol::{self, Header, Kind, DATA_PAYLOAD};
use std::io::{IoSlice, Read as _, Seek as _};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// One DATA datagram of `size` bytes from the sender (sealed with its
/// session: tag and sequence, as a game client would).
pub(crate) fn next_datagram(tx: &mut Sender, size: usize, buf: &mut [u8], body: &[u8]) -> usize {
    match tx.session.as_mut() {
        Some(s) => s.emit_data(size - DATA_PAYLOAD, buf).and_then(Result::ok).unwrap_or(0),
        None => {
            tx.seq += 1;
            let h = Header {
                kind: Kind::Data,
                group: tx.to.port(),
                sender: 1,
                membership: 1,
                seq: tx.seq,
            };
            protocol::emit(&h, body, None, buf).unwrap_or(0)
        }
    }
}

/// Length of the windows a measured phase is cut into.
pub(crate) const WINDOW: Duration = Duration::from_millis(200);

/// Sends at `rate` datagrams/s for `secs`, calling `at_window` with the
/// count sent so far every [`WINDOW`] and at the end; returns how many
/// were sent.
pub(crate) fn send_paced(tx: &mut Sender, size: usize, rate: u64, secs: f64, mut at_window: impl FnMut(u64)) -> u64 {
    let size = size.max(DATA_PAYLOAD);
    let mut buf = vec![0x5au8; size];
    // The multicast sender's DATA payload (its tag field is left zero).
    let body = vec![0x5au8; size - DATA_PAYLOAD];
    let start = Instant::now();
    let total = (rate as f64 * secs) as u64;
    let mut sent = 0u64;
    // A sender that cannot send at all must not hang the benchmark.
    let deadline = start + Duration::from_secs_f64(secs * 3.0 + 2.0);
    let mut next_window = start + WINDOW;
    while sent < total && Instant::now() < deadline && !STOP.load(Relaxed) {
        if Instant::now() >= next_window {
            at_window(sent);
            next_window += WINDOW;
        }
        // Datagrams due by now, sent as a burst every millisecond.
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        while sent < due {
            let n = next_datagram(tx, size, &mut buf, &body);
            if n == 0 {
                eprintln!("fanout-bench: cannot build a {size}-byte DATA datagram");
                return sent;
            }
            match tx.sock.send_to(&buf[..n], tx.to) {
                Ok(_) => sent += 1,
                Err(_) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    at_window(sent);
    sent
}

/// Counts what the receivers get until `stop`, then until quiet.
pub(crate) fn drain_receivers(rs: &[UdpSocket], stop: &AtomicBool, got: &AtomicU64) {
    for r in rs {
        let _ = r.set_nonblocking(true);
    }
    let mut buf = [0u8; 2048];
    let mut quiet_since: Option<Instant> = None;
    loop {
        let mut any = false;
        for r in rs {
            while r.recv(&mut buf).is_ok() {
                got.fetch_add(1, Relaxed);
                any = true;
            }
        }
        if any {
            quiet_since = None;
        } else if stop.load(Relaxed) {
            let q = *quiet_since.get_or_insert_with(Instant::now);
            if q.elapsed() > Duration::from_millis(300) {
                return;
            }
        }
        if !any {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// One repetition of one (cell, implementation).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    /// Delivery phase: datagrams sent, copies the receivers got, copies/s.
    pub(crate) sent: u64,
    pub(crate) delivered: u64,
    pub(crate) copies_per_s: f64,
    /// CPU phase.
    pub(crate) cpu: CpuPhase,
}

/// What a CPU phase measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct CpuPhase {
    /// Busy ns of the measured CPU per copy, the lower quartile of the
    /// windows (see [`cost_of`]).
    pub(crate) ns_per_copy: f64,
    /// Each window's busy ns per copy, in time order.
    pub(crate) windows: Vec<f64>,
    /// The measured CPU's busy fraction, %, the median window.
    pub(crate) busy_pct: f64,
    /// The sender's CPU's busy fraction, %, the median window (the sender
    /// sleeps while its window is full: below 100 it kept up with the
    /// measured CPU; the fan-out there would show as a jump).
    pub(crate) sender_busy_pct: f64,
    /// Copies per second over the measured windows (the saturation throughput).
    pub(crate) copies_per_s: f64,
    /// Copies counted over the measured windows.
    pub(crate) copies: u64,
    /// Of the packets that CPUs' receive backlogs processed during the
    /// measured windows, the share the measured CPU processed, %.
    pub(crate) rx_on_measured_pct: f64,
    /// Of the copies the sink counted, the share whose transmit ran on the
    /// measured CPU, % (NaN for multicast, whose copies the sink does not see).
    pub(crate) copies_on_measured_pct: f64,
    /// The measured CPU's busy fraction just before the phase, with nothing
    /// sent, %: work that is not ours (a quiet machine shows ~0).
    pub(crate) background_pct: f64,
    /// Copies counted over the whole phase, warm-up and the tail in flight
    /// included, per copy the datagrams sent should make (sent x R), %:
    /// 100 (multicast: a hair under, the few copies left in the receivers'
    /// buffers); below, copies were lost on the way; above, miscounted.
    pub(crate) counted_vs_sent_pct: f64,
    /// Times the sender found nothing counted for a while with its window
    /// full and sent on (datagrams lost on the way: a queue overflowed).
    pub(crate) stalls: u64,
    /// The measured CPU's speed around the phase: the mean of the clock
    /// probe's ns per step just before and just after it (see
    /// [`crate::probe`]).
    pub(crate) probe_ns: f64,
    /// The same for the cache probe (a diagnostic of the core's L2 being
    /// evicted by others).
    pub(crate) cache_probe_ns: f64,
}

impl CpuPhase {
    /// Each window's cost of a copy in clock-probe steps (its ns per copy /
    /// the clock probe's ns per step around the phase).
    pub(crate) fn step_windows(&self) -> Vec<f64> {
        self.windows.iter().map(|w| w / self.probe_ns).collect()
    }
}

/// Where the run happens: the lab, the measured CPU (the implementation is
/// pinned there and the veth's receive softirq steered there) and the
/// sender's CPU (the calling thread is pinned there, and the receivers'
/// reading in delivery phases runs there too).
pub(crate) struct Place<'a> {
    pub(crate) lab: &'a Lab,
    pub(crate) cpu: usize,
    pub(crate) sender_cpu: usize,
    /// Reads the measured CPU's speed around each CPU phase.
    pub(crate) probe: &'a Probe,
}

/// One (cell, implementation) run: a delivery phase (paced; what the
/// receivers get), then a CPU phase (saturated; copies counted by the
/// egress sink, for multicast as receive-buffer drops at the receivers).
pub(crate) fn one_run(
    at: &Place,
    cl: &mut Clients,
    size: usize,
    rate: u64,
    a: &Args,
    mcast: bool,
) -> Result<Sample, String> {
    let lab = at.lab;
    let (mut sent, mut delivered) = (0, 0);
    if a.delivery_seconds > 0.0 {
        let stop = AtomicBool::new(false);
        let got = AtomicU64::new(0);
        let (tx, receivers) = (&mut cl.sender, &cl.receivers);
        sent = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let _ = oskit::cpu::pin_this_thread(at.sender_cpu);
                drain_receivers(receivers, &stop, &got)
            });
            let sent = send_paced(tx, size, rate, a.delivery_seconds, |_| {});
            stop.store(true, Relaxed);
            let _ = h.join();
            sent
        });
        delivered = got.load(Relaxed);
    }
    let copies_per_s = delivered as f64 / a.delivery_seconds.max(1e-9);
    let r = cl.receivers.len();
    let cpu = if mcast {
        // The copies are offered to receive buffers of the minimum size that
        // nobody reads: each is made and freed in the clients' namespace,
        // counted there as a receive-buffer drop.
        for s in &cl.receivers {
            nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::RcvBuf, &1).map_err(|e| e.to_string())?;
        }
        let snmp = Lab::ns(&lab.veth.c)?
            .run(|| std::fs::File::open("/proc/thread-self/net/snmp"))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("/proc/net/snmp of the clients' namespace: {e}"))?;
        measured_phase(at, &mut cl.sender, size, r, a.seconds, &mut Copies::Drops(snmp))?
    } else {
        let rns = Lab::ns(&lab.veth.r)?;
        let sink = rns
            .run(|| Sink::attach(&lab.veth.r_dev, Some(SINK_DEVICE)))
            .map_err(|e| e.to_string())??;
        measured_phase(at, &mut cl.sender, size, r, a.seconds, &mut Copies::Sink(&sink))?
    };
    Ok(Sample {
        sent,
        delivered,
        copies_per_s,
        cpu,
    })
}

/// What counts the copies of a CPU phase.
pub(crate) enum Copies<'a> {
    /// The counting sink at the reflector's egress.
    Sink(&'a Sink),
    /// UDP receive-buffer drops in the clients' namespace (multicast):
    /// its `/proc/net/snmp`, open.
    Drops(std::fs::File),
}

impl Copies<'_> {
    /// Copies so far (a running total).
    pub(crate) fn total(&mut self) -> Result<u64, String> {
        match self {
            Copies::Sink(s) => Ok(s.count()),
            Copies::Drops(f) => udp_rcvbuf_errors(f),
        }
    }

    /// Copies so far per CPU, where the counter knows it.
    pub(crate) fn per_cpu(&self) -> Option<Vec<u64>> {
        match self {
            Copies::Sink(s) => Some(s.count_per_cpu()),
            Copies::Drops(_) => None,
        }
    }
}

/// `Udp: RcvbufErrors` from an open `/proc/net/snmp` (of the namespace
/// that opened it).
pub(crate) fn udp_rcvbuf_errors(f: &mut std::fs::File) -> Result<u64, String> {
    let mut text = String::new();
    f.rewind().map_err(|e| format!("/proc/net/snmp: {e}"))?;
    f.read_to_string(&mut text)
        .map_err(|e| format!("/proc/net/snmp: {e}"))?;
    parse_udp_rcvbuf_errors(&text)
}

/// `Udp: RcvbufErrors` from the text of `/proc/net/snmp` (a line of names,
/// then a line of values).
pub(crate) fn parse_udp_rcvbuf_errors(text: &str) -> Result<u64, String> {
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next(), udp.next());
    let (Some(names), Some(values)) = (names, values) else {
        return Err("/proc/net/snmp has no Udp lines".into());
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| "/proc/net/snmp has no Udp RcvbufErrors".into())
}

/// Packets each CPU's receive backlog has processed so far
/// (`/proc/net/softnet_stat`).
pub(crate) fn softnet_processed() -> Result<Vec<(usize, u64)>, String> {
    let text = std::fs::read_to_string("/proc/net/softnet_stat").map_err(|e| format!("/proc/net/softnet_stat: {e}"))?;
    parse_softnet_processed(&text)
}

/// (CPU, processed) per line of `/proc/net/softnet_stat`: the first field,
/// the CPU number from the 13th where the kernel gives it, else the line's
/// position; hexadecimal.
pub(crate) fn parse_softnet_processed(text: &str) -> Result<Vec<(usize, u64)>, String> {
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex =
                |s: &str| u64::from_str_radix(s, 16).map_err(|_| format!("/proc/net/softnet_stat: bad field '{s}'"));
            let cpu = match f.get(12) {
                Some(c) => hex(c)? as usize,
                None => i,
            };
            Ok((cpu, hex(f.first().copied().unwrap_or(""))?))
        })
        .collect()
}

/// The measured CPU's share of the packets processed between two
/// [`softnet_processed`] readings, %.
pub(crate) fn rx_share(before: &[(usize, u64)], after: &[(usize, u64)], cpu: usize) -> f64 {
    let delta = |c: usize| {
        let b = before.iter().find(|x| x.0 == c).map_or(0, |x| x.1);
        let a = after.iter().find(|x| x.0 == c).map_or(0, |x| x.1);
        a.wrapping_sub(b) & 0xffff_ffff
    };
    let total: u64 = after.iter().map(|x| delta(x.0)).sum();
    if total == 0 {
        return f64::NAN;
    }
    delta(cpu) as f64 * 100.0 / total as f64
}

/// Copies in flight the sender allows (in datagrams: this / receivers): a
/// few ms of work queued for the measured CPU, well within the socket
/// buffers (8 MiB at the reflector, 4 MiB at the relay) and the backlog.
pub(crate) const IN_FLIGHT_COPIES: u64 = 16_384;

/// Datagrams sent between two readings of the copy count (one sendmmsg).
pub(crate) const BURST: u64 = 64;

/// Warm-up at the start of a CPU phase, not measured.
pub(crate) const WARMUP: Duration = Duration::from_millis(200);

/// Above this busy fraction of the measured CPU with nothing sent, %, the
/// run says that the machine was not quiet.
pub(crate) const BACKGROUND_MAX_PCT: f64 = 3.0;

/// Busy ns so far of one CPU (cpuidle residency; only differences mean
/// anything).
pub(crate) fn busy_of(cpu: usize) -> Result<f64, String> {
    oskit::cpu::busy_ns(Some(cpu)).map_err(|e| e.to_string())
}

/// The measured CPU's busy fraction over [`WINDOW`] with nothing sent, %.
pub(crate) fn background_busy(cpu: usize) -> Result<f64, String> {
    let (t0, b0) = (Instant::now(), busy_of(cpu)?);
    std::thread::sleep(WINDOW);
    let (t1, b1) = (Instant::now(), busy_of(cpu)?);
    Ok((b1 - b0) * 100.0 / (t1 - t0).as_nanos().max(1) as f64)
}

/// A CPU phase: the sender (on its own CPU) keeps the measured CPU
/// saturated, sending as fast as it can while fewer than
/// [`IN_FLIGHT_COPIES`] copies' worth of datagrams are in flight, and every
/// [`WINDOW`] after the warm-up the measured CPU's busy time and the copies
/// counted (`count`, a running total) are read.
pub(crate) fn measured_phase(
    at: &Place,
    tx: &mut Sender,
    size: usize,
    receivers: usize,
    secs: f64,
    count: &mut Copies,
) -> Result<CpuPhase, String> {
    let size = size.max(DATA_PAYLOAD);
    let mut bufs = vec![vec![0x5au8; size]; BURST as usize];
    let mut lens = vec![0usize; BURST as usize];
    let body = vec![0x5au8; size - DATA_PAYLOAD];
    let SocketAddr::V4(to) = tx.to else {
        return Err(format!("{}: the lab is IPv4", tx.to));
    };
    let addrs = vec![Some(SockaddrIn::from(to)); BURST as usize];
    let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BURST as usize, None);
    let fd = tx.sock.as_raw_fd();
    // With RPS a datagram stays charged to the sender's socket until the
    // measured CPU has dealt with it: a send buffer that holds the whole
    // window, so that the sender never blocks on it.
    oskit::sockopt::set_buffers(&tx.sock, 4 << 20, 16 << 20).map_err(|e| format!("the sender's buffers: {e}"))?;
    let r = receivers.max(1) as u64;
    let window = (IN_FLIGHT_COPIES / r).clamp(16, 1024);
    let background_pct = background_busy(at.cpu)?;
    let probe_before = at.probe.read(at.cpu)?;
    let c0 = count.total()?;
    let start = Instant::now();
    let end = start + WARMUP + Duration::from_secs_f64(secs);
    let mut next_mark = start + WARMUP;
    // (time, busy ns of the measured CPU, copies) at each window's edge.
    let mut marks: Vec<(Instant, f64, u64, f64)> = Vec::new();
    let (mut rx0, mut cpu0) = (Vec::new(), None);
    let (mut sent, mut lost, mut stalls) = (0u64, 0u64, 0u64);
    let mut progress = (start, 0u64);
    loop {
        stopped()?;
        let copies = count.total()?.wrapping_sub(c0);
        let now = Instant::now();
        if now >= next_mark {
            if marks.is_empty() {
                rx0 = softnet_processed()?;
                cpu0 = count.per_cpu();
            }
            marks.push((now, busy_of(at.cpu)?, copies, busy_of(at.sender_cpu)?));
            if now >= end {
                break;
            }
            next_mark += WINDOW;
        }
        if copies != progress.1 {
            progress = (now, copies);
        } else if now - progress.0 > Duration::from_millis(500) && sent - lost >= copies / r + window {
            // Nothing counted for 500 ms with the window full: what is in
            // flight was lost (a queue overflowed; a process merely held off
            // the CPU by other work on a busy machine is back well before), so
            // send on.
            lost = sent - copies / r;
            stalls += 1;
            progress = (now, copies);
        }
        // Up to a burst, sealed in order and sent with one sendmmsg (a
        // partial send leaves a gap in the sequence, which is allowed).
        let n = (copies / r + window).saturating_sub(sent - lost).min(BURST) as usize;
        if n == 0 {
            // The window is full: the measured CPU has milliseconds of work
            // queued. Sleeping (not spinning) leaves the sender's CPU busy
            // only with sending, so its busy time is a diagnostic too.
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        for (b, l) in bufs.iter_mut().zip(lens.iter_mut()).take(n) {
            *l = next_datagram(tx, size, b, &body);
            if *l == 0 {
                return Err(format!("cannot build a {size}-byte DATA datagram"));
            }
        }
        let iovs: Vec<[IoSlice; 1]> = bufs
            .iter()
            .zip(&lens)
            .take(n)
            .map(|(b, &l)| [IoSlice::new(&b[..l])])
            .collect();
        if let Ok(done) = sendmmsg(fd, &mut headers, &iovs, &addrs[..n], [], MsgFlags::empty()) {
            sent += done.count() as u64;
        }
    }
    let rx1 = softnet_processed()?;
    // What is still in flight is counted before the totals are compared
    // (not measured): until the count stops for 50 ms, at most 1 s.
    let (mut total, mut since, deadline) = (
        count.total()?.wrapping_sub(c0),
        Instant::now(),
        Instant::now() + Duration::from_secs(1),
    );
    while Instant::now() < deadline && since.elapsed() < Duration::from_millis(50) {
        std::thread::sleep(Duration::from_millis(5));
        let now = count.total()?.wrapping_sub(c0);
        if now != total {
            (total, since) = (now, Instant::now());
        }
    }
    let probe_after = at.probe.read(at.cpu)?;
    let copies_on_measured_pct = match (cpu0, count.per_cpu()) {
        (Some(a), Some(b)) => {
            let d: Vec<u64> = b
                .iter()
                .zip(a.iter().chain(std::iter::repeat(&0)))
                .map(|(b, a)| b.wrapping_sub(*a))
                .collect();
            let all: u64 = d.iter().sum();
            d.get(at.cpu)
                .map_or(f64::NAN, |&m| m as f64 * 100.0 / all.max(1) as f64)
        }
        _ => f64::NAN,
    };
    let (mut per_copy, mut busy, mut sender_busy) = (Vec::new(), Vec::new(), Vec::new());
    for w in marks.windows(2) {
        let ((t0, b0, c0, s0), (t1, b1, c1, s1)) = (w[0], w[1]);
        if c1 > c0 {
            per_copy.push((b1 - b0) / (c1 - c0) as f64);
        }
        busy.push((b1 - b0) * 100.0 / (t1 - t0).as_nanos().max(1) as f64);
        sender_busy.push((s1 - s0) * 100.0 / (t1 - t0).as_nanos().max(1) as f64);
    }
    let (first, last) = (marks[0], marks[marks.len() - 1]);
    if per_copy.is_empty() {
        return Err("no copy was counted in a CPU phase: is the implementation running?".into());
    }
    Ok(CpuPhase {
        ns_per_copy: cost_of(per_copy.clone()),
        windows: per_copy,
        busy_pct: median(busy),
        sender_busy_pct: median(sender_busy),
        copies_per_s: (last.2 - first.2) as f64 / (last.0 - first.0).as_secs_f64(),
        copies: last.2 - first.2,
        rx_on_measured_pct: rx_share(&rx0, &rx1, at.cpu),
        copies_on_measured_pct,
        counted_vs_sent_pct: total as f64 * 100.0 / (sent * r).max(1) as f64,
        background_pct,
        stalls,
        probe_ns: (probe_before.clock_ns + probe_after.clock_ns) / 2.0,
        cache_probe_ns: (probe_before.cache_ns + probe_after.cache_ns) / 2.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcvbuf_errors_are_read_from_the_udp_lines() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            Udp: 10 0 7 3 7 0\n\
            UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            UdpLite: 0 0 0 0 99 0\n";
        assert_eq!(parse_udp_rcvbuf_errors(text), Ok(7));
        assert!(parse_udp_rcvbuf_errors("Ip: a\nIp: 1\n").is_err());
    }

    #[test]
    fn softnet_lines_give_cpu_and_processed() {
        let with_cpu = "00000010 0 0 0 0 0 0 0 0 0 0 0 00000000 0 0\n\
                        000000ff 0 0 0 0 0 0 0 0 0 0 0 00000003 0 0\n";
        assert_eq!(parse_softnet_processed(with_cpu), Ok(vec![(0, 16), (3, 255)]));
        let old = "00000001 0 0\n00000002 0 0\n";
        assert_eq!(parse_softnet_processed(old), Ok(vec![(0, 1), (1, 2)]));
    }

    #[test]
    fn rx_share_is_the_measured_cpus_part_of_what_was_processed() {
        let before = [(0, 100), (1, 1000)];
        let after = [(0, 110), (1, 1090)];
        assert_eq!(rx_share(&before, &after, 1), 90.0);
        // The kernel's counters are 32 bits and wrap.
        let before = [(0, 0xffff_fff0), (1, 0)];
        let after = [(0, 0x10), (1, 0)];
        assert_eq!(rx_share(&before, &after, 0), 100.0);
        assert!(rx_share(&after, &after, 0).is_nan());
    }
}
