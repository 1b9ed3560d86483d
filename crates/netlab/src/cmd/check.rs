//! `netlab check`: do the hosts reach each other (every pair, or a stated sample)?

use super::*;

#[derive(Args)]
pub struct CheckArgs {
    #[arg(long)]
    pub run: Option<String>,
    /// Every pair, whatever the lab's size (a 1,000-host lab has 999,000, each resolved by an
    /// ARP broadcast to every port: over an hour).
    #[arg(long)]
    pub all_pairs: bool,
    /// Random destinations per host in a sampled check (fewer if the kernel's neighbour
    /// table, shared by the machine, has no room for them).
    #[arg(long, default_value_t = probe::SAMPLE_PER_HOST as u16, value_parser = clap::value_parser!(u16).range(0..=1000))]
    pub sample: u16,
    /// Seed of the sample's random pairs (printed by every sampled check).
    #[arg(long)]
    pub seed: Option<u64>,
}

pub fn run(a: CheckArgs, stop: &AtomicBool) -> Result<ExitCode, LabError> {
    let CheckArgs {
        run,
        all_pairs,
        sample,
        seed,
    } = a;
    lab::require_caps()?;
    sweep_quietly();
    let st = lab::find_run(&state_dir(), run.as_deref())?;
    let eps = probe::endpoints(&st);
    let n = eps.len();
    let every = n * n.saturating_sub(1);
    let sampled = !all_pairs && n > probe::ALL_PAIRS_MAX;
    let sample = usize::from(sample);
    let (set, what, how) = if sampled {
        sample_set(&st, &eps, sample, seed)
    } else {
        if let Some(w) = load_addressing(&st).and_then(|a| lab::neighbour_warning(&a)) {
            eprintln!("netlab: note: {w}");
        }
        (probe::PairSet::all(n), format!("all {every} host pairs"), String::new())
    };
    let t0 = Instant::now();
    let show = |p: probe::CheckProgress| {
        eprint!(
            "\rnetlab: checking: {}/{} pairs, {} unreachable so far",
            p.done, p.total, p.failed
        );
        let _ = std::io::stderr().flush();
    };
    let result = probe::check_pairs(&eps, &set, probe::CheckOptions::default(), stop, show);
    // Ends the progress line.
    eprintln!();
    let failed = result?;
    if failed.is_empty() {
        println!(
            "netlab: {what} reach each other (UDP, {:.2}s){how}",
            t0.elapsed().as_secs_f64()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        const SHOWN: usize = 20;
        for (a, b) in failed.iter().take(SHOWN) {
            println!("unreachable: {a} -> {b}");
        }
        if failed.len() > SHOWN {
            println!("... and {} more", failed.len() - SHOWN);
        }
        println!(
            "netlab: {} of {what} unreachable ({:.2}s){how}",
            failed.len(),
            t0.elapsed().as_secs_f64()
        );
        Ok(ExitCode::FAILURE)
    }
}

/// destinations per host, fewer if the neighbour table has no room.
fn sample_set(
    st: &lab::RunState,
    eps: &[probe::Endpoint],
    want: usize,
    seed: Option<u64>,
) -> (probe::PairSet, String, String) {
    let n = eps.len();
    let (t3, seen) = match lab::limits::current(lab::limits::NEIGH_THRESH[2]) {
        Some(v) => (v, true),
        None => (lab::limits::KERNEL_DEFAULTS[2], false),
    };
    let k = probe::sample_budget(n, t3, want);
    if k < want {
        let whose = if seen {
            ""
        } else {
            " if this container's machine left the default"
        };
        eprintln!(
            "netlab: note: {k} instead of {want} random destinations per host: the kernel's neighbour table, \
             shared by the machine, holds {t3} entries{whose} (net.ipv4.neigh.default.gc_thresh3) and the sample \
             uses at most half of it"
        );
    }
    let seed = seed.unwrap_or_else(time_seed);
    let hub = load_addressing(st)
        .and_then(|a| a.big_segment_hub().map(String::from))
        .and_then(|h| eps.iter().position(|e| e.name == h))
        .unwrap_or(0);
    let set = probe::PairSet::sampled(n, hub, k, seed);
    let what = format!("{} sampled host pairs", set.len());
    let how = format!(
        ": every host to hub {} and {k} random destinations per host, seed {seed} (`--seed {seed}` repeats it); \
         {n} hosts have {} pairs, --all-pairs checks them all",
        eps[hub].name,
        n * n.saturating_sub(1)
    );
    eprintln!("netlab: checking {what}{how}");
    (set, what, how)
}

/// A seed for a sample nobody asked to repeat: the clock's nanoseconds.
fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id())
}

/// The addressing of a run, re-read from its state directory.
fn load_addressing(st: &lab::RunState) -> Option<netlab::addr::Addressing> {
    let text = std::fs::read(state_dir().join(&st.run_id).join("addressing.json")).ok()?;
    serde_json::from_slice(&text).ok()
}
