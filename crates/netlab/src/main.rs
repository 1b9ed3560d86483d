//! `netlab`: build emulated networks of namespaces, bridges and shaped links,
//! run commands in them, and remove them without leaving anything behind.
#![deny(unsafe_code)]

mod cmd;

use clap::{Parser, Subcommand};
use netlab::error::LabError;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

#[derive(Parser)]
#[command(
    name = "netlab",
    version,
    about = "An emulated network on one machine: hosts, links, switches, routers, topologies",
    long_about = "netlab builds networks out of Linux network namespaces (hosts, routers), \
bridges (switches) and veth pairs (links) shaped with HTB for bandwidth and with netem or \
netlab's own delay line for delay, jitter and loss. Everything it creates carries the \
prefix 'netlab-<run>-' and is removed on exit, on error, on Ctrl-C, and by the next \
netlab call after a crash.\n\n\
SCENARIO is a TOML file (see the README) or a built-in topology written as \
KIND[:SIZE]: pair, star:N (N hosts on a switch), linear:N (N switches, a host on each), \
chain:N (two hosts through N switches), fattree:K (K-ary fat tree of ECMP routers).\n\n\
Examples:\n  sudo netlab run crates/netlab/scenarios/star.toml   (from the repository root)\n  sudo netlab up star:4 --bw 100mbit --delay 1ms\n  \
sudo netlab exec h1 -- ip addr\n  sudo netlab check\n  sudo netlab down\n  sudo netlab clean"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a lab and leave it up (use `exec`, `check`, then `down`).
    Up(cmd::ScenarioArgs),
    /// Remove a lab left up by `up` (the only one, or --run ID, or --all).
    Down(cmd::down::DownArgs),
    /// Build a lab, run the scenario's commands, print their output, remove the lab.
    Run(cmd::run::RunArgs),
    /// Run a command inside a host (or router) of a lab that is up.
    Exec(cmd::exec::ExecArgs),
    /// Give a host (or router) of a lab that is up a monitor port: a veth pair in its namespace
    /// whose receiving end (NAME, default mon0) gets a copy of every frame the node's lab
    /// interfaces send and receive (tc mirred), for `capture -i NAME --mode xdp` or any capture.
    /// It goes with the lab; --remove takes it away earlier.
    Monitor(cmd::monitor::MonitorArgs),
    /// List labs and their hosts.
    List,
    /// Remove leftovers: crashed runs and labs left up; --force also removes
    /// labs that a live netlab process is using.
    Clean(cmd::clean::CleanArgs),
    /// Print the operations that `up` would run, without running them.
    Plan(cmd::ScenarioArgs),
    /// Change the time dilation factor of a running dilated lab: every link is re-rated to
    /// rate/TDF and the lab's clock (every process in it) runs TDF times slower.
    Tdf(cmd::tdf::TdfArgs),
    /// Check that the hosts reach each other (UDP probes of our own): every pair in a lab of
    /// up to 300 hosts; in a bigger one a sample: every host to a hub (the host whose neighbour
    /// entries the plan made permanent on the biggest segment, else the first) and 5 random
    /// destinations per host, named in the output with the seed that repeats it. --all-pairs
    /// checks every pair of any lab.
    Check(cmd::check::CheckArgs),
    /// Measure one TCP flow or UDP round trips between two hosts of a lab.
    Probe(cmd::probe_cmd::ProbeArgs),
    /// (internal) The delay line process of one link.
    #[command(hide = true)]
    DelayLine(cmd::delay_line::DelayLineArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    netlab::log::init_plain();
    use oskit::signal::{flag_on, Second, SIGHUP, SIGINT, SIGTERM};
    // A second signal must not cut the lab's removal short. Registration
    // only fails for forbidden signals, which these are not.
    let stop = flag_on(&[SIGINT, SIGTERM, SIGHUP], Second::Ignore).unwrap_or_default();
    match real_main(cli, &stop) {
        Ok(code) => code,
        Err(LabError::Interrupted) => {
            // Ends a progress line that may still be open.
            eprintln!("\nnetlab: interrupted; lab removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("netlab: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli, stop: &AtomicBool) -> Result<ExitCode, LabError> {
    match cli.cmd {
        Cmd::Plan(a) => cmd::plan::run(a),
        Cmd::DelayLine(a) => cmd::delay_line::run(a),
        Cmd::Up(a) => cmd::up::run(a, stop),
        Cmd::Down(a) => cmd::down::run(a),
        Cmd::Run(a) => cmd::run::run(a, stop),
        Cmd::Exec(a) => cmd::exec::run(a),
        Cmd::Monitor(a) => cmd::monitor::run(a),
        Cmd::List => cmd::list::run(),
        Cmd::Clean(a) => cmd::clean::run(a),
        Cmd::Tdf(a) => cmd::tdf::run(a),
        Cmd::Check(a) => cmd::check::run(a, stop),
        Cmd::Probe(a) => cmd::probe_cmd::run(a),
    }
}
