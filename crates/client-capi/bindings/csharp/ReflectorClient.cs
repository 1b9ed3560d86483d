// The reflector client from C#: P/Invoke over libreflector_c's C ABI
// (include/reflector_client.h). C# 7, no dependency beyond the base
// library: builds with Mono's mcs and in Unity (Mono or IL2CPP: no
// callbacks cross the boundary, events are polled).
//
// The native library's name is Native.Lib ("reflector_c": the loader
// looks for libreflector_c.so); change that one constant if you ship it
// under another name. A handle is used from one thread at a time (a
// game's main loop); errors throw ReflectorException with the library's
// message.
//
// Checkpoints (library 1.1): PollCheckpoint(out ev) each frame; answer a
// CheckpointKind.Requested with ProvideCheckpoint(tick, state) (the bytes
// are copied by the library before it returns), and copy a
// CheckpointKind.Ready's state out with TakeCheckpoint (the library keeps
// it until then). The exchanges run inside Update(), on its thread.
//
// Areas of interest (library 1.2): WithControl(..., areaRadius: 1,
// fallbackUrls: new[] { "https://control2.example" }) hears the cells
// around the player's; SetPosition(x, y) when the player crosses into
// another cell; EventKind.Moved (ev.FromGroup -> ev.Group) when sends
// switch to the new cell, EventKind.LeftGroup (ev.Group) for each group
// out of the new area once the new ones are members; SendingGroup,
// MemberGroups(). They throw with a 1.1 library (Native.Minor says which).
//
// The other checkpoint kept (library 1.4): FetchCheckpointOther(); its
// Ready or Empty event has Op == CheckpointOp.FetchOther (the latest's:
// CheckpointOp.Fetch).
//
// A game whose backend fetches the tokens, in a sealed group (library
// 1.6): Client.HandedIn() (no token yet), SignKey() to the backend's
// /join as sign_key (hex), then SetToken, SetEpochKeys (the grant's keys
// as EpochKey values) and SetCheckpointCertificate (control_public,
// certificate, expires_unix_s). A Failed fetch that the joiner's checks
// refused has ev.Check (Native.CheckName names it). With
// Client.HandedIn(keysFrom: "https://control.example") (library 1.8) the
// client asks that control server's /keys for the next epoch keys itself,
// so the backend need not hand each in before the current ones end.

using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;

namespace Reflector
{
    public enum Status
    {
        Ok = 0,
        None = 1,
        ErrNull = -1,
        ErrInvalidArgument = -2,
        ErrBadHandle = -3,
        ErrNotMember = -4,
        ErrTooLarge = -5,
        ErrIo = -6,
        ErrResolve = -7,
        ErrControl = -8,
        ErrJoinRefused = -9,
        ErrPanic = -10,
        ErrTableFull = -11,
        ErrBufferTooSmall = -12,
        ErrNotRequested = -13,
        ErrInFlight = -14,
        ErrNoChannel = -15,
        ErrTimedOut = -16,
        ErrRefused = -17,
        ErrProtocol = -18,
        ErrWrongState = -19,
    }

    public enum CheckpointKind
    {
        None = 0,
        Requested = 1,
        Uploaded = 2,
        Ready = 3,
        Empty = 4,
        Failed = 5,
    }

    public enum CheckpointOp
    {
        None = 0,
        Upload = 1,
        Fetch = 2,
        FetchOther = 3,
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct CheckpointEvent
    {
        public CheckpointKind Kind;
        public ushort Group;
        public CheckpointOp Op;
        public ulong Number;
        public ulong Tick;
        public uint FromPlayer;
        public uint AgeMs;
        public UIntPtr Len;
        public Status Error;
        public byte Refusal;
        /// <summary>READY: a <see cref="Verification"/> value (library 1.5, in 1.4's padding; 0 before).</summary>
        public Verification Verification;
        /// <summary>FAILED fetch the joiner's checks refused: which (library 1.6, in 1.5's padding; 0
        /// otherwise).</summary>
        public JoinerCheck Check;
    }

    // ---- Handed-in sealing (library 1.6) ----

