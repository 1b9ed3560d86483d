//! `netlab down`: remove labs left up.

use super::*;

#[derive(Args)]
pub struct DownArgs {
    #[arg(long)]
    pub run: Option<String>,
    #[arg(long)]
    pub all: bool,
    /// Also remove a lab that a live process (a `netlab run`, a test, the demo) is using.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: DownArgs) -> Result<ExitCode, LabError> {
    let DownArgs { run, all, force } = a;
    lab::require_caps()?;
    sweep_quietly();
    let runs: Vec<lab::RunState> = if all {
        lab::list_runs(&state_dir())
            .into_iter()
            .filter(|r| r.phase == lab::Phase::Detached)
            .collect()
    } else {
        vec![lab::find_run(&state_dir(), run.as_deref())?]
    };
    if runs.is_empty() {
        println!("netlab: no lab is up");
    }
    for r in &runs {
        if r.phase != lab::Phase::Detached && r.owner_alive() && !force {
            return Err(LabError::InUse {
                run: r.run_id.clone(),
                pid: r.owner_pid,
            });
        }
    }
    for r in runs {
        let t0 = Instant::now();
        lab::remove_run(&state_dir().join(&r.run_id), &r.run_id, &r.namespaces)?;
        println!("netlab: run {} removed in {:.2}s", r.run_id, t0.elapsed().as_secs_f64());
    }
    Ok(ExitCode::SUCCESS)
}
