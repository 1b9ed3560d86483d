//! `netlab tdf`: change a running dilated lab's time dilation factor.

use super::*;

#[derive(Args)]
pub struct TdfArgs {
    #[arg(long)]
    pub run: Option<String>,
    /// The new factor (a whole number, 1 or more).
    #[arg(value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub tdf: u32,
}

pub fn run(a: TdfArgs) -> Result<ExitCode, LabError> {
    let TdfArgs { run, tdf } = a;
    lab::require_caps()?;
    sweep_quietly();
    let mut st = lab::find_run(&state_dir(), run.as_deref())?;
    for line in lab::set_tdf(&st, tdf)? {
        println!("netlab: {line}");
    }
    st.tdf = tdf;
    lab::write_state(&state_dir().join(&st.run_id), &st)?;
    Ok(ExitCode::SUCCESS)
}
