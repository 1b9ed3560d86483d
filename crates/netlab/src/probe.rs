//! Probes of our own (no ICMP, no external tools): UDP reachability between
//! every pair of hosts, TCP throughput of one flow, UDP round-trip times.
//! Every probe is bounded in packets and in time, and only ever talks to
//! addresses inside the lab's own namespaces.

use crate::error::LabError;
use crate::netns::spawn_in;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

pub const PROBE_PORT: u16 = 47999;
pub const TCP_PORT: u16 = 47998;

#[derive(Clone, Debug)]
pub struct Endpoint {
    pub name: String,
    pub ns: String,
    pub addr: Ipv4Addr,
}

fn io(what: &str) -> impl Fn(std::io::Error) -> LabError + '_ {
    move |e| LabError::io(what.to_string(), e)
}

/// Starts a UDP echo responder in each endpoint's namespace; returns when all
/// are bound. They stop when `stop` is set.
fn start_responders(
    eps: &[Endpoint],
    stop: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<Result<(), LabError>>>, LabError> {
    let (tx, rx) = mpsc::channel();
    let mut hs = vec![];
    for e in eps {
        let (tx, stop) = (tx.clone(), stop.clone());
        hs.push(spawn_in(&e.ns, move || {
            let sock = match UdpSocket::bind((Ipv4Addr::UNSPECIFIED, PROBE_PORT)) {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let _ = sock.set_read_timeout(Some(Duration::from_millis(20)));
            let _ = tx.send(Ok(()));
            let mut buf = [0u8; 256];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        })?);
    }
    for _ in eps {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(LabError::io("bind UDP probe responder", e)),
            Err(_) => {
                return Err(LabError::io(
                    "UDP probe responder",
                    std::io::Error::other("did not start"),
                ))
            }
        }
    }
    Ok(hs
        .into_iter()
        .map(|h| std::thread::spawn(move || h.join().unwrap_or(Ok(()))))
        .collect())
}

/// How many hosts probe at the same time. All at once floods a big layer-2
/// segment with ARP broadcasts (N² of them, each to N ports) and the probes
/// are lost in the storm; a few at a time is fast and reliable.
const PARALLEL_SOURCES: usize = 8;

/// How a pair check is run.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// How long one round of probes waits for its answers.
    pub per_try: Duration,
    /// Rounds: each resends only to the destinations that have not answered.
    pub tries: u32,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            per_try: Duration::from_millis(300),
            tries: 5,
        }
    }
}

/// Where a running check stands, for a progress line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckProgress {
    pub done: usize,
    pub total: usize,
    pub failed: usize,
}

type Failures = Vec<(String, String)>;

/// Probes every destination from one source: each round sends one probe to
/// every destination that has not answered yet, then collects answers until
/// the round's deadline, so a source costs a few round trips, not one per
/// destination, and an unreachable destination costs `tries` rounds at most.
fn probe_from(name: &str, dsts: &[Endpoint], o: CheckOptions, stop: &AtomicBool) -> Result<Failures, LabError> {
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(io("bind UDP probe"))?;
    let mut answered = vec![false; dsts.len()];
    let mut buf = [0u8; 256];
    for attempt in 0..o.tries {
        for (k, d) in dsts.iter().enumerate().filter(|(k, _)| !answered[*k]) {
            let msg = format!("netlab-probe {name} {k} {attempt}");
            // Sending can fail transiently (neighbour resolution); that is
            // just a lost try.
            let _ = sock.send_to(msg.as_bytes(), (d.addr, PROBE_PORT));
        }
        let deadline = Instant::now() + o.per_try;
        while answered.iter().any(|a| !a) {
            if stop.load(Ordering::Relaxed) {
                return Err(LabError::Interrupted);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            // Short reads so that a stop request is seen within 50 ms.
            let _ = sock.set_read_timeout(Some(left.clamp(Duration::from_millis(1), Duration::from_millis(50))));
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            // An answer names its destination index; it must come from
            // that destination's address and port.
            let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
            let mut f = text.split(' ');
            if f.next() != Some("netlab-probe") || f.next() != Some(name) {
                continue;
            }
            if let Some(k) = f.next().and_then(|k| k.parse::<usize>().ok()) {
                if dsts
                    .get(k)
                    .is_some_and(|d| from == SocketAddr::from((d.addr, PROBE_PORT)))
                {
                    answered[k] = true;
                }
            }
        }
        if answered.iter().all(|a| *a) {
            break;
        }
    }
    Ok(dsts
        .iter()
        .zip(&answered)
        .filter(|(_, a)| !**a)
        .map(|(d, _)| (name.to_string(), d.name.clone()))
        .collect())
}

/// Labs of at most this many hosts are checked all pairs by default.
pub const ALL_PAIRS_MAX: usize = 300;

/// Random destinations per host in a sampled check, by default.
pub const SAMPLE_PER_HOST: usize = 5;

/// Which pairs a check probes: `dsts[i]` are the endpoints (by index) that
/// endpoint `i` probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairSet {
    pub dsts: Vec<Vec<usize>>,
}

