// The C# binding's keysFrom (library 1.8), run by tests/csharp_binding.rs,
// which plays the game's backend: it asks the control server's /join (a
// sealing secret) for player 1 and passes the grant as arguments. This
// program is the game: bad keysFrom arguments are refused with the
// library's status and message; then a client handed its tokens, made
// with keysFrom naming that control server, is handed the grant's token
// and its keys with the times of keys near their end, and asks /keys
// itself: its sealing counters show the request answered.
//
//   mono keys_from.exe URL PLAYER GROUP REFLECTOR EXPIRES TOKEN SESSION_KEY KEY...
//
// Each KEY: X,Y,CELL_ID,EPOCH,KEY,STARTS,ENDS (hex where binary). Lines
// out: "plain refused STATUS MESSAGE", "empty refused STATUS MESSAGE",
// "fallback refused STATUS MESSAGE", "refreshed REQUESTS REFRESHES
// FAILURES". Exit 1 on anything unexpected.

using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using Reflector;

public static class KeysFrom
{
    private static byte[] Hex(string s)
    {
        var b = new byte[s.Length / 2];
        for (var i = 0; i < b.Length; i++) b[i] = byte.Parse(s.Substring(2 * i, 2), NumberStyles.HexNumber);
        return b;
    }

    /// <summary>Runs make, which must throw: prints "WHAT refused STATUS MESSAGE".</summary>
    private static bool Refused(string what, Func<Client> make)
    {
        try
        {
            make().Dispose();
            Console.Error.WriteLine(what + " was taken");
            return false;
        }
        catch (ReflectorException e)
        {
            Console.WriteLine(what + " refused " + (int)e.Status + " " + e.Message);
            return true;
        }
    }

    public static int Main(string[] args)
    {
        var inv = CultureInfo.InvariantCulture;
        var url = args[0];
        if (!Refused("plain", () => Client.HandedIn("127.0.0.1:0", keysFrom: url))) return 1;
        if (!Refused("empty", () => Client.HandedIn("127.0.0.1:0", keysFrom: ""))) return 1;
        if (!Refused("fallback", () => Client.HandedIn("127.0.0.1:0", keysFrom: "https://control-a.example",
                fallbackUrls: new[] { "http://control-b.example" })))
            return 1;

        var player = uint.Parse(args[1], inv);
        var group = ushort.Parse(args[2], inv);
        var now = (ulong)DateTimeOffset.UtcNow.ToUnixTimeSeconds();
        var keys = new EpochKey[args.Length - 7];
        for (var i = 7; i < args.Length; i++)
        {
            var k = args[i].Split(',');
            keys[i - 7] = new EpochKey
            {
                CellX = uint.Parse(k[0], inv),
                CellY = uint.Parse(k[1], inv),
                CellId = Hex(k[2]),
                Epoch = uint.Parse(k[3], inv),
                Key = Hex(k[4]),
                // Near its end, within the overlap window: a refresh is due.
                StartsUnixS = now - 10,
                EndsUnixS = now + 30,
            };
        }
        using (var c = Client.HandedIn("127.0.0.1:0", keysFrom: url, allowPlainHttp: true))
        {
            c.SetToken(Hex(args[5]), Hex(args[6]), player, group, args[3], ulong.Parse(args[4], inv));
            c.SetEpochKeys(group, keys);
            var clock = Stopwatch.StartNew();
            SealingStats s;
            while ((s = c.GetSealingStats()).KeysRefreshes == 0)
            {
                if (clock.Elapsed.TotalSeconds > 15)
                {
                    Console.Error.WriteLine("no /keys answer within 15 s: requests " + s.KeysRequests + ", failures " +
                        s.KeysRefreshFailures + "; " + Native.LastError());
                    return 1;
                }
                c.Update();
                Event ev;
                while (c.PollEvent(out ev))
                    if (ev.Kind == EventKind.Error) Console.Error.WriteLine("error " + Native.LastError());
                Thread.Sleep(2);
            }
            Console.WriteLine("refreshed " + s.KeysRequests + " " + s.KeysRefreshes + " " + s.KeysRefreshFailures);
        }
        return 0;
    }
}
