#!/usr/bin/env python3
"""Per-datagram stages of the reflector from two callgrind runs (N and 2N
datagrams) and two strace -c summaries; called by reflector_stages.sh.

Every figure is (count at 2N - count at N) / N. A stage is the inclusive
instruction count of the functions that do it (the first pattern that matches
a function, in STAGES order, claims it; a function called from another
stage's function is counted there only once, by taking inclusive costs of
the outermost match). "other" is the event loop's per-datagram cost that no
stage function claims (the loop itself, counters, the tag zeroing, epoll)."""

import argparse
import re
import sys

# (stage, regular expression on the demangled function name). The names are
# those of both the current reflector and older ones (the stage is the same
# work whatever the function is called).
STAGES = [
    ("receive (recvmmsg, epoll)", r"sendpath::sys::RecvBatch::(recv|get|get_mut|slot)\b|nix::sys::epoll::Epoll::wait\b|\brecvmmsg\b|\bepoll_wait\b"),
    ("tag check (SipHash)", r"SessionKeys::verify_tag\b|SessionKeys::tag\b|\bsiphasher::"),
    ("membership + auth", r"reflector(_server)?::membership::Group::handle\b|reflector(_server)?::membership::Group::decide\b|reflector(_server)?::membership::Group::member_datagram\b"),
    ("fan-out (sendmmsg/sendto)", r"as reflector(_server)?::backend::Fanout>::fanout\b|reflector(_server)?::backend::UserFanout::fanout\b|\bsendmmsg\b|\bsendto\b"),
]
# The whole per-datagram path in user space.
LOOP = r"reflector(_server)?::server::Loop::run\b|reflector(_server)?::server::event_loop\b"


def callgrind(path):
    """Self cost per function, and call costs per (caller, callee), from a
    callgrind output file (one event: Ir)."""
    names, self_cost, calls = {}, {}, {}
    fn = callee = None
    pending = False
    total = 0

    def name(spec):
        # "(id) name" defines an id, "(id)" refers to it.
        spec = spec.strip()
        if spec.startswith("("):
            i = spec.index(")")
            ident, rest = spec[1:i], spec[i + 1 :].strip()
            if rest:
                names[ident] = rest
            return names.get(ident, ident)
        return spec

    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                fn = re.sub(r"::h[0-9a-f]{16}$", "", name(line[3:]))
            elif line.startswith("cfn="):
                callee = re.sub(r"::h[0-9a-f]{16}$", "", name(line[4:]))
            elif line.startswith("calls="):
                pending = True
                continue
            elif line.startswith("summary:") or line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
            elif line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) < 2 or fn is None:
                    continue
                cost = int(parts[1])
                if pending and callee is not None:
                    if callee != fn:
                        calls[(fn, callee)] = calls.get((fn, callee), 0) + cost
                    callee, pending = None, False
                else:
                    self_cost[fn] = self_cost.get(fn, 0) + cost
    return self_cost, calls, total


def inclusive(self_cost, calls):
    incl = dict(self_cost)
    for (caller, _), c in calls.items():
        incl[caller] = incl.get(caller, 0) + c
    return incl


def strace_counts(path):
    """syscall -> calls from an strace -c summary."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                # % time, seconds, usecs/call, calls, [errors], syscall
                if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                    try:
                        calls = int(parts[3])
                    except ValueError:
                        continue
                    out[parts[-1]] = out.get(parts[-1], 0) + calls
    except FileNotFoundError:
        pass
    return out


def stage_of(fn):
    for name, pat in STAGES:
        if re.search(pat, fn):
            return name
    return None


def per_datagram(a, b, n):
    return {k: (b.get(k, 0) - a.get(k, 0)) / n for k in set(a) | set(b)}


def stage_costs(calls):
    """Instructions per stage: the calls that enter a stage's functions from
    outside it, less the calls from inside it into another stage (a tag
    check inside the membership decision counts as tag check only)."""
    out = {name: 0 for name, _ in STAGES}
    for (caller, callee), c in calls.items():
        s, t = stage_of(callee), stage_of(caller)
        if s and s != t:
            out[s] += c
            if t:
                out[t] -= c
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--datagrams", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("cells", nargs="+", help="impl receivers callgrind_N callgrind_2N strace_N strace_2N, repeated")
    a = ap.parse_args()
    if len(a.cells) % 6:
        sys.exit("reflector_stages.py: cells come in sixes")
    n = a.datagrams
    print(f"# Reflector cost per DATA datagram ({a.size} B, one sender), build {a.label}")
    print("# Method: reflector-bench drives the release reflector under valgrind --tool=callgrind, then")
    print(f"# under strace -f -c; each cell runs with {n} and {2 * n} measured datagrams and every figure is")
    print(f"# (count at {2 * n} - count at {n}) / {n}. Instructions are user space only: a stage is what the")
    print("# calls into its functions cost, inclusive (bench/reflector_stages.py names them); the kernel's")
    print("# share shows as syscalls per datagram (clock_nanosleep there is the main thread waiting for")
    print("# the end of the run, not the event loop).")
    for i in range(0, len(a.cells), 6):
        imp, r, cg1, cg2, st1, st2 = a.cells[i : i + 6]
        (self1, calls1, t1), (self2, calls2, t2) = callgrind(cg1), callgrind(cg2)
        total = (t2 - t1) / n
        incl = per_datagram(inclusive(self1, calls1), inclusive(self2, calls2), n)
        self_ = per_datagram(self1, self2, n)
        loop = max((v for k, v in incl.items() if re.search(LOOP, k)), default=0.0)
        st = per_datagram(stage_costs(calls1), stage_costs(calls2), n)
        print()
        print(f"## {imp}, {r} receivers: {total:,.0f} instructions per datagram in the whole process, "
              f"{loop:,.0f} of them in the event loop")
        print(f"{'stage':<34} {'Ir/datagram':>12} {'share':>7}")
        for s, _ in STAGES:
            v = st.get(s, 0.0)
            print(f"{s:<34} {v:>12,.0f} {v / loop * 100 if loop else 0:>6.1f}%")
        other = loop - sum(st.values())
        print(f"{'other (loop, counters, hand-off)':<34} {other:>12,.0f} {other / loop * 100 if loop else 0:>6.1f}%")
        print("functions with the most self cost per datagram:")
        for fn, v in sorted(self_.items(), key=lambda kv: -kv[1])[:14]:
            if v < 1:
                break
            print(f"  {v:>9,.1f}  {fn[:110]}")
        sc1, sc2 = strace_counts(st1), strace_counts(st2)
        if sc1 or sc2:
            sc = per_datagram(sc1, sc2, n)
            tot = sum(sc.values())
            calls = ", ".join(f"{k} {v:.3f}" for k, v in sorted(sc.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.0005)
            print(f"syscalls per datagram: {tot:.3f} ({calls})")


if __name__ == "__main__":
    main()
