//! `netlab up`: build a lab and leave it up.

use super::*;

pub fn run(a: ScenarioArgs, stop: &AtomicBool) -> Result<ExitCode, LabError> {
    let ScenarioArgs { scenario, build } = a;
    let s = load_scenario(&scenario, &build)?;
    lab::require_caps()?;
    if s.tdf.is_some_and(|t| t > netlab::plan::Tdf::ONE) {
        return Err(LabError::DetachedClock);
    }
    let lab = Lab::up(&s.topology, &lab_options(&s, &build)?, stop)?;
    if stop.load(Ordering::Relaxed) {
        return Err(LabError::Interrupted);
    }
    let mut text = lab.summary();
    if !s.commands.is_empty() {
        text.push_str(&format!(
            "  note: the scenario's {} command(s) run only with `netlab run`\n",
            s.commands.len()
        ));
    }
    let st = lab.detach()?;
    print!("{text}");
    println!(
        "  run commands with: netlab exec{} HOST -- CMD;  remove with: netlab down{}",
        run_flag(&st.run_id),
        run_flag(&st.run_id)
    );
    Ok(ExitCode::SUCCESS)
}
