//! Control server (placeholder; being written).
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct ControlArgs {}

pub fn run(_args: ControlArgs, _stop: Arc<AtomicBool>) -> Result<(), crate::CliError> {
    Err("control server not built yet".into())
}
