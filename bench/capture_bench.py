#!/usr/bin/env python3
"""Capture benchmark (paper 002 on veth): captured fraction and CPU per
captured packet against offered packet rate for each capture mode, with
tcpdump (default and --immediate-mode) and netsniff-ng measured in the same
run as anchors; the packzip effect; CPU placement; concurrent captures.

Traffic: `capture gen --via txring` sends 64-byte broadcast UDP frames from
namespace A over a veth pair into namespace B, where the capture runs. IPv6
is off and nothing else talks on the link, so every frame on it is ours and
no filter is needed. All tools get the same ring/buffer size (2 MiB, the
tcpdump default) and write pcap to /dev/null. CPU is the capture process'
user+system time from wait4(); the kernel's softirq work for the veth runs
on the sender's CPU and is the same for every tool.

The `mirror` experiment feeds a monitor port instead: `tc ... mirred egress
mirror` copies every frame B's interface receives to a second veth pair in B,
and each tool (the xdp mode included, which takes the port's frames away from
its stack) captures on that pair's receiving end, at the same rates.

Usage: capture_bench.py BIN OUTDIR [--quick]
"""
import csv
import os
import re
import signal
import subprocess
import sys
import time

BIN = os.path.abspath(sys.argv[1])
OUT = sys.argv[2]
QUICK = "--quick" in sys.argv
PID = os.getpid()
NS_A, NS_B = f"capbench-{PID}-a", f"capbench-{PID}-b"
IF_A, IF_B = f"cbA{PID % 100000}", f"cbB{PID % 100000}"
# The monitor pair in B: frames mirrored to MON_TX arrive on MON_RX.
MON_TX, MON_RX = f"cbT{PID % 100000}", f"cbM{PID % 100000}"
DUR = 1.0 if QUICK else 2.0
NCPU = os.cpu_count() or 1
GEN_CPU, CAP_CPU = 0, (1 if NCPU > 1 else 0)


def sh(*args, check=True):
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


def cleanup_stale():
    """Removes namespaces a crashed earlier run left behind."""
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("capbench-"):
            sh("ip", "netns", "del", name, check=False)


def setup():
    sh("ip", "netns", "add", NS_A)
    sh("ip", "netns", "add", NS_B)
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "exec", ns, "sysctl", "-qw",
           "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    sh("ip", "-n", NS_A, "link", "add", IF_A, "type", "veth", "peer", "name", IF_B, "netns", NS_B)
    sh("ip", "-n", NS_A, "addr", "add", "10.199.0.1/24", "dev", IF_A)
    sh("ip", "-n", NS_B, "addr", "add", "10.199.0.2/24", "dev", IF_B)
    sh("ip", "-n", NS_A, "link", "set", IF_A, "up")
    sh("ip", "-n", NS_B, "link", "set", IF_B, "up")
    sh("ip", "-n", NS_B, "link", "add", MON_TX, "type", "veth", "peer", "name", MON_RX)
    sh("ip", "-n", NS_B, "link", "set", MON_TX, "up")
    sh("ip", "-n", NS_B, "link", "set", MON_RX, "up")


def mirror(on):
    """Mirrors what B's interface receives to the monitor port (or stops)."""
    if on:
        sh("ip", "netns", "exec", NS_B, "tc", "qdisc", "add", "dev", IF_B, "clsact")
        sh("ip", "netns", "exec", NS_B, "tc", "filter", "add", "dev", IF_B, "ingress", "u32", "match",
           "u32", "0", "0", "action", "mirred", "egress", "mirror", "dev", MON_TX)
    else:
        sh("ip", "netns", "exec", NS_B, "tc", "qdisc", "del", "dev", IF_B, "clsact", check=False)


def teardown():
    for ns in (NS_A, NS_B):
        sh("ip", "netns", "del", ns, check=False)


def pinned(cpu, argv):
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + argv


