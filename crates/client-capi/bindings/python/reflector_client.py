"""The reflector client from Python: ctypes over libreflector_c's C ABI
(include/reflector_client.h), no other dependency.

    import reflector_client as rc
    lib = rc.load()                              # or rc.load("/path/to/libreflector_c.so")
    c = rc.Client.with_token(lib, token, key, player, group, "host:port", expires)
    while playing:
        c.update()                               # every frame
        for ev in c.events(): ...
        for d in c.datagrams(): ...              # d.sender, d.seq, d.payload
        c.send(b"...")
        for ck in c.checkpoint_events():         # checkpoints (library 1.1)
            if ck.kind == rc.RC_CHECKPOINT_REQUESTED:
                c.provide_checkpoint(tick, game_state_bytes)
            elif ck.kind == rc.RC_CHECKPOINT_READY:
                tick, state = c.take_checkpoint()
    c.close()

The other checkpoint the reflector keeps (library 1.4): c.fetch_checkpoint_other();
its READY or EMPTY event has ck.op == rc.RC_CHECKPOINT_OP_FETCH_OTHER (the latest's:
RC_CHECKPOINT_OP_FETCH).

A game whose backend fetches the tokens, in a sealed group (library 1.6):

    c = rc.Client.handed_in(lib)                 # no token yet, nothing sent
    answer = backend_join(sign_key=c.sign_key().hex())   # GET /join?...&sign_key=HEX
    c.hand_in(answer)                            # token, keys, control_public + certificate
    # a FAILED fetch a joiner's check refused: ck.check, rc.check_name(lib, ck.check)

The client asks the control server's /keys for the next epoch keys itself
(library 1.8) when it is told where (else the backend hands each in):

    c = rc.Client.handed_in(lib, keys_from="https://control.example",
                            fallback_urls=["https://control2.example"])

An area of interest and more control servers (library 1.2):

    c = rc.Client.with_control(lib, "https://control.example", ticket, player, x, y,
                               area_radius=1, fallback_urls=["https://control2.example"])
    c.set_position(x, y)                         # crossed into another cell
    # events: RC_EVENT_MOVED (ev.from_group -> ev.group), RC_EVENT_LEFT_GROUP (ev.group)
    c.sending_group(), c.member_groups()

A handle is used from one thread at a time; errors raise ReflectorError
with the library's message. Checkpoint exchanges run inside update(); the
bytes given to provide_checkpoint are copied by the library at once, and a
fetched state is the library's until take_checkpoint copies it out.
"""

import ctypes
import os

REFLECTOR_C_VERSION_MAJOR = 1
# The checkpoint functions came with 1.1.
REFLECTOR_C_VERSION_MINOR_CHECKPOINTS = 1
# Areas of interest (rc_config, rc_set_position, ...) came with 1.2.
REFLECTOR_C_VERSION_MINOR_AREAS = 2
# An area's tokens handed in (rc_area_add_token, rc_set_area) came with 1.3.
REFLECTOR_C_VERSION_MINOR_HANDED_AREAS = 3
# The other checkpoint kept (rc_fetch_checkpoint_other) came with 1.4.
REFLECTOR_C_VERSION_MINOR_FETCH_OTHER = 4
# Sealed groups' counters (rc_sealing_stats) came with 1.5.
REFLECTOR_C_VERSION_MINOR_SEALING = 5
# Sealing for a game that fetches its own tokens (rc_client_new_handed_in,
# rc_sign_key, rc_set_epoch_keys, rc_set_checkpoint_certificate,
# CheckpointEvent.check, rc_check_name) came with 1.6.
REFLECTOR_C_VERSION_MINOR_HANDED_SEALING = 6
# Sealed duplicate deliveries counted apart (rc_sealing_duplicates) came with 1.7.
REFLECTOR_C_VERSION_MINOR_SEALED_DUPLICATES = 7
# /keys for a client handed its tokens (rc_config_new_handed_in,
# rc_config_set_keys_from) came with 1.8.
REFLECTOR_C_VERSION_MINOR_KEYS_FROM = 8
RC_MAX_AREA_TOKENS = 25
RC_TOKEN_LEN = 32
RC_SESSION_KEY_LEN = 32
RC_MAX_PAYLOAD = 1440

