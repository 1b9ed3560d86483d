//! The hardened HTTP server under the reflector's control server and its
//! `/metrics` listener: hyper (HTTP/1.1) on a small tokio runtime of its
//! own, one thread, off the data path. A user hands it a [`Handler`] (a
//! request in, a [`Response`] out) and its [`Limits`]; neither the control
//! server nor the data plane sees hyper or tokio.
//!
//! Whatever the clients do, the server stays within stated bounds, each a
//! field of [`Limits`] with its default:
//! - request headers (request line included) above `max_header_bytes` get
//!   431 and the connection is closed; memory per connection is bounded by
//!   hyper's read buffer, never by what the client sends;
//! - request bodies are never read: a declared body above `max_body_bytes`,
//!   or a chunked one, gets 413 (every endpoint is a GET);
//! - headers not complete within `header_read_timeout` (a slow or stuck
//!   client) and connections with no byte either way for `idle_timeout`
//!   are closed;
//! - at most `max_connections` are open at once (the open-file limit is
//!   raised to fit at start); further ones are closed at once and counted;
//! - malformed request lines get 400 and `HTTP/2.0` lines 400 (hyper's
//!   parser), the HTTP/2 connection preface gets 505; every connection is
//!   its own task, so a client that pipelines without reading stalls only
//!   itself;
//! - [`HttpServer::stop`] closes everything within [`SHUTDOWN_GRACE`],
//!   whatever the clients are doing;
//! - with a certificate ([`Tls`]) every connection is TLS (rustls, HTTP/1.1
//!   by ALPN); the handshake must finish within `header_read_timeout`.
#![deny(unsafe_code)]

pub mod expo;
use http_body_util::Full;
pub use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// How long [`HttpServer::stop`] lets requests in progress finish before
/// every connection is dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);
/// How often the serving loop looks at the process's stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);
/// File descriptors kept free for everything else the process opens.
const FD_RESERVE: u64 = 256;
/// The start of the HTTP/2 connection preface ("prior knowledge" clients).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// The bounds of one HTTP server; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Request line and headers, bytes (hyper's minimum buffer is 8 KiB).
    pub max_header_bytes: usize,
    /// Largest request body accepted without reading it, bytes.
    pub max_body_bytes: u64,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 8 << 10,
            max_body_bytes: 1 << 10,
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
}

/// The limits on the command line (`reflector control`, `reflector serve --metrics`).
#[derive(clap::Args, Debug, Clone)]
pub struct HttpArgs {
    /// HTTP: most connections open at once; more are closed at once and counted
    /// (the open-file limit is raised to fit).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub http_max_connections: u64,
    /// HTTP: how long a client may take to send a request's headers (e.g. 5s; a bare number is
    /// seconds); slower ones are disconnected (slow-header attacks).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = timeout)]
    pub http_header_timeout: Duration,
    /// HTTP: how long a connection may stay without a byte either way (e.g. 30s; a bare number
    /// is seconds).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = timeout)]
    pub http_idle_timeout: Duration,
    /// HTTP: largest request line plus headers, bytes (431 above; at least 8192).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(8192..=1 << 20))]
    pub http_max_header_bytes: u64,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl HttpArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            max_header_bytes: self.http_max_header_bytes as usize,
            max_body_bytes: Limits::default().max_body_bytes,
            header_read_timeout: self.http_header_timeout,
            idle_timeout: self.http_idle_timeout,
            max_connections: self.http_max_connections as usize,
        }
    }

    /// The TLS configuration, if a certificate was given.
    pub fn tls(&self) -> Result<Option<Tls>, HttpError> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Tls::from_pem_files(cert, key).map(Some),
            _ => Ok(None),
        }
    }
}

/// An HTTP timeout: above zero, at most a day.
fn timeout(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(Duration::from_millis(1), Duration::from_secs(86_400))(s)
}

/// A server certificate and key, ready for rustls.
#[derive(Clone)]
pub struct Tls(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.write_str("Tls(..)")
    }
}

impl Tls {
    /// Reads a PEM certificate chain and its private key.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Tls, HttpError> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |path: &Path, what: String| HttpError::Tls {
            path: path.display().to_string(),
            what,
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| bad(cert, format!("not a PEM certificate chain: {e}")))?;
        if chain.is_empty() {
            return Err(bad(cert, "holds no certificate".into()));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| bad(key, format!("does not go with the certificate: {e}")))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls(Arc::new(cfg)))
    }
}

