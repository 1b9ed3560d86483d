// The C# binding's sealing for a game that fetches its own tokens
// (library 1.6), run by tests/csharp_binding.rs, which plays the game's
// backend: this program makes two clients with no token yet
// (Client.HandedIn) and prints their signing keys; the test asks the
// control server's /join with each as sign_key and writes back one grant
// line per client on stdin; the program hands them in (SetToken,
// SetEpochKeys, SetCheckpointCertificate). A uploads a checkpoint when
// asked, B fetches it on joining and must take it as signed by A, and
// both exchange sealed DATA. Wrong lengths are refused naming the field.
//
//   mono handed_in_sealing.exe   (stdin: two grant lines)
//
// A grant line: PLAYER GROUP REFLECTOR EXPIRES TOKEN SESSION_KEY
// CONTROL_PUBLIC CERTIFICATE KEY... (hex), each KEY
// X,Y,CELL_ID,EPOCH,KEY,STARTS,ENDS. Lines out: "sign_key HEX" (twice),
// "short key STATUS MESSAGE", "short epoch key STATUS MESSAGE",
// "fetched KIND VERIFICATION FROM TICK CHECK", "same state True",
// "sealed data both ways, max payload N", "names A B". Exit 1 on anything
// unexpected.

using System;
using System.Diagnostics;
using System.Globalization;
using System.Text;
using System.Threading;
using Reflector;

public static class HandedInSealing
{
    private const ulong Tick = 777;

    private struct Grant
    {
        public uint Player;
        public ushort Group;
        public string Reflector;
        public ulong Expires;
        public byte[] Token, SessionKey, ControlPublic, Certificate;
        public EpochKey[] Keys;
    }

    private static byte[] Hex(string s)
    {
        var b = new byte[s.Length / 2];
        for (var i = 0; i < b.Length; i++) b[i] = byte.Parse(s.Substring(2 * i, 2), NumberStyles.HexNumber);
        return b;
    }

    private static string ToHex(byte[] b)
    {
        var sb = new StringBuilder();
        foreach (var x in b) sb.Append(x.ToString("x2", CultureInfo.InvariantCulture));
        return sb.ToString();
    }

    private static Grant Parse(string line)
    {
        var w = line.Split(' ');
        var inv = CultureInfo.InvariantCulture;
        var g = new Grant
        {
            Player = uint.Parse(w[0], inv),
            Group = ushort.Parse(w[1], inv),
            Reflector = w[2],
            Expires = ulong.Parse(w[3], inv),
            Token = Hex(w[4]),
            SessionKey = Hex(w[5]),
            ControlPublic = Hex(w[6]),
            Certificate = Hex(w[7]),
            Keys = new EpochKey[w.Length - 8],
        };
        for (var i = 8; i < w.Length; i++)
        {
            var k = w[i].Split(',');
            g.Keys[i - 8] = new EpochKey
            {
                CellX = uint.Parse(k[0], inv),
                CellY = uint.Parse(k[1], inv),
                CellId = Hex(k[2]),
                Epoch = uint.Parse(k[3], inv),
                Key = Hex(k[4]),
                StartsUnixS = ulong.Parse(k[5], inv),
                EndsUnixS = ulong.Parse(k[6], inv),
            };
        }
        return g;
    }

    private static void HandIn(Client c, Grant g)
    {
        c.SetToken(g.Token, g.SessionKey, g.Player, g.Group, g.Reflector, g.Expires);
        c.SetEpochKeys(g.Group, g.Keys);
        c.SetCheckpointCertificate(g.Group, g.ControlPublic, g.Certificate, g.Expires);
    }

    private static readonly byte[] State = MakeState();

    private static byte[] MakeState()
    {
        var sb = new StringBuilder();
        for (var i = 0; i < 100; i++) sb.Append("csharp state ");
        return Encoding.ASCII.GetBytes(sb.ToString());
    }

    private static bool Any(System.Collections.Generic.List<CheckpointEvent> l, CheckpointKind kind)
    {
        foreach (var e in l) if (e.Kind == kind) return true;
        return false;
    }

    private static bool Same(byte[] x, byte[] y)
    {
        if (x == null || x.Length != y.Length) return false;
        for (var i = 0; i < x.Length; i++) if (x[i] != y[i]) return false;
        return true;
    }

