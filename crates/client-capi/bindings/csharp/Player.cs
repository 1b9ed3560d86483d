// A C# player: joins with a token, walks a row of a 16x16 grid sending its
// position every 50 ms, prints what it hears, and after SECONDS prints
// "heard ME OTHER" for each player heard.
//
//   mono player.exe [--owed K:N] REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX
//
// Checkpoints: when the reflector asks, the player hands in StateLen bytes
// made from its id and its tick (the frame number), and prints "uploaded ME
// number N tick T size S" once stored; joining a group that has a
// checkpoint, it fetches it (the library does on each join) and prints
// "checkpoint ME from P number N tick T size S fnv1a H" (H: the state's
// 64-bit FNV-1a).
//
// --owed K:N: once it has heard N-1 others (all N players are members
// then), it sends K numbered datagrams "n SEQ" (one a frame), then "done";
// it prints "got ME SENDER SEQ" for each numbered datagram received, and
// stops ("complete ME") once its own are out and every other player's
// "done" came, or at SECONDS.
//
// Build: mcs -out:player.exe ReflectorClient.cs Player.cs
// (libreflector_c.so on LD_LIBRARY_PATH when run).

using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text;
using System.Threading;
using Reflector;

public static class Player
{
    const int StateLen = 20000;

    static byte[] Unhex(string s)
    {
        var b = new byte[s.Length / 2];
        for (var i = 0; i < b.Length; i++) b[i] = Convert.ToByte(s.Substring(2 * i, 2), 16);
        return b;
    }

    // The game state at a tick, made from the player and the tick (so a
    // joiner can tell it got exactly these bytes).
    static byte[] MakeState(uint player, ulong tick)
    {
        var b = new byte[StateLen];
        for (var i = 0; i < b.Length; i++) b[i] = (byte)(((ulong)i * 7 + ((ulong)i >> 8) + player * 13UL + tick) & 0xff);
        return b;
    }

    static ulong Fnv1a(byte[] data)
    {
        var h = 0xcbf29ce484222325UL;
        foreach (var b in data)
        {
            h ^= b;
            h = unchecked(h * 0x100000001b3UL);
        }
        return h;
    }

    static void OnCheckpoint(Client c, uint player, ulong tick, CheckpointEvent ck)
    {
        switch (ck.Kind)
        {
            case CheckpointKind.Requested:
                try
                {
                    c.ProvideCheckpoint(tick, MakeState(player, tick));
                }
                catch (ReflectorException e)
                {
                    Console.WriteLine("player {0}: no upload: {1}", player, e.Message);
                }
                break;
            case CheckpointKind.Uploaded:
                Console.WriteLine("uploaded {0} number {1} tick {2} size {3}", player, ck.Number, ck.Tick, StateLen);
                break;
            case CheckpointKind.Ready:
                byte[] state;
                ulong t;
                if (c.TakeCheckpoint(out state, out t))
                    Console.WriteLine("checkpoint {0} from {1} number {2} tick {3} size {4} fnv1a {5:x16}", player,
                        ck.FromPlayer, ck.Number, t, state.Length, Fnv1a(state));
                break;
            case CheckpointKind.Empty:
                Console.WriteLine("player {0}: the group has no checkpoint yet", player);
                break;
            case CheckpointKind.Failed:
                Console.WriteLine("player {0}: checkpoint {1} failed ({2}, refusal {3}): {4}", player,
                    ck.Op == CheckpointOp.Upload ? "upload" : "fetch", (int)ck.Error, ck.Refusal, Native.LastError());
                break;
        }
    }

    public static int Main(string[] argv)
    {
        var args = new List<string>(argv);
        int owed = 0, groupSize = 0;
        if (args.Count > 1 && args[0] == "--owed")
        {
            var kn = args[1].Split(':');
            owed = int.Parse(kn[0]);
            groupSize = int.Parse(kn[1]);
            args.RemoveRange(0, 2);
        }
        if (args.Count != 3)
        {
            Console.Error.WriteLine(
                "usage: player.exe [--owed K:N] REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX");
            return 2;
        }
        var seconds = double.Parse(args[1]);
        var f = args[2].Split(':');
        var player = uint.Parse(f[0]);
        var heard = new List<uint>();
        var doneFrom = new HashSet<uint>();
        int owedSent = 0;
        bool doneSent = false;
        long completeAt = -1;
        try
        {
            using (var c = Client.WithToken(Unhex(f[3]), Unhex(f[4]), player, ushort.Parse(f[1]), args[0],
                ulong.Parse(f[2])))
            {
                var clock = Stopwatch.StartNew();
                var last = -1000L;
                var x = 0;
                ulong tick = 0;
                while (clock.Elapsed.TotalSeconds < seconds)
                {
                    tick++;
                    c.Update();
                    Event ev;
                    while (c.PollEvent(out ev))
                    {
                        if (ev.Kind == EventKind.Joined)
                            Console.WriteLine("player {0} joined group {1} ({2} members)", player, ev.Group, ev.Members);
                        else if (ev.Kind == EventKind.Error)
                            Console.WriteLine("player {0}: error {1}: {2}", player, ev.Error, Native.LastError());
                    }
                    CheckpointEvent ck;
                    while (c.PollCheckpoint(out ck)) OnCheckpoint(c, player, tick, ck);
                    Datagram d;
                    while (c.Recv(out d))
                    {
                        var text = Encoding.UTF8.GetString(d.Payload);
                        if (text.StartsWith("pos "))
                            Console.WriteLine("player {0} hears player {1}: {2} (seq {3})", player, d.Sender, text,
                                d.Seq);
                        else if (text.StartsWith("n "))
                            Console.WriteLine("got {0} {1} {2}", player, d.Sender, text.Substring(2));
                        else if (text == "done")
                            doneFrom.Add(d.Sender);
                        if (!heard.Contains(d.Sender)) heard.Add(d.Sender);
                    }
                    var now = clock.ElapsedMilliseconds;
                    if (c.IsMember && now - last >= 50)
                    {
                        last = now;
                        x = (x + 1) % 16;
                        c.Send(Encoding.UTF8.GetBytes("pos " + x + " 2"));
                    }
                    if (groupSize > 0 && heard.Count >= groupSize - 1 && c.IsMember)
                    {
                        if (owedSent < owed)
                        {
                            c.Send(Encoding.UTF8.GetBytes("n " + owedSent));
                            owedSent++;
                        }
                        else if (!doneSent)
                        {
                            c.Send(Encoding.UTF8.GetBytes("done"));
                            doneSent = true;
                        }
                    }
                    if (groupSize > 0 && doneSent && doneFrom.Count >= groupSize - 1 && completeAt < 0)
                    {
                        completeAt = now;
                        Console.WriteLine("complete {0}", player);
                    }
                    if (completeAt >= 0 && now - completeAt >= 300) break;
                    Thread.Sleep(5);
                }
                var s = c.GetStats();
                Console.WriteLine("player {0}: sent {1}, received {2}", player, s.DataSent, s.DataReceived);
            }
        }
        catch (ReflectorException e)
        {
            Console.Error.WriteLine("player: " + e.Message);
            return 1;
        }
        foreach (var other in heard) Console.WriteLine("heard {0} {1}", player, other);
        return 0;
    }
}
