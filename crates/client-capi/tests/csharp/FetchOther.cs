// The C# binding's FETCH_OTHER (library 1.4), run by
// tests/checkpoint_bindings.rs against a real reflector with its
// checkpoint channel and nothing stored yet: a member (fetch on join off)
// asks for the other checkpoint kept; a second ask while it runs is
// refused in flight; it ends EMPTY with Op FetchOther.
//
//   mono fetch_other.exe SPEC
//
// SPEC is PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX, for a reflector on
// 127.0.0.1 whose port is the group. Lines: "in flight STATUS",
// "ended KIND OP GROUP". Exit 1 on anything unexpected.

using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using Reflector;

public static class FetchOther
{
    private static byte[] Hex(string s)
    {
        var b = new byte[s.Length / 2];
        for (var i = 0; i < b.Length; i++) b[i] = byte.Parse(s.Substring(2 * i, 2), NumberStyles.HexNumber);
        return b;
    }

    public static int Main(string[] args)
    {
        if (args.Length != 1)
        {
            Console.Error.WriteLine("usage: fetch_other.exe SPEC");
            return 2;
        }
        var p = args[0].Split(':');
        var inv = CultureInfo.InvariantCulture;
        var group = ushort.Parse(p[1], inv);
        using (var c = Client.WithToken(Hex(p[3]), Hex(p[4]), uint.Parse(p[0], inv), group, "127.0.0.1:" + p[1],
                   ulong.Parse(p[2], inv), "127.0.0.1:0"))
        {
            c.CheckpointConfigure(false);
            var clock = Stopwatch.StartNew();
            Event ev;
            while (!c.IsMember)
            {
                if (clock.Elapsed.TotalSeconds > 10)
                {
                    Console.Error.WriteLine("not a member within 10 s");
                    return 1;
                }
                c.Update();
                while (c.PollEvent(out ev)) { }
                Thread.Sleep(1);
            }
            c.FetchCheckpointOther();
            try
            {
                c.FetchCheckpointOther();
                Console.Error.WriteLine("a second FETCH_OTHER was started");
                return 1;
            }
            catch (ReflectorException e)
            {
                Console.WriteLine("in flight " + (int)e.Status);
            }
            while (true)
            {
                if (clock.Elapsed.TotalSeconds > 20)
                {
                    Console.Error.WriteLine("the FETCH_OTHER did not end");
                    return 1;
                }
                c.Update();
                while (c.PollEvent(out ev)) { }
                CheckpointEvent ck;
                while (c.PollCheckpoint(out ck))
                {
                    if (ck.Kind == CheckpointKind.Requested) continue;
                    Console.WriteLine("ended " + (int)ck.Kind + " " + (int)ck.Op + " " + ck.Group);
                    return 0;
                }
                Thread.Sleep(1);
            }
        }
    }
}
