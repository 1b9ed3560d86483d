//! The tokio driver (feature `tokio`): the client's socket is a
//! [`tokio::net::UdpSocket`](::tokio::net::UdpSocket), and
//! `Client<TokioDriver>` gets async entry points that await the socket or
//! the client's next timer ([`Client::next_update`]) and then `update`.
//!
//! What the UDP socket does not show wakes the loop too, so nothing is
//! polled: the token request's helper thread signals once its answer is
//! in (a std `Waker`, so the core knows no runtime), and each checkpoint
//! exchange's TCP socket is watched (a duplicate of it registered with
//! the runtime for the length of one wait, for reading or writing as the
//! exchange's step needs).
//! [`Config::background_poll`] adds a poll all the same, as a fallback.
//!
//! The core is the same as over [`UdpDriver`](super::UdpDriver), and
//! nothing in [`Client::update`] blocks: the token request (a blocking
//! HTTPS call) runs on a helper thread of its own and `update` only looks
//! for its answer, the checkpoint channel is a non-blocking TCP socket,
//! and the datagram socket is only read with `try_recv_from` and written
//! with `try_send_to`. So calling the client on a runtime worker is fine.
//! Two calls may still block briefly: a reflector or local address given
//! as a host name is resolved with the system resolver (when a token is
//! taken, and at bind); the control server hands out addresses.
//!
//! ```no_run
//! use reflector_client::{Client, Config, Event, Token, TokenSource};
//! use std::time::Duration;
//!
//! async fn play(token: Token) -> Result<(), Box<dyn std::error::Error>> {
//!     let mut client = Client::new_tokio(Config::new(TokenSource::Given(token)))?;
//!     let mut frame = tokio::time::interval(Duration::from_millis(50));
//!     loop {
//!         tokio::select! {
//!             // Sleeps until a datagram or the client's next timer, updates
//!             // (as often as needed) until there is something to take.
//!             alive = client.ready() => if !alive { break },
//!             // The game's own pace; waits if the socket buffer is full.
//!             _ = frame.tick(), if client.is_member() => {
//!                 client.send_async(b"my position").await?;
//!             }
//!         }
//!         // Everything is taken each time (`ready` returns at once while
//!         // something is left).
//!         while client.poll_checkpoint().is_some() {}
//!         while let Some(ev) = client.poll_event() {
//!             if let Event::Error(e) = ev {
//!                 eprintln!("{e}");
//!             }
//!         }
//!         while let Some(d) = client.recv() {
//!             println!("player {} #{}: {} bytes", d.sender, d.seq, d.payload.len());
//!         }
//!     }
//!     Ok(())
//! }
//! ```

use super::Driver;
use crate::schedule::Woken;
use crate::{Client, Config, Error, SendError};
use ::tokio::net::UdpSocket;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// A [`tokio::net::UdpSocket`](UdpSocket), read with `try_recv_from` and
/// written with `try_send_to` (never awaited inside the client). Made
/// within a tokio runtime with IO and time enabled (as `#[tokio::main]`
/// makes it).
#[derive(Debug)]
pub struct TokioDriver {
    sock: UdpSocket,
    /// The last send found the socket's send buffer full (`WouldBlock`).
    send_blocked: bool,
}

impl TokioDriver {
    /// Binds `local` (resolved by the system resolver: give an address, not
    /// a name, on a runtime worker) and registers it with the current tokio
    /// runtime. Outside a runtime it is an error; in a runtime without IO
    /// enabled tokio panics.
    pub fn bind(local: impl ToSocketAddrs) -> io::Result<TokioDriver> {
        ::tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("the tokio driver is made within a tokio runtime: {e}")))?;
        let sock = std::net::UdpSocket::bind(local)?;
        sock.set_nonblocking(true)?;
        Ok(TokioDriver::from(UdpSocket::from_std(sock)?))
    }

    /// The socket, e.g. for its options; the client reads and writes it.
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }
}

impl From<UdpSocket> for TokioDriver {
    /// A socket the caller bound (and set up) itself.
    fn from(sock: UdpSocket) -> TokioDriver {
        TokioDriver {
            sock,
            send_blocked: false,
        }
    }
}

impl Driver for TokioDriver {
    fn send_to(&mut self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        let r = self.sock.try_send_to(datagram, to);
        self.send_blocked = matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        r
    }

    fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.sock.try_recv_from(buf)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn rebind(&mut self) -> io::Result<SocketAddr> {
        let ip = self.sock.local_addr()?.ip();
        *self = TokioDriver::bind(SocketAddr::new(ip, 0))?;
        self.sock.local_addr()
    }
}

impl Client<TokioDriver> {
    /// Binds a [`TokioDriver`] on [`Config::local`] and starts (see
    /// [`Client::with_driver`]); called within a tokio runtime.
    pub fn new_tokio(cfg: Config) -> Result<Client<TokioDriver>, Error> {
        let sock = TokioDriver::bind(cfg.local.as_str()).map_err(|e| Error::socket("bind", e))?;
        Client::with_driver(cfg, sock)
    }