/// What a handler sees of a request.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    /// Path and query, e.g. `/join?player=1&x=0&y=0`.
    pub target: &'a str,
    pub peer: SocketAddr,
    /// The `Authorization` header, if any (and if it is text).
    pub authorization: Option<&'a str>,
    /// The `Accept` header, if any (and if it is text): the metrics
    /// endpoints choose their exposition format by it.
    pub accept: Option<&'a str>,
    /// What this server has done so far, this request counted (for the
    /// server's own `/metrics`).
    pub stats: Stats,
}

/// A handler's answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    /// Shared bytes, so a handler can answer from a cache without copying.
    pub body: Bytes,
    /// Sent as `Retry-After` (seconds), with 429 and 503.
    pub retry_after_s: Option<u32>,
}

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Bytes::from(body.into()),
            retry_after_s: None,
        }
    }
}

/// Answers requests. Called on the server's one thread: it must not block.
pub type Handler = Arc<dyn Fn(&Request<'_>) -> Response + Send + Sync>;

/// What a server did, returned by [`HttpServer::stop`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Requests answered by the handler.
    pub requests: u64,
    pub connections: u64,
    /// Connections closed at once because `max_connections` were open.
    pub over_cap: u64,
    /// Connections closed after `idle_timeout` without traffic.
    pub idle_closed: u64,
    /// Requests refused for their body (413).
    pub body_refused: u64,
    /// HTTP/2 prefaces answered 505.
    pub h2_refused: u64,
    /// TLS handshakes that failed or took longer than the header timeout.
    pub tls_failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    connections: AtomicU64,
    over_cap: AtomicU64,
    idle_closed: AtomicU64,
    body_refused: AtomicU64,
    h2_refused: AtomicU64,
    tls_failed: AtomicU64,
}

impl Counters {
    fn stats(&self) -> Stats {
        Stats {
            requests: self.requests.load(Relaxed),
            connections: self.connections.load(Relaxed),
            over_cap: self.over_cap.load(Relaxed),
            idle_closed: self.idle_closed.load(Relaxed),
            body_refused: self.body_refused.load(Relaxed),
            h2_refused: self.h2_refused.load(Relaxed),
            tls_failed: self.tls_failed.load(Relaxed),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {source} ({})", listen_hint(addr, source))]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the {name} HTTP thread: {source}")]
    Thread {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Limits(String),
    #[error("TLS: {path} {what}")]
    Tls { path: String, what: String },
}

/// What most likely made listening on `addr` fail, by the error's cause.
pub fn listen_hint(addr: &SocketAddr, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host: listen on one of its addresses (`ip -brief address`), or 127.0.0.1",
            addr.ip()
        ),
        io::ErrorKind::AddrInUse => format!("is another server running on port {}?", addr.port()),
        io::ErrorKind::PermissionDenied => format!(
            "port {} is below net.ipv4.ip_unprivileged_port_start: run as root or with CAP_NET_BIND_SERVICE, or use a higher port",
            addr.port()
        ),
        _ => "check the address".to_string(),
    }
}

/// Binds a listening socket for [`HttpServer::start_on`].
pub fn bind(listen: SocketAddr) -> Result<std::net::TcpListener, HttpError> {
    let listener = std::net::TcpListener::bind(listen).map_err(|source| HttpError::Listen { addr: listen, source })?;
    // tokio takes the socket over, and needs it non-blocking.
    listener
        .set_nonblocking(true)
        .map_err(|source| HttpError::Listen { addr: listen, source })?;
    Ok(listener)
}

/// A running HTTP server.
pub struct HttpServer {
    addr: SocketAddr,
    halt: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `listen` (port 0 picks one; see [`HttpServer::addr`]) and
    /// serves on a thread named `name` until [`HttpServer::stop`] or until
    /// `stop` (the process's signal flag) is set.
    pub fn start(
        name: &str,
        listen: SocketAddr,
        limits: Limits,
        tls: Option<Tls>,
        handler: Handler,
        stop: Arc<AtomicBool>,
    ) -> Result<HttpServer, HttpError> {
        HttpServer::start_on(name, bind(listen)?, limits, tls, handler, stop)
    }

