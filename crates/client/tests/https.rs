//! Tokens over HTTPS from a real control server (rustls, the test
//! certificate for 127.0.0.1 in `tests/data`): the client joins a real
//! reflector with the token it fetched; an untrusted certificate, plain
//! HTTP not asked for, and a bad CA file are each a distinct error.
#![cfg(feature = "http")]

mod common;

use common::{control_server, join_all, Reflector};
use reflector_client::{fetch_token, Client, Config, ControlError, ControlServer, Event, TokenSource};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A control server over TLS mapping its one cell to `r`'s group.
fn control_tls(r: &Reflector) -> reflector_control::ControlServer {
    let tls = reflector_http::Tls::from_pem_files(&data("test-cert.pem"), &data("test-key.pem")).unwrap();
    control_server(r, Some(tls))
}

#[test]
fn a_token_over_https_joins_and_untrusted_or_plain_is_refused() {
    let r = Reflector::start(0, false);
    let control = control_tls(&r);
    let url = control.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let trusting = ControlServer {
        ca_file: Some(data("test-ca.pem")),
        ..ControlServer::new(&url, 7, (10.0, 10.0))
    };

    // The built-in roots do not know the test CA: a TLS error that says so,
    // not "unreachable".
    let untrusted = fetch_token(&ControlServer::new(&url, 7, (10.0, 10.0)));
    match &untrusted {
        Err(ControlError::Tls { reason, .. }) => assert!(reason.contains("certificate"), "{reason}"),
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // http:// is refused before any connection unless asked for.
    let plain = fetch_token(&ControlServer::new(url.replace("https", "http"), 7, (10.0, 10.0)));
    assert!(matches!(plain, Err(ControlError::PlainHttp { .. })), "{plain:?}");
    assert!(plain.unwrap_err().to_string().contains("allow_plain_http"));
    // A CA file that is not one.
    let bad_ca = fetch_token(&ControlServer {
        ca_file: Some(data("README.md")),
        ..ControlServer::new(&url, 7, (10.0, 10.0))
    });
    assert!(matches!(bad_ca, Err(ControlError::BadCaFile { .. })), "{bad_ca:?}");

    // Trusting the test CA: a token for player 7 in the reflector's group.
    let t = fetch_token(&trusting).expect("a token over HTTPS");
    assert_eq!((t.player, t.group), (7, r.port));

    // And the client does the same by itself, then joins with it.
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(trusting))
    };
    let mut c = Client::new(cfg).unwrap();
    let ev = join_all(&mut [&mut c]);
    assert!(ev.iter().any(|(_, e)| *e == Event::TokenRequested), "{ev:?}");
    assert!(c.is_member() && c.group() == Some(r.port));
    control.stop();
    r.stop();
}
