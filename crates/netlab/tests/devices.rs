//! Device settings (`Op::Sysfs`) land on the device of the host they name,
//! inside its namespace, and nowhere else; one the kernel does not take
//! fails the build, naming the operation, and leaves nothing.

mod common;
use common::*;
use netlab::error::LabError;
use netlab::lab::Lab;
use netlab::model::{CpuList, DeviceSetting, LinkParams, Sysfs, Topology, MAX_CPUS};
use netlab::topo::Builtin;
use std::sync::atomic::AtomicBool;

fn pair_with_rps(h1_cpus: CpuList) -> Topology {
    let mut t = Builtin::Pair.build(&LinkParams::default());
    t.device_settings = vec![DeviceSetting {
        node: "h1".into(),
        dev: "eth0".into(),
        set: Sysfs::RpsCpus(h1_cpus),
    }];
    t
}

/// `rps_cpus` of every receive queue of every device this process's
/// `/sys` shows (the initial namespace's, for the test).
fn rps_here() -> Vec<(String, String)> {
    let mut v = vec![];
    for dev in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        let queues = dev.path().join("queues");
        for q in std::fs::read_dir(&queues).into_iter().flatten().flatten() {
            let f = q.path().join("rps_cpus");
            if let Ok(text) = std::fs::read_to_string(&f) {
                v.push((f.display().to_string(), text));
            }
        }
    }
    v.sort();
    v
}

#[test]
fn rps_is_written_on_the_named_device_in_its_hosts_namespace() {
    if !need_root("rps_is_written_on_the_named_device_in_its_hosts_namespace") {
        return;
    }
    let cpu = *oskit::cpu::allowed_cpus()
        .last()
        .expect("this process may run somewhere");
    let before = rps_here();
    let lab = up(&pair_with_rps(CpuList::one(cpu).unwrap()), &opts());
    // Read back from inside each namespace, by a process the launcher
    // starts there (`ip netns exec` mounts the namespace's own sysfs).
    let read = |host: &str| {
        let out = lab
            .launcher()
            .command(host, &["cat", "/sys/class/net/eth0/queues/rx-0/rps_cpus"])
            .unwrap()
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        CpuList::from_kernel_mask(&text).unwrap_or_else(|| panic!("not a CPU mask: {text}"))
    };
    assert_eq!(read("h1"), [cpu], "h1's eth0 steers to CPU {cpu}");
    assert_eq!(read("h2"), Vec::<usize>::new(), "h2's eth0 was not asked for");
    // Nothing of the caller's namespace changed, whatever its devices are
    // called (a namespace entered without its own sysfs would have written
    // here, to an eth0 of the caller's, or failed to find one).
    assert_eq!(rps_here(), before);
    let ns = lab.ns_of("h1").unwrap().to_string();
    // Nothing to undo: the device and its setting go with the namespace.
    lab.down().unwrap();
    assert!(!netlab::netns::our_namespaces().contains(&ns));
}

#[test]
fn an_rps_cpu_the_kernel_refuses_fails_the_build_and_leaves_nothing() {
    if !need_root("an_rps_cpu_the_kernel_refuses_fails_the_build_and_leaves_nothing") {
        return;
    }
    // A sane list (the plan takes it) of a CPU this machine cannot have:
    // the first after its possible ones (`0-1` on a machine of two).
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let last: usize = possible.trim().rsplit(['-', ',']).next().unwrap().parse().unwrap();
    assert!(last + 1 < MAX_CPUS, "this machine has every CPU a list may name");
    let cpus = CpuList::one(last + 1).unwrap();
    static NEVER: AtomicBool = AtomicBool::new(false);
    let e = match Lab::up(&pair_with_rps(cpus), &opts(), &NEVER) {
        Ok(lab) => panic!("RPS to CPU {} was taken (run {})", last + 1, lab.state.run_id),
        Err(e) => e,
    };
    eprintln!("as expected: {e}");
    eprintln!("ERR: {e}");
    let LabError::Apply { op, msg } = &e else {
        panic!("expected the failing device setting, got {e}");
    };
    assert!(op.contains("/sys/class/net/eth0/queues/rx-*/rps_cpus"), "{op}");
    assert!(msg.contains("rx-0/rps_cpus"), "{msg}");
    // `ip netns exec NS sh -c ...`: the host's namespace is gone.
    let ns = op.split_whitespace().nth(3).unwrap();
    assert!(ns.ends_with("-h1"), "{op}");
    assert!(!netlab::netns::our_namespaces().iter().any(|n| n == ns), "{ns} is left");
}