    /// [`HttpServer::start`] on a listener bound earlier with [`bind`] (so
    /// that a taken address fails before anything else starts).
    pub fn start_on(
        name: &str,
        listener: std::net::TcpListener,
        limits: Limits,
        tls: Option<Tls>,
        handler: Handler,
        stop: Arc<AtomicBool>,
    ) -> Result<HttpServer, HttpError> {
        if limits.max_header_bytes < 8192 {
            return Err(HttpError::Limits(format!(
                "the header limit must be at least 8192 bytes (hyper's smallest buffer), got {}",
                limits.max_header_bytes
            )));
        }
        if limits.max_connections == 0 || limits.header_read_timeout.is_zero() || limits.idle_timeout.is_zero() {
            return Err(HttpError::Limits(format!(
                "connection cap and timeouts must be positive: {limits:?}"
            )));
        }
        let max_connections = fit_connection_cap(limits.max_connections);
        let addr = listener.local_addr().map_err(|source| HttpError::Thread {
            name: name.to_string(),
            source,
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|source| HttpError::Thread {
                name: name.to_string(),
                source,
            })?;
        let halt = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let ctx = Arc::new(Ctx {
            limits: Limits {
                max_connections,
                ..limits
            },
            handler,
            counters: Arc::clone(&counters),
            tls: tls.map(|t| tokio_rustls::TlsAcceptor::from(t.0)),
        });
        let (h, name2) = (Arc::clone(&halt), name.to_string());
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(l) => accept_loop(l, ctx, &h, &stop).await,
                        Err(e) => tracing::error!("{name2}: cannot register the listener: {e}"),
                    }
                });
                // Dropping the runtime drops every connection task still
                // alive after the grace period: nothing outlives stop().
                drop(runtime);
            })
            .map_err(|source| HttpError::Thread {
                name: name.to_string(),
                source,
            })?;
        Ok(HttpServer {
            addr,
            halt,
            counters,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server has done so far.
    pub fn stats(&self) -> Stats {
        self.counters.stats()
    }

    /// Stops accepting, lets requests in progress finish for up to
    /// [`SHUTDOWN_GRACE`], drops every connection and waits for the thread.
    pub fn stop(mut self) -> Stats {
        self.halt();
        self.counters.stats()
    }

    fn halt(&mut self) {
        self.halt.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.halt();
    }
}

struct Ctx {
    limits: Limits,
    handler: Handler,
    counters: Arc<Counters>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// The cap we can honour: lifts the soft open-file limit towards the hard
/// one if needed, and lowers the cap (saying so once) if even that is short.
fn fit_connection_cap(want: usize) -> usize {
    let need = want as u64 + FD_RESERVE;
    match oskit::rlimit::raise_nofile_limit(need) {
        Ok(soft) if soft >= need => want,
        Ok(soft) => {
            let cap = soft.saturating_sub(FD_RESERVE).max(1) as usize;
            tracing::warn!(
                "open-file limit {soft} allows only {cap} HTTP connections, not {want}: raise `ulimit -n` for more"
            );
            cap
        }
        Err(e) => {
            tracing::warn!("cannot read the open-file limit ({e}); keeping the HTTP connection cap at {want}");
            want
        }
    }
}

/// Logs one line per reason at most once a second.
struct RateLimitedLog {
    last: Option<Instant>,
}

impl RateLimitedLog {
    fn warn(&mut self, msg: impl FnOnce() -> String) {
        let now = Instant::now();
        if self
            .last
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.last = Some(now);
            tracing::warn!("{}", msg());
        }
    }
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, halt: &AtomicBool, stop: &AtomicBool) {
    let permits = Arc::new(Semaphore::new(ctx.limits.max_connections));
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut cap_log = RateLimitedLog { last: None };
    let mut accept_log = RateLimitedLog { last: None };
    let mut tick = tokio::time::interval(STOP_POLL);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if halt.load(Relaxed) || stop.load(Relaxed) {
                    break;
                }
            }
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off a little instead of spinning.
                        accept_log.warn(|| format!("HTTP accept failed: {e}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    ctx.counters.over_cap.fetch_add(1, Relaxed);
                    cap_log.warn(|| format!(
                        "HTTP connection from {peer} closed: {} connections open (the cap)",
                        ctx.limits.max_connections
                    ));
                    drop(stream);
                    continue;
                };
                ctx.counters.connections.fetch_add(1, Relaxed);
                let (ctx, closing) = (Arc::clone(&ctx), closing_rx.clone());
                tokio::spawn(async move {
                    serve_connection(stream, peer, &ctx, closing).await;
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    // Ask every connection to finish its request in progress and close;
    // whatever is still open after the grace period is dropped with the runtime.
    let _ = closing_tx.send(true);
    let all = u32::try_from(ctx.limits.max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all)).await;
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, ctx: &Arc<Ctx>, closing: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let limits = ctx.limits;
    let activity = Arc::new(Activity::new());
    let tracked = Tracked {
        inner: stream,
        activity: Arc::clone(&activity),
    };
    match &ctx.tls {
        Some(acceptor) => {
            // The handshake counts as reading the headers: same deadline.
            let accepted = tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tracked)).await;
            match accepted {
                Ok(Ok(tls)) => serve_http(TokioIo::new(tls), &activity, peer, ctx, closing).await,
                Ok(Err(e)) => {
                    ctx.counters.tls_failed.fetch_add(1, Relaxed);
                    tracing::debug!("TLS handshake with {peer} failed: {e}");
                }
                Err(_) => {
                    ctx.counters.tls_failed.fetch_add(1, Relaxed);
                }
            }
        }
        None => match first_bytes(&tracked.inner, limits.header_read_timeout).await {
            First::Http1 => serve_http(TokioIo::new(tracked), &activity, peer, ctx, closing).await,
            First::H2Preface => {
                ctx.counters.h2_refused.fetch_add(1, Relaxed);
                refuse_h2(tracked.inner).await;
            }
            // Nothing within the header timeout, or gone: the same as a
            // header timeout, without an answer (there is no request).
            First::Nothing => {}
        },
    }
}

