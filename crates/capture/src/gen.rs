//! Packet generator: UDP datagrams or raw Ethernet frames at a fixed packet
//! rate and size, for a fixed count or duration.
//!
//! Every packet carries its sequence number (8 bytes, big endian) followed
//! by a pattern derived from it ([`payload_byte`]), so a receiver can check
//! both that it got every packet and that the bytes are right.

use std::fmt;
use std::net::SocketAddrV4;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{CaptureError, Result};
use crate::sys::{self, PacketSocket, UdpSender};

/// Ethernet + IPv4 + UDP header bytes.
pub const HEADERS_LEN: usize = 14 + 20 + 8;
/// Smallest frame we build: headers plus the sequence number.
pub const MIN_FRAME_LEN: usize = HEADERS_LEN + 8;

/// How the generator hands packets to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A UDP socket, `sendmmsg` batches (the kernel builds the headers).
    Udp,
    /// Raw frames on an `AF_PACKET` socket, `sendmmsg` batches.
    Mmsg,
    /// Raw frames through an `AF_PACKET` TX ring (TPACKET_V2).
    TxRing,
}

impl FromStr for Via {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "udp" => Ok(Via::Udp),
            "mmsg" | "sendmmsg" => Ok(Via::Mmsg),
            "txring" | "tx-ring" => Ok(Via::TxRing),
            _ => Err(format!("unknown generator path '{s}' (choose udp, mmsg or txring)")),
        }
    }
}

impl fmt::Display for Via {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Via::Udp => "udp",
            Via::Mmsg => "mmsg",
            Via::TxRing => "txring",
        })
    }
}

/// Addresses and size of the frames to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    /// Frame length without FCS (Ethernet header included), before a VLAN tag.
    pub frame_len: usize,
    /// An 802.1Q tag (VLAN id) to put after the MAC addresses, for raw frames.
    pub vlan: Option<u16>,
}

impl FrameSpec {
    pub fn payload_len(&self) -> usize {
        self.frame_len.saturating_sub(HEADERS_LEN).max(8)
    }
}

/// Byte `i` of the UDP payload of packet `seq`.
pub fn payload_byte(seq: u64, i: usize) -> u8 {
    if i < 8 {
        seq.to_be_bytes()[i]
    } else {
        (seq as u8).wrapping_mul(31).wrapping_add(i as u8)
    }
}

/// Fills `buf` with the payload of packet `seq`.
pub fn fill_payload(buf: &mut [u8], seq: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = payload_byte(seq, i);
    }
}

/// Checks a UDP payload against what packet `seq` carries; returns the seq.
pub fn check_payload(payload: &[u8]) -> Option<u64> {
    let seq = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
    payload
        .iter()
        .enumerate()
        .all(|(i, b)| *b == payload_byte(seq, i))
        .then_some(seq)
}

fn checksum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    sum
}

fn checksum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Builds a complete Ethernet/IPv4/UDP frame for packet `seq`, with valid
/// IPv4 and UDP checksums.
pub fn build_udp_frame(spec: &FrameSpec, seq: u64) -> Vec<u8> {
    let plen = spec.payload_len();
    let mut f = vec![0u8; HEADERS_LEN + plen];
    f[0..6].copy_from_slice(&spec.dst_mac);
    f[6..12].copy_from_slice(&spec.src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (20 + 8 + plen) as u16;
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&(seq as u16).to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&spec.src.ip().octets());
    ip[16..20].copy_from_slice(&spec.dst.ip().octets());
    let c = checksum_fold(checksum_add(0, ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let udp_len = (8 + plen) as u16;
    {
        let udp = &mut f[34..42];
        udp[0..2].copy_from_slice(&spec.src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&spec.dst.port().to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    }
    fill_payload(&mut f[42..], seq);
    let mut sum = checksum_add(0, &f[26..34]); // src + dst address
    sum += 17 + u32::from(udp_len);
    sum = checksum_add(sum, &f[34..]);
    let mut c = checksum_fold(sum);
    if c == 0 {
        c = 0xffff;
    }
    f[40..42].copy_from_slice(&c.to_be_bytes());
    if let Some(id) = spec.vlan {
        // TPID 0x8100, then PCP 0, DEI 0 and the 12-bit VLAN id.
        let tag = [0x81, 0x00, ((id >> 8) & 0x0f) as u8, id as u8];
        f.splice(12..12, tag);
    }
    f
}

/// Parses "aa:bb:cc:dd:ee:ff".
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut it = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(it.next()?, 16).ok()?;
    }
    it.next().is_none().then_some(m)
}

/// Generator settings.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub via: Via,
    /// Interface for raw frames (required for mmsg/txring; optional for udp).
    pub iface: Option<String>,
    pub spec: FrameSpec,
    /// Packets per second; 0 = as fast as possible.
    pub rate: u64,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    /// Packets per syscall at most.
    pub batch: usize,
}

