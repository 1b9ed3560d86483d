//! `netlab exec`: run a command inside a host of a lab that is up.

use super::*;

#[derive(Args)]
pub struct ExecArgs {
    #[arg(long)]
    pub run: Option<String>,
    pub host: String,
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

pub fn run(a: ExecArgs) -> Result<ExitCode, LabError> {
    let ExecArgs { run, host, cmd } = a;
    lab::require_caps()?;
    sweep_quietly();
    let st = lab::find_run(&state_dir(), run.as_deref())?;
    let mut c = Launcher::for_run(&st).command(&host, &cmd)?;
    let status = c.status().map_err(|e| LabError::Spawn {
        cmd: cmd.join(" "),
        source: e,
    })?;
    Ok(ExitCode::from(status.code().unwrap_or(1).clamp(0, 255) as u8))
}
