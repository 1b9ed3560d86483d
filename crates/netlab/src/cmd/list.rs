//! `netlab list`: the labs and their hosts.

use super::*;

pub fn run() -> Result<ExitCode, LabError> {
    if lab::require_caps().is_ok() {
        sweep_quietly();
    }
    let runs = lab::list_runs(&state_dir());
    if runs.is_empty() {
        println!("no labs");
    }
    for r in runs {
        let owner = if r.phase == lab::Phase::Detached {
            String::new()
        } else {
            format!(", owner pid {}", r.owner_pid)
        };
        println!(
            "run {}: {} [{}] {:?}{}, delay backend {}",
            r.run_id, r.scenario, r.topology, r.phase, owner, r.delay_backend
        );
        for h in &r.hosts {
            println!(
                "  {:<8} {:<7} {:<16} ns {}",
                h.name,
                format!("{:?}", h.kind).to_lowercase(),
                h.addr.map(|a| a.to_string()).unwrap_or_default(),
                h.ns
            );
        }
    }
    let stray: Vec<String> = netlab::netns::our_namespaces();
    if !stray.is_empty() {
        println!("{} namespaces carry the netlab- prefix", stray.len());
    }
    Ok(ExitCode::SUCCESS)
}