RC_OK = 0
RC_NONE = 1
RC_ERR_BAD_HANDLE = -3
RC_ERR_NOT_MEMBER = -4
RC_ERR_TOO_LARGE = -5
RC_ERR_BUFFER_TOO_SMALL = -12
RC_ERR_NOT_REQUESTED = -13
RC_ERR_IN_FLIGHT = -14
RC_ERR_NO_CHANNEL = -15
RC_ERR_TIMED_OUT = -16
RC_ERR_REFUSED = -17
RC_ERR_PROTOCOL = -18
RC_ERR_WRONG_STATE = -19

RC_CHECKPOINT_NONE = 0
RC_CHECKPOINT_REQUESTED = 1
RC_CHECKPOINT_UPLOADED = 2
RC_CHECKPOINT_READY = 3
RC_CHECKPOINT_EMPTY = 4
RC_CHECKPOINT_FAILED = 5

RC_CHECKPOINT_OP_UPLOAD = 1
RC_CHECKPOINT_OP_FETCH = 2
RC_CHECKPOINT_OP_FETCH_OTHER = 3

# CheckpointEvent.verification of a READY event (library 1.5; 0 before).
RC_VERIFICATION_NONE = 0
RC_VERIFICATION_CLEAR = 1
RC_VERIFICATION_SIGNED = 2
RC_VERIFICATION_VERIFIED_BY_TWO = 3
RC_VERIFICATION_DISAGREE = 4

# ---- Handed-in sealing (library 1.6) ----
RC_SIGN_KEY_LEN = 32
RC_CERTIFICATE_LEN = 64
RC_EPOCH_KEY_LEN = 32
RC_CELL_ID_LEN = 8
RC_MAX_EPOCH_KEYS = 128
# CheckpointEvent.check of a FAILED fetch the joiner's checks refused
# (library 1.6; 0 otherwise), in the document's order; check_name() names them.
RC_CHECK_NONE = 0
RC_CHECK_MALFORMED = 1
RC_CHECK_VERSION = 2
RC_CHECK_WRONG_CELL = 3
RC_CHECK_MISMATCH = 4
RC_CHECK_BAD_CERTIFICATE = 5
RC_CHECK_EXPIRED_CERTIFICATE = 6
RC_CHECK_BAD_SIGNATURE = 7
RC_CHECK_NO_KEY = 8
RC_CHECK_BAD = 9
# ---- end of handed-in sealing ----

RC_EVENT_NONE = 0
RC_EVENT_JOINED = 1
RC_EVENT_REJOINING = 2
RC_EVENT_RENEWED = 3
RC_EVENT_TOKEN_REQUESTED = 4
RC_EVENT_TOKEN_NEEDED = 5
RC_EVENT_SENDER_HEARD = 6
RC_EVENT_SENDER_SILENT = 7
RC_EVENT_LEFT = 8
RC_EVENT_ERROR = 9
RC_EVENT_MOVED = 10
RC_EVENT_LEFT_GROUP = 11
RC_EVENT_MOVE_ASKED = 12

EVENT_NAMES = {
    RC_EVENT_JOINED: "joined",
    RC_EVENT_REJOINING: "rejoining",
    RC_EVENT_RENEWED: "renewed",
    RC_EVENT_TOKEN_REQUESTED: "token_requested",
    RC_EVENT_TOKEN_NEEDED: "token_needed",
    RC_EVENT_SENDER_HEARD: "sender_heard",
    RC_EVENT_SENDER_SILENT: "sender_silent",
    RC_EVENT_LEFT: "left",
    RC_EVENT_ERROR: "error",
    RC_EVENT_MOVED: "moved",
    RC_EVENT_LEFT_GROUP: "left_group",
    RC_EVENT_MOVE_ASKED: "move_asked",
}


class Event(ctypes.Structure):
    """`group`: JOINED, REJOINING, RENEWED, LEFT_GROUP's group, MOVED's new
    sending group; `from_group`: MOVED's old one; `move_reason`, `within_ms`:
    MOVE_ASKED's (1.2, all three in 1.1's padding)."""
    _fields_ = [
        ("kind", ctypes.c_int),
        ("group", ctypes.c_uint16),
        ("members", ctypes.c_uint16),
        ("rejoin", ctypes.c_uint8),
        ("from_group", ctypes.c_uint16),
        ("reason", ctypes.c_int),
        ("player", ctypes.c_uint32),
        ("move_reason", ctypes.c_uint16),
        ("within_ms", ctypes.c_uint16),
        ("instance", ctypes.c_uint64),
        ("expires_unix_s", ctypes.c_uint64),
        ("error", ctypes.c_int),
    ]

    @property
    def name(self):
        return EVENT_NAMES.get(self.kind, "unknown")


