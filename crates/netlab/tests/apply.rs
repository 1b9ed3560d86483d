//! Applying checks every exit status: a failing operation stops the build
//! and is reported exactly, in both apply modes.

mod common;
use common::*;
use netlab::apply::{apply, ApplyCtx, ApplyMode};
use netlab::error::LabError;
use netlab::plan::{Naming, Op, Plan, PlanOptions, Tool};
use std::sync::atomic::AtomicBool;

fn ip(ns: &str, args: &str) -> Op {
    Op::Cmd {
        ns: Some(ns.into()),
        tool: Tool::Ip,
        args: args.split(' ').map(String::from).collect(),
    }
}

#[test]
fn failing_op_is_named_in_both_modes() {
    if !need_root("failing_op_is_named_in_both_modes") {
        return;
    }
    for (i, mode) in [ApplyMode::Batch, ApplyMode::PerOp].into_iter().enumerate() {
        // Unique per process and case; the guard deletes the namespace even
        // if an assertion fails first.
        let naming = Naming::new(format!("{:x}apply{i}", std::process::id()));
        let ns = naming.ns("x");
        let _g = oskit::testing::NetNsGuard::adopt(ns.clone());
        let plan = Plan {
            naming: naming.clone(),
            options: PlanOptions::default(),
            addressing: Default::default(),
            namespaces: vec![ns.clone()],
            shaped: vec![],
            ops: vec![
                Op::AddNetns(ns.clone()),
                ip(&ns, "link set lo up"),
                ip(&ns, "link add br0 type bridge"),
                ip(&ns, "link set nosuch up"),
                ip(&ns, "link set br0 up"),
            ],
        };
        let stop = AtomicBool::new(false);
        let dir = std::env::temp_dir();
        let mut progress = |_: usize, _: usize| {};
        let mut ctx = ApplyCtx {
            mode,
            exe: std::path::Path::new(env!("CARGO_BIN_EXE_netlab")),
            log_dir: &dir,
            stop: &stop,
            progress: &mut progress,
            clock: None,
        };
        match apply(&plan, &mut ctx) {
            Err(LabError::Command { cmd, stderr, .. }) => {
                assert_eq!(cmd, format!("ip -n {ns} link set nosuch up"), "{mode:?}");
                assert!(stderr.contains("nosuch"), "{mode:?}: {stderr}");
            }
            other => panic!("{mode:?}: expected the failing op, got {:?}", other.map(|_| ())),
        }
        // Nothing after the failure ran: br0 is still down.
        let o = std::process::Command::new("ip")
            .args(["-n", &ns, "-br", "link", "show", "br0"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&o.stdout).contains("DOWN"), "{mode:?}");
    }
}
