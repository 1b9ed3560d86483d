//! MSG_ZEROCOPY on real sockets, in namespaces of the test's own: over veth
//! the kernel copies on delivery and says so, and the sender falls back to
//! copies; into a sink where packets leave without local delivery (a TC
//! program that drops them) completions come uncopied and every buffer is
//! released; behind a slow qdisc the bound on pinned bytes holds.

use oskit::testing::{permanent_neighbour, root_or_skip, sh, veth_pair, NetNsGuard, VethEnd};
use sendpath::zerocopy::{Sent, ZeroCopySender};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

/// TC direct-action classic BPF that returns TC_ACT_SHOT (2) for every
/// packet: the kernel frees it there, before any local delivery.
const DROP_ALL: &str = "1,6 0 0 2,";

/// A namespace with veth `za` (10.97.0.1) and its peer `zb` (10.97.0.2,
/// an address of its own if `zb_addr`, else none).
fn za_zb(zb_addr: bool) -> NetNsGuard {
    let ns = NetNsGuard::new("zc");
    let n = ns.name();
    let zb = VethEnd::new(n, "zb");
    veth_pair(
        VethEnd::new(n, "za").addr("10.97.0.1/24"),
        if zb_addr { zb.addr("10.97.0.2/24") } else { zb },
    );
    ns
}

/// [`za_zb`] where everything sent to 10.97.0.2 is dropped on `za`'s
/// egress: packets leave the stack without local delivery.
fn dropping_sink() -> NetNsGuard {
    let ns = za_zb(false);
    let n = ns.name();
    permanent_neighbour(VethEnd::new(n, "za"), "10.97.0.2", "02:00:00:00:00:02");
    sh(&["tc", "-n", n, "qdisc", "add", "dev", "za", "clsact"]);
    sh(&[
        "tc", "-n", n, "filter", "add", "dev", "za", "egress", "bpf", "da", "bytecode", DROP_ALL,
    ]);
    ns
}

fn buffers(n: usize, len: usize) -> Vec<Arc<[u8]>> {
    (0..n).map(|i| vec![i as u8; len].into()).collect()
}

#[test]
fn over_veth_the_kernel_copies_and_the_sender_falls_back() {
    if !root_or_skip("over_veth_the_kernel_copies_and_the_sender_falls_back") {
        return;
    }
    let ns = za_zb(true);
    ns.run(|| {
        let rx = UdpSocket::bind("10.97.0.2:7000").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("10.97.0.1:0").unwrap();
        let to: SocketAddr = "10.97.0.2:7000".parse().unwrap();
        let mut zc = ZeroCopySender::new(tx.as_fd(), 1024, 1 << 20);
        assert!(zc.zero_copy_off().is_none(), "SO_ZEROCOPY refused");
        let bufs = buffers(40, 1400);
        let mut kinds = vec![];
        for b in &bufs {
            kinds.push(zc.send_to(tx.as_fd(), b, to, |_| {}).unwrap());
            // Every datagram arrives, whichever way it left.
            let mut got = [0u8; 2000];
            let n = rx.recv(&mut got).unwrap();
            assert_eq!(&got[..n], &b[..]);
        }
        assert!(zc.drain(tx.as_fd(), Duration::from_secs(5), |_| {}));
        assert_eq!(kinds[0], Sent::ZeroCopy);
        assert!(zc.stats.completed_copied > 0, "{:?}", zc.stats);
        assert!(zc.zero_copy_off().is_some(), "no fall-back after COPIED completions");
        assert_eq!(*kinds.last().unwrap(), Sent::Copied, "{:?}", zc.stats);
        assert_eq!(zc.stats.completed, zc.stats.zerocopy_sends);
        assert!(bufs.iter().all(|b| Arc::strong_count(b) == 1), "a buffer is still held");
    });
}

#[test]
fn into_a_dropping_sink_completions_are_uncopied_and_release_every_buffer() {
    if !root_or_skip("into_a_dropping_sink_completions_are_uncopied_and_release_every_buffer") {
        return;
    }
    let ns = dropping_sink();
    ns.run(|| {
        let tx = UdpSocket::bind("10.97.0.1:0").unwrap();
        // Larger than the MTU: only segmented late (GSO) is it sent from the
        // pages; fragmented, the kernel copies it (and says COPIED).
        sendpath::set_udp_segment(tx.as_fd(), 1400).unwrap();
        let to: SocketAddr = "10.97.0.2:7000".parse().unwrap();
        let mut zc = ZeroCopySender::new(tx.as_fd(), 4096, 1 << 20);
        let bufs = buffers(200, 8192);
        for b in &bufs {
            assert_eq!(zc.send_to(tx.as_fd(), b, to, |_| {}).unwrap(), Sent::ZeroCopy);
        }
        // Small ones are copied, by the threshold.
        assert_eq!(
            zc.send_to(tx.as_fd(), &bufs[0][..100].into(), to, |_| {}).unwrap(),
            Sent::Copied
        );
        assert!(zc.drain(tx.as_fd(), Duration::from_secs(5), |_| {}), "{:?}", zc.stats);
        assert_eq!(zc.stats.zerocopy_sends, 200);
        assert_eq!(zc.stats.completed, 200);
        assert_eq!(zc.stats.completed_copied, 0, "{:?}", zc.stats);
        assert!(zc.zero_copy_off().is_none());
        assert_eq!(zc.pinned_bytes(), 0);
        assert!(bufs.iter().all(|b| Arc::strong_count(b) == 1), "a buffer is still held");
    });
}

