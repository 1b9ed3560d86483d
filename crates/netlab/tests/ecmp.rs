//! ECMP in a k=4 fat tree (paper 003 section 5): with stride-1 traffic no two
//! flows share a (directed) core link; with stride-4 traffic some do, which
//! is ECMP's known weakness. Paths are read from the core routers' per-link
//! packet counters, one flow at a time.

mod common;
use common::*;
use netlab::model::LinkParams;
use netlab::netns::{link_counters, spawn_in};
use netlab::probe::Endpoint;
use netlab::topo::Builtin;
use std::collections::HashMap;
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SINK_PORT: u16 = 47990;
const PER_FLOW: u64 = 60;

/// (core router, interface, "up"|"down")
type DirLink = (String, String, &'static str);

fn core_counters(lab: &netlab::lab::Lab, cores: &[String]) -> HashMap<(String, String), [u64; 4]> {
    let mut m = HashMap::new();
    for c in cores {
        for (ifname, v) in link_counters(lab.ns_of(c).unwrap()).unwrap() {
            m.insert((c.clone(), ifname), v);
        }
    }
    m
}

#[test]
fn fattree_ecmp_stride_1_disjoint_stride_4_collides() {
    if !need_root("fattree_ecmp_stride_1_disjoint_stride_4_collides") {
        return;
    }
    let mut o = opts();
    // A fixed hash seed makes the path choice, and so this test, repeatable.
    o.ecmp_seed = Some(1);
    let lab = up(&Builtin::FatTree { k: 4 }.build(&LinkParams::default()), &o);
    let eps: Vec<Endpoint> = netlab::probe::endpoints(&lab.state);
    assert_eq!(eps.len(), 16);
    let by_name: HashMap<String, Endpoint> = eps.iter().map(|e| (e.name.clone(), e.clone())).collect();
    let cores: Vec<String> = (1..=4).map(|i| format!("c{i}")).collect();

    // A sink in every host counts what arrives, so no ICMP "port
    // unreachable" travels back over the links being counted.
    let stop = Arc::new(AtomicBool::new(false));
    let mut counts = HashMap::new();
    let mut sinks = vec![];
    for e in &eps {
        let n = Arc::new(AtomicU64::new(0));
        counts.insert(e.name.clone(), n.clone());
        let (stop, ready) = (stop.clone(), Arc::new(AtomicBool::new(false)));
        let r2 = ready.clone();
        sinks.push(
            spawn_in(&e.ns, move || {
                let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, SINK_PORT)).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                r2.store(true, Ordering::SeqCst);
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if s.recv(&mut buf).is_ok() {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
            .unwrap(),
        );
        wait_for("sink", Duration::from_secs(5), || {
            ready.load(Ordering::SeqCst).then_some(())
        });
    }

    let run_stride = |stride: usize| -> HashMap<DirLink, Vec<String>> {
        let mut used: HashMap<DirLink, Vec<String>> = HashMap::new();
        for x in 0..16 {
            let src = by_name[&format!("h{}", x + 1)].clone();
            let dst = by_name[&format!("h{}", (x + stride) % 16 + 1)].clone();
            let flow = format!("{}->{}", src.name, dst.name);
            let before = core_counters(&lab, &cores);
            let got0 = counts[&dst.name].load(Ordering::SeqCst);
            let daddr = dst.addr;
            let sport = 20000 + x as u16;
            spawn_in(&src.ns, move || {
                let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, sport)).unwrap();
                for i in 0..PER_FLOW {
                    s.send_to(&i.to_be_bytes(), (daddr, SINK_PORT)).unwrap();
                }
            })
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
            wait_for(&format!("{flow} delivered"), Duration::from_secs(5), || {
                (counts[&dst.name].load(Ordering::SeqCst) >= got0 + PER_FLOW).then_some(())
            });
            assert_eq!(
                counts[&dst.name].load(Ordering::SeqCst),
                got0 + PER_FLOW,
                "{flow}: exact count"
            );
            let after = core_counters(&lab, &cores);
            for (k, a) in &after {
                let b = before.get(k).copied().unwrap_or_default();
                // tx of a core interface is the down direction, rx the up one.
                if a[1] - b[1] >= PER_FLOW {
                    used.entry((k.0.clone(), k.1.clone(), "down"))
                        .or_default()
                        .push(flow.clone());
                }
                if a[3] - b[3] >= PER_FLOW {
                    used.entry((k.0.clone(), k.1.clone(), "up"))
                        .or_default()
                        .push(flow.clone());
                }
            }
        }
        used
    };

    let s1 = run_stride(1);
    // Four stride-1 flows leave their pod (h4->h5, h8->h9, h12->h13,
    // h16->h1), each over one core link up and one down.
    let uses: usize = s1.values().map(|v| v.len()).sum();
    assert_eq!(uses, 8, "stride 1 core link uses: {s1:?}");
    for (l, flows) in &s1 {
        assert_eq!(flows.len(), 1, "stride 1: flows {flows:?} share core link {l:?}");
    }

    let s4 = run_stride(4);
    let uses: usize = s4.values().map(|v| v.len()).sum();
    assert_eq!(uses, 32, "every stride-4 flow crosses the core: {s4:?}");
    let shared: Vec<_> = s4.iter().filter(|(_, f)| f.len() > 1).collect();
    println!(
        "stride 4: {} of {} used core links carry more than one flow: {shared:?}",
        shared.len(),
        s4.len()
    );
    assert!(!shared.is_empty(), "stride 4: no core link shared: {s4:?}");

    stop.store(true, Ordering::SeqCst);
    for s in sinks {
        s.join().unwrap().unwrap();
    }
}
