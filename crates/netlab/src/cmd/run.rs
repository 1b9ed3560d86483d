//! `netlab run`: build a lab, run the scenario's commands, remove it (optionally with an adaptive TDF).

use super::*;

#[derive(Args)]
pub struct RunArgs {
    pub scenario: String,
    #[command(flatten)]
    pub build: BuildArgs,
    /// Keep each command's stdout/stderr in this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Adapt the TDF to the machine's load while the commands run, within MIN-MAX (e.g.
    /// 1-8): raised when the CPUs are more than 85% busy, lowered below 40%; the trace is
    /// written to tdf-trace.csv in the output directory.
    #[arg(long, value_parser = netlab::adapt::parse_range)]
    pub adaptive_tdf: Option<(u32, u32)>,
    /// Seconds between adaptive TDF decisions.
    #[arg(long, default_value_t = 1.0)]
    pub adapt_epoch: f64,
}

pub fn run(a: RunArgs, stop: &AtomicBool) -> Result<ExitCode, LabError> {
    let RunArgs {
        scenario,
        build,
        out,
        adaptive_tdf,
        adapt_epoch,
    } = a;
    let s = load_scenario(&scenario, &build)?;
    lab::require_caps()?;
    let mut o = lab_options(&s, &build)?;
    if let Some((min, max)) = adaptive_tdf {
        if !(adapt_epoch.is_finite() && (0.05..=60.0).contains(&adapt_epoch)) {
            return Err(ModelError::OutOfRange {
                item: "--adapt-epoch".into(),
                value: adapt_epoch.to_string(),
                range: "between 0.05 and 60 seconds".into(),
            }
            .into());
        }
        o.virtual_time = true;
        let whole = |n: u32| {
            netlab::plan::Tdf::new(u64::from(n), 1)
                .map_err(|e| LabError::io("--adaptive-tdf", std::io::Error::other(e)))
        };
        o.dilation.tdf = o.dilation.tdf.clamp(whole(min)?, whole(max)?);
    }
    let lab = Lab::up(&s.topology, &o, stop)?;
    eprint!("{}", lab.summary());
    let out_dir = out.unwrap_or_else(|| lab.dir.join("out"));
    std::fs::create_dir_all(&out_dir).map_err(|e| LabError::io(format!("create {}", out_dir.display()), e))?;
    // On error the lab is dropped, which removes it.
    match adaptive_tdf {
        None => netlab::runner::run_commands(&lab, &s.commands, stop, &out_dir)?,
        Some((min_tdf, max_tdf)) => {
            let policy = netlab::adapt::Policy {
                min_tdf,
                max_tdf,
                epoch: Duration::from_secs_f64(adapt_epoch),
                ..Default::default()
            };
            let trace_path = out_dir.join("tdf-trace.csv");
            let mut trace = std::fs::File::create(&trace_path)
                .map_err(|e| LabError::io(format!("create {}", trace_path.display()), e))?;
            let done = AtomicBool::new(false);
            let state = lab.state.clone();
            let (ran, adapted) = std::thread::scope(|sc| {
                let adaptor = sc.spawn(|| netlab::adapt::run(&state, policy, &done, &mut trace));
                let ran = netlab::runner::run_commands(&lab, &s.commands, stop, &out_dir);
                done.store(true, Ordering::Relaxed);
                (ran, adaptor.join())
            });
            ran?;
            let last = adapted.map_err(|_| LabError::io("adaptive TDF", std::io::Error::other("panicked")))??;
            eprintln!(
                "netlab: adaptive TDF ended at {last}; trace in {}",
                trace_path.display()
            );
        }
    }
    let t = lab.down()?;
    eprintln!("netlab: lab removed in {:.2}s", t.as_secs_f64());
    Ok(ExitCode::SUCCESS)
}
