//! `reflector-fleet-lab`: a fleet of reflectors in the lab, and the events
//! it must survive (see `demo::fleet`).
#![deny(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = demo::fleet::FleetArgs::parse();
    demo::main_with("reflector-fleet-lab", |stop| demo::fleet::run(args, stop))
}
