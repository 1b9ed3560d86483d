#!/usr/bin/env bash
# Control-server benchmark: join tokens per second and latency percentiles
# with 1,000 concurrent keep-alive clients (wrk), each request a ticket check
# plus a signed token; the anchor is /healthz on the same server in the same
# run (the HTTP stack alone), variants interleaved, REPS repetitions. The
# server is pinned to CPU 0 and wrk to CPU 1; the server's CPU time per
# request comes from /proc. Rate limits are raised for the run (they would
# answer 429 to a flood from one address by design). Writes
# bench/results/control.csv, control_summary.csv and control.png.
# CONTROL_BENCH_SECS, CONTROL_BENCH_REPS and CONTROL_BENCH_CONNS override.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v wrk >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null
  else
    echo "bench/control.sh: needs wrk (apt-get install wrk)" >&2
    exit 1
  fi
fi
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/reflector"
[ -x "$bin" ] || cargo build --release -p reflector
secs=${CONTROL_BENCH_SECS:-10}
reps=${CONTROL_BENCH_REPS:-3}
conns=${CONTROL_BENCH_CONNS:-1000}
players=20000
work="$target_dir/bench-control"
mkdir -p "$work" bench/results
rm -f "$work"/wrk-*.txt

# The game backend's part: a ticket key, and one ticket per player.
key_hex=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$work/secret"
printf '[[key]]\nkid = "bench"\nalg = "HS256"\nsecret_hex = "%s"\n' "$key_hex" > "$work/ticket-keys.toml"
python3 bench/tickets.py "$key_hex" "$players" > "$work/tickets.txt"

# Every connection is a descriptor on both sides: raise the soft limit.
ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((conns + 200)) ]; then
  echo "bench/control.sh: open-file limit $(ulimit -n) is too low for $conns connections" >&2
  exit 1
fi
port=$((20000 + RANDOM % 20000))
pin_server=() pin_client=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin_server=(taskset -c 0) pin_client=(taskset -c 1)
fi
"${pin_server[@]}" "$bin" control --listen "127.0.0.1:$port" --secret-file "$work/secret" \
  --reflector 127.0.0.1:4000-4015 --ticket-keys "$work/ticket-keys.toml" \
  --ticket-rate-player 1000000 --ticket-rate-ip 1000000000 \
  --http-max-connections $((conns + 100)) 2> "$work/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then break; fi
  kill -0 $server 2>/dev/null || { echo "bench/control.sh: the control server died:" >&2; cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
# One request of each kind first: a wrong setup fails here, not as 10 s of 4xx.
python3 - "$port" "$(head -1 "$work/tickets.txt")" <<'PY'
import sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/join?x=1&y=1", headers={"Authorization": "Bearer " + sys.argv[2]})
body = urllib.request.urlopen(req, timeout=5).read()
assert b"token" in body, body
PY

cpu_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
hz=$(getconf CLK_TCK)
runs="$work/runs.csv"
echo "endpoint,rep,connections,seconds,server_cpu_s,wrk_output" > "$runs"
for r in $(seq 1 "$reps"); do
  for endpoint in healthz join; do
    echo "control bench: repetition $r/$reps, /$endpoint, $conns connections, ${secs}s" >&2
    if [ "$endpoint" = join ]; then path="/join?x=10&y=20" tickets="$work/tickets.txt"; else path=/healthz tickets=""; fi
    out="$work/wrk-$endpoint-$r.txt"
    before=$(cpu_ticks)
    CONTROL_PATH="$path" TICKETS="$tickets" "${pin_client[@]}" wrk -t2 -c"$conns" -d"${secs}s" --timeout 10s \
      --latency -s bench/control.lua "http://127.0.0.1:$port" > "$out"
    after=$(cpu_ticks)
    cpu=$(awk -v a="$before" -v b="$after" -v hz="$hz" 'BEGIN{printf "%.3f", (b-a)/hz}')
    echo "$endpoint,$r,$conns,$secs,$cpu,$out" >> "$runs"
  done
done
"${BENCH_PYTHON:-python3}" bench/control_plot.py "$runs" bench/results
