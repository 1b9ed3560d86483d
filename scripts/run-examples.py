#!/usr/bin/env python3
"""Runs every example the project shows a user, as written: the ```sh and
```bash blocks of the READMEs, and the "Example(s)" / "Typical set-up"
sections of every binary's --help (read from the binaries themselves, every
subcommand's too, so a new example is covered without editing this file).

How each runs is in scripts/examples.toml (committed): where (in a scratch
directory on loopback, or inside host h1 of a netlab `pair` lab whose h2 is
10.0.0.2), how (a README block as one bash script; a help section line by
line, each line a "terminal": a line still running after its wait is a
server and stays up for the next lines, or is stopped, as the section says),
and which examples are skipped, each with its reason. A block that is a
template (placeholders to fill) is fenced as ```text in its README, not
skipped here.

Usage: scripts/run-examples.py [--bin-dir target/debug] [--only SUBSTRING]
Exit status: 0 all ran, 1 an example failed, 2 bad usage or set-up."""

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# "Examples:", "Example: CMD", "Example (a note): CMD", "Typical set-up ...:";
# the first colon ends the head (a URL in CMD has more).
SECTION_HEAD = re.compile(r"^(Examples?|Typical set-up)\b[^:]*:(?:\s+(.*))?$")


def readme_blocks():
    """(key, file, first line number, text) of every sh/bash block."""
    files = [ROOT / "README.md"] + sorted(ROOT.glob("crates/*/README.md"))
    for f in files:
        lines = f.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(sh|bash)\s*$", lines[i])
            if not m:
                i += 1
                continue
            start = i + 1
            j = start
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            body = "\n".join(lines[start:j])
            first = next((l for l in lines[start:j] if l.strip()), "")
            yield f"{f.relative_to(ROOT)}: {first.strip()}", f.relative_to(ROOT), start, body
            i = j + 1


def strip_comment(line):
    """An example line without its explanation: a trailing `# ...`, a
    `(...)` note, or text after three or more spaces."""
    line = line.strip()
    line = re.split(r"\s{3,}", line)[0]
    line = re.sub(r"\s+#\s.*$", "", line)
    line = re.sub(r"\s+\([^)]*\)$", "", line)
    return line.strip()


def help_text(bin_dir, argv):
    p = subprocess.run([str(bin_dir / argv[0]), *argv[1:], "--help"], capture_output=True, text=True, timeout=30)
    return p.stdout


def subcommands(text):
    out, on = [], False
    for line in text.splitlines():
        if line.startswith("Commands:"):
            on = True
            continue
        if on:
            m = re.match(r"^  (\S+)\s", line)
            if not m:
                if line.strip() == "" or not line.startswith(" "):
                    on = False
                continue
            if m.group(1) != "help":
                out.append(m.group(1))
    return out


def help_sections(bin_dir, binaries):
    """(key, argv, lines) of every example section of every (sub)command."""
    seen = set()
    todo = [[b] for b in binaries]
    while todo:
        argv = todo.pop(0)
        text = help_text(bin_dir, argv)
        if len(argv) < 3:
            todo.extend(argv + [s] for s in subcommands(text))
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            m = SECTION_HEAD.match(lines[i])
            if not m:
                i += 1
                continue
            cmds = []
            if (m.group(2) or "").strip():
                cmds.append(strip_comment(m.group(2)))
            i += 1
            while i < len(lines) and lines[i].strip() and (lines[i].startswith(" ") or m.group(1) != "Typical set-up"):
                if SECTION_HEAD.match(lines[i]) or lines[i].startswith("Usage:"):
                    break
                cmds.append(strip_comment(lines[i]))
                i += 1
            key = f"help: {' '.join(argv)}: {cmds[0] if cmds else ''}"
            if cmds and key not in seen:
                seen.add(key)
                yield key, argv, [c for c in cmds if c]


class Lab:
    """A netlab `pair` lab for the examples that need an interface."""

    def __init__(self, bin_dir):
        self.netlab = str(bin_dir / "netlab")
        p = subprocess.run([self.netlab, "up", "pair", "-q"], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"netlab up pair failed: {p.stdout}{p.stderr}")
        m = re.search(r"run (\S+)", p.stdout + p.stderr)
        if not m:
            raise RuntimeError(f"no run id in: {p.stdout}")
        self.run = m.group(1).rstrip(":")

    def wrap(self, script):
        return [self.netlab, "exec", "--run", self.run, "h1", "--", "bash", "-c", script]

    def down(self):
        subprocess.run([self.netlab, "down", "--run", self.run], capture_output=True, timeout=120)


def prelude(bin_dir):
    # `sudo` as written in the examples: the runner is root already.
    # `cargo run` in a scratch directory builds into the repository's target.
    target = shlex.quote(str(ROOT / "target"))
    return (
        f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"; export CARGO_TARGET_DIR="${{CARGO_TARGET_DIR:-{target}}}"; '
        'sudo() { "$@"; }; export -f sudo 2>/dev/null; '
    )


