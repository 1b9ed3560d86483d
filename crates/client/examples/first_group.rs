//! A first group: one player asks the control server for a place, joins the
//! group it is given, sends a few datagrams and prints what the others send,
//! then leaves. Run two of them (two players) and each hears the other:
//!
//! ```text
//! cargo run -p reflector-client --example first_group -- \
//!     --control http://127.0.0.1:8700 --ticket "$(cat ticket1)" --player 1 --plain-http
//! ```
//!
//! It exits 0 once it has heard `--count` datagrams from another player
//! (having sent at least `--count` itself), 1 if `--timeout` passes first.
//! The whole game-side API is here: `Client::new`, then in the game loop
//! `update`, `poll_event`, `recv` and `send`; `leave` at the end.

use reflector_client::{Client, Config, ControlServer, Event, TokenSource};
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What the command line says.
pub struct Args {
    pub control: String,
    pub ticket: Option<String>,
    pub player: u32,
    pub position: (f64, f64),
    pub plain_http: bool,
    pub count: u64,
    pub timeout: Duration,
}

impl Args {
    fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            control: "https://127.0.0.1:8700".into(),
            ticket: None,
            player: 1,
            position: (0.0, 0.0),
            plain_http: false,
            count: 20,
            timeout: Duration::from_secs(15),
        };
        let num = |flag: &str, v: Option<String>| -> Result<f64, String> {
            let v = v.ok_or(format!("{flag} needs a value"))?;
            v.parse().map_err(|_| format!("{flag}: '{v}' is not a number"))
        };
        while let Some(flag) = it.next() {
            match flag.as_str() {
                "--control" => a.control = it.next().ok_or("--control needs a URL")?,
                "--ticket" => a.ticket = Some(it.next().ok_or("--ticket needs the game backend's JWT")?),
                "--player" => a.player = num("--player", it.next())? as u32,
                "--x" => a.position.0 = num("--x", it.next())?,
                "--y" => a.position.1 = num("--y", it.next())?,
                "--plain-http" => a.plain_http = true,
                "--count" => a.count = num("--count", it.next())? as u64,
                "--timeout" => a.timeout = Duration::from_secs_f64(num("--timeout", it.next())?),
                "-h" | "--help" => {
                    return Err(
                        "usage: first_group --control URL [--ticket JWT] [--player N] [--x X --y Y] \
                                [--plain-http] [--count N] [--timeout S]"
                            .into(),
                    )
                }
                other => return Err(format!("unknown argument '{other}' (try --help)")),
            }
        }
        Ok(a)
    }
}

/// Plays until it has heard `count` datagrams from another player and sent
/// `count` itself; true if that happened before the timeout.
pub fn run(args: &Args) -> bool {
    // 1. Where to get a token: the control server, with the player's
    //    ticket from the game's backend.
    let control = ControlServer {
        ticket: args.ticket.clone(),
        allow_plain_http: args.plain_http,
        ..ControlServer::new(&args.control, args.player, args.position)
    };
    let mut client = match Client::new(Config::new(TokenSource::Control(control))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("player {}: {e}", args.player);
            return false;
        }
    };
    let start = Instant::now();
    let mut next_send = start;
    let mut sent = 0u64;
    let mut heard: HashMap<u32, u64> = HashMap::new();
    let done = |heard: &HashMap<u32, u64>, sent: u64| sent >= args.count && heard.values().any(|&n| n >= args.count);
    while !done(&heard, sent) && start.elapsed() < args.timeout {
        // 2. The game loop: all I/O that is due, then events, then data.
        let now = Instant::now();
        client.update(now);
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Joined { group, members, .. } => {
                    println!("player {}: joined group {group} ({members} members)", args.player)
                }
                Event::SenderHeard { player, .. } => println!("player {}: hearing player {player}", args.player),
                Event::Error(e) => eprintln!("player {}: {e}", args.player),
                _ => {}
            }
        }
        while let Some(d) = client.recv() {
            let n = heard.entry(d.sender).or_default();
            *n += 1;
            if *n == 1 || *n == args.count {
                let text = String::from_utf8_lossy(d.payload);
                println!("player {}: from player {} #{n}: {text}", args.player, d.sender);
            }
        }
        // 3. Send ten times a second once a member (keep sending while
        //    waiting to hear enough: a later joiner must hear us too).
        if client.is_member() && now >= next_send {
            let msg = format!("hello {} from player {}", sent, args.player);
            if client.send(msg.as_bytes()).is_ok() {
                sent += 1;
            }
            next_send = now + Duration::from_millis(100);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let ok = done(&heard, sent);
    // A moment more of sending, so the other player can finish too.
    let linger = Instant::now() + Duration::from_millis(1000);
    while ok && Instant::now() < linger {
        client.update(Instant::now());
        while client.recv().is_some() {}
        if Instant::now() >= next_send {
            let _ = client.send(format!("bye from player {}", args.player).as_bytes());
            next_send = Instant::now() + Duration::from_millis(100);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // 4. Leave: the reflector stops sending to us at once.
    client.leave();
    client.update(Instant::now());
    let s = client.stats();
    println!(
        "player {}: sent {sent}, received {} ({} duplicates dropped); {}",
        args.player,
        s.data_received,
        s.streams.duplicates,
        if ok { "done" } else { "timed out" }
    );
    ok
}

fn main() -> ExitCode {
    match Args::parse(std::env::args().skip(1)) {
        Ok(a) if run(&a) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
