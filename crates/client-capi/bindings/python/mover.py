"""A Python player with an area of interest that moves (library 1.2): it
asks the control server(s) for the area of RADIUS cells around (FROM_X,
50), sends its position every 50 ms to its cell, and once it has heard
another player it moves to (TO_X, 50) with set_position. It prints its
area events and what it hears, and ends once the move has settled (sends
switched, the old groups left, another player heard since) and a second
has passed, or at SECONDS:

    python3 mover.py PLAYER RADIUS FROM_X TO_X SECONDS URL [FALLBACK_URL...]

Lines: "joined G", "moved FROM TO", "left_group G", "rejoining G",
"renewed G", "error CODE MESSAGE", "heard ME OTHER before|after" (once each
per player and side of the move), and at the end "groups G..." (the
groups it is a member of, sorted), "sending G" and "token_requests N".
The URLs are plain http:// (a lab on loopback). The library:
$REFLECTOR_C_LIB, else libreflector_c.so on the loader's path.
"""

import sys
import time

import reflector_client as rc


def main():
    args = sys.argv[1:]
    if len(args) < 6:
        print(__doc__, file=sys.stderr)
        return 2
    player, radius = int(args[0]), int(args[1])
    from_x, to_x, seconds = float(args[2]), float(args[3]), float(args[4])
    urls = args[5:]
    lib = rc.load()
    heard = set()
    with rc.Client.with_control(lib, urls[0], None, player, from_x, 50.0, allow_plain_http=True,
                                local="127.0.0.1:0", area_radius=radius, fallback_urls=urls[1:]) as c:
        end = time.monotonic() + seconds
        last, asked, moved_at, left = 0.0, False, None, False
        while time.monotonic() < end:
            c.update()
            for ev in c.events():
                if ev.kind == rc.RC_EVENT_JOINED:
                    print("joined %d" % ev.group)
                elif ev.kind == rc.RC_EVENT_MOVED:
                    print("moved %d %d" % (ev.from_group, ev.group))
                    moved_at = time.monotonic()
                elif ev.kind == rc.RC_EVENT_LEFT_GROUP:
                    print("left_group %d" % ev.group)
                    left = True
                elif ev.kind == rc.RC_EVENT_REJOINING:
                    print("rejoining %d" % ev.group)
                elif ev.kind == rc.RC_EVENT_RENEWED:
                    print("renewed %d" % ev.group)
                elif ev.kind == rc.RC_EVENT_ERROR:
                    print("error %d %s" % (ev.error, rc.last_error(lib)))
            side = "after" if moved_at is not None else "before"
            for d in c.datagrams():
                if (d.sender, side) not in heard:
                    heard.add((d.sender, side))
                    print("heard %d %d %s" % (player, d.sender, side))
            now = time.monotonic()
            if c.is_member() and now - last >= 0.05:
                last = now
                c.send(b"pos %d 50" % int(to_x if moved_at is not None else from_x))
            if not asked and any(s == "before" for _, s in heard):
                c.set_position(to_x, 50.0)
                asked = True
                print("set_position %d" % int(to_x))
            if moved_at is not None and left and any(s == "after" for _, s in heard) and now - moved_at >= 1.0:
                break
            time.sleep(0.005)
        print("groups %s" % " ".join(str(g) for g in c.member_groups()))
        print("sending %s" % c.sending_group())
        print("token_requests %d" % c.stats().token_requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