    /// Waits until the socket has a datagram or the client's next timer
    /// is due ([`Client::next_update`]), then [`Client::update`]s: the
    /// async loop's one step, in place of a game loop's fixed-rate
    /// `update`. At once if a timer is already due. Cancel safe (nothing
    /// happens before the wait ends), so it can be one branch of a
    /// `tokio::select!`.
    ///
    /// Woken also by the work the UDP socket does not show: a token
    /// request's answer, and a checkpoint exchange's socket becoming ready
    /// for its next step; neither is polled (see the module docs).
    pub async fn update_when_due(&mut self) {
        {
            let exchanges = channel::Watch::new(self);
            let woken = Woken {
                token_answer: true,
                checkpoint_sockets: exchanges.all_watched(),
            };
            let due = self.next_due(woken);
            if due.is_none_or(|t| t > Instant::now()) {
                let mut timer = pin!(due.map(|t| ::tokio::time::sleep_until(t.into())));
                let mut any = pin!(std::future::poll_fn(|cx: &mut Context<'_>| {
                    // Each is polled every time, so each has our waker. An
                    // error is the runtime shutting down or a socket
                    // failing: `update` finds out.
                    let woke = self.wake.poll(cx).is_ready()
                        | self.sock.sock.poll_recv_ready(cx).is_ready()
                        | exchanges.poll_ready(cx)
                        | timer.as_mut().as_pin_mut().is_some_and(|t| t.poll(cx).is_ready());
                    if woke {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                }));
                any.as_mut().await;
            }
        }
        self.update(Instant::now());
    }

    /// Updates as [`Client::update_when_due`] does until there is
    /// something to take: an event ([`Client::poll_event`]), a datagram
    /// ([`Client::recv`]) or a checkpoint event
    /// ([`Client::poll_checkpoint`]); at once if there is already, so
    /// take everything from the three each time. False once the client
    /// has left ([`Client::leave`]) and everything is taken: nothing more
    /// comes. Cancel safe.
    pub async fn ready(&mut self) -> bool {
        loop {
            if !self.events.is_empty() || self.inbox.len > 0 || !self.ck_events.is_empty() {
                return true;
            }
            if self.left {
                return false;
            }
            self.update_when_due().await;
        }
    }

    /// [`Client::send`], waiting for room when the socket's send buffer is
    /// full instead of failing: the datagram is then sent again, with the
    /// next sequence number (receivers count the number the full buffer
    /// took as a gap). Other errors are `send`'s. Cancelled while waiting,
    /// nothing was sent.
    pub async fn send_async(&mut self, payload: &[u8]) -> Result<u64, SendError> {
        loop {
            self.sock.send_blocked = false;
            match self.send(payload) {
                Err(SendError::Io(_)) if self.sock.send_blocked => {
                    self.sock
                        .sock
                        .writable()
                        .await
                        .map_err(|e| SendError::Io(e.to_string()))?;
                }
                sent => return sent,
            }
        }
    }
}

/// The checkpoint exchanges' sockets, watched for one wait.
mod channel {
    use crate::checkpoint::Waits;
    use crate::{Client, Driver};
    use ::tokio::net::TcpStream;
    use std::task::Context;

    /// Each exchange's socket registered with the runtime, and what its
    /// step waits for. The registration is of a duplicate of the socket
    /// (its own descriptor of the same connection), made for each wait
    /// and closed after it: the exchange's own socket stays the client's
    /// to close whenever `update` ends the exchange, and a fresh
    /// registration also reports a socket that is ready already (one the
    /// last `update` left with bytes unread, its budget spent).
    pub(super) struct Watch {
        sockets: Vec<(TcpStream, Waits)>,
        all: bool,
    }

    impl Watch {
        pub(super) fn new<D: Driver>(c: &Client<D>) -> Watch {
            let mut w = Watch {
                sockets: Vec::new(),
                all: true,
            };
            for t in c.transfers() {
                // The duplicate shares the connection's non-blocking flag.
                match t.socket().try_clone().and_then(TcpStream::from_std) {
                    Ok(s) => w.sockets.push((s, t.waits())),
                    // Not watched: `next_due` polls it instead.
                    Err(_) => w.all = false,
                }
            }
            w
        }

        /// Whether every exchange's socket is watched (none to poll).
        pub(super) fn all_watched(&self) -> bool {
            self.all
        }

        /// Whether any socket is ready for its exchange's next step (or
        /// failed: `update` reports it); registers `cx` with each.
        pub(super) fn poll_ready(&self, cx: &mut Context<'_>) -> bool {
            let mut any = false;
            for (s, waits) in &self.sockets {
                any |= match waits {
                    Waits::Read => s.poll_read_ready(cx).is_ready(),
                    Waits::Write => s.poll_write_ready(cx).is_ready(),
                };
            }
            any
        }
    }
}
