//! `netlab list`: the labs and their hosts.

use super::*;

pub fn run() -> Result<ExitCode, LabError> {
    if lab::require_caps().is_ok() {
        sweep_quietly();
    }
    let runs = lab::list_runs(&state_dir());
    let mut lines = Vec::new();
    if runs.is_empty() {
        lines.push("no labs".to_string());
    }
    for r in runs {
        let owner = if r.phase == lab::Phase::Detached {
            String::new()
        } else {
            format!(", owner pid {}", r.owner_pid)
        };
        lines.push(format!(
            "run {}: {} [{}] {:?}{}, delay backend {}",
            r.run_id, r.scenario, r.topology, r.phase, owner, r.delay_backend
        ));
        for h in &r.hosts {
            lines.push(format!(
                "  {:<8} {:<7} {:<16} ns {}",
                h.name,
                format!("{:?}", h.kind).to_lowercase(),
                h.addr.map(|a| a.to_string()).unwrap_or_default(),
                h.ns
            ));
        }
    }
    let stray: Vec<String> = netlab::netns::our_namespaces();
    if !stray.is_empty() {
        lines.push(format!("{} namespaces carry the netlab- prefix", stray.len()));
    }
    // A reader that stops early (`netlab list | head -1`) ends it quietly.
    print_lines(lines)?;
    Ok(ExitCode::SUCCESS)
}
