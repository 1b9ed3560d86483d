//! The demo's one error type, in a module of its own so that every part
//! (placement, scenario, wire counting) can use it without importing the
//! others.

/// Errors of the demo: a message for the user.
pub type DemoError = Box<dyn std::error::Error + Send + Sync>;