    /// <summary>The joiner's check that refused a fetched sealed checkpoint, in the
    /// document's order (Native.CheckName gives its counter's name). Library 1.6.</summary>
    public enum JoinerCheck : byte
    {
        None = 0,
        Malformed = 1,
        Version = 2,
        WrongCell = 3,
        Mismatch = 4,
        BadCertificate = 5,
        ExpiredCertificate = 6,
        BadSignature = 7,
        NoKey = 8,
        Bad = 9,
    }

    /// <summary>rc_epoch_key: one entry of a grant's keys, its hex fields decoded
    /// (CellId 8 bytes, Key 32). Library 1.6.</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct EpochKey
    {
        public uint CellX, CellY, Epoch, Reserved;
        [MarshalAs(UnmanagedType.ByValArray, SizeConst = 8)] public byte[] CellId;
        [MarshalAs(UnmanagedType.ByValArray, SizeConst = 32)] public byte[] Key;
        public ulong StartsUnixS, EndsUnixS;
    }

    // ---- end of handed-in sealing ----

    /// <summary>How far a fetched checkpoint can be trusted (library 1.5).</summary>
    public enum Verification : byte
    {
        None = 0,
        Clear = 1,
        Signed = 2,
        VerifiedByTwo = 3,
        Disagree = 4,
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct CheckpointStats
    {
        public ulong Requested, Uploaded, Fetched, Failures;
    }

    /// <summary>Sealed groups' counters (library 1.5).</summary>
    public struct SealingStats
    {
        public ulong Malformed, Version, NoKey, Replay, Bad, KeysRequests, KeysRefreshes, KeysRefreshFailures;
        /// <summary>Fetched checkpoints a sealed group's joiner refused, per check.</summary>
        public ulong CheckpointMalformed, CheckpointVersion, CheckpointWrongCell, CheckpointMismatch,
            CheckpointBadCertificate, CheckpointExpiredCertificate, CheckpointBadSignature, CheckpointNoKey,
            CheckpointBad;
    }

    public enum EventKind
    {
        None = 0,
        Joined = 1,
        Rejoining = 2,
        Renewed = 3,
        TokenRequested = 4,
        TokenNeeded = 5,
        SenderHeard = 6,
        SenderSilent = 7,
        Left = 8,
        Error = 9,
        Moved = 10,
        LeftGroup = 11,
        MoveAsked = 12,
    }

    /// <summary>Group: Joined, Rejoining, Renewed, LeftGroup's group, Moved's new
    /// sending group; FromGroup: Moved's old one; MoveReason, WithinMs:
    /// MoveAsked's (1.2, all three in 1.1's padding).</summary>
    [StructLayout(LayoutKind.Sequential)]
    public struct Event
    {
        public EventKind Kind;
        public ushort Group;
        public ushort Members;
        public byte Rejoin;
        public ushort FromGroup;
        public int Reason;
        public uint Player;
        public ushort MoveReason;
        public ushort WithinMs;
        public ulong Instance;
        public ulong ExpiresUnixS;
        public Status Error;
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct DatagramInfo
    {
        public ushort Group;
        public uint Sender;
        public ulong Instance;
        public ulong Seq;
        public UIntPtr Len;
        public byte Truncated;
    }

    [StructLayout(LayoutKind.Sequential)]
    public struct Stats
    {
        public ulong DataSent, BytesSent, DataReceived, BytesReceived;
        public ulong Duplicates, Reordered, Gaps, TooLate, InboxFull;
        public ulong RttLastUs, RttSmoothedUs, RttMinUs;
        public ulong Joins, Rejoins, Renewals, TokenRequests;
    }

    /// <summary>One received datagram, its payload copied out.</summary>
    public struct Datagram
    {
        public ushort Group;
        public uint Sender;
        public ulong Instance;
        public ulong Seq;
        public byte[] Payload;
    }

    public class ReflectorException : Exception
    {
        public readonly Status Status;

        public ReflectorException(Status status, string message) : base(message + " (status " + (int)status + ")")
        {
            Status = status;
        }
    }