/// What the generator achieved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenReport {
    pub sent: u64,
    pub elapsed: Duration,
    pub syscalls: u64,
    /// TX ring frames the kernel rejected (TP_STATUS_WRONG_FORMAT).
    pub rejected: u64,
}

impl GenReport {
    pub fn rate(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.sent as f64 / s
        } else {
            0.0
        }
    }
}

/// Paces sending: how many packets may go now so that `sent` follows `rate`.
#[derive(Debug, Clone, Copy)]
pub struct Pacer {
    rate: u64,
    batch: usize,
}

impl Pacer {
    pub fn new(rate: u64, batch: usize) -> Self {
        Pacer {
            rate,
            batch: batch.max(1),
        }
    }

    /// Packets allowed at `elapsed` having sent `sent`, or the time to wait.
    pub fn allowance(&self, elapsed: Duration, sent: u64) -> std::result::Result<usize, Duration> {
        if self.rate == 0 {
            return Ok(self.batch);
        }
        let due = (elapsed.as_nanos() * u128::from(self.rate) / 1_000_000_000) as u64 + 1;
        if due > sent {
            Ok((due - sent).min(self.batch as u64) as usize)
        } else {
            let next_at = Duration::from_nanos(((sent as u128) * 1_000_000_000 / u128::from(self.rate)) as u64);
            Err(next_at.saturating_sub(elapsed))
        }
    }
}

/// Reads the MAC address of an interface from sysfs.
pub fn iface_mac(iface: &str) -> Option<[u8; 6]> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{iface}/address")).ok()?;
    parse_mac(s.trim())
}

enum Sender {
    Udp(UdpSender),
    Mmsg(PacketSocket),
    Ring(TxRing),
}

struct TxRing {
    sock: PacketSocket,
    ring: sys::Ring,
    frame_size: usize,
    frames_per_block: usize,
    block_size: usize,
    frame_nr: usize,
    next: usize,
}

const TP_STATUS_AVAILABLE: u32 = 0;
const TP_STATUS_SEND_REQUEST: u32 = 1;
const TP_STATUS_WRONG_FORMAT: u32 = 1 << 2;
/// Where TPACKET_V2 TX frames start their data: TPACKET2_HDRLEN minus
/// sizeof(sockaddr_ll).
const TX_DATA_OFF: usize = 32;

impl TxRing {
    fn frame_off(&self, i: usize) -> usize {
        (i / self.frames_per_block) * self.block_size + (i % self.frames_per_block) * self.frame_size
    }

    /// Waits for every queued frame to be sent; counts rejected ones.
    fn drain(&mut self, deadline: Instant) -> Result<u64> {
        let mut rejected = 0;
        for i in 0..self.frame_nr {
            let off = self.frame_off(i);
            loop {
                let st = self.ring.load_status(off);
                if st & TP_STATUS_WRONG_FORMAT != 0 {
                    rejected += 1;
                    self.ring.store_status(off, TP_STATUS_AVAILABLE);
                    break;
                }
                if st == TP_STATUS_AVAILABLE || Instant::now() > deadline {
                    break;
                }
                self.sock.kick_tx(false).map_err(CaptureError::from_sys)?;
                self.sock
                    .poll_out(Duration::from_millis(10))
                    .map_err(CaptureError::from_sys)?;
            }
        }
        Ok(rejected)
    }
}

