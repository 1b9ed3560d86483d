"""Plots the fleet lab's run: members and copies fanned out per second of
every reflector over (virtual) time, from fleet_rate.csv, with the events
of fleet.csv marked."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rate_csv, events_csv, out = sys.argv[1:4]
rows = list(csv.DictReader(open(rate_csv)))
events = list(csv.DictReader(open(events_csv)))
hosts = [k[len("members_"):] for k in rows[0] if k.startswith("members_")]
t = [float(r["t_s"]) for r in rows]


def series(key):
    return [float(r[key]) if r[key] != "" else float("nan") for r in rows]


# Rates between two polls are noisy (a poll is a fraction of a second):
# shown as a running mean over one virtual second.
step = (t[-1] - t[0]) / max(1, len(t) - 1)
width = max(1, round(1.0 / step)) if step > 0 else 1


def smooth(v):
    out = []
    for i in range(len(v)):
        w = [x for x in v[max(0, i - width + 1) : i + 1] if x == x]
        out.append(sum(w) / len(w) if w else float("nan"))
    return out


fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
total_rate = [0.0] * len(rows)
total_members = [0.0] * len(rows)
for h in hosts:
    m, c = series(f"members_{h}"), smooth(series(f"copies_per_s_{h}"))
    a.plot(t, c, label=f"reflector {h}", linewidth=1)
    b.plot(t, m, label=f"reflector {h}", linewidth=1)
    total_rate = [x + (y if y == y else 0.0) for x, y in zip(total_rate, c)]
    total_members = [x + (y if y == y else 0.0) for x, y in zip(total_members, m)]
a.plot(t, total_rate, color="black", label="fleet", linewidth=1.5)
b.plot(t, total_members, color="black", label="fleet", linewidth=1.5)
for ax in (a, b):
    for e in events:
        at = float(e["at_s"])
        ax.axvline(at, color="red", linestyle="--", linewidth=1)
        if ax is a:
            # The bots' move windows: affected players, the longest window
            # (virtual s), owed loss outside the windows, the verdict.
            rec = e["recovery_s"]
            label = (
                f"{e['event']}: {e['affected_players']} affected, "
                + (f"max window {float(rec):.2f} s" if rec else "a window never ended")
                + f", lost out {e['lost_outside_windows']}, 429s {e['rate_limited_429']}, "
                + ("pass" if e["pass"] == "true" else "FAIL")
            )
            ax.text(at, ax.get_ylim()[1] * 0.95, " " + label, rotation=90, va="top", fontsize=7, color="red")
a.set_ylabel("copies fanned out per s (1 s mean)")
b.set_ylabel("members")
b.set_xlabel("virtual time since the bots started (s)")
a.legend(fontsize=7, loc="lower left")
a.set_title("fleet lab: delivered rate and members per reflector, events marked", fontsize=10)
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f"wrote {out}")
