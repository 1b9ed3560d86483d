//! The resend thread: copies the program could not send (a full qdisc or
//! device queue) come up through a ring buffer and are sent from the
//! group's socket, waiting out EAGAIN and ENOBUFS as the user-space
//! backends do, so a full queue loses nothing in the kernel path either.

use super::sys::{RESEND_HEAD, RESEND_MAX};
use crate::backend::user::{Next, ResendTarget, Waiter, Wake};
use crate::metrics::GroupCounters;
use aya::maps::{Array, MapData, RingBuf};
use std::net::UdpSocket;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

/// One record of the resend ring: the group, the member, the datagram.
fn parse_resend(b: &[u8]) -> Option<(u16, SocketAddrV4, &[u8])> {
    let head = b.get(..RESEND_HEAD)?;
    let group = u16::from_be_bytes([head[0], head[1]]);
    let port = u16::from_be_bytes([head[2], head[3]]);
    let ip = Ipv4Addr::new(head[4], head[5], head[6], head[7]);
    let len = u32::from_ne_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if len > RESEND_MAX {
        return None;
    }
    let data = b.get(RESEND_HEAD..RESEND_HEAD + len)?;
    Some((group, SocketAddrV4::new(ip, port), data))
}

pub(super) fn resend_loop(
    mut ring: RingBuf<MapData>,
    mut resent: Array<MapData, u64>,
    targets: &[ResendTarget],
    ids: &[u32],
    stop: &AtomicBool,
) {
    let mut done = vec![0u64; targets.len()];
    let epoll = match nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("resend thread: epoll: {e}; copies the kernel could not send will be lost");
            return;
        }
    };
    let ev = nix::sys::epoll::EpollEvent::new(nix::sys::epoll::EpollFlags::EPOLLIN, 0);
    if let Err(e) = epoll.add(ring.as_fd(), ev) {
        tracing::error!("resend thread: cannot wait on the ring buffer: {e}");
        return;
    }
    let mut events = [nix::sys::epoll::EpollEvent::empty(); 1];
    let mut buf = Vec::with_capacity(RESEND_MAX);
    while !stop.load(Relaxed) {
        let _ = epoll.wait(&mut events, nix::sys::epoll::EpollTimeout::from(50u16));
        loop {
            let Some(item) = ring.next() else { break };
            let Some((group, to, data)) = parse_resend(&item) else {
                continue;
            };
            buf.clear();
            buf.extend_from_slice(data);
            // Release the ring's slot before the (possibly long) wait.
            drop(item);
            let Some(k) = targets.iter().position(|t| t.port == group) else {
                continue;
            };
            let t = &targets[k];
            if resend(&t.sock, &buf, SocketAddr::V4(to), &t.counters, stop) {
                t.counters.fanned_out.fetch_add(1, Relaxed);
                t.counters.bytes_out.fetch_add(buf.len() as u64, Relaxed);
                t.counters.kernel_resent.fetch_add(1, Relaxed);
            } else {
                t.counters.send_errors.fetch_add(1, Relaxed);
            }
            // Dealt with: once all are, the program takes the group back.
            done[k] += 1;
            if let Err(e) = resent.set(ids[k], done[k], 0) {
                tracing::warn!("resend thread: cannot update group {group}'s count: {e}");
            }
        }
    }
}

/// Sends one copy, waiting as long as the queue is full (the no-loss rule
/// of the user-space backends); false if the destination keeps failing
/// for another reason, or at shutdown.
fn resend(sock: &UdpSocket, buf: &[u8], to: SocketAddr, c: &GroupCounters, stop: &AtomicBool) -> bool {
    let mut w = Waiter::new();
    loop {
        match sendpath::SendOne::send(sock.as_fd(), buf, to) {
            Ok(_) => {
                w.success();
                return true;
            }
            Err(e) => match w.after_error(&e, c) {
                Next::Retry => {}
                Next::Skip => return false,
                Next::Wait(Wake::Writable) => {
                    let _ = sendpath::wait_writable(sock.as_fd(), 50);
                }
                Next::Wait(Wake::At(t)) => std::thread::sleep(t.saturating_duration_since(Instant::now())),
            },
        }
        if stop.load(Relaxed) {
            return false;
        }
    }
}