/// Sends packets as configured until the count or duration is reached or
/// `stop` is set. `progress` is called about once a second.
pub fn generate(cfg: &GenConfig, stop: &AtomicBool, progress: &mut dyn FnMut(u64, Duration)) -> Result<GenReport> {
    if cfg.spec.frame_len < MIN_FRAME_LEN {
        return Err(CaptureError::Config(format!(
            "frame size {} is below the minimum of {MIN_FRAME_LEN} bytes (headers + sequence number)",
            cfg.spec.frame_len
        )));
    }
    if cfg.count.is_none() && cfg.duration.is_none() {
        return Err(CaptureError::Config("give a packet count (-c) or a --duration".into()));
    }
    let ifindex = match &cfg.iface {
        Some(i) => Some(sys::if_index(i).ok_or_else(|| CaptureError::NoSuchInterface(i.clone()))?),
        None => None,
    };
    let need_iface =
        || ifindex.ok_or_else(|| CaptureError::Config(format!("--via {} needs an interface (-i)", cfg.via)));
    let mut sender = match cfg.via {
        Via::Udp => Sender::Udp(
            UdpSender::new(cfg.spec.dst, Some(cfg.spec.src), cfg.iface.as_deref()).map_err(CaptureError::from_sys)?,
        ),
        Via::Mmsg => {
            let s = PacketSocket::open(false).map_err(CaptureError::from_sys)?;
            s.bind(need_iface()?, 0).map_err(CaptureError::from_sys)?;
            Sender::Mmsg(s)
        }
        Via::TxRing => {
            let s = PacketSocket::open(false).map_err(CaptureError::from_sys)?;
            s.set_version(1).map_err(CaptureError::from_sys)?;
            let frame_size = (cfg.spec.frame_len + TX_DATA_OFF).next_power_of_two().max(2048) as u32;
            let block_size = frame_size.max(64 << 10);
            let block_nr = 16u32;
            s.set_tx_ring_v2(block_size, block_nr, frame_size)
                .map_err(|e| CaptureError::RingRefused {
                    mode: "tx",
                    block_size,
                    block_count: block_nr,
                    frame_size,
                    source: e,
                })?;
            let ring = s
                .mmap_ring((block_size * block_nr) as usize)
                .map_err(CaptureError::from_sys)?;
            s.bind(need_iface()?, 0).map_err(CaptureError::from_sys)?;
            let fpb = (block_size / frame_size) as usize;
            Sender::Ring(TxRing {
                sock: s,
                ring,
                frame_size: frame_size as usize,
                frames_per_block: fpb,
                block_size: block_size as usize,
                frame_nr: fpb * block_nr as usize,
                next: 0,
            })
        }
    };
    let batch = cfg.batch.clamp(1, 1024);
    // Pre-build one batch worth of packets; only the sequence-dependent
    // parts change per packet, but rebuilding is simpler and cheap next to
    // the syscall at these sizes.
    let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(batch);
    let pacer = Pacer::new(cfg.rate, batch);
    let start = Instant::now();
    let mut last_progress = start;
    let mut sent: u64 = 0;
    let mut syscalls: u64 = 0;
    let limit = cfg.count.unwrap_or(u64::MAX);
    loop {
        let elapsed = start.elapsed();
        if sent >= limit || stop.load(Ordering::Relaxed) || cfg.duration.is_some_and(|d| elapsed >= d) {
            break;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            progress(sent, elapsed);
            last_progress = Instant::now();
        }
        let n = match pacer.allowance(elapsed, sent) {
            Ok(n) => n.min((limit - sent) as usize),
            Err(wait) => {
                // Sleep when the next packet is far off; spin-yield otherwise
                // (sleep granularity would cap the rate).
                if wait > Duration::from_micros(200) {
                    std::thread::sleep(wait - Duration::from_micros(100));
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
        };
        bufs.clear();
        for k in 0..n as u64 {
            let f = build_udp_frame(&cfg.spec, sent + k);
            bufs.push(match cfg.via {
                Via::Udp => f[HEADERS_LEN..].to_vec(),
                _ => f,
            });
        }
        let done = match &mut sender {
            Sender::Udp(s) => {
                let refs: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
                syscalls += 1;
                s.send_batch(&refs).map_err(CaptureError::from_sys)?
            }
            Sender::Mmsg(s) => {
                let refs: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
                syscalls += 1;
                sys::sendmmsg(s.raw_fd(), &refs).map_err(CaptureError::from_sys)?
            }
            Sender::Ring(r) => {
                let mut queued = 0;
                for b in &bufs {
                    let off = r.frame_off(r.next);
                    let st = r.ring.load_status(off);
                    if st != TP_STATUS_AVAILABLE && st & TP_STATUS_WRONG_FORMAT == 0 {
                        break;
                    }
                    let len = b.len();
                    match r.ring.bytes_mut(off + TX_DATA_OFF, len) {
                        Some(dst) => dst.copy_from_slice(b),
                        None => break,
                    }
                    r.ring.write_u32(off + 4, len as u32);
                    r.ring.write_u32(off + 8, len as u32);
                    r.ring.store_status(off, TP_STATUS_SEND_REQUEST);
                    r.next = (r.next + 1) % r.frame_nr;
                    queued += 1;
                }
                syscalls += 1;
                r.sock.kick_tx(false).map_err(CaptureError::from_sys)?;
                if queued == 0 {
                    r.sock
                        .poll_out(Duration::from_millis(10))
                        .map_err(CaptureError::from_sys)?;
                }
                queued
            }
        };
        if done == 0 {
            // Socket buffer full: give the receiver a moment instead of spinning.
            std::thread::yield_now();
        }
        sent += done as u64;
    }
    let rejected = match &mut sender {
        Sender::Ring(r) => r.drain(Instant::now() + Duration::from_secs(2))?,
        _ => 0,
    };
    Ok(GenReport {
        sent: sent - rejected,
        elapsed: start.elapsed(),
        syscalls,
        rejected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(len: usize) -> FrameSpec {
        FrameSpec {
            vlan: None,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [0xff; 6],
            src: "192.0.2.1:1000".parse().expect("addr"),
            dst: "192.0.2.2:2000".parse().expect("addr"),
            frame_len: len,
        }
    }

    #[test]
    fn frame_has_right_size_and_checksums() {
        for len in [MIN_FRAME_LEN, 64, 65, 1514] {
            let f = build_udp_frame(&spec(len), 12345);
            assert_eq!(f.len(), len);
            // A correct IPv4 header sums to 0xffff (fold gives 0).
            assert_eq!(checksum_fold(checksum_add(0, &f[14..34])), 0);
            let mut sum = checksum_add(0, &f[26..34]);
            sum += 17 + (len - 34) as u32;
            sum = checksum_add(sum, &f[34..]);
            assert_eq!(checksum_fold(sum), 0, "udp checksum for len {len}");
            assert_eq!(check_payload(&f[HEADERS_LEN..]), Some(12345));
        }
    }

    #[test]
    fn corrupted_payload_is_detected() {
        let mut f = build_udp_frame(&spec(64), 9);
        f[50] ^= 1;
        assert_eq!(check_payload(&f[HEADERS_LEN..]), None);
        assert_eq!(check_payload(&f[HEADERS_LEN..HEADERS_LEN + 4]), None);
    }

    #[test]
    fn pacer_follows_rate() {
        let p = Pacer::new(1000, 64);
        assert_eq!(p.allowance(Duration::ZERO, 0), Ok(1));
        assert_eq!(p.allowance(Duration::from_millis(10), 0), Ok(11));
        assert_eq!(
            p.allowance(Duration::from_millis(10), 11),
            Err(Duration::from_millis(1))
        );
        assert_eq!(p.allowance(Duration::from_secs(10), 0), Ok(64));
        assert_eq!(Pacer::new(0, 32).allowance(Duration::ZERO, 1_000_000), Ok(32));
    }

    #[test]
    fn macs_and_vias_parse() {
        assert_eq!(parse_mac("02:00:00:00:0a:ff"), Some([2, 0, 0, 0, 10, 255]));
        assert_eq!(parse_mac("02:00:00:00:0a"), None);
        assert_eq!(parse_mac("02:00:00:00:0a:ff:01"), None);
        assert_eq!("txring".parse(), Ok(Via::TxRing));
        assert!("x".parse::<Via>().is_err());
    }
}