def stop_group(p):
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def run_script(argv, cwd, limit):
    """Runs a whole block; it must exit 0 within `limit` seconds."""
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        stop_group(p)
        return False, f"still running after {limit} s"
    return p.returncode == 0, out[-3000:]


def run_lines(wrap, lines, cwd, wait_s, servers):
    """Each line in a terminal of its own: a line that exits non-zero within
    `wait_s` fails; one still running then is a server (kept for the next
    lines when `servers`, else stopped). Everything is stopped at the end."""
    running, log = [], []
    ok = True
    for line in lines:
        p = subprocess.Popen(wrap(line), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=wait_s)
            log.append(f"$ {line}\n{out[-1500:]}(exit {p.returncode})")
            if p.returncode != 0:
                ok = False
                break
        except subprocess.TimeoutExpired:
            log.append(f"$ {line}\n(still running after {wait_s} s: {'kept as a server' if servers else 'stopped'})")
            if servers:
                running.append(p)
            else:
                stop_group(p)
    for p in running:
        stop_group(p)
    return ok, "\n".join(log)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default=os.environ.get("EXAMPLES_BIN_DIR", str(ROOT / "target" / "debug")))
    ap.add_argument("--only", help="run only examples whose key contains this")
    ap.add_argument("--list", action="store_true", help="list the examples and how each would run")
    a = ap.parse_args()
    bin_dir = Path(a.bin_dir).resolve()
    cfg = tomllib.loads((ROOT / "scripts" / "examples.toml").read_text())
    binaries = cfg["binaries"]
    missing = [b for b in binaries if not (bin_dir / b).is_file()]
    if missing:
        print(f"run-examples: not built in {bin_dir}: {', '.join(missing)} (cargo build --workspace --bins)", file=sys.stderr)
        return 2

    def rule(table, key):
        return next((v for k, v in cfg.get(table, {}).items() if k in key), None)

    work = []
    for key, f, line, body in readme_blocks():
        work.append(("block", key, body))
    for key, argv, lines in help_sections(bin_dir, binaries):
        work.append(("help", key, lines))
    if a.only:
        work = [w for w in work if a.only in w[1]]
    used_skips = set()
    scratches = {}
    failed, ran, skipped = [], 0, 0
    for kind, key, what in work:
        skip = next(((k, v) for k, v in cfg.get("skip", {}).items() if k in key), None)
        where = rule("lab", key) and "lab" or "loopback"
        if a.list:
            how = "lines" if kind == "help" or rule("lines", key) is not None else "script"
            print(f"{'SKIP' if skip else where + ' ' + how:15} {key}" + (f"  ({skip[1]})" if skip else ""))
            continue
        if skip:
            used_skips.add(skip[0])
            skipped += 1
            print(f"skip  {key}: {skip[1]}", flush=True)
            continue
        # A README is followed in one directory, block after block (its
        # quick start writes files the next block uses); each help section
        # starts in a directory of its own.
        group = key.split(":")[0] if kind == "block" else key
        if group not in scratches:
            scratches[group] = Path(tempfile.mkdtemp(prefix="examples-"))
            # Repository paths in examples are relative to its root, and
            # `cargo run -p ...` (the client's guide) works there too.
            for name in ("crates", "Cargo.toml", "Cargo.lock"):
                (scratches[group] / name).symlink_to(ROOT / name)
        scratch = scratches[group]
        lab = None
        try:
            if where == "lab":
                lab = Lab(bin_dir)
                wrap = lambda s: lab.wrap(f"cd {shlex.quote(str(scratch))}; " + prelude(bin_dir) + s)
            else:
                wrap = lambda s: ["bash", "-c", prelude(bin_dir) + s]
            t0 = time.monotonic()
            wait_s = rule("lines", key)
            servers = bool(rule("servers", key))
            if kind == "block" and wait_s is None:
                ok, log = run_script(wrap(what), scratch, cfg.get("block_limit_s", 120))
            else:
                lines = [l for l in what.splitlines() if l.strip()] if kind == "block" else what
                ok, log = run_lines(wrap, lines, scratch, wait_s or cfg.get("line_wait_s", 8), servers)
            ran += 1
            print(f"{'ok  ' if ok else 'FAIL'}  {key} ({time.monotonic() - t0:.1f} s, {where})", flush=True)
            if not ok:
                failed.append(key)
                print("      " + log.replace("\n", "\n      "), flush=True)
        finally:
            if lab:
                lab.down()
    for d in scratches.values():
        shutil.rmtree(d, ignore_errors=True)
    if a.list:
        return 0
    stale = set(cfg.get("skip", {})) - used_skips
    if stale and not a.only:
        print(f"run-examples: skip entries that match no example (remove them): {sorted(stale)}", file=sys.stderr)
        return 1
    print(f"run-examples: {ran} ran, {skipped} skipped (reasons above), {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
