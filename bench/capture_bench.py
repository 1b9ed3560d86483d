#!/usr/bin/env python3
"""Capture benchmark (paper 002 on veth): captured fraction and CPU per
captured packet against offered packet rate for each capture mode, with
tcpdump (default and --immediate-mode) and netsniff-ng measured in the same
run as anchors; the packzip effect; CPU placement; concurrent captures.

The lab is netlab's `pair` (hosts h1 and h2 on one veth link), owned by a
`netlab run` of this script's own and taken down on every way out. Traffic:
`capture gen --via txring` sends 64-byte broadcast UDP frames from h1 into
h2, where the capture runs. IPv6 is off in netlab's namespaces and their
neighbours are permanent (no ARP), so every frame on the link is ours and no
filter is needed. All tools get the same ring/buffer size (2 MiB, the
tcpdump default) and write pcap to /dev/null. Every process starts through
`netlab exec` (pinned with `--cpus`), which replaces itself with the command:
CPU is the capture process' user+system time from wait4() (netlab's own
start-up included); the kernel's softirq work for the veth runs on the
sender's CPU and is the same for every tool.

The `mirror` experiment feeds a monitor port instead: `netlab monitor h2`
gives h2 a second veth pair whose receiving end (mon0) gets a copy, by tc
mirred, of every frame h2's link interface receives and sends (it sends
none here), and each tool (the xdp mode included, which takes the port's
frames away from its stack) captures on mon0, at the same rates.

Usage: capture_bench.py CAPTURE_BIN NETLAB_BIN OUTDIR [--quick]
"""
import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

if len(sys.argv) < 4:
    sys.exit(__doc__.strip().splitlines()[-1])
BIN = os.path.abspath(sys.argv[1])
NETLAB = os.path.abspath(sys.argv[2])
OUT = sys.argv[3]
QUICK = "--quick" in sys.argv
GEN_HOST, CAP_HOST = "h1", "h2"
LINK_IF = "eth0"  # each host's device on its first (here only) link
MON_PORT = "mon0"
DUR = 1.0 if QUICK else 2.0
NCPU = os.cpu_count() or 1
GEN_CPU, CAP_CPU = 0, (1 if NCPU > 1 else 0)
# Processes started in the lab and not yet reaped: killed on the way out.
LIVE = set()
# How long the lab may stay up: longer than the full sweep takes.
LAB_LIFETIME_S = 6 * 3600


class Lab:
    """Our netlab lab: the `netlab run` process that owns it, its run id and
    the hosts' addresses."""
    owner = None
    run = None
    addr = {}
    log = []


def sh(*args, check=True):
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def netlab(*args, check=True):
    return sh(NETLAB, *args, check=check)


