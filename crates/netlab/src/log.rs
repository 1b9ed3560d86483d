//! How the netlab binary (and the demo and the benchmarks, which build labs with this
//! library) shows the library's events: one plain line each on stderr, as
//! the messages are written ("netlab: ..."), no time stamp or level.
//! `RUST_LOG` filters as usual (default `info`; `RUST_LOG=warn` silences
//! the progress notes); `NETLAB_TRACE=1` adds every apply operation and
//! the time it took (target `netlab::trace`).

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; does nothing if one is already installed.
pub fn init_plain() {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if std::env::var_os("NETLAB_TRACE").is_some_and(|v| v == "1") {
        if let Ok(d) = "netlab::trace=debug".parse() {
            filter = filter.add_directive(d);
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}
