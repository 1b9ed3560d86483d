//! `netlab exec`: run a command inside a host of a lab that is up.

use super::*;
use netlab::model::CpuList;
use std::os::unix::process::CommandExt;

#[derive(Args)]
pub struct ExecArgs {
    #[arg(long)]
    pub run: Option<String>,
    /// Run the command on these CPUs (taskset's syntax: 1, 0-3, 0,2-3) instead of the host's
    /// CPU set from the scenario, e.g. to pin a load generator and a receiver apart.
    #[arg(long, value_name = "LIST", allow_hyphen_values = true, value_parser = |s: &str| CpuList::parse(s))]
    pub cpus: Option<CpuList>,
    pub host: String,
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

pub fn run(a: ExecArgs) -> Result<ExitCode, LabError> {
    let ExecArgs { run, cpus, host, cmd } = a;
    lab::require_caps()?;
    sweep_quietly();
    let st = lab::find_run(&state_dir(), run.as_deref())?;
    let st = match cpus {
        Some(cpus) => on_cpus(st, &host, &cpus),
        None => st,
    };
    let mut c = Launcher::for_run(&st).command(&host, &cmd)?;
    // netlab replaces itself with the command (as `ip netns exec` does), so
    // the caller's child is the command: a signal sent to it reaches the
    // command, and wait4() reports the command's exit status and CPU time.
    let e = c.exec();
    Err(LabError::Spawn {
        cmd: cmd.join(" "),
        source: e,
    })
}

/// The run as the launcher should see it for one command: `host` on `cpus`
/// (the launcher starts a host's commands on its CPU set). An unknown host
/// is left for the launcher to report.
fn on_cpus(mut st: lab::RunState, host: &str, cpus: &CpuList) -> lab::RunState {
    if let Some(h) = st.hosts.iter_mut().find(|h| h.name == host) {
        h.cpus = Some(cpus.to_string());
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        exec: ExecArgs,
    }

    fn parse(args: &[&str]) -> Result<ExecArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("exec").chain(args.iter().copied())).map(|c| c.exec)
    }

    fn pair(h2_cpus: Option<&str>) -> lab::RunState {
        let host = |name: &str, cpus: Option<&str>| lab::HostInfo {
            name: name.into(),
            kind: netlab::model::NodeKind::Host,
            ns: format!("netlab-r1-{name}"),
            addr: None,
            cpus: cpus.map(String::from),
        };
        lab::RunState {
            run_id: "r1".into(),
            scenario: "pair".into(),
            topology: "pair".into(),
            owner_pid: 1,
            owner_start: None,
            phase: lab::Phase::Detached,
            delay_backend: netlab::plan::DelayBackend::DelayLine,
            tdf: vtime::Tdf::ONE,
            namespaces: vec![],
            hosts: vec![host("h1", None), host("h2", h2_cpus)],
            clock: None,
            shaped: vec![],
        }
    }

    fn argv(st: &lab::RunState, host: &str) -> Vec<String> {
        let c = Launcher::for_run(st).command(host, &["true"]).unwrap();
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn cpus_pin_the_command_and_override_the_hosts_set() {
        let a = parse(&["--run", "r1", "--cpus", "1,0", "h1", "--", "true"]).unwrap();
        let cpus = a.cpus.expect("--cpus parsed");
        assert_eq!(cpus.cpus(), [0, 1]);
        let st = on_cpus(pair(Some("0")), "h1", &cpus);
        assert_eq!(
            argv(&st, "h1"),
            ["ip", "netns", "exec", "netlab-r1-h1", "taskset", "-c", "0-1", "true"]
        );
        // Only the named host changes; h2 keeps its own set.
        assert_eq!(
            argv(&st, "h2"),
            ["ip", "netns", "exec", "netlab-r1-h2", "taskset", "-c", "0", "true"]
        );
        let st = on_cpus(pair(Some("0")), "h2", &CpuList::one(1).unwrap());
        assert_eq!(
            argv(&st, "h2"),
            ["ip", "netns", "exec", "netlab-r1-h2", "taskset", "-c", "1", "true"]
        );
    }

    #[test]
    fn without_cpus_the_host_keeps_its_set() {
        let a = parse(&["h2", "--", "true"]).unwrap();
        assert!(a.cpus.is_none());
        assert_eq!(
            argv(&pair(Some("1")), "h2"),
            ["ip", "netns", "exec", "netlab-r1-h2", "taskset", "-c", "1", "true"]
        );
    }

    #[test]
    fn a_bad_cpu_list_is_refused_naming_it() {
        for bad in ["x", "2-1", "", "1,,2", "-1"] {
            let e = match parse(&["--cpus", bad, "h1", "--", "true"]) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("--cpus '{bad}' accepted"),
            };
            assert!(e.contains("--cpus") && e.contains("CPU list"), "{bad}: {e}");
        }
    }
}