    /// <summary>One frame: update, drain events and DATA (into heard), answer a
    /// request with the state when provide; the checkpoint events that
    /// ended something.</summary>
    private static void Frame(Client c, bool provide, System.Collections.Generic.List<string> heard,
        System.Collections.Generic.List<CheckpointEvent> ended)
    {
        c.Update();
        Event ev;
        while (c.PollEvent(out ev)) { }
        Datagram d;
        while (c.Recv(out d)) heard.Add(d.Sender + ":" + Encoding.ASCII.GetString(d.Payload));
        CheckpointEvent ck;
        while (c.PollCheckpoint(out ck))
        {
            if (ck.Kind == CheckpointKind.Requested)
            {
                if (!provide) continue;
                try { c.ProvideCheckpoint(Tick, State); }
                catch (ReflectorException e) { if (e.Status != Status.ErrInFlight) throw; }
            }
            else ended.Add(ck);
        }
    }

    public static int Main()
    {
        using (var a = Client.HandedIn("127.0.0.1:0"))
        using (var b = Client.HandedIn("127.0.0.1:0"))
        {
            a.CheckpointConfigure(false);
            Console.WriteLine("sign_key " + ToHex(a.SignKey()));
            Console.WriteLine("sign_key " + ToHex(b.SignKey()));
            Console.Out.Flush();
            var ga = Parse(Console.ReadLine());
            var gb = Parse(Console.ReadLine());
            HandIn(a, ga);
            try
            {
                a.SetCheckpointCertificate(ga.Group, new byte[31], ga.Certificate, ga.Expires);
                Console.Error.WriteLine("a 31-byte control_public was taken");
                return 1;
            }
            catch (ReflectorException e)
            {
                Console.WriteLine("short key " + (int)e.Status + " " + e.Message);
            }
            try
            {
                var k = ga.Keys[0];
                k.Key = new byte[31];
                a.SetEpochKeys(ga.Group, new[] { k });
                Console.Error.WriteLine("a 31-byte epoch key was taken");
                return 1;
            }
            catch (ReflectorException e)
            {
                Console.WriteLine("short epoch key " + (int)e.Status + " " + e.Message);
            }

            var heardA = new System.Collections.Generic.List<string>();
            var heardB = new System.Collections.Generic.List<string>();
            var endedA = new System.Collections.Generic.List<CheckpointEvent>();
            var endedB = new System.Collections.Generic.List<CheckpointEvent>();
            var clock = Stopwatch.StartNew();
            while (!Any(endedA, CheckpointKind.Uploaded))
            {
                if (clock.Elapsed.TotalSeconds > 10 || Any(endedA, CheckpointKind.Failed))
                {
                    Console.Error.WriteLine("A uploaded nothing: " + Native.LastError());
                    return 1;
                }
                Frame(a, true, heardA, endedA);
                Thread.Sleep(1);
            }
            HandIn(b, gb);
            clock.Restart();
            while (endedB.Count == 0)
            {
                if (clock.Elapsed.TotalSeconds > 10)
                {
                    Console.Error.WriteLine("B's fetch on join did not end");
                    return 1;
                }
                Frame(a, true, heardA, endedA);
                Frame(b, false, heardB, endedB);
                Thread.Sleep(1);
            }
            var f = endedB[0];
            Console.WriteLine("fetched " + (int)f.Kind + " " + (int)f.Verification + " " + f.FromPlayer + " " + f.Tick +
                " " + (int)f.Check);
            byte[] state;
            ulong tick;
            var took = b.TakeCheckpoint(out state, out tick);
            Console.WriteLine("same state " + (took && tick == Tick && Same(state, State) ? "True" : "False"));
            clock.Restart();
            while (!(heardA.Contains(gb.Player + ":from b") && heardB.Contains(ga.Player + ":from a")))
            {
                if (clock.Elapsed.TotalSeconds > 10)
                {
                    Console.Error.WriteLine("no sealed DATA within 10 s");
                    return 1;
                }
                a.Send(Encoding.ASCII.GetBytes("from a"));
                b.Send(Encoding.ASCII.GetBytes("from b"));
                Frame(a, false, heardA, endedA);
                Frame(b, false, heardB, endedB);
                Thread.Sleep(10);
            }
            Console.WriteLine("sealed data both ways, max payload " + a.MaxPayload);
            Console.WriteLine("names " + Native.CheckName(JoinerCheck.WrongCell) + " " + Native.CheckName(JoinerCheck.Bad));
        }
        return 0;
    }
}
