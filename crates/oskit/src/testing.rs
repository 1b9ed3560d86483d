//! Helpers for the tests of every crate (feature `testing`): one namespace
//! guard, one root-or-skip rule, a command that runs inside a namespace
//! and a bare veth pair between two namespaces. A test that needs a real
//! topology builds it with netlab's library instead.

use crate::netns::{path_of, NetNs};
use crate::SysError;
use std::ffi::OsStr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// True if a test that needs root may go on. Without root it prints
/// "skipping TEST: needs root" and returns false, unless
/// `REQUIRE_ROOT_TESTS=1` (CI), where a skip is a failure.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "{test} needs root, and REQUIRE_ROOT_TESTS=1 forbids skipping it"
    );
    eprintln!("skipping {test}: needs root");
    false
}

/// Runs a command (`ip`, `tc`, …) and panics with its stderr if it fails:
/// test set-up that cannot go on after a failure.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace owned by a test: deleted on drop, even when the test
/// panics, after every process inside it has been ended.
#[derive(Debug)]
pub struct NetNsGuard {
    name: String,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl NetNsGuard {
    /// Creates a namespace named `{tag}{pid}x{n}` (unique per process and
    /// call, at most 15 + tag bytes) with its loopback up.
    pub fn new(tag: &str) -> NetNsGuard {
        let name = format!(
            "{tag}{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        sh(&["ip", "netns", "add", &name]);
        let guard = NetNsGuard { name };
        sh(&["ip", "-n", &guard.name, "link", "set", "lo", "up"]);
        guard
    }

    /// Takes over deletion of a namespace created by other means (a plan
    /// under test), whether or not it exists yet.
    pub fn adopt(name: impl Into<String>) -> NetNsGuard {
        NetNsGuard { name: name.into() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn open(&self) -> Result<NetNs, SysError> {
        NetNs::open(&self.name)
    }

    /// Runs `f` on a thread inside the namespace (sockets it creates live
    /// there); panics if the namespace cannot be entered.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.open()
            .and_then(|ns| ns.run(f))
            .unwrap_or_else(|e| panic!("running in {}: {e}", self.name))
    }

    /// A command that runs `program` inside the namespace ([`netns_command`]).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        netns_command(&self.name, program)
    }
}

/// A command that runs `program` inside network namespace `ns`; the caller
/// adds the arguments, stdio and environment. It goes through `ip netns
/// exec`, which besides entering the namespace mounts a `/sys` of it (so
/// `/sys/class/net` lists the namespace's devices, as the tests expect),
/// and `exec`s the program: the child's pid is the program's. (Entering
/// with `setns` in the child would need `pre_exec`, unsafe code this crate
/// does not have, and would leave `/sys` the caller's.)
pub fn netns_command(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// [`sh`] inside namespace `ns` (`ethtool`, `sysctl`, …: tools without a
/// namespace option of their own).
pub fn sh_in(ns: &str, args: &[&str]) {
    let out = netns_command(ns, args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} in {ns}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{args:?} in {ns} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One end of a [`veth_pair`].
#[derive(Debug, Clone, Copy)]
pub struct VethEnd<'a> {
    /// The namespace it lives in.
    pub ns: &'a str,
    /// Its device name (unique only within `ns`).
    pub ifname: &'a str,
    /// Its MAC address; the kernel picks a random one if none.
    pub mac: Option<&'a str>,
    /// Its address with prefix length (`10.1.2.1/24`), if any.
    pub addr: Option<&'a str>,
}

impl<'a> VethEnd<'a> {
    /// An end with no fixed MAC and no address.
    pub fn new(ns: &'a str, ifname: &'a str) -> VethEnd<'a> {
        VethEnd {
            ns,
            ifname,
            mac: None,
            addr: None,
        }
    }

    pub fn mac(self, mac: &'a str) -> VethEnd<'a> {
        VethEnd { mac: Some(mac), ..self }
    }

    pub fn addr(self, addr: &'a str) -> VethEnd<'a> {
        VethEnd {
            addr: Some(addr),
            ..self
        }
    }
}

/// Creates a veth pair from `a` to `b`, each end made straight inside its
/// namespace (so its name need be unique only there), with its MAC and
/// address if given, and up. Panics with `ip`'s message on failure; the
/// namespaces' guards remove the pair.
pub fn veth_pair(a: VethEnd<'_>, b: VethEnd<'_>) {
    let mut add = vec!["ip", "-n", a.ns, "link", "add", a.ifname];
    if let Some(mac) = a.mac {
        add.extend(["address", mac]);
    }
    add.extend(["type", "veth", "peer", "name", b.ifname]);
    if let Some(mac) = b.mac {
        add.extend(["address", mac]);
    }
    add.extend(["netns", b.ns]);
    sh(&add);
    for end in [a, b] {
        if let Some(addr) = end.addr {
            sh(&["ip", "-n", end.ns, "addr", "add", addr, "dev", end.ifname]);
        }
        sh(&["ip", "-n", end.ns, "link", "set", end.ifname, "up"]);
    }
}

/// Permanent neighbour entries on both ends of a veth pair for each
/// other's address, so no ARP crosses the link: only the test's packets
/// do, and the one neighbour table all namespaces share (`gc_thresh3`)
/// cannot evict them when a large lab runs beside the test. Both ends need
/// an address.
pub fn static_neighbours(a: VethEnd<'_>, b: VethEnd<'_>) {
    for (me, peer) in [(a, b), (b, a)] {
        let addr = peer
            .addr
            .unwrap_or_else(|| panic!("{} in {} has no address to be a neighbour at", peer.ifname, peer.ns));
        let ip = addr.split('/').next().unwrap_or(addr);
        permanent_neighbour(me, ip, &link_mac(peer.ns, peer.ifname));
    }
}

/// A permanent neighbour entry behind `end` (its namespace and device):
/// `ip` is at `mac`, so nothing is resolved by ARP (a peer without an
/// address, a MAC the test chose, a MAC that changed). Replaces an entry
/// that is there.
pub fn permanent_neighbour(end: VethEnd<'_>, ip: &str, mac: &str) {
    let (ns, dev) = (end.ns, end.ifname);
    sh(&[
        "ip",
        "-n",
        ns,
        "neigh",
        "replace",
        ip,
        "lladdr",
        mac,
        "dev",
        dev,
        "nud",
        "permanent",
    ]);
}

/// A route in namespace `ns` to `dest` (`10.1.3.0/24`, `default`) through
/// gateway `via`.
pub fn route_via(ns: &str, dest: &str, via: &str) {
    sh(&["ip", "-n", ns, "route", "add", dest, "via", via]);
}

/// Gives the device of `end` the MAC address `mac` (a router whose
/// address changes, as after a replaced card).
pub fn set_link_mac(end: VethEnd<'_>, mac: &str) {
    sh(&["ip", "-n", end.ns, "link", "set", end.ifname, "address", mac]);
}

/// The MAC address of device `ifname` in namespace `ns`.
pub fn link_mac(ns: &str, ifname: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-br", "link", "show", "dev", ifname])
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    // `NAME@PEER STATE MAC <FLAGS>`
    text.split_whitespace()
        .nth(2)
        .filter(|mac| out.status.success() && mac.len() == 17)
        .unwrap_or_else(|| {
            panic!(
                "no MAC for {ifname} in {ns}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string()
}

/// Attaches the XDP program in section `section` of object file `obj` to
/// device `ifname` of namespace `ns` the legacy way (netlink, in generic
/// mode): an attachment that outlives the process that made it, as a
/// crashed program on a kernel without XDP links leaves behind.
pub fn attach_xdp_legacy(ns: &str, ifname: &str, obj: &str, section: &str) {
    sh(&[
        "ip",
        "-n",
        ns,
        "link",
        "set",
        "dev",
        ifname,
        "xdpgeneric",
        "obj",
        obj,
        "sec",
        section,
    ]);
}

/// The XDP program attached to device `ifname` of namespace `ns`, as
/// `ip -d link` describes it (`prog/xdp id N name NAME ...`), if any.
pub fn xdp_program(ns: &str, ifname: &str) -> Option<String> {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", ifname])
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip: {e}"));
    assert!(
        out.status.success(),
        "ip -n {ns} -d link show dev {ifname}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("prog/xdp"))
        .map(|l| l.trim().to_string())
}

impl Drop for NetNsGuard {
    fn drop(&mut self) {
        delete_netns(&self.name);
    }
}

/// Ends every process in namespace `name` (SIGTERM, then SIGKILL after 2 s)
/// and deletes it; a namespace that does not exist is not an error.
pub fn delete_netns(name: &str) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let path = path_of(name);
    if std::fs::symlink_metadata(&path).is_err() {
        return;
    }
    let pids = crate::procfs::pids_in_netns(&[&path]);
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| crate::procfs::alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in crate::procfs::pids_in_netns(&[&path]) {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    let _ = Command::new("ip").args(["netns", "del", name]).status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_removes_its_namespace_and_the_processes_inside() {
        if !root_or_skip("guard_removes_its_namespace_and_the_processes_inside") {
            return;
        }
        let g = NetNsGuard::new("oskt");
        let path = path_of(g.name());
        assert!(path.exists());
        let child = g.command("sleep").arg("30").spawn().unwrap();
        let mut child = crate::child::ChildGuard::new(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while crate::procfs::pids_in_netns(&[&path]).is_empty() {
            assert!(Instant::now() < deadline, "sleep never appeared in the namespace");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The thread sees the namespace (/proc/net is the process leader's
        // view, thread-self the thread's): only lo exists there.
        let ifaces = g.run(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap());
        assert_eq!(ifaces.lines().skip(2).count(), 1, "{ifaces}");
        drop(g);
        assert!(!path.exists());
        assert!(!child.child().wait().unwrap().success());
    }

    #[test]
    fn a_thread_with_the_namespaces_sysfs_sees_its_devices_and_leaves_the_callers_alone() {
        if !root_or_skip("a_thread_with_the_namespaces_sysfs_sees_its_devices_and_leaves_the_callers_alone") {
            return;
        }
        let (a, b) = (NetNsGuard::new("oskfa"), NetNsGuard::new("oskfb"));
        veth_pair(VethEnd::new(a.name(), "sfa"), VethEnd::new(b.name(), "sfb"));
        let list = || {
            let mut v: Vec<String> = std::fs::read_dir("/sys/class/net")
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        let ours = list();
        let ns = a.open().unwrap();
        assert_eq!(ns.run_with_sysfs(list).unwrap(), ["lo", "sfa"]);
        // A thread that only entered the namespace still sees the caller's
        // sysfs: why run_with_sysfs mounts its own.
        assert_eq!(ns.run(list).unwrap(), ours);
        // What the thread wrote lands on the namespace's device.
        let mtu = "/sys/class/net/sfa/mtu";
        ns.run_with_sysfs(|| std::fs::write(mtu, "1400")).unwrap().unwrap();
        let out = a.command("cat").arg(mtu).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1400");
        // The mount went with the thread: the caller's /sys is as it was.
        assert_eq!(list(), ours);
    }

    #[test]
    fn a_veth_pair_carries_datagrams_between_two_namespaces() {
        if !root_or_skip("a_veth_pair_carries_datagrams_between_two_namespaces") {
            return;
        }
        let (a, b) = (NetNsGuard::new("oskva"), NetNsGuard::new("oskvb"));
        let end_a = VethEnd::new(a.name(), "va")
            .mac("02:52:46:00:0e:01")
            .addr("10.209.0.1/24");
        let end_b = VethEnd::new(b.name(), "vb").addr("10.209.0.2/24");
        veth_pair(end_a, end_b);
        static_neighbours(end_a, end_b);
        assert_eq!(link_mac(a.name(), "va"), "02:52:46:00:0e:01");
        // A command in the namespace sees its devices, /sys included.
        let out = b.command("cat").arg("/sys/class/net/vb/address").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), link_mac(b.name(), "vb"));
        let neigh = Command::new("ip")
            .args(["-n", b.name(), "neigh", "show", "dev", "vb"])
            .output()
            .unwrap();
        let neigh = String::from_utf8_lossy(&neigh.stdout);
        assert!(
            neigh.contains("10.209.0.1 lladdr 02:52:46:00:0e:01 PERMANENT"),
            "{neigh}"
        );
        // A datagram from a reaches b over the pair.
        let rx = b.run(|| std::net::UdpSocket::bind("10.209.0.2:0").unwrap());
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let to = rx.local_addr().unwrap();
        a.run(|| {
            let tx = std::net::UdpSocket::bind("10.209.0.1:0").unwrap();
            tx.send_to(b"over the veth", to).unwrap();
        });
        let mut buf = [0u8; 32];
        let (n, from) = rx.recv_from(&mut buf).expect("the datagram crossed the pair");
        assert_eq!(&buf[..n], b"over the veth");
        assert_eq!(from.ip(), std::net::IpAddr::from([10, 209, 0, 1]));
    }
}
