//! `reflector`: the multicast reflector server, its control server and bot
//! clients, as subcommands of one binary. Each role is a library crate
//! (`reflector-server`, `reflector-control`, `reflector-bots`); this is the
//! command line over them and the check of what each needs from the OS.
#![deny(unsafe_code)]

mod privileges;

use clap::{Parser, Subcommand};
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
        Typical set-up (one secret shared by control server and reflectors):\n  \
        od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > secret\n  \
        reflector serve --ports 4000-4015 --secret-file secret\n  \
        reflector control --secret-file secret --reflector 127.0.0.1:4000-4015\n  \
        reflector bots --control http://127.0.0.1:8700 --count 20 --duration 10\n\n\
        All three together, in an emulated network: reflector-demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the reflector: one UDP port per group, fan-out to members.
    Serve(server::ServeArgs),
    /// Run the control server: maps world cells to groups, issues join tokens.
    Control(reflector_control::ControlArgs),
    /// Run simulated players that join, move, send and measure loss and latency.
    Bots(bots::BotsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let stop = match oskit::signal::stop_flag() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("reflector: cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    // What the configuration needs from the OS is checked before anything
    // starts, so a missing capability is named instead of an EPERM later.
    let unprivileged_from = oskit::caps::unprivileged_port_start();
    let (command, needs) = match &cli.command {
        Command::Serve(a) => ("serve", privileges::for_serve(&a.ports.0, a.metrics, unprivileged_from)),
        Command::Control(a) => ("control", privileges::for_control(a.listen, unprivileged_from)),
        Command::Bots(a) => ("bots", privileges::for_bots(&a.netns)),
    };
    if let Err(msg) = privileges::check(command, &needs) {
        eprintln!("reflector: error: {msg}");
        return ExitCode::from(1);
    }
    let result = match cli.command {
        Command::Serve(a) => server::run(a, stop).map(|()| 0),
        Command::Control(a) => reflector_control::run(a, stop).map(|()| 0),
        Command::Bots(a) => bots::run(a, stop),
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
            eprintln!("{msg}");
            ExitCode::from(1)
        }
    }
}