#[test]
fn behind_a_slow_qdisc_the_pinned_bytes_stay_bounded() {
    if !root_or_skip("behind_a_slow_qdisc_the_pinned_bytes_stay_bounded") {
        return;
    }
    let ns = za_zb(false);
    let n = ns.name();
    permanent_neighbour(VethEnd::new(n, "za"), "10.97.0.2", "02:00:00:00:00:02");
    // 8 Mbit/s with a deep queue: completions come late (when TBF lets a
    // datagram's last fragment go), uncopied (the peer drops it on ingress).
    sh(&[
        "tc", "-n", n, "qdisc", "add", "dev", "za", "root", "tbf", "rate", "8mbit", "burst", "4kb", "limit", "4mb",
    ]);
    sh(&["tc", "-n", n, "qdisc", "add", "dev", "zb", "clsact"]);
    sh(&[
        "tc", "-n", n, "filter", "add", "dev", "zb", "ingress", "bpf", "da", "bytecode", DROP_ALL,
    ]);
    ns.run(|| {
        let tx = UdpSocket::bind("10.97.0.1:0").unwrap();
        sendpath::set_udp_segment(tx.as_fd(), 1400).unwrap();
        let to: SocketAddr = "10.97.0.2:7000".parse().unwrap();
        let bound = 96 << 10;
        let mut zc = ZeroCopySender::new(tx.as_fd(), 4096, bound).with_stall(Duration::from_secs(10));
        let bufs = buffers(24, 32 << 10);
        for b in &bufs {
            assert_eq!(zc.send_to(tx.as_fd(), b, to, |_| {}).unwrap(), Sent::ZeroCopy);
            assert!(zc.pinned_bytes() <= bound, "{} bytes pinned", zc.pinned_bytes());
        }
        assert!(zc.stats.waits > 0, "the bound never made a send wait: {:?}", zc.stats);
        assert!(zc.stats.peak_pinned <= bound, "{:?}", zc.stats);
        assert!(zc.drain(tx.as_fd(), Duration::from_secs(20), |_| {}), "{:?}", zc.stats);
        assert_eq!(
            (zc.stats.completed, zc.stats.completed_copied, zc.stats.stalled),
            (24, 0, 0)
        );
        assert!(bufs.iter().all(|b| Arc::strong_count(b) == 1));
    });
}

#[test]
fn the_probe_finds_a_zero_copy_path_on_this_kernel() {
    use sendpath::zerocopy::ZcBackend;
    let (best, why_not) = ZcBackend::probe();
    // Linux 6.0+ has SEND_ZC; anything older must say why it fell back.
    assert!(best == ZcBackend::Uring || !why_not.is_empty(), "{best:?} {why_not:?}");
    assert_ne!(best, ZcBackend::Copy, "{why_not:?}");
}

#[test]
fn uring_send_zc_from_registered_buffers_completes_uncopied_into_a_dropping_sink() {
    if !root_or_skip("uring_send_zc_from_registered_buffers_completes_uncopied_into_a_dropping_sink") {
        return;
    }
    let ns = dropping_sink();
    ns.run(|| {
        let tx = UdpSocket::bind("10.97.0.1:0").unwrap();
        tx.connect("10.97.0.2:7000").unwrap();
        sendpath::set_udp_segment(tx.as_fd(), 1400).unwrap();
        let mut u = sendpath::UringZcSender::new(tx.as_fd(), 16, 8192).unwrap();
        for k in 0..200u32 {
            let (i, buf) = u.slot().unwrap();
            buf.fill(k as u8);
            u.send(i, 8192).unwrap();
        }
        assert!(u.drain(Duration::from_secs(5)).unwrap(), "{:?}", u.stats);
        assert_eq!((u.stats.zerocopy_sends, u.stats.completed), (200, 200));
        assert_eq!(u.stats.completed_copied, 0, "{:?}", u.stats);
        assert_eq!(u.outstanding(), 0);
    });
}

#[test]
fn uring_send_zc_over_veth_delivers_every_datagram_and_reports_the_copy() {
    if !root_or_skip("uring_send_zc_over_veth_delivers_every_datagram_and_reports_the_copy") {
        return;
    }
    let ns = za_zb(true);
    ns.run(|| {
        let rx = UdpSocket::bind("10.97.0.2:7000").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("10.97.0.1:0").unwrap();
        tx.connect("10.97.0.2:7000").unwrap();
        let mut u = sendpath::UringZcSender::new(tx.as_fd(), 4, 1400).unwrap();
        for k in 0..50u8 {
            let (i, buf) = u.slot().unwrap();
            buf.fill(k);
            u.send(i, 1400).unwrap();
            let mut got = [0u8; 2000];
            let len = rx.recv(&mut got).unwrap();
            assert_eq!(len, 1400);
            assert!(got[..len].iter().all(|b| *b == k), "datagram {k} bytes");
        }
        assert!(u.drain(Duration::from_secs(5)).unwrap());
        assert_eq!(u.stats.completed, 50);
        // Local delivery copies the pages; the notification says so.
        assert!(u.stats.completed_copied > 0, "{:?}", u.stats);
    });
}
