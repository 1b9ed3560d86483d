//! The registry's transport: `rediss://` through rustls (the server's
//! certificate checked against the system's roots, or against the CA file
//! the operator names; a client certificate if Redis asks for one), a
//! warning for plain `redis://` off this host, and connection failures
//! turned into messages that name the problem: a certificate that does not
//! verify, a TLS URL to a plain port, a plain URL to a TLS port.

use crate::{redacted, RegistryError};
use redis::{ClientTlsConfig, ConnectionAddr, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

/// What a `rediss://` registry is checked with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryTls {
    /// PEM certificates of the CA(s) the server's certificate must chain
    /// to, instead of the system's roots (a fleet's own CA).
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain and its key (PEM), for a Redis that
    /// requires one (`tls-auth-clients yes`, its default).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// Whether `url` is a TLS URL (`rediss://`).
pub(crate) fn is_tls(url: &str) -> bool {
    url.starts_with("rediss://")
}

/// The client for `url`: TLS with `tls` for `rediss://`; a plain URL with
/// TLS files given is a contradiction refused here, and a plain URL to
/// another host is warned about once per process.
pub(crate) fn client(url: &str, tls: &RegistryTls) -> Result<redis::Client, RegistryError> {
    let bad_url = |source| RegistryError::Redis {
        url: redacted(url),
        source,
    };
    if !is_tls(url) {
        if tls != &RegistryTls::default() {
            return Err(RegistryError::Bad(format!(
                "{}: a CA or client certificate file is given but the URL is plain redis://; use rediss:// for TLS",
                redacted(url)
            )));
        }
        let client = redis::Client::open(url).map_err(bad_url)?;
        if let ConnectionAddr::Tcp(host, _) = client.get_connection_info().addr() {
            if !is_loopback(host) {
                static WARNED: Once = Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        "registry {}: plain redis:// to another host, so the registry's traffic (its password included) crosses the network in clear; use rediss:// (see deploy/redis/README.md)",
                        redacted(url)
                    )
                });
            }
        }
        return Ok(client);
    }
    let root_cert = match &tls.ca_file {
        Some(path) => {
            let pem = read("CA file", path)?;
            let n = CertificateDer::pem_slice_iter(&pem).filter(Result::is_ok).count();
            if n == 0 {
                return Err(RegistryError::Bad(format!(
                    "{}: the CA file holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    path.display()
                )));
            }
            Some(pem)
        }
        None => None,
    };
    let client_tls = match &tls.client_cert {
        Some((cert, key)) => {
            let client_cert = read("client certificate", cert)?;
            if CertificateDer::pem_slice_iter(&client_cert).next().is_none() {
                return Err(RegistryError::Bad(format!(
                    "{}: the client certificate file holds no PEM certificate",
                    cert.display()
                )));
            }
            let client_key = read("client key", key)?;
            if PrivateKeyDer::from_pem_slice(&client_key).is_err() {
                return Err(RegistryError::Bad(format!(
                    "{}: the client key file holds no PEM private key",
                    key.display()
                )));
            }
            Some(ClientTlsConfig {
                client_cert,
                client_key,
            })
        }
        None => None,
    };
    redis::Client::build_with_tls(url, TlsCertificates { client_tls, root_cert }).map_err(bad_url)
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, RegistryError> {
    std::fs::read(path).map_err(|e| RegistryError::Bad(format!("cannot read the {what} {}: {e}", path.display())))
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

/// A failed connection, explained when its cause is one an operator must
/// fix (the TLS set-up), else as Redis reported it. `probe_for` bounds the
/// one extra connection made to tell a scheme mismatch from an outage.
pub(crate) fn explain(
    url: &str,
    tls: &RegistryTls,
    client: &redis::Client,
    source: redis::RedisError,
    probe_for: Duration,
) -> RegistryError {
    let misconfigured = |problem: String| RegistryError::Misconfigured {
        url: redacted(url),
        problem,
    };
    let (host, port, tls_url) = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(h, p) => (h.clone(), *p, false),
        ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port, true),
        _ => return redis_error(url, source),
    };
    if let Some(e) = rustls_error(&source) {
        if let rustls::Error::InvalidCertificate(why) = e {
            let against = match &tls.ca_file {
                Some(p) => format!("the CA file {}", p.display()),
                None => "the system's roots (give the fleet's CA with --registry-ca-file)".into(),
            };
            let problem = match why {
                rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature => {
                    format!("the server's certificate does not verify against {against}: it was not signed by that CA")
                }
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. } => {
                    format!("the server's certificate is not valid for '{host}': the URL's host must be one of its subject alternative names")
                }
                rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. } => {
                    "the server's certificate has expired".into()
                }
                rustls::CertificateError::NotValidYet | rustls::CertificateError::NotValidYetContext { .. } => {
                    "the server's certificate is not valid yet (check the clocks)".into()
                }
                other => format!("the server's certificate was refused: {other:?}"),
            };
            return misconfigured(problem);
        }
        if matches!(e, rustls::Error::AlertReceived(_)) && tls.client_cert.is_none() {
            return misconfigured(format!(
                "the server ended the TLS handshake ({e}): if it requires client certificates (tls-auth-clients), give one with --registry-cert-file and --registry-key-file"
            ));
        }
        if matches!(e, rustls::Error::InvalidMessage(_)) && speaks_plain_redis(&host, port, probe_for) {
            return misconfigured(format!(
                "rediss:// but {host}:{port} answers in plain text: it is a plain Redis port; give its tls-port, or redis:// on a trusted network"
            ));
        }
        return misconfigured(format!("the TLS handshake failed: {e}"));
    }
    // An outage, or an answer from Redis itself: no scheme to blame.
    if source.is_connection_refusal() || !matches!(source.kind(), redis::ErrorKind::Io | redis::ErrorKind::Parse) {
        return redis_error(url, source);
    }
    if tls_url {
        // A plain Redis may wait for the end of an inline command that a
        // ClientHello never brings: a timeout as often as an error.
        if speaks_plain_redis(&host, port, probe_for) {
            return misconfigured(format!(
                "rediss:// but {host}:{port} answers in plain text: it is a plain Redis port; give its tls-port, or redis:// on a trusted network"
            ));
        }
    } else if speaks_tls(&host, port, probe_for) {
        return misconfigured(format!(
            "redis:// but {host}:{port} is a TLS port (it answered a TLS hello): use rediss://"
        ));
    }
    redis_error(url, source)
}