    /// <summary>The C functions, one to one.</summary>
    public static class Native
    {
        /// <summary>The native library's name, without "lib" and ".so".</summary>
        public const string Lib = "reflector_c";
        public const int VersionMajor = 1;
        /// <summary>The minor version areas of interest came with.</summary>
        public const int VersionMinorAreas = 2;
        /// <summary>An area's tokens handed in (rc_area_add_token, rc_set_area) came with 1.3.</summary>
        public const int VersionMinorHandedAreas = 3;
        /// <summary>The other checkpoint kept (rc_fetch_checkpoint_other) came with 1.4.</summary>
        public const int VersionMinorFetchOther = 4;
        /// <summary>Sealed groups' counters (rc_sealing_stats) came with 1.5.</summary>
        public const int VersionMinorSealing = 5;
        /// <summary>Sealing for a game that fetches its own tokens came with 1.6.</summary>
        public const int VersionMinorHandedSealing = 6;
        public const int SignKeyLen = 32;
        public const int CertificateLen = 64;
        public const int EpochKeyLen = 32;
        public const int CellIdLen = 8;
        /// <summary>Sealed duplicate deliveries counted apart (rc_sealing_duplicates) came with 1.7.</summary>
        public const int VersionMinorSealedDuplicates = 7;
        /// <summary>/keys for a client handed its tokens (rc_config_new_handed_in,
        /// rc_config_set_keys_from) came with 1.8.</summary>
        public const int VersionMinorKeysFrom = 8;
        public const int TokenLen = 32;
        public const int SessionKeyLen = 32;
        public const int MaxPayload = 1440;

        [DllImport(Lib)] public static extern uint rc_version();
        [DllImport(Lib)] public static extern ulong rc_now_ms();
        [DllImport(Lib)] public static extern UIntPtr rc_last_error(byte[] buf, UIntPtr cap);

        [DllImport(Lib)]
        public static extern Status rc_client_new_with_token(byte[] token, UIntPtr tokenLen, byte[] sessionKey,
            UIntPtr sessionKeyLen, uint player, ushort group, byte[] reflector, ulong expiresUnixS, byte[] local,
            out ulong handle);

        [DllImport(Lib)]
        public static extern Status rc_client_new_control(byte[] url, byte[] ticket, uint player, double x, double y,
            byte[] caFile, int allowPlainHttp, byte[] local, out ulong handle);

        [DllImport(Lib)] public static extern Status rc_update(ulong h, ulong nowMs);
        [DllImport(Lib)] public static extern Status rc_poll_event(ulong h, out Event ev);
        [DllImport(Lib)] public static extern Status rc_recv(ulong h, byte[] buf, UIntPtr cap, out DatagramInfo info);
        [DllImport(Lib)] public static extern Status rc_send(ulong h, byte[] data, UIntPtr len, out ulong seq);
        [DllImport(Lib)] public static extern Status rc_stats(ulong h, out Stats stats);
        [DllImport(Lib)] public static extern long rc_max_payload(ulong h);
        [DllImport(Lib)] public static extern int rc_is_member(ulong h);
        [DllImport(Lib)] public static extern Status rc_leave(ulong h);
        [DllImport(Lib)] public static extern Status rc_free(ulong h);
        [DllImport(Lib)] public static extern Status rc_poll_checkpoint(ulong h, out CheckpointEvent ev);
        [DllImport(Lib)] public static extern Status rc_provide_checkpoint(ulong h, ulong tick, byte[] state, UIntPtr len);
        [DllImport(Lib)] public static extern Status rc_fetch_checkpoint(ulong h);
        [DllImport(Lib)] public static extern Status rc_fetch_checkpoint_other(ulong h);

        [DllImport(Lib)]
        public static extern Status rc_checkpoint_take(ulong h, byte[] buf, UIntPtr cap, out UIntPtr len,
            out ulong tick);

        [DllImport(Lib)]
        public static extern Status rc_checkpoint_configure(ulong h, int fetchOnJoin, ulong timeoutMs, ulong maxBytes);

        [DllImport(Lib)] public static extern Status rc_checkpoint_stats(ulong h, out CheckpointStats stats);
        [DllImport(Lib)] public static extern Status rc_sealing_stats(ulong h, out SealingStats stats);
        [DllImport(Lib)] public static extern Status rc_sealing_duplicates(ulong h, out ulong count);

