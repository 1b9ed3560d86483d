//! The only door into a host: every process netlab starts inside a lab
//! (scenario commands, `exec`, the demo's servers and bots) is built here,
//! from the run's recorded state, so what a run decides for its processes
//! (the CPU set of a host, the time dilation factor, the environment)
//! reaches every one of them. A dilated run's processes start under the
//! vtime shim on the run's clock record (`LD_PRELOAD` and `VTIME_RECORD`,
//! inherited by their children).

use super::state::{HostInfo, RunState};
use crate::error::LabError;
use std::ffi::OsStr;
use std::process::Command;

/// Starts processes inside the hosts of one run.
#[derive(Clone, Debug)]
pub struct Launcher {
    state: RunState,
}

impl Launcher {
    /// The launcher of a run, as its state records it.
    pub fn for_run(state: &RunState) -> Launcher {
        Launcher { state: state.clone() }
    }

    /// The run this launcher starts processes in.
    pub fn run(&self) -> &RunState {
        &self.state
    }

    /// The network namespace of `host`.
    pub fn netns(&self, host: &str) -> Result<&str, LabError> {
        Ok(self.state.host(host)?.ns.as_str())
    }

    /// A command that runs `argv` inside `host`: in its namespace, on its
    /// CPU set if it has one, with the run's environment
    /// ([`Launcher::env`]). The caller sets stdio and spawns it.
    pub fn command<S: AsRef<OsStr>>(&self, host: &str, argv: &[S]) -> Result<Command, LabError> {
        let h = self.state.host(host)?;
        let Some((program, args)) = argv.split_first() else {
            return Err(LabError::io(
                format!("start a process in host '{host}'"),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command line"),
            ));
        };
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.ns]);
        if let Some(cpus) = &h.cpus {
            c.args(["taskset", "-c", cpus]);
        }
        c.arg(program).args(args);
        c.envs(self.env(h));
        if let Some(clock) = &self.state.clock {
            // `ip` and `taskset` run under the shim too, harmlessly: they
            // exec the program, which keeps the environment.
            let domain = vtime::Domain::open(&clock.dir, &clock.domain)?;
            c.envs(domain.child_env(&clock.shim));
        }
        Ok(c)
    }

    /// Environment every command gets: its host's name, the run, the run's
    /// time dilation factor, and every host's address as `NETLAB_IP_<host>`.
    pub fn env(&self, host: &HostInfo) -> Vec<(String, String)> {
        let mut v = vec![
            ("NETLAB_HOST".to_string(), host.name.clone()),
            ("NETLAB_RUN".to_string(), self.state.run_id.clone()),
            ("NETLAB_TDF".to_string(), self.state.tdf.to_string()),
        ];
        for h in &self.state.hosts {
            if let Some(a) = h.addr {
                v.push((format!("NETLAB_IP_{}", h.name), a.to_string()));
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NodeKind;
    use crate::plan::DelayBackend;

    fn state() -> RunState {
        let host = |name: &str, cpus: Option<&str>| HostInfo {
            name: name.into(),
            kind: NodeKind::Host,
            ns: format!("netlab-r1-{name}"),
            addr: Some([10, 0, 0, 1].into()),
            cpus: cpus.map(String::from),
        };
        RunState {
            run_id: "r1".into(),
            scenario: "t".into(),
            topology: "pair".into(),
            owner_pid: 1,
            owner_start: None,
            phase: super::super::Phase::Running,
            delay_backend: DelayBackend::DelayLine,
            tdf: vtime::Tdf::new(4, 1).unwrap(),
            namespaces: vec![],
            hosts: vec![host("h1", None), host("h2", Some("1"))],
            clock: None,
            shaped: vec![],
        }
    }

    fn argv(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn commands_enter_the_host_with_its_cpus_and_the_run_environment() {
        let l = Launcher::for_run(&state());
        let c = l.command("h1", &["echo", "hi"]).unwrap();
        assert_eq!(argv(&c), ["ip", "netns", "exec", "netlab-r1-h1", "echo", "hi"]);
        let c = l.command("h2", &["echo"]).unwrap();
        assert_eq!(
            argv(&c),
            ["ip", "netns", "exec", "netlab-r1-h2", "taskset", "-c", "1", "echo"]
        );
        let env: Vec<(String, String)> = c
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy().into(), v.unwrap().to_string_lossy().into()))
            .collect();
        assert!(env.contains(&("NETLAB_HOST".into(), "h2".into())));
        assert!(env.contains(&("NETLAB_TDF".into(), "4".into())));
        assert!(env.contains(&("NETLAB_IP_h1".into(), "10.0.0.1".into())));
    }

    #[test]
    fn unknown_hosts_and_empty_commands_are_errors() {
        let l = Launcher::for_run(&state());
        assert!(matches!(
            l.command("nope", &["true"]),
            Err(LabError::UnknownHost { .. })
        ));
        assert!(l.command::<&str>("h1", &[]).is_err());
        assert_eq!(l.netns("h2").unwrap(), "netlab-r1-h2");
    }
}
