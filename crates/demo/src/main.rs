//! `reflector-demo`: the main scenario (what `make demo` runs).
#![deny(unsafe_code)]

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = demo::DemoArgs::parse();
    demo::main_with("reflector-demo", |stop| demo::run(args, stop))
}