        // ---- Handed-in sealing (library 1.6) ----
        [DllImport(Lib)] public static extern Status rc_client_new_handed_in(byte[] local, out ulong handle);
        [DllImport(Lib)] public static extern Status rc_sign_key(ulong h, byte[] buf, UIntPtr cap);
        [DllImport(Lib)]
        public static extern Status rc_set_epoch_keys(ulong h, ushort group, [In] EpochKey[] keys, UIntPtr n);
        [DllImport(Lib)]
        public static extern Status rc_set_checkpoint_certificate(ulong h, ushort group, byte[] controlPublic,
            UIntPtr controlPublicLen, byte[] certificate, UIntPtr certificateLen, ulong expiresUnixS);
        [DllImport(Lib)] public static extern IntPtr rc_check_name(byte check);

        /// <summary>The name of a joiner's check ("checkpoint_wrong_cell", ...), or
        /// null for None and values the library does not know. Library 1.6.</summary>
        public static string CheckName(JoinerCheck check)
        {
            Need(VersionMinorHandedSealing, "CheckName");
            var p = rc_check_name((byte)check);
            return p == IntPtr.Zero ? null : Marshal.PtrToStringAnsi(p);
        }
        // ---- end of handed-in sealing ----

        // ---- Keys from a control server (library 1.8) ----
        [DllImport(Lib)] public static extern Status rc_config_new_handed_in(byte[] local, out ulong config);
        [DllImport(Lib)]
        public static extern Status rc_config_set_keys_from(ulong config, byte[] url, byte[] caFile,
            int allowPlainHttp);
        // ---- end of keys from a control server ----

        [DllImport(Lib)]
        public static extern Status rc_config_new_control(byte[] url, byte[] ticket, uint player, double x, double y,
            byte[] caFile, int allowPlainHttp, byte[] local, out ulong config);

        [DllImport(Lib)] public static extern Status rc_config_set_area_radius(ulong config, byte radius);
        [DllImport(Lib)] public static extern Status rc_config_add_fallback_url(ulong config, byte[] url);
        [DllImport(Lib)] public static extern Status rc_client_new_from_config(ulong config, out ulong handle);
        [DllImport(Lib)] public static extern Status rc_config_free(ulong config);
        [DllImport(Lib)] public static extern Status rc_set_position(ulong h, double x, double y);

        [DllImport(Lib)]
        public static extern Status rc_set_token(ulong h, byte[] token, UIntPtr tokenLen, byte[] sessionKey,
            UIntPtr sessionKeyLen, uint player, ushort group, byte[] reflector, ulong expiresUnixS);

        [DllImport(Lib)]
        public static extern Status rc_area_add_token(ulong h, byte[] token, UIntPtr tokenLen, byte[] sessionKey,
            UIntPtr sessionKeyLen, uint player, ushort group, byte[] reflector, ulong expiresUnixS);

        [DllImport(Lib)] public static extern Status rc_set_area(ulong h);
        [DllImport(Lib)] public static extern Status rc_sending_group(ulong h, out ushort group);

        [DllImport(Lib)]
        public static extern Status rc_member_groups(ulong h, ushort[] groups, UIntPtr cap, out UIntPtr count);

        /// <summary>The library's minor version.</summary>
        public static int Minor { get { return (int)(rc_version() & 0xffff); } }

        /// <summary>Throws unless the library is at least 1.wanted.</summary>
        public static void Need(int wanted, string what)
        {
            if (Minor < wanted)
                throw new ReflectorException(Status.ErrInvalidArgument,
                    what + " needs library 1." + wanted + "; this one is 1." + Minor);
        }

        /// <summary>This thread's last error message.</summary>
        public static string LastError()
        {
            var n = (int)rc_last_error(null, UIntPtr.Zero);
            var buf = new byte[n + 1];
            rc_last_error(buf, (UIntPtr)buf.Length);
            return Encoding.UTF8.GetString(buf, 0, n);
        }

