"""A Python player: joins with a token, walks a row of a 16x16 grid sending
its position every 50 ms, prints what it hears, and after SECONDS prints
"heard ME OTHER" for each player heard.

    python3 player.py REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX

The library: $REFLECTOR_C_LIB, else libreflector_c.so on the loader's path.
"""

import sys
import time

import reflector_client as rc


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    reflector, seconds, spec = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    player, group, expires, token_hex, key_hex = spec.split(":")
    player = int(player)
    lib = rc.load()
    heard = []
    with rc.Client.with_token(lib, bytes.fromhex(token_hex), bytes.fromhex(key_hex), player, int(group),
                              reflector, int(expires)) as c:
        end = time.monotonic() + seconds
        last, x = 0.0, 0
        while time.monotonic() < end:
            c.update()
            for ev in c.events():
                if ev.kind == rc.RC_EVENT_JOINED:
                    print("player %d joined group %d (%d members)" % (player, ev.group, ev.members))
                elif ev.kind == rc.RC_EVENT_ERROR:
                    print("player %d: error %d: %s" % (player, ev.error, rc.last_error(lib)))
            for d in c.datagrams():
                print("player %d hears player %d: %s (seq %d)" % (player, d.sender, d.payload.decode(), d.seq))
                if d.sender not in heard:
                    heard.append(d.sender)
            now = time.monotonic()
            if c.is_member() and now - last >= 0.05:
                last, x = now, (x + 1) % 16
                c.send(b"pos %d 1" % x)
            time.sleep(0.005)
        s = c.stats()
        print("player %d: sent %d, received %d" % (player, s.data_sent, s.data_received))
    for other in heard:
        print("heard %d %d" % (player, other))
    return 0


if __name__ == "__main__":
    sys.exit(main())
