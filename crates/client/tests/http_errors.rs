//! The control server's refusals, as the client reports them: down, 401,
//! 403 and 429 are distinct errors (each calls for something else).
#![cfg(feature = "http")]

mod common;

use common::net::{ticket_json, HttpStub};
use reflector_client::{fetch_token, Client, Config, ControlError, ControlServer, Error, Event, TokenSource};
use std::time::{Duration, Instant};

fn control(url: &str) -> ControlServer {
    ControlServer {
        url: url.into(),
        fallback_urls: Vec::new(),
        ticket: Some("t".into()),
        player: 5,
        position: (0.0, 0.0),
        ca_file: None,
        allow_plain_http: true,
    }
}

fn refusal(status: u16, headers: Vec<(&'static str, String)>) -> HttpStub {
    HttpStub::start(move || {
        (
            status,
            headers.clone(),
            format!("{{\"error\": \"refused with {status}\"}}"),
        )
    })
}

#[test]
fn down_401_403_429_are_distinct() {
    let unauthorized = refusal(401, vec![]);
    let forbidden = refusal(403, vec![]);
    let limited = refusal(429, vec![("Retry-After", "7".into())]);
    assert_eq!(
        fetch_token(&control(&unauthorized.url)),
        Err(ControlError::Unauthorized {
            message: "refused with 401".into()
        })
    );
    assert_eq!(
        fetch_token(&control(&forbidden.url)),
        Err(ControlError::Forbidden {
            message: "refused with 403".into()
        })
    );
    assert_eq!(
        fetch_token(&control(&limited.url)),
        Err(ControlError::RateLimited {
            retry_after_s: 7,
            message: "refused with 429".into()
        })
    );
    // A port nobody listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let down = fetch_token(&control(&format!("http://{closed}")));
    assert!(matches!(down, Err(ControlError::Unreachable { .. })), "{down:?}");
    assert!(down.unwrap_err().to_string().contains("unreachable"));
}

#[test]
fn the_client_reports_a_refused_ticket_and_asks_again_later() {
    let stub = refusal(401, vec![]);
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(control(&stub.url)))
    };
    let mut c = Client::new(cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut errors = 0;
    while errors < 2 && Instant::now() < deadline {
        c.update(Instant::now());
        while let Some(e) = c.poll_event() {
            if let Event::Error(Error::Control(ControlError::Unauthorized { .. })) = e {
                errors += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(errors, 2, "refused, then asked again after the retry delay");
    assert_eq!(stub.requests(), 2);
    assert!(!c.is_member());
}

/// A port nobody listens on: bound, then closed.
fn closed_url() -> String {
    let a = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    format!("http://{a}")
}

#[test]
fn a_down_or_failing_control_server_fails_over_to_the_next() {
    let failing = refusal(503, vec![]);
    let t = common::token(5, 4000, "127.0.0.1:4000".parse().unwrap(), 300);
    let body = ticket_json(&t);
    let good = HttpStub::start(move || (200, vec![], body.clone()));
    let c = ControlServer {
        fallback_urls: vec![failing.url.clone(), good.url.clone()],
        ..control(&closed_url())
    };
    let got = fetch_token(&c).expect("the third server answers");
    assert_eq!((got.player, got.group, got.token), (5, 4000, t.token));
    assert_eq!((failing.requests(), good.requests()), (1, 1));
}

#[test]
fn a_refusal_is_the_answer_and_is_not_asked_elsewhere() {
    let unauthorized = refusal(401, vec![]);
    let limited = refusal(429, vec![("Retry-After", "3".into())]);
    let t = common::token(5, 4000, "127.0.0.1:4000".parse().unwrap(), 300);
    let body = ticket_json(&t);
    let good = HttpStub::start(move || (200, vec![], body.clone()));
    for first in [&unauthorized, &limited] {
        let c = ControlServer {
            fallback_urls: vec![good.url.clone()],
            ..control(&first.url)
        };
        let e = fetch_token(&c).unwrap_err();
        assert!(!e.fails_over(), "{e}");
    }
    assert_eq!(good.requests(), 0, "a refused ticket is not shopped around");
    // A bad fallback URL is a configuration error before anything is sent.
    let c = ControlServer {
        fallback_urls: vec!["ftp://control".into()],
        ..control(&good.url)
    };
    assert!(matches!(fetch_token(&c), Err(ControlError::BadUrl { .. })));
    assert_eq!(good.requests(), 0);
}

#[test]
fn all_down_is_unreachable_naming_each() {
    let (a, b) = (closed_url(), closed_url());
    let c = ControlServer {
        fallback_urls: vec![b.clone()],
        ..control(&a)
    };
    let e = fetch_token(&c).unwrap_err();
    assert!(matches!(e, ControlError::Unreachable { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("all 2 tried") && text.contains(&a) && text.contains(&b),
        "{text}"
    );
}