impl PairSet {
    /// Every ordered pair of `n` endpoints.
    pub fn all(n: usize) -> PairSet {
        PairSet {
            dsts: (0..n).map(|i| (0..n).filter(|&j| j != i).collect()).collect(),
        }
    }

    /// Every endpoint to `hub`, and `per_host` other destinations per
    /// endpoint drawn at random (distinct, never itself nor the hub) from a
    /// generator seeded with `seed`, so a sample can be repeated. Each
    /// endpoint is then probed as a source `per_host + 1` times and, on
    /// average, as a destination as often.
    pub fn sampled(n: usize, hub: usize, per_host: usize, seed: u64) -> PairSet {
        let mut rng = SplitMix64(seed);
        let dsts = (0..n)
            .map(|i| {
                let mut v = if i == hub { vec![] } else { vec![hub] };
                // Candidates: everyone but itself, and but the hub, which
                // it probes anyway.
                let candidates = if i == hub { n - 1 } else { n.saturating_sub(2) };
                let want = per_host.min(candidates);
                let mut picked = vec![];
                while picked.len() < want {
                    let j = (rng.next() % n as u64) as usize;
                    if j != i && j != hub && !picked.contains(&j) {
                        picked.push(j);
                    }
                }
                v.extend(picked);
                v
            })
            .collect();
        PairSet { dsts }
    }

