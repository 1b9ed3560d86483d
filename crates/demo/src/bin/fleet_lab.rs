//! `reflector-fleet-lab`: a fleet of reflectors in the lab, and the events
//! it must survive (see `demo::fleet`).
#![deny(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

fn main() -> ExitCode {
    let args = demo::fleet::FleetArgs::parse();
    netlab::log::init_plain();
    // A second Ctrl-C must not cut the lab's removal short.
    let stop = match oskit::signal::flag_on(
        &[oskit::signal::SIGINT, oskit::signal::SIGTERM],
        oskit::signal::Second::Ignore,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("reflector-fleet-lab: cannot install signal handlers: {e}");
            return ExitCode::from(2);
        }
    };
    match demo::fleet::run(args, &stop) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(_) if stop.load(Ordering::Relaxed) => {
            eprintln!("reflector-fleet-lab: interrupted; children stopped, lab removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("reflector-fleet-lab: error: {e}");
            ExitCode::from(2)
        }
    }
}