class CheckpointEvent(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("group", ctypes.c_uint16),
        ("op", ctypes.c_int),
        ("number", ctypes.c_uint64),
        ("tick", ctypes.c_uint64),
        ("from_player", ctypes.c_uint32),
        ("age_ms", ctypes.c_uint32),
        ("len", ctypes.c_size_t),
        ("error", ctypes.c_int),
        ("refusal", ctypes.c_uint8),
        # Since 1.5, in 1.4's padding: an RC_VERIFICATION_* value.
        ("verification", ctypes.c_uint8),
        # Since 1.6, in 1.5's padding: an RC_CHECK_* value.
        ("check", ctypes.c_uint8),
    ]


class EpochKey(ctypes.Structure):
    """rc_epoch_key (library 1.6): one entry of a grant's `keys`, decoded."""
    _fields_ = [
        ("cell_x", ctypes.c_uint32),
        ("cell_y", ctypes.c_uint32),
        ("epoch", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("cell_id", ctypes.c_uint8 * RC_CELL_ID_LEN),
        ("key", ctypes.c_uint8 * RC_EPOCH_KEY_LEN),
        ("starts_unix_s", ctypes.c_uint64),
        ("ends_unix_s", ctypes.c_uint64),
    ]


class CheckpointStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("requested", "uploaded", "fetched", "failures")]


class SealingStats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "malformed", "version", "no_key", "replay", "bad",
            "keys_requests", "keys_refreshes", "keys_refresh_failures",
            "checkpoint_malformed", "checkpoint_version", "checkpoint_wrong_cell",
            "checkpoint_mismatch", "checkpoint_bad_certificate", "checkpoint_expired_certificate",
            "checkpoint_bad_signature", "checkpoint_no_key", "checkpoint_bad",
        )
    ]


class DatagramInfo(ctypes.Structure):
    _fields_ = [
        ("group", ctypes.c_uint16),
        ("sender", ctypes.c_uint32),
        ("instance", ctypes.c_uint64),
        ("seq", ctypes.c_uint64),
        ("len", ctypes.c_size_t),
        ("truncated", ctypes.c_uint8),
    ]


class Stats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "data_sent", "bytes_sent", "data_received", "bytes_received",
            "duplicates", "reordered", "gaps", "too_late", "inbox_full",
            "rtt_last_us", "rtt_smoothed_us", "rtt_min_us",
            "joins", "rejoins", "renewals", "token_requests",
        )
    ]


class Datagram:
    """One received datagram (its payload copied out)."""

    __slots__ = ("group", "sender", "instance", "seq", "payload")

    def __init__(self, info, payload):
        self.group = info.group
        self.sender = info.sender
        self.instance = info.instance
        self.seq = info.seq
        self.payload = payload


class ReflectorError(Exception):
    def __init__(self, code, message):
        super().__init__("%s (status %d)" % (message, code))
        self.code = code
        self.message = message


