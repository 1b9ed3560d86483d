//! `netlab probe`: one TCP flow or UDP round trips between two hosts.

use super::*;

#[derive(Subcommand)]
pub enum ProbeCmd {
    /// TCP throughput from one host to another.
    Tcp {
        from: String,
        to: String,
        /// Seconds measured (after one second of warm-up).
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
    },
    /// UDP round-trip times from one host to another.
    Rtt {
        from: String,
        to: String,
        #[arg(long, default_value_t = 200)]
        count: usize,
    },
}

#[derive(Args)]
pub struct ProbeArgs {
    #[arg(long)]
    pub run: Option<String>,
    #[command(subcommand)]
    pub what: ProbeCmd,
}

pub fn run(a: ProbeArgs) -> Result<ExitCode, LabError> {
    let ProbeArgs { run, what } = a;
    lab::require_caps()?;
    sweep_quietly();
    let st = lab::find_run(&state_dir(), run.as_deref())?;
    let eps = probe::endpoints(&st);
    let find = |n: &str| {
        eps.iter()
            .find(|e| e.name == n)
            .cloned()
            .ok_or_else(|| LabError::UnknownHost {
                host: n.into(),
                run: st.run_id.clone(),
                known: eps.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", "),
            })
    };
    match what {
        ProbeCmd::Tcp { from, to, secs } => {
            if !(0.1..=600.0).contains(&secs) {
                return Err(ModelError::OutOfRange {
                    item: "--secs".into(),
                    value: secs.to_string(),
                    range: "between 0.1 and 600".into(),
                }
                .into());
            }
            let t = probe::tcp_flow(
                &find(&from)?,
                &find(&to)?,
                Duration::from_secs(1),
                Duration::from_secs_f64(secs),
            )?;
            println!(
                "tcp {from} -> {to}: {:.1} Mbit/s goodput ({} bytes in {:.2}s)",
                t.goodput_bps / 1e6,
                t.bytes,
                t.window.as_secs_f64()
            );
        }
        ProbeCmd::Rtt { from, to, count } => {
            let count = count.clamp(1, 100_000);
            let mut v = probe::udp_rtts(
                &find(&from)?,
                &find(&to)?,
                count,
                Duration::from_millis(2),
                Duration::from_secs(1),
            )?;
            v.sort();
            if v.is_empty() {
                println!("rtt {from} -> {to}: no replies");
                return Ok(ExitCode::FAILURE);
            }
            let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
            println!(
                "rtt {from} -> {to}: {} of {count} replies, min {:.0}us median {:.0}us p99 {:.0}us",
                v.len(),
                q(0.0),
                q(0.5),
                q(0.99)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
