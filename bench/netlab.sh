#!/usr/bin/env bash
# netlab benchmark (paper 003): build/teardown time of large topologies, the
# throughput one TCP flow gets through a chain of switches at 1 and 10 Gb/s
# configured (where the machine stops delivering the configured rate), and
# the delay line's accuracy. Every figure is a ratio against an anchor
# measured in the same run:
#   build time  -> per-op apply (one ip/tc process per operation, Mininet's
#                  way) measured here; Mininet's published times are printed
#                  beside them for reference only (other machine, other year)
#   throughput  -> the configured link rate, and an unshaped veth pair (the
#                  machine's ceiling for one flow)
#   delay line  -> the target delay, and the same pair with no delay (stack
#                  latency)
# Writes bench/results/netlab_{build,throughput,delay}.csv and netlab.png.
set -euo pipefail
cd "$(dirname "$0")/.."
NL=${NETLAB_BIN:-target/release/netlab}
OUT=bench/results
REPS=${NETLAB_BENCH_REPS:-3}
SECS=${NETLAB_BENCH_SECS:-3}
# Sections to run (all by default); the plot uses whatever CSVs exist.
PARTS=${NETLAB_BENCH_PARTS:-build throughput delayline delay}
want() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
mkdir -p "$OUT"
[ -x "$NL" ] || { echo "bench netlab: $NL not built (run: cargo build --release -p netlab)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "bench netlab: needs root (namespaces, tc): run with sudo" >&2; exit 1; }

# Never leave a lab behind, whatever happens.
trap '"$NL" clean >/dev/null 2>&1 || true' EXIT
"$NL" clean >/dev/null

now() { date +%s.%N; }
# Arithmetic with awk (always installed), not bc (not always).
calc() { awk "BEGIN { printf \"%.4f\", $1 }"; }
run_id() { sed -n 's/^netlab: run \([^ ]*\) up:.*/\1/p'; }

if want build; then
echo "== build and teardown time =="
echo "topology,apply,rep,up_s,down_s,namespaces,ops" > "$OUT/netlab_build.csv"
for topo in linear:10 linear:50 linear:100 fattree:4; do
  for mode in batch per-op; do
    for rep in $(seq 1 "$REPS"); do
      t0=$(now)
      out=$("$NL" up "$topo" --bw 1gbit --apply "$mode" -q)
      t1=$(now)
      id=$(echo "$out" | run_id)
      ns=$(echo "$out" | sed -n 's/.*(\([0-9]*\) namespaces, \([0-9]*\) ops.*/\1/p')
      ops=$(echo "$out" | sed -n 's/.*(\([0-9]*\) namespaces, \([0-9]*\) ops.*/\2/p')
      "$NL" down --run "$id" >/dev/null
      t2=$(now)
      up=$(calc "$t1 - $t0"); down=$(calc "$t2 - $t1")
      printf '%s,%s,%s,%.3f,%.3f,%s,%s\n' "$topo" "$mode" "$rep" "$up" "$down" "$ns" "$ops" >> "$OUT/netlab_build.csv"
      printf '  %-11s %-7s rep %s: up %6.2fs  down %5.2fs  (%s namespaces, %s ops)\n' "$topo" "$mode" "$rep" "$up" "$down" "$ns" "$ops"
    done
  done
done

fi

if want throughput; then
echo "== one TCP flow through chain(N) =="
echo "switches,configured_mbit,rep,goodput_mbit,ratio_to_configured" > "$OUT/netlab_throughput.csv"
for rep in $(seq 1 "$REPS"); do
  id=$("$NL" up pair -q | run_id)
  g=$("$NL" probe --run "$id" tcp h1 h2 --secs "$SECS" | sed -n 's/.*: \([0-9.]*\) Mbit\/s goodput.*/\1/p')
  "$NL" down --run "$id" >/dev/null
  echo "0,0,$rep,$g,0" >> "$OUT/netlab_throughput.csv"
  echo "  unshaped veth pair rep $rep: $g Mbit/s"
done
for bw in 1000 10000; do
  for n in 1 10 40; do
    for rep in $(seq 1 "$REPS"); do
      id=$("$NL" up "chain:$n" --bw "${bw}mbit" -q | run_id)
      g=$("$NL" probe --run "$id" tcp h1 h2 --secs "$SECS" | sed -n 's/.*: \([0-9.]*\) Mbit\/s goodput.*/\1/p')
      "$NL" down --run "$id" >/dev/null
      r=$(calc "$g / $bw")
      printf '%s,%s,%s,%s,%.4f\n' "$n" "$bw" "$rep" "$g" "$r" >> "$OUT/netlab_throughput.csv"
      printf '  chain:%-3s at %5s Mbit/s rep %s: %8.1f Mbit/s goodput = %.3f of configured\n' "$n" "$bw" "$rep" "$g" "$r"
    done
  done
done

fi

if want delayline; then
echo "== what the delay line costs: one TCP flow through it =="
# Anchor: the plain veth pair for the unshaped case, the configured rate
# (of which TCP can reach 0.956) for the shaped ones.
echo "config,rep,goodput_mbit,anchor,ratio_to_anchor" > "$OUT/netlab_delayline_tput.csv"
for rep in $(seq 1 "$REPS"); do
  id=$("$NL" up pair -q | run_id)
  base=$("$NL" probe --run "$id" tcp h1 h2 --secs "$SECS" | sed -n 's/.*: \([0-9.]*\) Mbit\/s goodput.*/\1/p')
  "$NL" down --run "$id" >/dev/null
  echo "veth,$rep,$base,veth,1" >> "$OUT/netlab_delayline_tput.csv"
  for cfg in "100us:none" "100us:1gbit" "1ms:1gbit"; do
    d=${cfg%%:*}; bw=${cfg##*:}
    id=$("$NL" up pair --delay "$d" --bw "$bw" --delay-backend delay-line -q | run_id)
    g=$("$NL" probe --run "$id" tcp h1 h2 --secs "$SECS" | sed -n 's/.*: \([0-9.]*\) Mbit\/s goodput.*/\1/p')
    "$NL" down --run "$id" >/dev/null
    if [ "$bw" = none ]; then anchor=veth; a=$base; else anchor=configured; a=${bw%gbit}000; fi
    printf 'delay %s bw %s,%s,%s,%s,%.4f\n' "$d" "$bw" "$rep" "$g" "$anchor" "$(calc "$g / $a")" >> "$OUT/netlab_delayline_tput.csv"
    printf '  delay line %-5s bw %-5s rep %s: %8.1f Mbit/s (veth alone %.1f)\n' "$d" "$bw" "$rep" "$g" "$base"
  done
done

fi

if want delay; then
echo "== delay line accuracy (one-way = RTT/2, 500 UDP round trips) =="
echo "target_us,backend,min_us,median_us,p99_us" > "$OUT/netlab_delay.csv"
for d in 0 100 1000 10000; do
  if [ "$d" -eq 0 ]; then id=$("$NL" up pair -q | run_id); else id=$("$NL" up pair --delay "${d}us" --delay-backend delay-line -q | run_id); fi
  line=$("$NL" probe --run "$id" rtt h1 h2 --count 500)
  "$NL" down --run "$id" >/dev/null
  mn=$(echo "$line" | sed -n 's/.*min \([0-9]*\)us.*/\1/p')
  md=$(echo "$line" | sed -n 's/.*median \([0-9]*\)us.*/\1/p')
  p99=$(echo "$line" | sed -n 's/.*p99 \([0-9]*\)us.*/\1/p')
  printf '%s,%s,%.1f,%.1f,%.1f\n' "$d" "$([ "$d" -eq 0 ] && echo none || echo delay-line)" "$(calc "$mn/2")" "$(calc "$md/2")" "$(calc "$p99/2")" >> "$OUT/netlab_delay.csv"
  echo "  target ${d}us: one-way min $(calc "$mn/2")us median $(calc "$md/2")us p99 $(calc "$p99/2")us"
done

fi

"${BENCH_PYTHON:-python3}" bench/plot_netlab.py "$OUT"