        /// <summary>A NUL-terminated UTF-8 string (null stays null).</summary>
        public static byte[] Utf8(string s)
        {
            if (s == null) return null;
            var b = Encoding.UTF8.GetBytes(s);
            Array.Resize(ref b, b.Length + 1);
            return b;
        }

        public static long Check(long code)
        {
            if (code < 0) throw new ReflectorException((Status)code, LastError());
            return code;
        }

        public static Status Check(Status s)
        {
            Check((long)s);
            return s;
        }
    }

    /// <summary>One reflector client (one handle).</summary>
    public sealed class Client : IDisposable
    {
        public readonly ulong Handle;
        private readonly byte[] buf = new byte[Native.MaxPayload];
        private bool freed;

        private Client(ulong handle)
        {
            Handle = handle;
        }

        private static void CheckVersion()
        {
            var major = Native.rc_version() >> 16;
            if (major != Native.VersionMajor)
                throw new ReflectorException(Status.ErrInvalidArgument,
                    "library major version " + major + ", this binding " + Native.VersionMajor);
        }

        /// <summary>A client with a token handed in (from the game's backend).</summary>
        public static Client WithToken(byte[] token, byte[] sessionKey, uint player, ushort group, string reflector,
            ulong expiresUnixS, string local = null)
        {
            CheckVersion();
            ulong h;
            Native.Check(Native.rc_client_new_with_token(token, (UIntPtr)token.Length, sessionKey,
                (UIntPtr)sessionKey.Length, player, group, Native.Utf8(reflector), expiresUnixS, Native.Utf8(local),
                out h));
            return new Client(h);
        }

        /// <summary>A client that asks the control server for its tokens. An area
        /// (areaRadius > 0: the cells around the player's, 2 at most) or
        /// fallbackUrls (more control servers of the world, tried in turn when
        /// one cannot answer) need library 1.2: they go through an rc_config,
        /// freed before this returns.</summary>
        public static Client WithControl(string url, string ticket, uint player, double x, double y,
            string caFile = null, bool allowPlainHttp = false, string local = null, byte areaRadius = 0,
            string[] fallbackUrls = null)
        {
            CheckVersion();
            ulong h;
            if (areaRadius == 0 && (fallbackUrls == null || fallbackUrls.Length == 0))
            {
                Native.Check(Native.rc_client_new_control(Native.Utf8(url), Native.Utf8(ticket), player, x, y,
                    Native.Utf8(caFile), allowPlainHttp ? 1 : 0, Native.Utf8(local), out h));
                return new Client(h);
            }
            Native.Need(Native.VersionMinorAreas, "an area or fallback URLs");
            ulong cfg;
            Native.Check(Native.rc_config_new_control(Native.Utf8(url), Native.Utf8(ticket), player, x, y,
                Native.Utf8(caFile), allowPlainHttp ? 1 : 0, Native.Utf8(local), out cfg));
            try
            {
                Native.Check(Native.rc_config_set_area_radius(cfg, areaRadius));
                if (fallbackUrls != null)
                    foreach (var u in fallbackUrls) Native.Check(Native.rc_config_add_fallback_url(cfg, Native.Utf8(u)));
                Native.Check(Native.rc_client_new_from_config(cfg, out h));
            }
            finally
            {
                Native.rc_config_free(cfg);
            }
            return new Client(h);
        }

        /// <summary>All the I/O that is due; call it every frame.</summary>
        public void Update()
        {
            Native.Check(Native.rc_update(Handle, Native.rc_now_ms()));
        }

        /// <summary>The next event, or false when there is none.</summary>
        public bool PollEvent(out Event ev)
        {
            return Native.Check(Native.rc_poll_event(Handle, out ev)) == Status.Ok;
        }

        /// <summary>The next datagram, or false when none is waiting.</summary>
        public bool Recv(out Datagram d)
        {
            DatagramInfo info;
            d = default(Datagram);
            if (Native.Check(Native.rc_recv(Handle, buf, (UIntPtr)buf.Length, out info)) != Status.Ok) return false;
            var n = Math.Min((int)(ulong)info.Len, buf.Length);
            var payload = new byte[n];
            Buffer.BlockCopy(buf, 0, payload, 0, n);
            d = new Datagram
            {
                Group = info.Group, Sender = info.Sender, Instance = info.Instance, Seq = info.Seq, Payload = payload,
            };
            return true;
        }

