//! Loopback stand-ins: a UDP relay between a client and its reflector
//! (so a test can send datagrams "from the reflector"), and a tiny HTTP
//! server that answers like the control server and counts requests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A datagram a [`Relay`] carried: towards the reflector (true) or the
/// client, and its bytes.
pub type Tapped = (bool, Vec<u8>);

/// The most datagrams a [`Relay`] keeps in its tap.
pub const TAP_MAX: usize = 10_000;

/// Relays datagrams between one client and a reflector. The client sends
/// to [`Relay::addr`] as if it were the reflector.
pub struct Relay {
    pub addr: SocketAddr,
    facing_client: UdpSocket,
    client: Arc<Mutex<Option<SocketAddr>>>,
    /// The next DATA towards the client goes twice.
    pub duplicate_next: Arc<AtomicBool>,
    /// Every datagram relayed, in order, with its direction (true: from
    /// the client to the reflector), the first [`TAP_MAX`] only: what
    /// anyone on the path sees.
    pub tap: Arc<Mutex<Vec<Tapped>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    pub fn start(reflector: SocketAddr) -> Relay {
        let facing_client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let facing_reflector = UdpSocket::bind("127.0.0.1:0").unwrap();
        for s in [&facing_client, &facing_reflector] {
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        }
        let client = Arc::new(Mutex::new(None));
        let duplicate_next = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let tap = Arc::new(Mutex::new(Vec::new()));
        let record = |tap: &Mutex<Vec<Tapped>>, up: bool, d: &[u8]| {
            let mut t = tap.lock().unwrap();
            if t.len() < TAP_MAX {
                t.push((up, d.to_vec()));
            }
        };
        let up = {
            let (c, r, client, stop, tap) = (
                facing_client.try_clone().unwrap(),
                facing_reflector.try_clone().unwrap(),
                Arc::clone(&client),
                Arc::clone(&stop),
                Arc::clone(&tap),
            );
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(SeqCst) {
                    if let Ok((n, from)) = c.recv_from(&mut buf) {
                        record(&tap, true, &buf[..n]);
                        *client.lock().unwrap() = Some(from);
                        let _ = r.send_to(&buf[..n], reflector);
                    }
                }
            })
        };
        let down = {
            let (c, r, client, dup, stop, tap) = (
                facing_client.try_clone().unwrap(),
                facing_reflector,
                Arc::clone(&client),
                Arc::clone(&duplicate_next),
                Arc::clone(&stop),
                Arc::clone(&tap),
            );
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !stop.load(SeqCst) {
                    if let Ok((n, _)) = r.recv_from(&mut buf) {
                        record(&tap, false, &buf[..n]);
                        let Some(to) = *client.lock().unwrap() else { continue };
                        let _ = c.send_to(&buf[..n], to);
                        let data = n > 3 && buf[3] == reflector_proto::protocol::Kind::Data as u8;
                        if data && dup.swap(false, SeqCst) {
                            let _ = c.send_to(&buf[..n], to);
                        }
                    }
                }
            })
        };
        Relay {
            addr: facing_client.local_addr().unwrap(),
            facing_client,
            client,
            duplicate_next,
            tap,
            stop,
            threads: vec![up, down],
        }
    }

    /// Sends `bytes` to the client from the relay's address (which the
    /// client takes for the reflector's).
    pub fn inject(&self, bytes: &[u8]) {
        let to = self.client.lock().unwrap().expect("the client has sent something");
        self.facing_client.send_to(bytes, to).unwrap();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What the stub answers: status, extra headers, body.
pub type Answer = (u16, Vec<(&'static str, String)>, String);

/// An HTTP/1.1 server on loopback that answers every request with what
/// `answer` says, and counts requests.
pub struct HttpStub {
    pub url: String,
    requests: Arc<AtomicU64>,
    /// The request line of the last request (`GET /join?... HTTP/1.1`).
    last: Arc<std::sync::Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpStub {
    pub fn start(answer: impl Fn() -> Answer + Send + 'static) -> HttpStub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (Arc::clone(&requests), Arc::clone(&stop));
        let last = Arc::new(std::sync::Mutex::new(String::new()));
        let last_line = Arc::clone(&last);
        let thread = std::thread::spawn(move || {
            while !halt.load(SeqCst) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req).lines().next().unwrap_or("").to_string();
                *last_line.lock().unwrap() = line;
                count.fetch_add(1, SeqCst);
                let (status, headers, body) = answer();
                let mut resp = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                    body.len()
                );
                for (k, v) in headers {
                    resp.push_str(&format!("{k}: {v}\r\n"));
                }
                resp.push_str("\r\n");
                resp.push_str(&body);
                let _ = conn.write_all(resp.as_bytes());
            }
        });
        HttpStub {
            url,
            requests,
            last,
            stop,
            thread: Some(thread),
        }
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(SeqCst)
    }

    /// The request line of the last request.
    pub fn last_request(&self) -> String {
        self.last.lock().unwrap().clone()
    }
}

impl Drop for HttpStub {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The control server's `/join` answer for `t`.
pub fn ticket_json(t: &reflector_client::Token) -> String {
    serde_json::json!({
        "player": t.player,
        "cell": [0, 0],
        "reflector": t.reflector,
        "reflector_id": 0,
        "group": t.group,
        "token": hex::encode(t.token),
        "session_key": hex::encode(t.session_key),
        "expires_unix_s": t.expires_unix_s,
    })
    .to_string()
}