def up():
    """Brings the pair up, owned by a `netlab run` whose only command waits
    in h1 for this script to end. A lab owned by a live process is left alone
    by other people's `netlab clean` and `netlab down --all` (a lab left up
    by `netlab up` is not), and it goes away without us: on Ctrl-C `netlab
    run` removes it itself, and if this script is killed (-9) the command
    ends and the run removes the lab."""
    scenario = (
        f'name = "capture bench, pid {os.getpid()}"\n'
        '[topology]\nkind = "pair"\n'
        '[[command]]\nhost = "h1"\n'
        # tail --pid polls once a second and forks nothing meanwhile.
        f'cmd = "exec tail -f /dev/null --pid={os.getpid()}"\n'
        f'timeout = "{LAB_LIFETIME_S}s"\n'
    )
    with tempfile.NamedTemporaryFile("w", prefix="capture-bench-", suffix=".toml") as sc:
        sc.write(scenario)
        sc.flush()
        Lab.owner = subprocess.Popen([NETLAB, "run", sc.name, "-q"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        # The run prints its summary (run id, addresses) to stderr once the lab is up;
        # a thread keeps reading so that later output cannot block it.
        threading.Thread(target=lambda: Lab.log.extend(Lab.owner.stderr), daemon=True).start()
        deadline = time.monotonic() + 120
        while True:
            text = "".join(Lab.log)
            m = re.search(r"^netlab: run (\S+) up", text, re.M)
            addr = dict(re.findall(r"^\s+(h\d+)\s+(\d+\.\d+\.\d+\.\d+)\s*$", text, re.M))
            if m and set(addr) == {GEN_HOST, CAP_HOST}:
                Lab.run, Lab.addr = m.group(1), addr
                return
            if Lab.owner.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"netlab run did not bring the lab up (exit {Lab.owner.poll()}):\n{text}")
            time.sleep(0.05)


def down():
    """Stops what still runs in the lab, then has its owner take it down."""
    for p in list(LIVE):
        if p.poll() is None:
            p.kill()
        p.wait()
        LIVE.discard(p)
    if Lab.owner:
        if Lab.owner.poll() is None:
            Lab.owner.send_signal(signal.SIGTERM)  # the run removes the lab, then exits
        try:
            Lab.owner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            Lab.owner.kill()
            Lab.owner.wait()
            raise RuntimeError(f"netlab run did not take lab {Lab.run} down within 60 s")
        Lab.owner = None
        Lab.run = None


def monitor(on):
    """Gives h2 its monitor port (or takes it away)."""
    if on:
        netlab("monitor", "--run", Lab.run, CAP_HOST, "--name", MON_PORT)
    else:
        netlab("monitor", "--run", Lab.run, CAP_HOST, "--name", MON_PORT, "--remove", check=False)


def in_host(host, cpu, argv):
    """`argv` run inside `host`, pinned to `cpu` unless it is None."""
    pin = ["--cpus", str(cpu)] if cpu is not None else []
    return [NETLAB, "exec", "--run", Lab.run, *pin, host, "--", *argv]


def tool_argv(tool, extra=(), iface=None):
    """Command line of a capture tool, writing to /dev/null."""
    iface = iface or LINK_IF
    if tool.startswith("capture-"):
        mode = tool.split("-", 1)[1]
        return [BIN, "-i", iface, "--mode", mode, "-B", "2048", "-w", "/dev/null", *extra]
    if tool == "tcpdump":
        return ["tcpdump", "-i", iface, "-n", "-B", "2048", "-w", "/dev/null"]
    if tool == "tcpdump-immediate":
        return ["tcpdump", "-i", iface, "-n", "-B", "2048", "--immediate-mode", "-w", "/dev/null"]
    if tool == "netsniff-ng":
        return ["netsniff-ng", "--in", iface, "--out", "/dev/null", "--silent", "-S", "2MiB"]
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
    """Starts a capture tool in h2, pinned to `cpu` unless it is None."""
    argv = tool_argv(tool, extra, iface)
    p = subprocess.Popen(in_host(CAP_HOST, cpu, argv), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    LIVE.add(p)
    p.program = os.path.basename(argv[0])
    return p


def wait_exec(p, tool, timeout=10.0):
    """Waits until `netlab exec` has become the tool itself (netlab, the
    namespace entry and the CPU pinning each exec the next), so that the
    SIGINT meant for the tool is not taken by one of them."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{p.pid}/comm") as f:
                comm = f.read().strip()
        except FileNotFoundError:
            comm = None
        if comm == p.program[:15]:  # the kernel keeps 15 bytes of a name
            return
        if p.poll() is not None or time.monotonic() > deadline:
            out = p.stdout.read() if p.poll() is not None else ""
            raise RuntimeError(f"{tool} did not start in {CAP_HOST} within {timeout}s "
                               f"(process is {comm!r}, exit {p.returncode}):\n{out}")
        time.sleep(0.02)


def gen(rate, cpu):
    argv = [BIN, "gen", "-i", LINK_IF, "--via", "txring",
            "--src", f"{Lab.addr[GEN_HOST]}:4000", "--dst", f"{Lab.addr[CAP_HOST]}:5000",
            "--size", "64", "--rate", str(rate), "--duration", str(DUR), "--csv"]
    out = sh(*in_host(GEN_HOST, cpu, argv)).stdout.strip().splitlines()[-1].split(",")
    return int(out[0]), float(out[2])


def stop(p, tool, timeout=10.0):
    """Stops a tool with SIGINT (it prints its statistics then) and reaps it;
    one that has not exited after `timeout` seconds is killed, an error."""
    p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        except ChildProcessError:
            LIVE.discard(p)
            raise RuntimeError(f"{tool} vanished")
        if pid:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{tool} did not exit within {timeout}s of SIGINT")
        time.sleep(0.01)
    LIVE.discard(p)
    p.returncode = os.waitstatus_to_exitcode(status)
    text = p.stdout.read()
    cap, drops = parse(tool, text)
    return cap, drops, ru.ru_utime + ru.ru_stime


def run_point(tools, rate, cap_cpu=CAP_CPU, gen_cpu=GEN_CPU, extra=(), iface=None):
    """Starts `tools` at once, offers `rate`, returns sent, pps, [(tool, cap, drops, cpu)]."""
    procs = [(t, start(t, cap_cpu, extra, iface)) for t in tools]
    for t, p in procs:
        wait_exec(p, t)
    # Each tool prints its banner before it is ready; rings of 2 MiB map in
    # well under this time (netsniff-ng prints nothing to wait for).
    time.sleep(0.8)
    sent, pps = gen(rate, gen_cpu)
    time.sleep(0.3)  # let the readers drain their rings
    res = [(t,) + stop(p, t) for t, p in procs]
    return sent, pps, res


def main():
    os.makedirs(OUT, exist_ok=True)
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
        up()
        tools = ["tcpdump", "tcpdump-immediate", "netsniff-ng", "capture-recv", "capture-v2", "capture-v3"]
        rates = [100_000, 300_000, 0] if QUICK else [50_000, 100_000, 200_000, 300_000, 0]
        print("== offered rate sweep (capture pinned to cpu %d, generator to cpu %d)" % (CAP_CPU, GEN_CPU))
        for rate in rates:
            for t in tools:
                sent, pps, res = run_point([t], rate)
                for tool, cap, drops, cpu in res:
                    record("rate", tool, rate or "max", sent, pps, cap, drops, cpu)

        print("== mirror port: every tool on netlab's monitor port, fed by tc mirred (the xdp mode needs one)")
        monitor(True)
        try:
            for rate in rates:
                for t in ["tcpdump", "tcpdump-immediate", "capture-recv", "capture-v2", "capture-v3",
                          "capture-xdp"]:
                    sent, pps, res = run_point([t], rate, iface=MON_PORT)
                    for tool, cap, drops, cpu in res:
                        record("mirror", tool, rate or "max", sent, pps, cap, drops, cpu)
        finally:
            monitor(False)

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
        down()

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
    # SIGTERM unwinds like an error, so that main() takes the lab down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        main()
    except KeyboardInterrupt:
        print("capture_bench: interrupted; lab taken down", file=sys.stderr)
        sys.exit(130)