        /// <summary>Sends to the group; the datagram's sequence number.</summary>
        public ulong Send(byte[] payload)
        {
            ulong seq;
            Native.Check(Native.rc_send(Handle, payload, (UIntPtr)payload.Length, out seq));
            return seq;
        }

        public Stats GetStats()
        {
            Stats s;
            Native.Check(Native.rc_stats(Handle, out s));
            return s;
        }

        public long MaxPayload { get { return Native.Check(Native.rc_max_payload(Handle)); } }

        public bool IsMember { get { return Native.Check(Native.rc_is_member(Handle)) == 1; } }

        public void Leave()
        {
            Native.Check(Native.rc_leave(Handle));
        }

        /// <summary>Hands in a new token (after EventKind.TokenNeeded, or to move to
        /// another group); arguments as WithToken.</summary>
        public void SetToken(byte[] token, byte[] sessionKey, uint player, ushort group, string reflector,
            ulong expiresUnixS)
        {
            Native.Check(Native.rc_set_token(Handle, token, (UIntPtr)token.Length, sessionKey,
                (UIntPtr)sessionKey.Length, player, group, Native.Utf8(reflector), expiresUnixS));
        }

        /// <summary>Adds one token of an area the game's backend fetched
        /// (GET /join?...&amp;area=R): the player's own cell first, then the other
        /// groups of the area, nearest first; nothing changes until SetArea. A
        /// refused token empties what was added. Library 1.3.</summary>
        public void AddAreaToken(byte[] token, byte[] sessionKey, uint player, ushort group, string reflector,
            ulong expiresUnixS)
        {
            Native.Need(Native.VersionMinorHandedAreas, "AddAreaToken");
            Native.Check(Native.rc_area_add_token(Handle, token, (UIntPtr)token.Length, sessionKey,
                (UIntPtr)sessionKey.Length, player, group, Native.Utf8(reflector), expiresUnixS));
        }

        /// <summary>Hands in the tokens added since the last call: groups held
        /// that are still in the area are renewed, new ones joined, the others
        /// left once the new ones are members (EventKind.Moved,
        /// EventKind.LeftGroup). Library 1.3.</summary>
        public void SetArea()
        {
            Native.Need(Native.VersionMinorHandedAreas, "SetArea");
            Native.Check(Native.rc_set_area(Handle));
        }

        /// <summary>The player moved to (x, y): the area there is asked for (one
        /// request: call it when the player crosses into another cell). Then
        /// EventKind.Moved when sends switch to the new cell, EventKind.LeftGroup
        /// for each group out of the new area once the new ones are members.
        /// Library 1.2.</summary>
        public void SetPosition(double x, double y)
        {
            Native.Need(Native.VersionMinorAreas, "SetPosition");
            Native.Check(Native.rc_set_position(Handle, x, y));
        }

        /// <summary>The group Send goes to now, or null. Library 1.2.</summary>
        public ushort? SendingGroup
        {
            get
            {
                Native.Need(Native.VersionMinorAreas, "SendingGroup");
                ushort g;
                return Native.Check(Native.rc_sending_group(Handle, out g)) == Status.Ok ? g : (ushort?)null;
            }
        }

        /// <summary>The groups the client is a member of now, sorted. Library 1.2.</summary>
        public ushort[] MemberGroups()
        {
            Native.Need(Native.VersionMinorAreas, "MemberGroups");
            var buf = new ushort[25];
            UIntPtr count;
            var s = Native.rc_member_groups(Handle, buf, (UIntPtr)buf.Length, out count);
            if (s == Status.ErrBufferTooSmall)
            {
                buf = new ushort[(int)(ulong)count];
                s = Native.rc_member_groups(Handle, buf, (UIntPtr)buf.Length, out count);
            }
            Native.Check(s);
            var groups = new ushort[Math.Min((int)(ulong)count, buf.Length)];
            Array.Copy(buf, groups, groups.Length);
            Array.Sort(groups);
            return groups;
        }

