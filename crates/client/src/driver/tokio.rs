//! The tokio driver (feature `tokio`): the client's socket is a
//! [`tokio::net::UdpSocket`](::tokio::net::UdpSocket), and
//! `Client<TokioDriver>` gets async entry points that await the socket or
//! the client's next timer ([`Client::next_update`]) and then `update`.
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
use crate::{Client, Config, Error, SendError};
use ::tokio::net::UdpSocket;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
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
    pub async fn update_when_due(&mut self) {
        let due = self.next_update();
        if due.is_none_or(|t| t > Instant::now()) {
            let readable = self.sock.sock.readable();
            // An error here is the runtime shutting down: update anyway.
            let _ = match due {
                Some(t) => ::tokio::time::timeout_at(t.into(), readable).await.unwrap_or(Ok(())),
                None => readable.await,
            };
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
