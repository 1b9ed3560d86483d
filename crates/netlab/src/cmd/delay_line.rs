//! `netlab delay-line` (internal): the delay-line process of one link.

use super::*;
use netlab::delayline;

#[derive(Args)]
pub struct DelayLineArgs {
    #[arg(long)]
    pub link: usize,
    #[arg(long)]
    pub a: String,
    #[arg(long)]
    pub b: String,
    #[arg(long, default_value_t = 0)]
    pub delay_ns: u64,
    #[arg(long, default_value_t = 0)]
    pub jitter_ns: u64,
    #[arg(long, default_value_t = 0)]
    pub loss_ppm: u32,
    #[arg(long, default_value_t = 10_000)]
    pub limit: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 30_000)]
    pub spin_ns: u64,
    /// The lab's clock (a dilated lab): the delay follows its TDF.
    #[arg(long, requires_all = ["clock_domain", "built_tdf"])]
    pub clock_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    pub clock_domain: Option<String>,
    /// The TDF the delay and jitter above were computed for.
    #[arg(long)]
    pub built_tdf: Option<vtime::Tdf>,
}

pub fn run(a: DelayLineArgs) -> Result<ExitCode, LabError> {
    // The delay line runs until netlab ends it (SIGTERM); a terminal
    // hang-up must not take a link down under a lab left up.
    use oskit::signal::{flag_on, ignore, Second, SIGHUP, SIGINT, SIGTERM};
    let stop = flag_on(&[SIGTERM, SIGINT], Second::Ignore).unwrap_or_default();
    let _ = ignore(&[SIGHUP]);
    let clock = match (&a.clock_dir, &a.clock_domain, a.built_tdf) {
        (Some(dir), Some(domain), Some(built)) => {
            let link = format!("{} ({} <-> {})", a.link, a.a, a.b);
            let err = |msg: String| LabError::DelayLine {
                link: link.clone(),
                msg,
            };
            let d = vtime::Domain::open(dir, domain).map_err(|e| err(e.to_string()))?;
            Some((d, built))
        }
        _ => None,
    };
    let cfg = delayline::Config {
        clock,
        a: a.a.clone(),
        b: a.b.clone(),
        delay_ns: a.delay_ns,
        jitter_ns: a.jitter_ns,
        loss_ppm: a.loss_ppm,
        limit: a.limit.max(1),
        seed: a.seed,
        spin_ns: a.spin_ns,
    };
    let stats = delayline::run(&cfg, &stop, || {
        println!("ready");
        let _ = std::io::stdout().flush();
    })
    .map_err(|e| LabError::DelayLine {
        link: format!("{} ({} <-> {})", a.link, a.a, a.b),
        msg: e.to_string(),
    })?;
    eprintln!("delay line {}: a->b {:?}; b->a {:?}", a.link, stats[0], stats[1]);
    Ok(ExitCode::SUCCESS)
}
