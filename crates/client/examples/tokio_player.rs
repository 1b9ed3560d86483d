//! A player on tokio (feature `tokio`): `first_group.rs` as an async task.
//! It asks the control server for a place, joins the group it is given,
//! sends ten datagrams a second and prints what the others send, then
//! leaves; no fixed-rate loop: it sleeps until a datagram, the client's
//! next timer or its own send pace. Run two of them (two players):
//!
//! ```text
//! cargo run -p reflector-client --features tokio --example tokio_player -- \
//!     --control http://127.0.0.1:8700 --ticket "$(cat ticket1)" --player 1 --plain-http
//! ```
//!
//! It exits 0 once it has heard `--count` datagrams from another player
//! (having sent at least `--count` itself), 1 if `--timeout` passes first.
//! The async API is here: `Client::new_tokio`, then `ready()` (awaits the
//! socket or the next timer and updates), `poll_event`, `recv` and
//! `send_async`; `leave` at the end. The token request runs on a helper
//! thread, so the runtime's one thread never waits for HTTPS.

use reflector_client::{Client, Config, ControlServer, Event, TokenSource};
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

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
                        "usage: tokio_player --control URL [--ticket JWT] [--player N] [--x X --y Y] \
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
/// `count` itself; true if that happened before the timeout. Runs within a
/// tokio runtime (IO and time enabled).
pub async fn run(args: &Args) -> bool {
    // 1. Where to get a token: the control server, with the player's
    //    ticket from the game's backend.
    let control = ControlServer {
        ticket: args.ticket.clone(),
        allow_plain_http: args.plain_http,
        ..ControlServer::new(&args.control, args.player, args.position)
    };
    let mut client = match Client::new_tokio(Config::new(TokenSource::Control(control))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("player {}: {e}", args.player);
            return false;
        }
    };
    let me = args.player;
    let mut sent = 0u64;
    let mut heard: HashMap<u32, u64> = HashMap::new();
    let done = |heard: &HashMap<u32, u64>, sent: u64| sent >= args.count && heard.values().any(|&n| n >= args.count);
    let timeout = tokio::time::sleep(args.timeout);
    tokio::pin!(timeout);
    // Ten sends a second, once a member (and on while waiting to hear
    // enough: a later joiner must hear us too).
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    while !done(&heard, sent) {
        // 2. Wait for whichever comes first; nothing runs in between.
        tokio::select! {
            _ = &mut timeout => break,
            _ = client.ready() => {}
            _ = pace.tick(), if client.is_member() => {
                let msg = format!("hello {sent} from player {me}");
                if client.send_async(msg.as_bytes()).await.is_ok() {
                    sent += 1;
                }
            }
        }
        // 3. Events, then data (every queue drained: `ready` returns at
        //    once while something is left in one).
        while client.poll_checkpoint().is_some() {}
        while let Some(ev) = client.poll_event() {
            match ev {
                Event::Joined { group, members, .. } => {
                    println!("player {me}: joined group {group} ({members} members)")
                }
                Event::SenderHeard { player, .. } => println!("player {me}: hearing player {player}"),
                Event::Error(e) => eprintln!("player {me}: {e}"),
                _ => {}
            }
        }
        while let Some(d) = client.recv() {
            let n = heard.entry(d.sender).or_default();
            *n += 1;
            if *n == 1 || *n == args.count {
                let text = String::from_utf8_lossy(d.payload);
                println!("player {me}: from player {} #{n}: {text}", d.sender);
            }
        }
    }
    let ok = done(&heard, sent);
    // A moment more of sending, so the other player can finish too.
    let linger = tokio::time::sleep(Duration::from_millis(if ok { 1000 } else { 0 }));
    tokio::pin!(linger);
    loop {
        tokio::select! {
            _ = &mut linger => break,
            _ = client.ready() => while client.recv().is_some() {},
            _ = pace.tick() => {
                let _ = client.send_async(format!("bye from player {me}").as_bytes()).await;
            }
        }
        while client.poll_event().is_some() || client.poll_checkpoint().is_some() {}
    }
    // 4. Leave: the reflector stops sending to us at once.
    client.leave();
    let s = client.stats();
    println!(
        "player {me}: sent {sent}, received {} ({} duplicates dropped); {}",
        s.data_received,
        s.streams.duplicates,
        if ok { "done" } else { "timed out" }
    );
    ok
}

fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // One thread is enough: nothing the client does blocks it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if rt.block_on(run(&args)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
