//! `netlab tdf`: change a running dilated lab's time dilation factor.

use super::*;

#[derive(Args)]
pub struct TdfArgs {
    #[arg(long)]
    pub run: Option<String>,
    /// The new factor (4, 2.5 or 3/2; 1 to 1000).
    #[arg(value_parser = netlab::plan::parse_tdf)]
    pub tdf: netlab::plan::Tdf,
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
