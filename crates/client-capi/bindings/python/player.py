"""A Python player: joins with a token, walks a row of a 16x16 grid sending
its position every 50 ms, prints what it hears, and after SECONDS prints
"heard ME OTHER" for each player heard.

    python3 player.py [--owed K:N] REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX

Checkpoints: when the reflector asks, the player hands in STATE_LEN bytes
made from its id and its tick (the frame number), and prints "uploaded ME
number N tick T size S" once stored; joining a group that has a checkpoint,
it fetches it (the library does on each join) and prints "checkpoint ME
from P number N tick T size S fnv1a H" (H: the state's 64-bit FNV-1a).

--owed K:N: once it has heard N-1 others (all N players are members then),
it sends K numbered datagrams "n SEQ" (one a frame), then "done"; it prints
"got ME SENDER SEQ" for each numbered datagram received, and stops
("complete ME") once its own are out and every other player's "done" came,
or at SECONDS.

The library: $REFLECTOR_C_LIB, else libreflector_c.so on the loader's path.
"""

import sys
import time

import reflector_client as rc

STATE_LEN = 20000


def make_state(player, tick):
    """The game state at a tick, made from the player and the tick (so a
    joiner can tell it got exactly these bytes)."""
    return bytes((i * 7 + (i >> 8) + player * 13 + tick) & 0xFF for i in range(STATE_LEN))


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def on_checkpoint(lib, c, player, tick, ck):
    if ck.kind == rc.RC_CHECKPOINT_REQUESTED:
        try:
            c.provide_checkpoint(tick, make_state(player, tick))
        except rc.ReflectorError as e:
            print("player %d: no upload: %s" % (player, e))
    elif ck.kind == rc.RC_CHECKPOINT_UPLOADED:
        print("uploaded %d number %d tick %d size %d" % (player, ck.number, ck.tick, STATE_LEN))
    elif ck.kind == rc.RC_CHECKPOINT_READY:
        got = c.take_checkpoint()
        if got is not None:
            t, state = got
            print("checkpoint %d from %d number %d tick %d size %d fnv1a %016x"
                  % (player, ck.from_player, ck.number, t, len(state), fnv1a(state)))
    elif ck.kind == rc.RC_CHECKPOINT_EMPTY:
        print("player %d: the group has no checkpoint yet" % player)
    elif ck.kind == rc.RC_CHECKPOINT_FAILED:
        op = "upload" if ck.op == rc.RC_CHECKPOINT_OP_UPLOAD else "fetch"
        print("player %d: checkpoint %s failed (%d, refusal %d): %s"
              % (player, op, ck.error, ck.refusal, rc.last_error(lib)))


def main():
    args = sys.argv[1:]
    owed, group_size = 0, 0
    if len(args) > 1 and args[0] == "--owed":
        owed, group_size = (int(v) for v in args[1].split(":"))
        args = args[2:]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    reflector, seconds, spec = args[0], float(args[1]), args[2]
    player, group, expires, token_hex, key_hex = spec.split(":")
    player = int(player)
    lib = rc.load()
    heard = []
    done_from = set()
    owed_sent, done_sent, complete_at = 0, False, None
    with rc.Client.with_token(lib, bytes.fromhex(token_hex), bytes.fromhex(key_hex), player, int(group),
                              reflector, int(expires)) as c:
        end = time.monotonic() + seconds
        last, x, tick = 0.0, 0, 0
        while time.monotonic() < end:
            tick += 1
            c.update()
            for ev in c.events():
                if ev.kind == rc.RC_EVENT_JOINED:
                    print("player %d joined group %d (%d members)" % (player, ev.group, ev.members))
                elif ev.kind == rc.RC_EVENT_ERROR:
                    print("player %d: error %d: %s" % (player, ev.error, rc.last_error(lib)))
            for ck in c.checkpoint_events():
                on_checkpoint(lib, c, player, tick, ck)
            for d in c.datagrams():
                if d.payload.startswith(b"pos "):
                    print("player %d hears player %d: %s (seq %d)" % (player, d.sender, d.payload.decode(), d.seq))
                elif d.payload.startswith(b"n "):
                    print("got %d %d %d" % (player, d.sender, int(d.payload[2:])))
                elif d.payload == b"done":
                    done_from.add(d.sender)
                if d.sender not in heard:
                    heard.append(d.sender)
            now = time.monotonic()
            if c.is_member() and now - last >= 0.05:
                last, x = now, (x + 1) % 16
                c.send(b"pos %d 1" % x)
            if group_size and len(heard) >= group_size - 1 and c.is_member():
                if owed_sent < owed:
                    c.send(b"n %d" % owed_sent)
                    owed_sent += 1
                elif not done_sent:
                    c.send(b"done")
                    done_sent = True
            if group_size and done_sent and len(done_from) >= group_size - 1 and complete_at is None:
                complete_at = now
                print("complete %d" % player)
            if complete_at is not None and now - complete_at >= 0.3:
                break
            time.sleep(0.005)
        s = c.stats()
        print("player %d: sent %d, received %d" % (player, s.data_sent, s.data_received))
    for other in heard:
        print("heard %d %d" % (player, other))
    return 0


if __name__ == "__main__":
    sys.exit(main())
