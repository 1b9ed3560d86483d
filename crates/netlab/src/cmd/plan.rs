//! `netlab plan`: print the operations `up` would run.

use super::*;

pub fn run(a: ScenarioArgs) -> Result<ExitCode, LabError> {
    let ScenarioArgs { scenario, build } = a;
    let s = load_scenario(&scenario, &build)?;
    let o = PlanOptions {
        delay_backend: s.delay_backend.unwrap_or(netlab::plan::DelayBackend::DelayLine),
        dilation: Dilation {
            tdf: s.tdf.unwrap_or(netlab::plan::Tdf::ONE),
        },
        ecmp_seed: s.ecmp_seed,
        ..PlanOptions::default()
    };
    let p = build_plan(&s.topology, &Naming::new("RUN"), &o)?;
    let head = format!(
        "# {} ({} operations; RUN is the run id chosen at `up`)",
        s.topology.name,
        p.ops.len()
    );
    print_lines(std::iter::once(head).chain(p.ops.iter().map(|op| op.to_string())))?;
    Ok(ExitCode::SUCCESS)
}
