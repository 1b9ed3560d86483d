//! `netlab clean`: remove what crashed runs (and, forced, live ones) left.

use super::*;

#[derive(Args)]
pub struct CleanArgs {
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: CleanArgs) -> Result<ExitCode, LabError> {
    let CleanArgs { force } = a;
    lab::require_caps()?;
    let r = lab::sweep(
        &state_dir(),
        if force { SweepMode::Force } else { SweepMode::AllButLive },
    )?;
    for (id, pid) in &r.skipped {
        println!("netlab: kept run {id}: in use by live process {pid} (use --force to remove it anyway)");
    }
    if r.removed.is_empty() {
        println!("netlab: nothing to clean");
    } else {
        println!("netlab: removed {}", r.removed.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