def tool_argv(tool, extra=(), iface=None):
    """Command line of a capture tool in namespace B, writing to /dev/null."""
    ns = ["ip", "netns", "exec", NS_B]
    iface = iface or IF_B
    if tool.startswith("capture-"):
        mode = tool.split("-", 1)[1]
        return ns + [BIN, "-i", iface, "--mode", mode, "-B", "2048", "-w", "/dev/null", *extra]
    if tool == "tcpdump":
        return ns + ["tcpdump", "-i", iface, "-n", "-B", "2048", "-w", "/dev/null"]
    if tool == "tcpdump-immediate":
        return ns + ["tcpdump", "-i", iface, "-n", "-B", "2048", "--immediate-mode", "-w", "/dev/null"]
    if tool == "netsniff-ng":
        return ns + ["netsniff-ng", "--in", iface, "--out", "/dev/null", "--silent", "-S", "2MiB"]
    raise ValueError(tool)


def parse(tool, text):
    """(captured, kernel drops) from a tool's final statistics."""
    def num(pat):
        m = re.findall(pat, text)
        if not m:
            raise RuntimeError(f"{tool}: no match for {pat!r} in output:\n{text}")
        return int(m[-1])
    if tool.startswith("capture-"):
        return num(r"total: captured (\d+) packets"), num(r"accepted by filter, (\d+) dropped")
    if tool.startswith("tcpdump"):
        return num(r"(\d+) packets captured"), num(r"(\d+) packets dropped by kernel")
    return num(r"(\d+)\s+packets passed filter"), num(r"(\d+)\s+packets failed filter")


