// A C# player with an area of interest that moves (library 1.2): it asks
// the control server(s) for the area of RADIUS cells around (FROM_X, 50),
// sends its position every 50 ms to its cell, and once it has heard
// another player it moves to (TO_X, 50) with SetPosition. It prints its
// area events and what it hears, and ends once the move has settled (sends
// switched, the old groups left, another player heard since) and a second
// has passed, or at SECONDS:
//
//   mono mover.exe PLAYER RADIUS FROM_X TO_X SECONDS URL [FALLBACK_URL...]
//
// Lines: "joined G", "moved FROM TO", "left_group G", "rejoining G",
// "renewed G", "error CODE MESSAGE", "heard ME OTHER before|after" (once
// each per player and side of the move), and at the end "groups G..." (the
// groups it is a member of, sorted), "sending G" and "token_requests N".
// The URLs are plain http:// (a lab on loopback).
//
// Build: mcs -out:mover.exe ReflectorClient.cs Mover.cs
// (libreflector_c.so on LD_LIBRARY_PATH when run).

using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.Linq;
using System.Text;
using System.Threading;
using Reflector;

public static class Mover
{
    public static int Main(string[] args)
    {
        if (args.Length < 6)
        {
            Console.Error.WriteLine("usage: mover.exe PLAYER RADIUS FROM_X TO_X SECONDS URL [FALLBACK_URL...]");
            return 2;
        }
        var inv = CultureInfo.InvariantCulture;
        var player = uint.Parse(args[0], inv);
        var radius = byte.Parse(args[1], inv);
        var fromX = double.Parse(args[2], inv);
        var toX = double.Parse(args[3], inv);
        var seconds = double.Parse(args[4], inv);
        var fallbacks = args.Skip(6).ToArray();
        var heard = new HashSet<string>();
        var clock = Stopwatch.StartNew();
        using (var c = Client.WithControl(args[5], null, player, fromX, 50.0, null, true, "127.0.0.1:0", radius,
                   fallbacks))
        {
            double last = 0, movedAt = -1;
            bool asked = false, left = false, heardBefore = false, heardAfter = false;
            while (clock.Elapsed.TotalSeconds < seconds)
            {
                c.Update();
                Event ev;
                while (c.PollEvent(out ev))
                {
                    switch (ev.Kind)
                    {
                        case EventKind.Joined: Console.WriteLine("joined " + ev.Group); break;
                        case EventKind.Moved:
                            Console.WriteLine("moved " + ev.FromGroup + " " + ev.Group);
                            movedAt = clock.Elapsed.TotalSeconds;
                            break;
                        case EventKind.LeftGroup:
                            Console.WriteLine("left_group " + ev.Group);
                            left = true;
                            break;
                        case EventKind.Rejoining: Console.WriteLine("rejoining " + ev.Group); break;
                        case EventKind.Renewed: Console.WriteLine("renewed " + ev.Group); break;
                        case EventKind.Error:
                            Console.WriteLine("error " + (int)ev.Error + " " + Native.LastError());
                            break;
                    }
                }
                var side = movedAt >= 0 ? "after" : "before";
                Datagram d;
                while (c.Recv(out d))
                {
                    if (heard.Add(d.Sender + " " + side))
                        Console.WriteLine("heard " + player + " " + d.Sender + " " + side);
                    if (side == "before") heardBefore = true;
                    else heardAfter = true;
                }
                var now = clock.Elapsed.TotalSeconds;
                if (c.IsMember && now - last >= 0.05)
                {
                    last = now;
                    c.Send(Encoding.ASCII.GetBytes("pos " + (int)(movedAt >= 0 ? toX : fromX) + " 50"));
                }
                if (!asked && heardBefore)
                {
                    c.SetPosition(toX, 50.0);
                    asked = true;
                    Console.WriteLine("set_position " + (int)toX);
                }
                if (movedAt >= 0 && left && heardAfter && now - movedAt >= 1.0) break;
                Thread.Sleep(5);
            }
            Console.WriteLine("groups " + string.Join(" ", c.MemberGroups().Select(g => g.ToString()).ToArray()));
            var sending = c.SendingGroup;
            Console.WriteLine("sending " + (sending.HasValue ? sending.Value.ToString() : "None"));
            Console.WriteLine("token_requests " + c.GetStats().TokenRequests);
        }
        return 0;
    }
}
