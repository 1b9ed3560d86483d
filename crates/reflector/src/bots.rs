//! Bots (placeholder; being written).
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct BotsArgs {}

/// Returns the process exit code (non-zero on loss).
pub fn run(_args: BotsArgs, _stop: Arc<AtomicBool>) -> Result<i32, crate::CliError> {
    Err("bots not built yet".into())
}
