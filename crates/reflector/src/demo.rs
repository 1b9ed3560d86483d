//! Loopback demo (placeholder; being written).
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {}

/// Returns the process exit code (non-zero on loss).
pub fn run(_args: DemoArgs, _stop: Arc<AtomicBool>) -> Result<i32, crate::CliError> {
    Err("demo not built yet".into())
}