        /// <summary>The next checkpoint event, or false when there is none. A Ready
        /// event's state waits for TakeCheckpoint; a Failed one's message is
        /// Native.LastError() on this thread.</summary>
        public bool PollCheckpoint(out CheckpointEvent ev)
        {
            return Native.Check(Native.rc_poll_checkpoint(Handle, out ev)) == Status.Ok;
        }

        /// <summary>Answers the reflector's request with the game's state at tick
        /// (copied by the library before this returns).</summary>
        public void ProvideCheckpoint(ulong tick, byte[] state)
        {
            Native.Check(Native.rc_provide_checkpoint(Handle, tick, state, (UIntPtr)state.Length));
        }

        /// <summary>Fetches the group's latest checkpoint (the outcome is an event).</summary>
        public void FetchCheckpoint()
        {
            Native.Check(Native.rc_fetch_checkpoint(Handle));
        }

        /// <summary>Fetches the other checkpoint the reflector keeps for the group
        /// (the one before the latest, from another member when it has one): a
        /// Ready or Empty event (fewer than two stored) with Op
        /// CheckpointOp.FetchOther. Library 1.4.</summary>
        public void FetchCheckpointOther()
        {
            Native.Need(Native.VersionMinorFetchOther, "FetchCheckpointOther");
            Native.Check(Native.rc_fetch_checkpoint_other(Handle));
        }

        /// <summary>The state of the last Ready event and its tick, or false when
        /// none waits: its size asked first, then copied into an array that
        /// large.</summary>
        public bool TakeCheckpoint(out byte[] state, out ulong tick)
        {
            UIntPtr len;
            state = null;
            var s = Native.rc_checkpoint_take(Handle, null, UIntPtr.Zero, out len, out tick);
            if (s == Status.None) return false;
            if (s == Status.Ok)
            {
                state = new byte[0];
                return true;
            }
            if (s != Status.ErrBufferTooSmall) Native.Check(s);
            var buf = new byte[(int)(ulong)len];
            Native.Check(Native.rc_checkpoint_take(Handle, buf, (UIntPtr)buf.Length, out len, out tick));
            state = buf;
            return true;
        }

        /// <summary>Checkpoint settings (0 keeps the timeout or bound); before the
        /// first Update for the first join to see them.</summary>
        public void CheckpointConfigure(bool fetchOnJoin, ulong timeoutMs = 0, ulong maxBytes = 0)
        {
            Native.Check(Native.rc_checkpoint_configure(Handle, fetchOnJoin ? 1 : 0, timeoutMs, maxBytes));
        }

        public CheckpointStats GetCheckpointStats()
        {
            CheckpointStats s;
            Native.Check(Native.rc_checkpoint_stats(Handle, out s));
            return s;
        }

        // ---- Handed-in sealing (library 1.6) ----

        /// <summary>A client handed its tokens that has none yet: nothing is sent
        /// until SetToken (or AddAreaToken and SetArea); its SignKey() is there at
        /// once, for the /join that brings the first token.
        ///
        /// keysFrom (library 1.8): the control server (its URL) the client asks
        /// GET /keys for a sealed group's next epoch keys, with the membership's
        /// token, when the newest key held nears its end; then fallbackUrls in
        /// turn when one cannot answer; caFile a PEM file of a private CA,
        /// allowPlainHttp for http:// (closed labs). Each is checked here (a bad
        /// one throws, saying what); they go through an rc_config, freed before
        /// this returns. Without it the backend hands every key in
        /// (SetEpochKeys).</summary>
        public static Client HandedIn(string local = null, string keysFrom = null, string caFile = null,
            bool allowPlainHttp = false, string[] fallbackUrls = null)
        {
            CheckVersion();
            Native.Need(Native.VersionMinorHandedSealing, "HandedIn");
            ulong h;
            if (keysFrom == null && caFile == null && !allowPlainHttp &&
                (fallbackUrls == null || fallbackUrls.Length == 0))
            {
                Native.Check(Native.rc_client_new_handed_in(Native.Utf8(local), out h));
                return new Client(h);
            }
            Native.Need(Native.VersionMinorKeysFrom, "keysFrom");
            if (keysFrom == null)
                throw new ReflectorException(Status.ErrInvalidArgument,
                    "fallbackUrls, caFile and allowPlainHttp are keysFrom's: name keysFrom");
            ulong cfg;
            Native.Check(Native.rc_config_new_handed_in(Native.Utf8(local), out cfg));
            try
            {
                Native.Check(Native.rc_config_set_keys_from(cfg, Native.Utf8(keysFrom), Native.Utf8(caFile),
                    allowPlainHttp ? 1 : 0));
                if (fallbackUrls != null)
                    foreach (var u in fallbackUrls) Native.Check(Native.rc_config_add_fallback_url(cfg, Native.Utf8(u)));
                Native.Check(Native.rc_client_new_from_config(cfg, out h));
            }
            finally
            {
                Native.rc_config_free(cfg);
            }
            return new Client(h);
        }

