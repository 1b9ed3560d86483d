//! `reflector`: the multicast reflector server, its control server and bot
//! clients, as subcommands of one binary. Each role is a library crate
//! (`reflector-server`, `reflector-control`, `reflector-bots`); this is the
//! command line over them and the check of what each needs from the OS.
//! `reflector ticket` plays the game backend for a local test.
#![deny(unsafe_code)]

mod config;
mod privileges;
mod ticket;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use reflector_bots as bots;
use reflector_server::server;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "reflector",
    version,
    about = "Software multicast reflector for multiplayer games",
    long_about = "Software multicast reflector for multiplayer games.\n\n\
        Clients send unicast UDP to a group's port; the reflector forwards every datagram \
        to all other members of that group. Membership needs a token from the control \
        server and a stateless address check, so the reflector cannot be used as an amplifier.\n\n\
        Typical set-up on one machine (one secret shared by control server and reflectors; \
        a development ticket key file, since the control server issues tokens only to players \
        with a ticket from the game's backend); each server in a terminal of its own:\n  \
        od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > secret\n  \
        reflector ticket --ticket-keys tickets.toml > /dev/null\n  \
        reflector serve --bind 127.0.0.1 --ports 4000-4015 --secret-file secret\n  \
        reflector control --secret-file secret --reflector 127.0.0.1:4000-4015 --ticket-keys tickets.toml\n  \
        reflector bots --control http://127.0.0.1:8700 --ticket-keys tickets.toml --count 20 --duration 10\n\n\
        All three together, in an emulated network: reflector-demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the reflector: one UDP port per group, fan-out to members.
    Serve(server::cli::ServeArgs),
    /// Run the control server: maps world cells to groups, issues join tokens.
    Control(reflector_control::ControlArgs),
    /// Run simulated players that join, move, send and measure loss and latency.
    Bots(bots::BotsArgs),
    /// For a local test: write a development ticket key file and print a player ticket.
    Ticket(ticket::TicketArgs),
}

fn main() -> ExitCode {
    let cmd = config::with_config_args(Cli::command());
    let matches = match config::parse(cmd, std::env::args_os().collect()) {
        Ok(config::Parsed::Run(m)) => m,
        Ok(config::Parsed::Print(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("reflector: error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Ticket(a) = &cli.command {
        return match ticket::run(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("reflector: error: {e}");
                ExitCode::from(1)
            }
        };
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    let json = config::json_logs(&matches);
    // A collector of JSON logs gets the final error as JSON too.
    let report = |msg: &str| {
        if json {
            tracing::error!("{msg}");
        } else {
            eprintln!("{msg}");
        }
    };
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    // `bots` documents 2 for errors (1 is loss).
    let fail = if matches!(cli.command, Command::Bots(_)) { 2 } else { 1 };
    let stop = match oskit::signal::stop_flag() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("reflector: cannot install signal handlers: {e}");
            return ExitCode::from(fail);
        }
    };
    // What the configuration needs from the OS is checked before anything
    // starts, so a missing capability is named instead of an EPERM later.
    let unprivileged_from = oskit::caps::unprivileged_port_start();
    let (command, needs) = match &cli.command {
        Command::Serve(a) => {
            // Without --strict-backend, a backend that cannot run falls back to user space.
            let strict = a.backend.filter(|_| a.strict_backend);
            (
                "serve",
                privileges::for_serve(&a.ports.0, a.metrics, unprivileged_from, strict),
            )
        }
        Command::Control(a) => ("control", privileges::for_control(a.listen, unprivileged_from)),
        Command::Bots(a) => ("bots", privileges::for_bots(&a.netns)),
        Command::Ticket(_) => ("ticket", Vec::new()),
    };
    if let Err(msg) = privileges::check(command, &needs) {
        report(&format!("reflector: error: {msg}"));
        return ExitCode::from(fail);
    }
    let result = match cli.command {
        Command::Serve(a) => server::cli::run(a, stop).map(|()| 0),
        Command::Control(a) => reflector_control::run(a, stop).map(|()| 0),
        Command::Bots(a) => bots::run(a, stop),
        Command::Ticket(_) => Ok(0),
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            let mut msg = format!("reflector: error: {e}");
            let mut src = e.source();
            while let Some(s) = src {
                // Many errors already quote their cause in their message.
                let text = s.to_string();
                if !msg.contains(&text) {
                    msg.push_str(&format!(": {text}"));
                }
                src = s.source();
            }
            report(&msg);
            ExitCode::from(fail)
        }
    }
}
