// A C# player: joins with a token, walks a row of a 16x16 grid sending its
// position every 50 ms, prints what it hears, and after SECONDS prints
// "heard ME OTHER" for each player heard.
//
//   mono player.exe REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX
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
    static byte[] Unhex(string s)
    {
        var b = new byte[s.Length / 2];
        for (var i = 0; i < b.Length; i++) b[i] = Convert.ToByte(s.Substring(2 * i, 2), 16);
        return b;
    }

    public static int Main(string[] args)
    {
        if (args.Length != 3)
        {
            Console.Error.WriteLine("usage: player.exe REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX");
            return 2;
        }
        var seconds = double.Parse(args[1]);
        var f = args[2].Split(':');
        var player = uint.Parse(f[0]);
        var heard = new List<uint>();
        try
        {
            using (var c = Client.WithToken(Unhex(f[3]), Unhex(f[4]), player, ushort.Parse(f[1]), args[0],
                ulong.Parse(f[2])))
            {
                var clock = Stopwatch.StartNew();
                var last = -1000L;
                var x = 0;
                while (clock.Elapsed.TotalSeconds < seconds)
                {
                    c.Update();
                    Event ev;
                    while (c.PollEvent(out ev))
                    {
                        if (ev.Kind == EventKind.Joined)
                            Console.WriteLine("player {0} joined group {1} ({2} members)", player, ev.Group, ev.Members);
                        else if (ev.Kind == EventKind.Error)
                            Console.WriteLine("player {0}: error {1}: {2}", player, ev.Error, Native.LastError());
                    }
                    Datagram d;
                    while (c.Recv(out d))
                    {
                        Console.WriteLine("player {0} hears player {1}: {2} (seq {3})", player, d.Sender,
                            Encoding.UTF8.GetString(d.Payload), d.Seq);
                        if (!heard.Contains(d.Sender)) heard.Add(d.Sender);
                    }
                    var now = clock.ElapsedMilliseconds;
                    if (c.IsMember && now - last >= 50)
                    {
                        last = now;
                        x = (x + 1) % 16;
                        c.Send(Encoding.UTF8.GetBytes("pos " + x + " 2"));
                    }
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
