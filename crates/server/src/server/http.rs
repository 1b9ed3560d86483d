//! The metrics listener: `/metrics`, `/healthz` and `/readyz` over `reflector-http`.

use crate::CliError;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Binds the metrics listener (before the server starts, so a taken
/// address fails early and leaves nothing running).
pub fn bind_metrics(addr: SocketAddr) -> Result<std::net::TcpListener, CliError> {
    reflector_http::bind(addr).map_err(|e| format!("cannot serve metrics: {e}").into())
}

/// A health answer: `Err(why)` is served as 503 with the reason.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Serves `/metrics` (the classic text format, or OpenMetrics when the
/// scraper's `Accept` asks for it), `/healthz` and `/readyz` until `stop`
/// is set. `alive` answers `/healthz` (`Err(why)` names the threads that
/// ended), `ready` answers `/readyz` (not ready while draining: a fleet's
/// placement and a load balancer stop sending players here).
pub fn serve_metrics(
    listener: std::net::TcpListener,
    limits: reflector_http::Limits,
    tls: Option<reflector_http::Tls>,
    exposition: crate::metrics::Exposition,
    alive: Check,
    ready: Check,
    stop: Arc<AtomicBool>,
) -> Result<reflector_http::HttpServer, CliError> {
    let handler: reflector_http::Handler =
        Arc::new(
            move |req: &reflector_http::Request<'_>| match (req.method, req.target.split('?').next()) {
                ("GET", Some("/metrics")) => {
                    let format = reflector_http::expo::Format::negotiate(req.accept);
                    reflector_http::Response {
                        status: 200,
                        content_type: format.content_type(),
                        body: exposition.encode(format).into(),
                        retry_after_s: None,
                    }
                }
                ("GET", Some("/healthz")) => match alive() {
                    Ok(()) => reflector_http::Response::text(200, "ok\n"),
                    Err(dead) => reflector_http::Response::text(503, format!("{dead}\n")),
                },
                ("GET", Some("/readyz")) => match ready() {
                    Ok(()) => reflector_http::Response::text(200, "ready\n"),
                    Err(why) => reflector_http::Response::text(503, format!("{why}\n")),
                },
                ("GET", _) => reflector_http::Response::text(404, "not found: try /metrics, /healthz or /readyz\n"),
                (m, _) => reflector_http::Response::text(405, format!("method {m} not allowed: use GET /metrics\n")),
            },
        );
    Ok(reflector_http::HttpServer::start_on(
        "metrics", listener, limits, tls, handler, stop,
    )?)
}