def start(tool, cpu, extra=(), iface=None):
    p = subprocess.Popen(pinned(cpu, tool_argv(tool, extra, iface)), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    return p


def gen(rate, cpu):
    argv = pinned(cpu, ["ip", "netns", "exec", NS_A, BIN, "gen", "-i", IF_A, "--via", "txring",
                        "--src", "10.199.0.1:4000", "--dst", "10.199.0.2:5000", "--size", "64",
                        "--rate", str(rate), "--duration", str(DUR), "--csv"])
    out = sh(*argv).stdout.strip().splitlines()[-1].split(",")
    return int(out[0]), float(out[2])


def stop(p, tool):
    p.send_signal(signal.SIGINT)
    try:
        _, status, ru = os.wait4(p.pid, 0)
    except ChildProcessError:
        raise RuntimeError(f"{tool} vanished")
    p.returncode = os.waitstatus_to_exitcode(status)
    text = p.stdout.read()
    cap, drops = parse(tool, text)
    return cap, drops, ru.ru_utime + ru.ru_stime


def run_point(tools, rate, cap_cpu=CAP_CPU, gen_cpu=GEN_CPU, extra=(), iface=None):
    """Starts `tools` at once, offers `rate`, returns sent, pps, [(tool, cap, drops, cpu)]."""
    procs = [(t, start(t, cap_cpu, extra, iface)) for t in tools]
    # Each tool prints its banner before it is ready; rings of 2 MiB map in
    # well under this time (netsniff-ng prints nothing to wait for).
    time.sleep(0.8)
    sent, pps = gen(rate, gen_cpu)
    time.sleep(0.3)  # let the readers drain their rings
    res = [(t,) + stop(p, t) for t, p in procs]
    return sent, pps, res


def main():
    os.makedirs(OUT, exist_ok=True)
    cleanup_stale()
    setup()
    rows = []

    def record(exp, tool, param, sent, pps, cap, drops, cpu, nproc=1):
        frac = cap / sent if sent else 0.0
        rows.append(dict(experiment=exp, tool=tool, param=param, offered_pps=round(pps),
                         sent=sent, captured=cap, kernel_drops=drops,
                         captured_frac=round(frac, 5), cpu_s=round(cpu, 4),
                         cpu_ns_per_pkt=round(cpu * 1e9 / cap, 1) if cap else "", procs=nproc))
        print(f"  {exp:7} {tool:18} {str(param):>9} offered {pps:9.0f} pps: captured {frac*100:6.2f}% "
              f"({drops} kernel drops), cpu {cpu:.3f}s", flush=True)

    try:
        tools = ["tcpdump", "tcpdump-immediate", "netsniff-ng", "capture-recv", "capture-v2", "capture-v3"]
        rates = [100_000, 300_000, 0] if QUICK else [50_000, 100_000, 200_000, 300_000, 0]
        print("== offered rate sweep (capture pinned to cpu %d, generator to cpu %d)" % (CAP_CPU, GEN_CPU))
        for rate in rates:
            for t in tools:
                sent, pps, res = run_point([t], rate)
                for tool, cap, drops, cpu in res:
                    record("rate", tool, rate or "max", sent, pps, cap, drops, cpu)

        print("== mirror port: every tool on a monitor veth fed by tc mirred (the xdp mode needs one)")
        mirror(True)
        try:
            for rate in rates:
                for t in ["tcpdump", "tcpdump-immediate", "capture-recv", "capture-v2", "capture-v3",
                          "capture-xdp"]:
                    sent, pps, res = run_point([t], rate, iface=MON_RX)
                    for tool, cap, drops, cpu in res:
                        record("mirror", tool, rate or "max", sent, pps, cap, drops, cpu)
        finally:
            mirror(False)

        print("== packzip: zlib level vs loss at the highest offered rate")
        levels = [0, 1, 5, 9] if QUICK else list(range(10))
        for mode in ["recv", "v2", "v3"]:
            for lvl in ["none"] + levels:
                extra = () if lvl == "none" else ("--compress", f"zlib:{lvl}")
                sent, pps, res = run_point([f"capture-{mode}"], 0, extra=extra)
                for tool, cap, drops, cpu in res:
                    record("packzip", tool, lvl, sent, pps, cap, drops, cpu)

        print("== scheduling (paper fig. 5): capture and traffic on the same core, different cores, scheduler")
        placements = [("same", GEN_CPU, GEN_CPU), ("different", CAP_CPU, GEN_CPU), ("scheduler", None, None)]
        for name, ccpu, gcpu in placements:
            for t in ["tcpdump", "capture-v2", "capture-v3"]:
                sent, pps, res = run_point([t], 200_000, cap_cpu=ccpu, gen_cpu=gcpu)
                for tool, cap, drops, cpu in res:
                    record("sched", tool, name, sent, pps, cap, drops, cpu)

        print("== concurrent capture processes (paper fig. 9)")
        for t in ["tcpdump", "capture-v2", "capture-v3"]:
            for k in [1, 2, 3]:
                sent, pps, res = run_point([t] * k, 200_000, cap_cpu=None, gen_cpu=GEN_CPU)
                cap = sum(r[1] for r in res) / k
                drops = sum(r[2] for r in res) / k
                cpu = sum(r[3] for r in res)
                record("multi", t, k, sent, pps, round(cap), round(drops), cpu / k, nproc=k)
    finally:
        teardown()

    path = os.path.join(OUT, "capture_runs.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    # Ratios against the anchor (tcpdump default) measured in the same run,
    # on the same interface (the mirror port's rows against tcpdump there).
    summary = []
    for exp, suffix in (("rate", ""), ("mirror", "@mirror")):
        for r in rows:
            if r["experiment"] != exp:
                continue
            anchor = next(a for a in rows if a["experiment"] == exp and a["tool"] == "tcpdump"
                          and a["param"] == r["param"])
            loss = 1 - r["captured_frac"]
            aloss = 1 - anchor["captured_frac"]
            summary.append(dict(
                tool=r["tool"] + suffix, offered=r["param"], offered_pps=r["offered_pps"],
                captured_frac=r["captured_frac"], tcpdump_captured_frac=anchor["captured_frac"],
                loss_vs_tcpdump=(round(loss / aloss, 3) if aloss > 0 else ("0/0" if loss == 0 else "inf")),
                cpu_per_pkt_vs_tcpdump=(round(r["cpu_ns_per_pkt"] / anchor["cpu_ns_per_pkt"], 3)
                                        if r["cpu_ns_per_pkt"] and anchor["cpu_ns_per_pkt"] else "")))
    spath = os.path.join(OUT, "capture_summary.csv")
    with open(spath, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        w.writeheader()
        w.writerows(summary)
    print(f"wrote {path} and {spath}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