/// HTTP/1.1 on one connection until it ends, idles out or the server stops.
async fn serve_http<I>(
    io: TokioIo<I>,
    activity: &Activity,
    peer: SocketAddr,
    ctx: &Arc<Ctx>,
    mut closing: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = ctx.limits;
    let c = Arc::clone(ctx);
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let c = Arc::clone(&c);
        async move {
            // One request per turn: a client pipelining requests without
            // reading the answers must not keep the thread from the others.
            tokio::task::yield_now().await;
            Ok::<_, Infallible>(answer(&c, &req, peer))
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .max_header_size(limits.max_header_bytes);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut shutting_down = false;
    loop {
        let check_in = limits.idle_timeout.saturating_sub(activity.idle_for());
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep(check_in) => {
                if activity.idle_for() >= limits.idle_timeout {
                    ctx.counters.idle_closed.fetch_add(1, Relaxed);
                    return;
                }
            }
            changed = closing.changed(), if !shutting_down => {
                shutting_down = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Builds the answer to one request: the size checks, then the handler.
fn answer(ctx: &Ctx, req: &hyper::Request<Incoming>, peer: SocketAddr) -> hyper::Response<Full<Bytes>> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let chunked = req.headers().contains_key(TRANSFER_ENCODING);
    let limit = ctx.limits.max_body_bytes;
    let r = if chunked || declared.is_some_and(|n| n > limit) {
        ctx.counters.body_refused.fetch_add(1, Relaxed);
        Response::text(
            413,
            format!("request bodies above {limit} bytes (or chunked) are not accepted: every endpoint is a GET\n"),
        )
    } else {
        ctx.counters.requests.fetch_add(1, Relaxed);
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        (ctx.handler)(&Request {
            method: req.method().as_str(),
            target,
            peer,
            authorization: req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
            accept: req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()),
            stats: ctx.counters.stats(),
        })
    };
    let status = hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = hyper::Response::new(Full::new(r.body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(r.content_type));
    if let Some(s) = r.retry_after_s {
        resp.headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from(s));
    }
    if status == hyper::StatusCode::PAYLOAD_TOO_LARGE {
        // The body was not read: the connection cannot carry another request.
        resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

enum First {
    Http1,
    H2Preface,
    Nothing,
}

/// Looks at the first bytes without taking them: the HTTP/2 preface, which
/// hyper's HTTP/1 parser would drop without an answer, is answered 505
/// here. Waits at most `timeout` for a first byte; whatever the rest of the
/// headers take is hyper's header timeout.
async fn first_bytes(stream: &TcpStream, timeout: Duration) -> First {
    let mut first = [0u8; H2_PREFACE.len()];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n == first.len() && first == H2_PREFACE => First::H2Preface,
        Ok(Ok(n)) if n > 0 => First::Http1,
        _ => First::Nothing,
    }
}

async fn refuse_h2(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = "this server speaks HTTP/1.1 only\n";
    let msg = format!(
        "HTTP/1.1 505 HTTP Version Not Supported\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(msg.as_bytes())).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}

/// When a connection last moved a byte, for the idle timeout.
struct Activity {
    base: Instant,
    last_ns: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            base: Instant::now(),
            last_ns: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        self.last_ns.store(self.base.elapsed().as_nanos() as u64, Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_nanos(self.last_ns.load(Relaxed));
        self.base.elapsed().saturating_sub(last)
    }
}

/// A stream that records when it last moved a byte.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn server(limits: Limits) -> HttpServer {
        let big = "x".repeat(1 << 20);
        let handler: Handler = Arc::new(move |req: &Request<'_>| match req.target {
            "/big" => Response::text(200, big.clone()),
            _ => Response::text(200, "ok\n"),
        });
        let stop = Arc::new(AtomicBool::new(false));
        HttpServer::start("test-http", "127.0.0.1:0".parse().unwrap(), limits, None, handler, stop).unwrap()
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_client_that_stops_reading_is_closed_after_the_idle_timeout() {
        let s = server(Limits {
            idle_timeout: Duration::from_millis(500),
            ..Limits::default()
        });
        let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        // Megabyte answers that are never read: the server's writes stall.
        for _ in 0..64 {
            if c.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n").is_err() {
                break;
            }
        }
        wait_until("the idle close", || s.stats().idle_closed == 1);
        let st = s.stop();
        assert!(st.requests >= 1, "{st:?}");
        assert_eq!(st.connections, 1);
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let s = server(Limits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(2),
            ..Limits::default()
        });
        let ask = |bytes: &[u8]| {
            let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(bytes).unwrap();
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            out
        };
        assert!(ask(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").starts_with("HTTP/1.1 505"));
        assert!(ask(b"GET / HTTP/1.1\r\nContent-Length: 2000\r\n\r\n").starts_with("HTTP/1.1 413"));
        assert!(ask(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 200"));
        let held: Vec<_> = (0..2)
            .map(|_| std::net::TcpStream::connect(s.addr()).unwrap())
            .collect();
        wait_until("the cap to be reached", || {
            let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            matches!(c.read(&mut [0u8; 1]), Ok(0))
        });
        drop(held);
        let st = s.stop();
        assert_eq!((st.h2_refused, st.body_refused, st.requests), (1, 1, 1), "{st:?}");
        assert!(st.over_cap >= 1, "{st:?}");
    }

    #[test]
    fn limits_are_checked_and_http_args_validated() {
        let handler: Handler = Arc::new(|_: &Request<'_>| Response::text(200, ""));
        let stop = Arc::new(AtomicBool::new(false));
        let small = Limits {
            max_header_bytes: 100,
            ..Limits::default()
        };
        let e = HttpServer::start("t", "127.0.0.1:0".parse().unwrap(), small, None, handler, stop)
            .err()
            .unwrap();
        assert!(e.to_string().contains("8192"), "{e}");
        assert!(timeout("0").is_err());
        assert!(timeout("2d").is_err());
        let ok = HttpArgs {
            http_max_connections: 10,
            http_header_timeout: timeout("2.5").unwrap(),
            http_idle_timeout: timeout("1500ms").unwrap(),
            http_max_header_bytes: 8192,
            tls_cert: None,
            tls_key: None,
        };
        assert_eq!(ok.limits().header_read_timeout, Duration::from_millis(2500));
        assert_eq!(ok.limits().idle_timeout, Duration::from_millis(1500));
        assert_eq!(ok.limits().max_connections, 10);
    }
}
