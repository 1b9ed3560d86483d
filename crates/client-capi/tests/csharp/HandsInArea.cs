// The C# binding's area hand-in (library 1.3), run by
// tests/csharp_binding.rs against a real reflector: the same check as the
// Python one. A client made with its cell's token is handed an area of two
// groups (AddAreaToken, SetArea) and must become a member of both, sending
// to the first; a group added twice is refused with the library's message
// (and the area being added dropped); SetToken marshals its lengths (a
// 5-byte token refused) and renews with a good one.
//
//   mono hands_in_area.exe CELL_SPEC OTHER_SPEC
//
// A SPEC is PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX, for a reflector on
// 127.0.0.1 whose port is the group. Lines: "refused STATUS MESSAGE",
// "set_token refused STATUS MESSAGE", "members of [G, G] sending to G",
// "renewed". Exit 1 on anything unexpected.

using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using Reflector;

public static class HandsInArea
{
    private struct Spec
    {
        public uint Player;
        public ushort Group;
        public ulong Expires;
        public byte[] Token;
        public byte[] Key;
        public string Reflector { get { return "127.0.0.1:" + Group.ToString(CultureInfo.InvariantCulture); } }
    }

    private static byte[] Hex(string s)
    {
        var b = new byte[s.Length / 2];
        for (var i = 0; i < b.Length; i++) b[i] = byte.Parse(s.Substring(2 * i, 2), NumberStyles.HexNumber);
        return b;
    }

    private static Spec Parse(string spec)
    {
        var p = spec.Split(':');
        var inv = CultureInfo.InvariantCulture;
        return new Spec
        {
            Player = uint.Parse(p[0], inv),
            Group = ushort.Parse(p[1], inv),
            Expires = ulong.Parse(p[2], inv),
            Token = Hex(p[3]),
            Key = Hex(p[4]),
        };
    }

    private static void Add(Client c, Spec s)
    {
        c.AddAreaToken(s.Token, s.Key, s.Player, s.Group, s.Reflector, s.Expires);
    }

    public static int Main(string[] args)
    {
        if (args.Length != 2)
        {
            Console.Error.WriteLine("usage: hands_in_area.exe CELL_SPEC OTHER_SPEC");
            return 2;
        }
        var cell = Parse(args[0]);
        var other = Parse(args[1]);
        using (var c = Client.WithToken(cell.Token, cell.Key, cell.Player, cell.Group, cell.Reflector, cell.Expires,
                   "127.0.0.1:0"))
        {
            try
            {
                Add(c, cell);
                Add(c, cell);
                Console.Error.WriteLine("a group twice was taken");
                return 1;
            }
            catch (ReflectorException e)
            {
                Console.WriteLine("refused " + (int)e.Status + " " + e.Message);
            }
            Add(c, cell);
            Add(c, other);
            c.SetArea();
            var want = new[] { cell.Group, other.Group };
            Array.Sort(want);
            var clock = Stopwatch.StartNew();
            ushort[] groups = c.MemberGroups();
            while (groups.Length != 2 || groups[0] != want[0] || groups[1] != want[1])
            {
                if (clock.Elapsed.TotalSeconds > 10)
                {
                    Console.Error.WriteLine("not a member of both groups: [" + string.Join(", ", groups) + "]");
                    return 1;
                }
                c.Update();
                Event ev;
                while (c.PollEvent(out ev))
                {
                    if (ev.Kind == EventKind.Error) Console.WriteLine("error " + (int)ev.Error + " " + Native.LastError());
                }
                Thread.Sleep(1);
                groups = c.MemberGroups();
            }
            var sending = c.SendingGroup;
            Console.WriteLine("members of [" + string.Join(", ", groups) + "] sending to " +
                (sending.HasValue ? sending.Value.ToString(CultureInfo.InvariantCulture) : "none"));

            try
            {
                c.SetToken(new byte[5], cell.Key, cell.Player, cell.Group, cell.Reflector, cell.Expires);
                Console.Error.WriteLine("a 5-byte token was taken");
                return 1;
            }
            catch (ReflectorException e)
            {
                Console.WriteLine("set_token refused " + (int)e.Status + " " + e.Message);
            }
            // The cell's own token again: a renewal of that group, no error.
            c.SetToken(cell.Token, cell.Key, cell.Player, cell.Group, cell.Reflector, cell.Expires);
            Console.WriteLine("renewed");
        }
        return 0;
    }
}
