//! The control server over TLS (rustls), as the real binary on 127.0.0.1,
//! with the test certificate in `tests/data` (signed by a test CA): a TLS client gets
//! its answers; plain HTTP, a stalled handshake and garbage are closed
//! without disturbing it; a bad certificate path is a clear error; plain
//! HTTP on a non-loopback address is refused unless asked for.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn control(port: u16, cert: &str, key: &str) -> Command {
    // In the target's scratch directory for tests, not the system's temp
    // directory: the file is left for the next run to overwrite, never
    // piling up outside the build.
    let secret = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tls-test-secret-{port}"));
    std::fs::write(&secret, "cd".repeat(32)).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_reflector"));
    c.args(["control", "--anonymous-joins", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--secret-file",
            secret.to_str().unwrap(),
            "--reflector",
            "127.0.0.1:4000-4003",
        ])
        .args(["--tls-cert", cert, "--tls-key", key, "--http-header-timeout", "1"])
        .env("RUST_LOG", "warn");
    c
}

fn client_config() -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(data("test-ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// One HTTPS GET; the status code and the body.
fn https_get(port: u16, path: &str) -> (u16, String) {
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(client_config(), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // A peer that closes without close_notify: what arrived counts.
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (code, body)
}

#[test]
fn control_server_speaks_tls_and_sheds_what_is_not() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cert = data("test-cert.pem");
    let key = data("test-key.pem");
    let p = Proc(
        control(port, cert.to_str().unwrap(), key.to_str().unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "control server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, body) = https_get(port, "/healthz");
    assert_eq!(code, 200, "{body}");
    let (code, body) = https_get(port, "/join?player=3&x=1&y=1");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"token\""), "{body}");
    // Plain HTTP to the TLS port: closed, no answer in the clear.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = plain.read_to_end(&mut out);
    assert!(
        !out.starts_with(b"HTTP/"),
        "no plaintext answer: {:?}",
        String::from_utf8_lossy(&out)
    );
    // A client that never finishes its handshake is dropped after the
    // header timeout (1 s here), and meanwhile others are served.
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let (code, _) = https_get(port, "/healthz");
    assert_eq!(code, 200);
    stalled.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut b = [0u8; 64];
    let r = stalled.read(&mut b);
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(4), "closed after the header timeout");
    drop(p);
}

#[test]
fn a_missing_or_mismatched_certificate_is_a_clear_error() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = control(port, "/nonexistent/cert.pem", data("test-key.pem").to_str().unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("/nonexistent/cert.pem"), "{err}");
    // The key given as the certificate: no certificate in it.
    let key = data("test-key.pem");
    let o = control(port, key.to_str().unwrap(), key.to_str().unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("TLS") && err.contains("test-key.pem"), "{err}");
    let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args([
            "control",
            "--anonymous-joins",
            "--reflector",
            "127.0.0.1:4000",
            "--secret-file",
            "x",
            "--tls-cert",
            "c.pem",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--tls-key"));
}

#[test]
fn plain_http_on_a_non_loopback_address_is_refused_before_listening() {
    let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args([
            "control",
            "--anonymous-joins",
            "--listen",
            "0.0.0.0:0",
            "--reflector",
            "127.0.0.1:4000",
        ])
        .args(["--secret-file", "/nonexistent/secret"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("refusing") && err.contains("--insecure-http") && err.contains("--tls-cert"),
        "{err}"
    );
}
