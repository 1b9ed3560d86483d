#!/usr/bin/env bash
# Control servers of a fleet: join tokens per second with one and with two
# control servers placing cells through one Redis (`control --registry`),
# against the anchor measured in the same run: one control server with the
# static `--reflector` list (no registry). A reflector registers in the same
# Redis so every cell has a placement. Each server is pinned to CPU 0 (two
# servers share it: the same CPU budget in every mode), Redis, the
# reflector and wrk to CPU 1; wrk sends 1,000 keep-alive connections of
# /join with a ticket per player (bench/control.lua), split evenly between
# the servers of the mode. The figure is tokens per second and server CPU
# per token; the ratio is against the static anchor's. Modes interleaved,
# REPS repetitions. Writes bench/results/control_fleet.csv.
# CONTROL_FLEET_SECS, CONTROL_FLEET_REPS, CONTROL_FLEET_CONNS and CONTROL_FLEET_OUT override.
set -euo pipefail
cd "$(dirname "$0")/.."
# wrk is a benchmark-only dependency: installed here, never by make test.
if ! command -v wrk >/dev/null && [ "$(id -u)" -eq 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
for tool in wrk redis-server redis-cli; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench/control_fleet.sh: needs $tool (apt-get install wrk redis-server)" >&2
    exit 1
  fi
done
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/release/reflector"
[ -x "$bin" ] || cargo build --release -p reflector
secs=${CONTROL_FLEET_SECS:-10}
reps=${CONTROL_FLEET_REPS:-3}
conns=${CONTROL_FLEET_CONNS:-1000}
players=20000
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p bench/results

# The game backend's part: a ticket key, and one ticket per player.
key_hex=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$work/secret"
od -An -tx1 -N16 /dev/urandom | tr -d ' \n' > "$work/redis-password"
printf '[[key]]\nkid = "bench"\nalg = "HS256"\nsecret_hex = "%s"\n' "$key_hex" > "$work/ticket-keys.toml"
python3 bench/tickets.py "$key_hex" "$players" > "$work/tickets.txt"

ulimit -n "$(ulimit -Hn)"
pin0=() pin1=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  pin0=(taskset -c 0) pin1=(taskset -c 1)
fi
base=$((20000 + RANDOM % 20000))
redis_port=$base reflector_port=$((base + 100)) http=($((base + 1)) $((base + 2)) $((base + 3)))

"${pin1[@]}" redis-server --bind 127.0.0.1 --port "$redis_port" --requirepass "$(cat "$work/redis-password")" \
  --save "" --appendonly no --dir "$work" > "$work/redis.log" 2>&1 &
pids+=($!)
registry=(--registry "redis://127.0.0.1:$redis_port" --registry-password-file "$work/redis-password")
for _ in $(seq 50); do
  redis-cli -p "$redis_port" -a "$(cat "$work/redis-password")" --no-auth-warning ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
"${pin1[@]}" "$bin" serve --bind 127.0.0.1 --advertise 127.0.0.1 --ports "$reflector_port-$((reflector_port + 15))" \
  --secret-file "$work/secret" "${registry[@]}" > "$work/serve.out" 2> "$work/serve.log" &
pids+=($!)

# The control servers of a mode: static (anchor), fleet1, fleet2.
start_controls() {
  local mode=$1 n=1 i
  [ "$mode" = fleet2 ] && n=2
  servers=()
  for i in $(seq 0 $((n - 1))); do
    local src=(--reflector "127.0.0.1:$reflector_port-$((reflector_port + 15))")
    [ "$mode" != static ] && src=("${registry[@]}")
    "${pin0[@]}" "$bin" control --listen "127.0.0.1:${http[$i]}" --secret-file "$work/secret" "${src[@]}" \
      --ticket-keys "$work/ticket-keys.toml" --ticket-rate-player 1000000 --ticket-rate-ip 1000000000 \
      --http-max-connections $((conns + 100)) 2> "$work/control-$mode-$i.log" &
    servers+=($!)
  done
  # Ready when each answers a join with a token (a fleet's placement included).
  for i in $(seq 0 $((n - 1))); do
    local ok=
    for _ in $(seq 100); do
      if python3 - "${http[$i]}" "$(head -1 "$work/tickets.txt")" 2>/dev/null <<'PY'
import sys, urllib.request
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/join?x=1&y=1",
                             headers={"Authorization": "Bearer " + sys.argv[2]})
assert b"token" in urllib.request.urlopen(req, timeout=2).read()
PY
      then ok=1; break; fi
      sleep 0.2
    done
    [ -n "$ok" ] || { echo "bench/control_fleet.sh: $mode control server $i never answered a join:" >&2; cat "$work/control-$mode-$i.log" >&2; exit 1; }
  done
}
stop_controls() {
  for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
hz=$(getconf CLK_TCK)

out=${CONTROL_FLEET_OUT:-bench/results/control_fleet.csv}
echo "mode,rep,servers,connections,seconds,requests,tokens_per_s,non_2xx,server_cpu_s,cpu_us_per_token" > "$out"
for r in $(seq 1 "$reps"); do
  for mode in static fleet1 fleet2; do
    start_controls "$mode"
    n=${#servers[@]}
    echo "control fleet bench: repetition $r/$reps, $mode ($n server(s)), $conns connections, ${secs}s" >&2
    before=$(cpu_ticks "${servers[@]}")
    wrks=()
    for i in $(seq 0 $((n - 1))); do
      CONTROL_PATH="/join?x=10&y=20" TICKETS="$work/tickets.txt" "${pin1[@]}" wrk -t1 -c$((conns / n)) -d"${secs}s" \
        --timeout 10s -s bench/control.lua "http://127.0.0.1:${http[$i]}" > "$work/wrk-$mode-$r-$i.txt" &
      wrks+=($!)
    done
    for w in "${wrks[@]}"; do wait "$w"; done
    after=$(cpu_ticks "${servers[@]}")
    stop_controls
    python3 - "$mode" "$r" "$n" "$conns" "$secs" "$before" "$after" "$hz" "$work"/wrk-"$mode"-"$r"-*.txt >> "$out" <<'PY'
import re, sys
mode, rep, n, conns, secs, before, after, hz = sys.argv[1:9]
requests = non2xx = 0
for path in sys.argv[9:]:
    text = open(path).read()
    requests += int(re.search(r"(\d+) requests in", text).group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    non2xx += int(m.group(1)) if m else 0
tokens = requests - non2xx
cpu = (int(after) - int(before)) / int(hz)
print(f"{mode},{rep},{n},{conns},{secs},{requests},{tokens / float(secs):.1f},{non2xx},{cpu:.3f},"
      f"{cpu * 1e6 / tokens if tokens else float('nan'):.2f}")
PY
  done
done
python3 - "$out" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = lambda mode, key: statistics.median(float(r[key]) for r in rows if r["mode"] == mode)
anchor_rate, anchor_cpu = med("static", "tokens_per_s"), med("static", "cpu_us_per_token")
print("mode      tokens/s (median)  vs static   server CPU per token  vs static   non-2xx")
for mode in ("static", "fleet1", "fleet2"):
    rate, cpu = med(mode, "tokens_per_s"), med(mode, "cpu_us_per_token")
    bad = sum(int(r["non_2xx"]) for r in rows if r["mode"] == mode)
    print(f"{mode:8} {rate:18.0f} {rate / anchor_rate:9.2f}x {cpu:17.1f} us {cpu / anchor_cpu:9.2f}x {bad:9d}")
PY