        /// <summary>The client's checkpoint signing key (32 bytes): send it, hex, as
        /// sign_key on every /join for this client.</summary>
        public byte[] SignKey()
        {
            Native.Need(Native.VersionMinorHandedSealing, "SignKey");
            var k = new byte[Native.SignKeyLen];
            Native.Check(Native.rc_sign_key(Handle, k, (UIntPtr)k.Length));
            return k;
        }

        /// <summary>Hands in the epoch keys of group (its grant's keys, in the
        /// answer's order). A CellId or Key of another length throws, naming it.</summary>
        public void SetEpochKeys(ushort group, EpochKey[] keys)
        {
            Native.Need(Native.VersionMinorHandedSealing, "SetEpochKeys");
            for (var i = 0; i < keys.Length; i++)
            {
                if (keys[i].CellId == null || keys[i].CellId.Length != Native.CellIdLen)
                    throw new ReflectorException(Status.ErrInvalidArgument, "epoch key " + i + ": CellId is " +
                        (keys[i].CellId == null ? 0 : keys[i].CellId.Length) + " bytes; it must be " + Native.CellIdLen);
                if (keys[i].Key == null || keys[i].Key.Length != Native.EpochKeyLen)
                    throw new ReflectorException(Status.ErrInvalidArgument, "epoch key " + i + ": Key is " +
                        (keys[i].Key == null ? 0 : keys[i].Key.Length) + " bytes; it must be " + Native.EpochKeyLen);
            }
            Native.Check(Native.rc_set_epoch_keys(Handle, group, keys, (UIntPtr)keys.Length));
        }

        /// <summary>Hands in group's checkpoint certificate: the grant's
        /// control_public and certificate (decoded; the library checks their
        /// lengths) and its expires_unix_s.</summary>
        public void SetCheckpointCertificate(ushort group, byte[] controlPublic, byte[] certificate,
            ulong expiresUnixS)
        {
            Native.Need(Native.VersionMinorHandedSealing, "SetCheckpointCertificate");
            Native.Check(Native.rc_set_checkpoint_certificate(Handle, group, controlPublic,
                (UIntPtr)controlPublic.Length, certificate, (UIntPtr)certificate.Length, expiresUnixS));
        }

        // ---- end of handed-in sealing ----

        /// <summary>Sealed groups' counters. Library 1.5.</summary>
        public SealingStats GetSealingStats()
        {
            Native.Need(Native.VersionMinorSealing, "GetSealingStats");
            SealingStats s;
            Native.Check(Native.rc_sealing_stats(Handle, out s));
            return s;
        }

        /// <summary>Sealed duplicate deliveries dropped (another group's copy of a datagram
        /// already received; not a replay). Library 1.7.</summary>
        public ulong GetSealingDuplicates()
        {
            Native.Need(Native.VersionMinorSealedDuplicates, "GetSealingDuplicates");
            ulong n;
            Native.Check(Native.rc_sealing_duplicates(Handle, out n));
            return n;
        }

        /// <summary>Frees the handle (once; later calls on it throw).</summary>
        public void Dispose()
        {
            if (freed) return;
            freed = true;
            Native.Check(Native.rc_free(Handle));
        }
    }
}