    pub fn len(&self) -> usize {
        self.dsts.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A small, well-mixed generator (Steele et al., SplitMix64): enough for
/// choosing probe pairs, and no dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// How many random destinations per host a sampled check of `hosts` hosts
/// may use without overflowing the kernel's neighbour table: each random
/// pair on a big segment may make two entries the kernel resolves and
/// counts (the hub's are permanent and not counted), and the table is
/// shared by the whole machine, so at most half of `gc_thresh3` is used.
pub fn sample_budget(hosts: usize, gc_thresh3: u64, wanted: usize) -> usize {
    let per_host = gc_thresh3 / 2 / (2 * hosts.max(1) as u64);
    wanted.min(per_host as usize)
}

/// Checks that every host reaches every other with UDP. Returns the pairs
/// (from, to) that did not answer within `o.tries` rounds. `progress` is
/// called about twice a second; `stop` ends the check within about 50 ms
/// with [`LabError::Interrupted`].
pub fn all_pairs(
    eps: &[Endpoint],
    o: CheckOptions,
    stop: &AtomicBool,
    progress: impl FnMut(CheckProgress),
) -> Result<Failures, LabError> {
    check_pairs(eps, &PairSet::all(eps.len()), o, stop, progress)
}

/// Checks the pairs of `pairs` with UDP, as [`all_pairs`] does.
pub fn check_pairs(
    eps: &[Endpoint],
    pairs: &PairSet,
    o: CheckOptions,
    stop: &AtomicBool,
    mut progress: impl FnMut(CheckProgress),
) -> Result<Failures, LabError> {
    let quit = Arc::new(AtomicBool::new(false));
    let responders = start_responders(eps, &quit)?;
    let mut state = CheckProgress {
        total: pairs.len(),
        ..Default::default()
    };
    let (mut failed, mut err) = (vec![], None);
    type Source = std::thread::JoinHandle<Result<Result<Failures, LabError>, LabError>>;
    let mut running: Vec<(usize, Source)> = vec![];
    let mut next = 0;
    let mut last = Instant::now();
    while (next < eps.len() || !running.is_empty()) && err.is_none() {
        if stop.load(Ordering::Relaxed) {
            err = Some(LabError::Interrupted);
            break;
        }
        while running.len() < PARALLEL_SOURCES && next < eps.len() {
            let i = next;
            next += 1;
            let mine = pairs.dsts.get(i).map(Vec::as_slice).unwrap_or(&[]);
            if mine.is_empty() {
                continue;
            }
            let dsts: Vec<Endpoint> = mine.iter().map(|&j| eps[j].clone()).collect();
            let (name, q) = (eps[i].name.clone(), quit.clone());
            match spawn_in(&eps[i].ns, move || probe_from(&name, &dsts, o, &q)) {
                Ok(h) => running.push((mine.len(), h)),
                Err(e) => err = Some(e),
            }
        }
        let mut k = 0;
        while k < running.len() {
            if !running[k].1.is_finished() {
                k += 1;
                continue;
            }
            let (pairs, h) = running.swap_remove(k);
            match h.join() {
                Ok(Ok(Ok(f))) => {
                    state.failed += f.len();
                    failed.extend(f);
                }
                Ok(Ok(Err(e))) | Ok(Err(e)) => err = Some(e),
                Err(_) => err = Some(LabError::io("probe", std::io::Error::other("probe thread panicked"))),
            }
            state.done += pairs;
        }
        if last.elapsed() >= Duration::from_millis(500) {
            last = Instant::now();
            progress(state);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Stops the sources still probing (after an error or a stop) and the
    // responders.
    quit.store(true, Ordering::Relaxed);
    for (_, h) in running {
        let _ = h.join();
    }
    for r in responders {
        let _ = r.join();
    }
    progress(state);
    match err {
        Some(e) => Err(e),
        None => Ok(failed),
    }
}

#[derive(Clone, Debug)]
pub struct Throughput {
    /// Application bytes per second over the measured window, in bits/s.
    pub goodput_bps: f64,
    pub bytes: u64,
    pub window: Duration,
}

/// One TCP flow from `src` to `dst` for `warmup + measure`; the rate is
/// taken by the receiver over the `measure` window only, so slow start does
/// not count.
pub fn tcp_flow(src: &Endpoint, dst: &Endpoint, warmup: Duration, measure: Duration) -> Result<Throughput, LabError> {
    let (tx, rx) = mpsc::channel();
    let total = warmup + measure;
    let server = spawn_in(&dst.ns, move || -> Result<Throughput, LabError> {
        let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, TCP_PORT)).map_err(io("bind TCP probe"))?;
        let _ = tx.send(());
        l.set_nonblocking(true).map_err(io("TCP probe"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                Err(e) => return Err(LabError::io("accept TCP probe", e)),
            }
        };
        s.set_nonblocking(false).map_err(io("TCP probe"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(io("TCP probe"))?;
        let mut buf = vec![0u8; 1 << 16];
        let t0 = Instant::now();
        let mut bytes = 0u64;
        let mut mark: Option<(Instant, u64)> = None;
        let end = t0 + total;
        loop {
            let n = s.read(&mut buf).map_err(io("read TCP probe"))?;
            let now = Instant::now();
            if n == 0 || now >= end {
                let (tm, bm) = mark.unwrap_or((t0, 0));
                let window = now - tm;
                let b = bytes - bm;
                return Ok(Throughput {
                    goodput_bps: b as f64 * 8.0 / window.as_secs_f64(),
                    bytes: b,
                    window,
                });
            }
            bytes += n as u64;
            if mark.is_none() && now - t0 >= warmup {
                mark = Some((now, bytes));
            }
        }
    })?;
    rx.recv_timeout(Duration::from_secs(5))
        .map_err(|_| LabError::io("TCP probe", std::io::Error::other("server did not start")))?;
    let daddr = dst.addr;
    let client = spawn_in(&src.ns, move || -> Result<(), LabError> {
        let mut s = TcpStream::connect_timeout(&SocketAddr::from((daddr, TCP_PORT)), Duration::from_secs(5))
            .map_err(io("connect TCP probe"))?;
        s.set_write_timeout(Some(Duration::from_secs(5)))
            .map_err(io("TCP probe"))?;
        let buf = vec![0x5au8; 1 << 16];
        // A little longer than the receiver measures, so that it never
        // waits for data at the end of its window.
        let end = Instant::now() + total + Duration::from_millis(300);
        while Instant::now() < end {
            if s.write(&buf).is_err() {
                break;
            }
        }
        Ok(())
    })?;
    let r = server
        .join()
        .map_err(|_| LabError::io("TCP probe", std::io::Error::other("panicked")))??;
    let _ = client.join();
    r
}

/// `count` UDP round trips from `src` to `dst`, one at a time, `gap` apart.
/// Returns the round-trip times of those that came back within `wait`.
pub fn udp_rtts(
    src: &Endpoint,
    dst: &Endpoint,
    count: usize,
    gap: Duration,
    wait: Duration,
) -> Result<Vec<Duration>, LabError> {
    let stop = Arc::new(AtomicBool::new(false));
    let responders = start_responders(std::slice::from_ref(dst), &stop)?;
    let daddr = dst.addr;
    let r = spawn_in(&src.ns, move || -> Result<Vec<Duration>, LabError> {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(io("bind UDP probe"))?;
        sock.connect((daddr, PROBE_PORT)).map_err(io("connect UDP probe"))?;
        sock.set_read_timeout(Some(wait)).map_err(io("UDP probe"))?;
        let mut v = vec![];
        let mut buf = [0u8; 64];
        for i in 0..count as u64 {
            let msg = i.to_be_bytes();
            let t = Instant::now();
            let _ = sock.send(&msg);
            loop {
                match sock.recv(&mut buf) {
                    Ok(8) if buf[..8] == msg => {
                        v.push(t.elapsed());
                        break;
                    }
                    Ok(_) => continue,
                    Err(_) => break,
                }
            }
            std::thread::sleep(gap);
        }
        Ok(v)
    })?
    .join()
    .map_err(|_| LabError::io("UDP probe", std::io::Error::other("panicked")))?;
    stop.store(true, Ordering::Relaxed);
    for h in responders {
        let _ = h.join();
    }
    r?
}

/// Endpoints of every host of a run.
pub fn endpoints(state: &crate::lab::RunState) -> Vec<Endpoint> {
    state
        .hosts
        .iter()
        .filter(|h| h.kind == crate::model::NodeKind::Host)
        .filter_map(|h| {
            h.addr.map(|a| Endpoint {
                name: h.name.clone(),
                ns: h.ns.clone(),
                addr: a,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_pairs_is_every_ordered_pair() {
        let p = PairSet::all(4);
        assert_eq!(p.len(), 12);
        assert_eq!(p.dsts[2], [0, 1, 3]);
        assert!(PairSet::all(1).is_empty());
    }

    #[test]
    fn a_sample_is_every_host_to_the_hub_and_distinct_random_others() {
        let n = 1000;
        let p = PairSet::sampled(n, 0, 5, 42);
        assert_eq!(p.len(), (n - 1) * 6 + 5);
        for (i, d) in p.dsts.iter().enumerate() {
            if i == 0 {
                assert_eq!(d.len(), 5);
            } else {
                assert_eq!(d[0], 0, "host {i} probes the hub first");
                assert_eq!(d.len(), 6);
            }
            let mut u = d.clone();
            u.sort();
            u.dedup();
            assert_eq!(u.len(), d.len(), "distinct destinations of {i}");
            assert!(!d.contains(&i));
            assert!(!d[1..].contains(&0) || i == 0);
        }
        // Repeatable from its seed, different with another.
        assert_eq!(p, PairSet::sampled(n, 0, 5, 42));
        assert_ne!(p, PairSet::sampled(n, 0, 5, 43));
        // Asking for more than there are gives all there are.
        let mut small = PairSet::sampled(3, 0, 10, 1);
        small.dsts.iter_mut().for_each(|d| d.sort());
        assert_eq!(small.dsts, [vec![1, 2], vec![0, 2], vec![0, 1]]);
    }

    #[test]
    fn the_sample_fits_in_half_the_neighbour_table() {
        // A container cannot raise the kernel's default 1024: only the hub.
        assert_eq!(sample_budget(1000, 1024, SAMPLE_PER_HOST), 0);
        // As `up` raises it for star:1000 (2^21): as many as wanted.
        assert_eq!(sample_budget(1000, 1 << 21, SAMPLE_PER_HOST), SAMPLE_PER_HOST);
        assert_eq!(sample_budget(400, 8192, 10), 5);
    }
}
