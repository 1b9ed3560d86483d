//! Every built-in topology comes up, every host reaches every other with
//! UDP probes, and the lab is removed completely afterwards.

mod common;
use common::*;
use netlab::model::LinkParams;
use netlab::probe;
use netlab::topo::Builtin;

static NEVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn roundtrip(b: Builtin, params: LinkParams) {
    let name = format!("topology {}", b.label());
    if !need_root(&name) {
        return;
    }
    let lab = up(&b.build(&params), &opts());
    let run = lab.state.run_id.clone();
    assert_eq!(namespaces_of(&run).len(), lab.state.namespaces.len());
    let eps = probe::endpoints(&lab.state);
    let failed = probe::all_pairs(&eps, Default::default(), &NEVER, |_| {}).unwrap();
    assert!(failed.is_empty(), "{name}: unreachable pairs {failed:?}");
    let pids: Vec<i32> = lab
        .state
        .namespaces
        .iter()
        .flat_map(|n| netlab::netns::pids_in(n))
        .collect();
    let dir = lab.dir.clone();
    lab.down().unwrap();
    assert!(namespaces_of(&run).is_empty(), "{name}: namespaces left behind");
    assert!(!dir.exists(), "{name}: state left behind");
    for p in pids {
        assert!(!oskit::procfs::alive(p), "{name}: process {p} left running");
    }
}

#[test]
fn pair() {
    roundtrip(Builtin::Pair, LinkParams::default());
}

#[test]
fn pair_with_shaping_and_delay_line() {
    roundtrip(
        Builtin::Pair,
        LinkParams {
            bw_bps: Some(50_000_000),
            delay_ns: 500_000,
            queue: Some(100),
            ..Default::default()
        },
    );
}

#[test]
fn star() {
    roundtrip(Builtin::Star { hosts: 6 }, LinkParams::default());
}

#[test]
fn linear() {
    roundtrip(
        Builtin::Linear { switches: 5 },
        LinkParams {
            bw_bps: Some(100_000_000),
            ..Default::default()
        },
    );
}

#[test]
fn chain() {
    roundtrip(Builtin::Chain { switches: 4 }, LinkParams::default());
}

#[test]
fn fattree() {
    roundtrip(Builtin::FatTree { k: 4 }, LinkParams::default());
}

#[test]
fn fattree_applied_one_process_per_op() {
    if !need_root("fattree_applied_one_process_per_op") {
        return;
    }
    // The same lab through the other apply backend must come out the same.
    let mut o = opts();
    o.apply_mode = netlab::apply::ApplyMode::PerOp;
    let lab = up(&Builtin::FatTree { k: 4 }.build(&LinkParams::default()), &o);
    let failed = probe::all_pairs(&probe::endpoints(&lab.state), Default::default(), &NEVER, |_| {}).unwrap();
    assert!(failed.is_empty(), "per-op fattree: unreachable pairs {failed:?}");
    let run = lab.state.run_id.clone();
    lab.down().unwrap();
    assert!(namespaces_of(&run).is_empty());
}