def load(path=None):
    """Loads the library: `path`, else $REFLECTOR_C_LIB, else
    libreflector_c.so from the loader's search path."""
    path = path or os.environ.get("REFLECTOR_C_LIB") or "libreflector_c.so"
    lib = ctypes.CDLL(path)
    u64, u32, u16, size = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint16, ctypes.c_size_t
    bytes_p, char_p = ctypes.POINTER(ctypes.c_uint8), ctypes.c_char_p
    sigs = {
        "rc_version": (u32, []),
        "rc_now_ms": (u64, []),
        "rc_last_error": (size, [ctypes.c_char_p, size]),
        "rc_client_new_with_token": (ctypes.c_int, [
            bytes_p, size, bytes_p, size, u32, u16, char_p, u64, char_p, ctypes.POINTER(u64)]),
        "rc_client_new_control": (ctypes.c_int, [
            char_p, char_p, u32, ctypes.c_double, ctypes.c_double, char_p, ctypes.c_int, char_p,
            ctypes.POINTER(u64)]),
        "rc_update": (ctypes.c_int, [u64, u64]),
        "rc_poll_event": (ctypes.c_int, [u64, ctypes.POINTER(Event)]),
        "rc_recv": (ctypes.c_int, [u64, bytes_p, size, ctypes.POINTER(DatagramInfo)]),
        "rc_send": (ctypes.c_int, [u64, bytes_p, size, ctypes.POINTER(u64)]),
        "rc_stats": (ctypes.c_int, [u64, ctypes.POINTER(Stats)]),
        "rc_max_payload": (ctypes.c_int64, [u64]),
        "rc_is_member": (ctypes.c_int, [u64]),
        "rc_leave": (ctypes.c_int, [u64]),
        "rc_set_token": (ctypes.c_int, [u64, bytes_p, size, bytes_p, size, u32, u16, char_p, u64]),
        "rc_free": (ctypes.c_int, [u64]),
        "rc_poll_checkpoint": (ctypes.c_int, [u64, ctypes.POINTER(CheckpointEvent)]),
        "rc_provide_checkpoint": (ctypes.c_int, [u64, u64, bytes_p, size]),
        "rc_fetch_checkpoint": (ctypes.c_int, [u64]),
        "rc_checkpoint_take": (ctypes.c_int, [u64, bytes_p, size, ctypes.POINTER(size), ctypes.POINTER(u64)]),
        "rc_checkpoint_configure": (ctypes.c_int, [u64, ctypes.c_int, u64, u64]),
        "rc_checkpoint_stats": (ctypes.c_int, [u64, ctypes.POINTER(CheckpointStats)]),
    }
    # 1.2's functions, bound only when the library has them (a 1.1
    # library loads, and with_control without an area works with it).
    sigs_1_2 = {
        "rc_config_new_control": (ctypes.c_int, [
            char_p, char_p, u32, ctypes.c_double, ctypes.c_double, char_p, ctypes.c_int, char_p,
            ctypes.POINTER(u64)]),
        "rc_config_set_area_radius": (ctypes.c_int, [u64, ctypes.c_uint8]),
        "rc_config_add_fallback_url": (ctypes.c_int, [u64, char_p]),
        "rc_client_new_from_config": (ctypes.c_int, [u64, ctypes.POINTER(u64)]),
        "rc_config_free": (ctypes.c_int, [u64]),
        "rc_set_position": (ctypes.c_int, [u64, ctypes.c_double, ctypes.c_double]),
        "rc_sending_group": (ctypes.c_int, [u64, ctypes.POINTER(u16)]),
        "rc_member_groups": (ctypes.c_int, [u64, ctypes.POINTER(u16), size, ctypes.POINTER(size)]),
    }
    sigs_1_3 = {
        "rc_area_add_token": (ctypes.c_int, [u64, bytes_p, size, bytes_p, size, u32, u16, char_p, u64]),
        "rc_set_area": (ctypes.c_int, [u64]),
    }
    sigs_1_4 = {
        "rc_fetch_checkpoint_other": (ctypes.c_int, [u64]),
    }
    sigs_1_5 = {
        "rc_sealing_stats": (ctypes.c_int, [u64, ctypes.POINTER(SealingStats)]),
    }
    sigs_1_6 = {
        "rc_client_new_handed_in": (ctypes.c_int, [char_p, ctypes.POINTER(u64)]),
        "rc_sign_key": (ctypes.c_int, [u64, bytes_p, size]),
        "rc_set_epoch_keys": (ctypes.c_int, [u64, u16, ctypes.POINTER(EpochKey), size]),
        "rc_set_checkpoint_certificate": (ctypes.c_int, [u64, u16, bytes_p, size, bytes_p, size, u64]),
        "rc_check_name": (ctypes.c_char_p, [ctypes.c_uint8]),
    }
    sigs_1_7 = {
        "rc_sealing_duplicates": (ctypes.c_int, [u64, ctypes.POINTER(u64)]),
    }
    sigs_1_8 = {
        "rc_config_new_handed_in": (ctypes.c_int, [char_p, ctypes.POINTER(u64)]),
        "rc_config_set_keys_from": (ctypes.c_int, [u64, char_p, char_p, ctypes.c_int]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    major = lib.rc_version() >> 16
    if major != REFLECTOR_C_VERSION_MAJOR:
        raise ReflectorError(-2, "library major version %d, this binding %d" % (major, REFLECTOR_C_VERSION_MAJOR))
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_AREAS:
        for name, (res, args) in sigs_1_2.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_HANDED_AREAS:
        for name, (res, args) in sigs_1_3.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_FETCH_OTHER:
        for name, (res, args) in sigs_1_4.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_SEALING:
        for name, (res, args) in sigs_1_5.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_HANDED_SEALING:
        for name, (res, args) in sigs_1_6.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_SEALED_DUPLICATES:
        for name, (res, args) in sigs_1_7.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    if minor(lib) >= REFLECTOR_C_VERSION_MINOR_KEYS_FROM:
        for name, (res, args) in sigs_1_8.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
    return lib


def minor(lib):
    """The library's minor version."""
    return lib.rc_version() & 0xFFFF


def _need(lib, wanted, what):
    if minor(lib) < wanted:
        raise ReflectorError(-2, "%s needs library 1.%d; this one is 1.%d" % (what, wanted, minor(lib)))


def last_error(lib):
    n = lib.rc_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.rc_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def _check(lib, code):
    if code < 0:
        raise ReflectorError(code, last_error(lib))
    return code


def _bytes(b):
    return (ctypes.c_uint8 * len(b)).from_buffer_copy(bytes(b)), len(b)


# ---- Handed-in sealing (library 1.6) ----

def check_name(lib, check):
    """The name of an RC_CHECK_* value ("checkpoint_wrong_cell", ...), or
    None for 0 and values the library does not know. Library 1.6."""
    _need(lib, REFLECTOR_C_VERSION_MINOR_HANDED_SEALING, "check_name")
    name = lib.rc_check_name(check)
    return name.decode() if name is not None else None


def _hex_or_bytes(v):
    return bytes.fromhex(v) if isinstance(v, str) else bytes(v)


def epoch_key(entry, index=0):
    """An EpochKey from one `keys` entry of a /join (or /keys) answer, as
    the JSON has it (hex strings) or with bytes; a wrong length raises
    ReflectorError naming the field and the entry's index."""
    k = EpochKey()
    k.cell_x, k.cell_y = entry["cell"]
    k.epoch = entry["epoch"]
    k.starts_unix_s, k.ends_unix_s = entry["starts_unix_s"], entry["ends_unix_s"]
    for field, want in (("cell_id", RC_CELL_ID_LEN), ("key", RC_EPOCH_KEY_LEN)):
        b = _hex_or_bytes(entry[field])
        if len(b) != want:
            raise ReflectorError(-2, "epoch key %d: %s is %d bytes; it must be %d" % (index, field, len(b), want))
        getattr(k, field)[:] = list(b)
    return k

# ---- end of handed-in sealing ----


class Client:
    """One reflector client (one handle)."""

    def __init__(self, lib, handle):
        self._lib = lib
        self.handle = handle
        self._buf = (ctypes.c_uint8 * RC_MAX_PAYLOAD)()

    @classmethod
    def with_token(cls, lib, token, session_key, player, group, reflector, expires_unix_s, local=None):
        t, tl = _bytes(token)
        k, kl = _bytes(session_key)
        h = ctypes.c_uint64()
        _check(lib, lib.rc_client_new_with_token(
            t, tl, k, kl, player, group, reflector.encode(), expires_unix_s,
            local.encode() if local else None, ctypes.byref(h)))
        return cls(lib, h.value)

    @classmethod
    def with_control(cls, lib, url, ticket, player, x, y, ca_file=None, allow_plain_http=False, local=None,
                     area_radius=0, fallback_urls=()):
        """A client that asks the control server at `url` for its tokens.
        `area_radius` > 0 (the cells around the player's, 2 at most) or
        `fallback_urls` (more control servers of the world, tried in turn
        when one cannot answer) need library 1.2: they go through an
        rc_config, freed before this returns."""
        args = (url.encode(), ticket.encode() if ticket else None, player, x, y,
                ca_file.encode() if ca_file else None, 1 if allow_plain_http else 0,
                local.encode() if local else None)
        h = ctypes.c_uint64()
        if not area_radius and not fallback_urls:
            _check(lib, lib.rc_client_new_control(*args, ctypes.byref(h)))
            return cls(lib, h.value)
        _need(lib, REFLECTOR_C_VERSION_MINOR_AREAS, "an area or fallback URLs")
        cfg = ctypes.c_uint64()
        _check(lib, lib.rc_config_new_control(*args, ctypes.byref(cfg)))
        try:
            _check(lib, lib.rc_config_set_area_radius(cfg.value, area_radius))
            for u in fallback_urls:
                _check(lib, lib.rc_config_add_fallback_url(cfg.value, u.encode()))
            _check(lib, lib.rc_client_new_from_config(cfg.value, ctypes.byref(h)))
        finally:
            lib.rc_config_free(cfg.value)
        return cls(lib, h.value)

    def update(self, now_ms=None):
        _check(self._lib, self._lib.rc_update(self.handle, self._lib.rc_now_ms() if now_ms is None else now_ms))

    def events(self):
        """The events waiting, in order."""
        out = []
        while True:
            ev = Event()
            if _check(self._lib, self._lib.rc_poll_event(self.handle, ctypes.byref(ev))) == RC_NONE:
                return out
            out.append(ev)

    def datagrams(self):
        """The datagrams waiting, in order."""
        out = []
        info = DatagramInfo()
        while _check(self._lib, self._lib.rc_recv(self.handle, self._buf, len(self._buf), ctypes.byref(info))) == RC_OK:
            n = min(info.len, len(self._buf))
            out.append(Datagram(info, bytes(self._buf[:n])))
        return out

    def send(self, payload):
        """Sends to the group; the datagram's sequence number."""
        d, n = _bytes(payload)
        seq = ctypes.c_uint64()
        _check(self._lib, self._lib.rc_send(self.handle, d, n, ctypes.byref(seq)))
        return seq.value

    def stats(self):
        s = Stats()
        _check(self._lib, self._lib.rc_stats(self.handle, ctypes.byref(s)))
        return s

    def max_payload(self):
        return _check(self._lib, self._lib.rc_max_payload(self.handle))

    def is_member(self):
        return _check(self._lib, self._lib.rc_is_member(self.handle)) == 1

    def leave(self):
        _check(self._lib, self._lib.rc_leave(self.handle))

    def set_token(self, token, session_key, player, group, reflector, expires_unix_s):
        """Hands in a new token (after RC_EVENT_TOKEN_NEEDED, or to move to
        another group); arguments as with_token."""
        t, tl = _bytes(token)
        k, kl = _bytes(session_key)
        _check(self._lib, self._lib.rc_set_token(
            self.handle, t, tl, k, kl, player, group, reflector.encode(), expires_unix_s))

    def set_area(self, tokens):
        """Hands in an area's tokens that the game's backend fetched
        (GET /join?...&area=R): `tokens` is a list of (token, session_key,
        player, group, reflector, expires_unix_s), the player's own cell
        first, then the other groups of the area, nearest first (at most
        RC_MAX_AREA_TOKENS). Groups held that are still in the area are
        renewed, new ones joined, the others left once the new ones are
        members (RC_EVENT_MOVED, RC_EVENT_LEFT_GROUP). Library 1.3."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_HANDED_AREAS, "set_area")
        for token, session_key, player, group, reflector, expires_unix_s in tokens:
            t, tl = _bytes(token)
            k, kl = _bytes(session_key)
            # A refused token empties what was added (the library's rule).
            _check(self._lib, self._lib.rc_area_add_token(
                self.handle, t, tl, k, kl, player, group, reflector.encode(), expires_unix_s))
        _check(self._lib, self._lib.rc_set_area(self.handle))

    def set_position(self, x, y):
        """The player moved to (x, y): the area there is asked for (one
        request: call it when the player crosses into another cell). Then
        RC_EVENT_MOVED when sends switch to the new cell, RC_EVENT_LEFT_GROUP
        for each group out of the new area once the new ones are members.
        Library 1.2."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_AREAS, "set_position")
        _check(self._lib, self._lib.rc_set_position(self.handle, x, y))

    def sending_group(self):
        """The group send() goes to now, or None. Library 1.2."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_AREAS, "sending_group")
        g = ctypes.c_uint16()
        code = _check(self._lib, self._lib.rc_sending_group(self.handle, ctypes.byref(g)))
        return None if code == RC_NONE else g.value

    def member_groups(self):
        """The groups the client is a member of now, sorted. Library 1.2."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_AREAS, "member_groups")
        count = ctypes.c_size_t()
        while True:
            buf = (ctypes.c_uint16 * max(count.value, 25))()
            code = self._lib.rc_member_groups(self.handle, buf, len(buf), ctypes.byref(count))
            if code != RC_ERR_BUFFER_TOO_SMALL:
                _check(self._lib, code)
                return sorted(buf[:count.value])

    def checkpoint_events(self):
        """The checkpoint events waiting, in order. A READY event's state
        waits for take_checkpoint(); a FAILED one's message is in
        last_error(lib) until the next failing call."""
        out = []
        while True:
            ev = CheckpointEvent()
            if _check(self._lib, self._lib.rc_poll_checkpoint(self.handle, ctypes.byref(ev))) == RC_NONE:
                return out
            out.append(ev)

    def provide_checkpoint(self, tick, state):
        """Answers the reflector's request (a REQUESTED event) with the
        game's state at `tick` (bytes; copied by the library)."""
        d, n = _bytes(state)
        _check(self._lib, self._lib.rc_provide_checkpoint(self.handle, tick, d, n))

    def fetch_checkpoint(self):
        """Fetches the group's latest checkpoint (the outcome is an event)."""
        _check(self._lib, self._lib.rc_fetch_checkpoint(self.handle))

    def fetch_checkpoint_other(self):
        """Fetches the other checkpoint the reflector keeps for the group
        (the one before the latest, from another member when it has one):
        a READY or EMPTY event (fewer than two stored) with op
        RC_CHECKPOINT_OP_FETCH_OTHER. Library 1.4."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_FETCH_OTHER, "fetch_checkpoint_other")
        _check(self._lib, self._lib.rc_fetch_checkpoint_other(self.handle))

    def take_checkpoint(self):
        """The state of the last READY event as (tick, bytes), or None: its
        size asked first, then copied into a buffer that large."""
        size, tick = ctypes.c_size_t(), ctypes.c_uint64()
        code = self._lib.rc_checkpoint_take(self.handle, None, 0, ctypes.byref(size), ctypes.byref(tick))
        if code == RC_NONE:
            return None
        if code == RC_OK:  # an empty state, taken
            return tick.value, b""
        if code != RC_ERR_BUFFER_TOO_SMALL:
            _check(self._lib, code)
        buf = (ctypes.c_uint8 * max(size.value, 1))()
        _check(self._lib, self._lib.rc_checkpoint_take(self.handle, buf, size.value, ctypes.byref(size),
                                                       ctypes.byref(tick)))
        return tick.value, bytes(buf[:size.value])

    def checkpoint_configure(self, fetch_on_join=True, timeout_ms=0, max_bytes=0):
        """Checkpoint settings (0 keeps the timeout or bound); before the
        first update() for the first join to see them."""
        _check(self._lib, self._lib.rc_checkpoint_configure(self.handle, 1 if fetch_on_join else 0, timeout_ms,
                                                            max_bytes))

    def checkpoint_stats(self):
        s = CheckpointStats()
        _check(self._lib, self._lib.rc_checkpoint_stats(self.handle, ctypes.byref(s)))
        return s

    # ---- Handed-in sealing (library 1.6) ----

    @classmethod
    def handed_in(cls, lib, local=None, keys_from=None, ca_file=None, allow_plain_http=False, fallback_urls=()):
        """A client handed its tokens that has none yet: nothing is sent
        until set_token() or set_area() (or hand_in()); its sign_key() is
        there at once, for the /join that brings the first token.

        `keys_from` (library 1.8): the control server (its URL) the client
        asks GET /keys for a sealed group's next epoch keys, with the
        membership's token, when the newest key held nears its end; then
        `fallback_urls` in turn when one cannot answer; `ca_file` a PEM file
        of a private CA, `allow_plain_http` for http:// (closed labs). Each
        is checked now (a bad one raises ReflectorError saying what); they
        go through an rc_config, freed before this returns. Without it the
        backend hands every key in (set_epoch_keys)."""
        _need(lib, REFLECTOR_C_VERSION_MINOR_HANDED_SEALING, "Client.handed_in")
        h = ctypes.c_uint64()
        local_b = local.encode() if local else None
        if keys_from is None and not fallback_urls and ca_file is None and not allow_plain_http:
            _check(lib, lib.rc_client_new_handed_in(local_b, ctypes.byref(h)))
            return cls(lib, h.value)
        _need(lib, REFLECTOR_C_VERSION_MINOR_KEYS_FROM, "keys_from")
        if keys_from is None:
            raise ReflectorError(-2, "fallback_urls, ca_file and allow_plain_http are keys_from's: name keys_from")
        cfg = ctypes.c_uint64()
        _check(lib, lib.rc_config_new_handed_in(local_b, ctypes.byref(cfg)))
        try:
            _check(lib, lib.rc_config_set_keys_from(cfg.value, keys_from.encode(),
                                                     ca_file.encode() if ca_file is not None else None,
                                                     1 if allow_plain_http else 0))
            for u in fallback_urls:
                _check(lib, lib.rc_config_add_fallback_url(cfg.value, u.encode()))
            _check(lib, lib.rc_client_new_from_config(cfg.value, ctypes.byref(h)))
        finally:
            lib.rc_config_free(cfg.value)
        return cls(lib, h.value)

    def sign_key(self):
        """The client's checkpoint signing key (32 bytes): send it, hex, as
        sign_key on every /join for this client."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_HANDED_SEALING, "sign_key")
        buf = (ctypes.c_uint8 * RC_SIGN_KEY_LEN)()
        _check(self._lib, self._lib.rc_sign_key(self.handle, buf, RC_SIGN_KEY_LEN))
        return bytes(buf)

    def set_epoch_keys(self, group, entries):
        """Hands in `group`'s epoch keys: the `keys` entries of its grant
        (dicts as the JSON has them, hex or bytes), in the answer's order."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_HANDED_SEALING, "set_epoch_keys")
        keys = [epoch_key(e, i) for i, e in enumerate(entries)]
        arr = (EpochKey * max(len(keys), 1))(*keys)
        _check(self._lib, self._lib.rc_set_epoch_keys(self.handle, group, arr, len(keys)))

    def set_checkpoint_certificate(self, group, control_public, certificate, expires_unix_s):
        """Hands in `group`'s checkpoint certificate: the grant's
        control_public and certificate (hex or bytes; the library checks
        the lengths) and its expires_unix_s."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_HANDED_SEALING, "set_checkpoint_certificate")
        cp, cpl = _bytes(_hex_or_bytes(control_public))
        ce, cel = _bytes(_hex_or_bytes(certificate))
        _check(self._lib, self._lib.rc_set_checkpoint_certificate(self.handle, group, cp, cpl, ce, cel,
                                                                  expires_unix_s))

    def hand_in(self, grant):
        """Hands in one grant of a /join answer (a dict, as the JSON has
        it): its token, then its keys and its certificate when it has them
        (a control server with a sealing secret, asked with sign_key)."""
        self.set_token(bytes.fromhex(grant["token"]), bytes.fromhex(grant["session_key"]), grant["player"],
                       grant["group"], grant["reflector"], grant["expires_unix_s"])
        if grant.get("keys"):
            self.set_epoch_keys(grant["group"], grant["keys"])
        if grant.get("certificate"):
            self.set_checkpoint_certificate(grant["group"], grant["control_public"], grant["certificate"],
                                            grant["expires_unix_s"])

    # ---- end of handed-in sealing ----

    def sealing_stats(self):
        """Sealed groups' counters (library 1.5)."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_SEALING, "sealing_stats")
        s = SealingStats()
        _check(self._lib, self._lib.rc_sealing_stats(self.handle, ctypes.byref(s)))
        return s

    def sealing_duplicates(self):
        """Sealed duplicate deliveries dropped (another group's copy; library 1.7)."""
        _need(self._lib, REFLECTOR_C_VERSION_MINOR_SEALED_DUPLICATES, "sealing_duplicates")
        n = ctypes.c_uint64()
        _check(self._lib, self._lib.rc_sealing_duplicates(self.handle, ctypes.byref(n)))
        return n.value

    def close(self):
        """Frees the handle (a second close raises: the handle is dead)."""
        _check(self._lib, self._lib.rc_free(self.handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