fn redis_error(url: &str, source: redis::RedisError) -> RegistryError {
    RegistryError::Redis {
        url: redacted(url),
        source,
    }
}

/// The rustls error under a Redis error: directly (building the
/// connection), or inside the I/O error of a handshake.
fn rustls_error(e: &redis::RedisError) -> Option<&rustls::Error> {
    use std::error::Error;
    let inner: &(dyn Error + Send + Sync) = &**e.source()?.downcast_ref::<std::sync::Arc<dyn Error + Send + Sync>>()?;
    if let Some(r) = inner.downcast_ref::<rustls::Error>() {
        return Some(r);
    }
    inner
        .downcast_ref::<std::io::Error>()?
        .get_ref()?
        .downcast_ref::<rustls::Error>()
}

fn connect(host: &str, port: u16, limit: Duration) -> Option<TcpStream> {
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let s = TcpStream::connect_timeout(&addr, limit).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
    s.set_write_timeout(Some(limit)).ok()?;
    Some(s)
}

/// Whether `host:port` answers a plain `PING` as Redis does (`+PONG`, or an
/// error such as `-NOAUTH`): then it is no TLS port.
fn speaks_plain_redis(host: &str, port: u16, limit: Duration) -> bool {
    let Some(mut s) = connect(host, port, limit) else {
        return false;
    };
    let mut first = [0u8; 1];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut first).is_ok() && matches!(first[0], b'+' | b'-')
}

/// Whether `host:port` answers a TLS ClientHello with a TLS record (a
/// ServerHello, or an alert): then it is a TLS port. The hello is rustls'
/// own; nothing is verified, since the handshake goes no further.
fn speaks_tls(host: &str, port: u16, limit: Duration) -> bool {
    let Some(mut s) = connect(host, port, limit) else {
        return false;
    };
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let Ok(builder) = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = builder
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
        return false;
    };
    let Ok(mut conn) = rustls::ClientConnection::new(std::sync::Arc::new(config), name) else {
        return false;
    };
    let mut hello = Vec::new();
    if conn.write_tls(&mut hello).is_err() || s.write_all(&hello).is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    // 0x16: a handshake record; 0x15: an alert. Redis' replies start with
    // one of "+-:$*".
    s.read_exact(&mut first).is_ok() && matches!(first[0], 0x15 | 0x16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_apart() {
        for h in ["127.0.0.1", "127.3.2.1", "[::1]", "::1", "localhost", "LOCALHOST"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["10.0.0.9", "redis.example", "[2001:db8::1]", "0.0.0.0"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn tls_files_with_a_plain_url_are_refused() {
        let tls = RegistryTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            client_cert: None,
        };
        let e = client("redis://127.0.0.1:6379", &tls).err().unwrap().to_string();
        assert!(e.contains("rediss://"), "{e}");
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let tls = RegistryTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            client_cert: None,
        };
        let e = client("rediss://127.0.0.1:6379", &tls).err().unwrap().to_string();
        assert!(e.contains("cannot read the CA file /nonexistent/ca.pem"), "{e}");
        let f = std::env::temp_dir().join(format!("registry-empty-ca-{}", std::process::id()));
        std::fs::write(&f, "not a certificate\n").unwrap();
        let tls = RegistryTls {
            ca_file: Some(f.clone()),
            client_cert: None,
        };
        let e = client("rediss://127.0.0.1:6379", &tls).err().unwrap().to_string();
        let _ = std::fs::remove_file(&f);
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }
}
