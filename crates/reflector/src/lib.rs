//! The reflector's bot clients and the privilege checks of the `reflector`
//! binary, whose data plane is `reflector-server` and whose control server
//! is `reflector-control`:
//! - [`bots`]: simulated players that measure delivery, loss and latency;
//! - [`privileges`]: what each command's configuration needs from the OS.
#![deny(unsafe_code)]

pub mod bots;
pub mod privileges;

/// Boxed error for command entry points: `main` prints it with its causes.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
