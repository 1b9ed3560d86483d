"""The document's constants and the helpers every check uses: key derivations,
reporting, value parsing and field comparison."""

import hashlib
import hmac
import ipaddress
import json
import os
import sys
import struct

from .crypto import *  # noqa: F401,F403

# ---------------------------------------------------------------------------
# The document's constants.
# ---------------------------------------------------------------------------

MAGIC = 0x5246
CHANNEL_MAGIC = 0x5246434B
HEADER = 24
MAX_DATAGRAM = 65507
MAX_DATA = 1472  # "A DATA is at most 1,472 bytes"

JOIN, JOIN_CHALLENGE, JOIN_ACK, LEAVE, KEEPALIVE, DATA, ERROR = 1, 2, 3, 4, 5, 6, 7
PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO, ECHO_REPLY, MOVED = 8, 9, 10, 11, 12, 13

TYPE_NAMES = {
    1: "JOIN", 2: "JOIN_CHALLENGE", 3: "JOIN_ACK", 4: "LEAVE", 5: "KEEPALIVE",
    6: "DATA", 7: "ERROR", 8: "PROBE", 9: "PROBE_REPLY",
    10: "CHECKPOINT_REQUEST", 11: "ECHO", 12: "ECHO_REPLY", 13: "MOVED",
}
# Sizes from the Types table (JOIN: without / with cookie; DATA: 32 + n).
SIZES = {1: (72, 88), 2: (56,), 3: (48,), 4: (40,), 5: (40,), 7: (28,),
         8: (40,), 9: (40,), 10: (40,), 11: (40,), 12: (40,), 13: (48,)}
FULL_MAC = {JOIN, JOIN_CHALLENGE, JOIN_ACK, LEAVE, KEEPALIVE, MOVED}
SHORT_MAC = {PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO, ECHO_REPLY}
# Direction column: (sender, receiver); "member" is a client that is a member.
DIRECTIONS = {1: ("client", "reflector"), 2: ("reflector", "client"),
              3: ("reflector", "client"), 4: ("client", "reflector"),
              5: ("client", "reflector"), 6: ("both", "both"),
              7: ("reflector", "client"), 8: ("reflector", "member"),
              9: ("member", "reflector"), 10: ("reflector", "member"),
              11: ("member", "reflector"), 12: ("reflector", "member"),
              13: ("reflector", "member")}

ERROR_CODES = {1: "BadToken", 2: "ExpiredToken", 3: "BadCookie", 4: "NotMember",
               5: "GroupFull", 6: "Version", 7: "BadMac", 8: "AddressLimit",
               9: "Retry"}
MOVED_REASONS = {1: "draining", 2: "reassigned", 3: "shutting down"}
OPS = {1: "UPLOAD", 2: "FETCH", 3: "FETCH_OTHER"}
STATUSES = {1: "CONTINUE", 2: "STORED", 3: "CHECKPOINT", 4: "EMPTY", 5: "REFUSED"}
REFUSALS = {1: "NotMember", 2: "BadMac", 3: "NotRequested", 4: "TooLarge",
            5: "Malformed", 6: "Busy", 7: "NoGroup"}
FLAG_BITS = {"tags": 0, "instance": 1, "sealed": 2}

HELLO_LEN, REQUEST_LEN, REPLY_LEN, BODY_MAC_LEN = 32, 64, 88, 16

REQUIRED_SECTIONS = ["secret", "cookie_key", "now_unix_ms", "tokens", "cookies",
                     "datagrams", "channel", "invalid", "areas", "sealed"]

# Sealed payloads: the section's keys, a datagram's keys, and the receiving
# steps' counters in their order.
SEALED_KEYS = {"master_secret", "world", "world_id", "epoch_length_s", "jitter_bound_s",
               "cells", "senders", "datagrams", "keys_request", "keys_answers", "checkpoints"}
# Sealed checkpoints: the object's keys, a player's, an envelope's, and the
# joiner's checks' names in their order.
CHECKPOINTS_KEYS = {"control_seed", "control_public", "group_cells", "players", "envelopes"}
CHECKPOINT_PLAYER_KEYS = {"player", "seed", "public_key", "expires_unix_s", "certificate"}
ENVELOPE_KEYS = {"name", "signer", "instance", "hex", "reply_tick", "reply_from_player", "reply_unix_ms",
                 "age_ms", "state", "checkpoint_key", "reject", "why"}
CHECKPOINT_STEPS = ["checkpoint_malformed", "checkpoint_version", "checkpoint_wrong_cell",
                    "checkpoint_mismatch", "checkpoint_bad_certificate", "checkpoint_expired_certificate",
                    "checkpoint_bad_signature", "checkpoint_no_key", "checkpoint_bad"]
ENVELOPE_MAGIC = b"RFCP"
# The sealed DATA's version (byte 40) and the envelope's (byte 4): 2, both
# AES-256-GCM; version 1 (ChaCha20-Poly1305) is withdrawn and refused like
# any other.
SEALED_VERSION, ENVELOPE_VERSION = 2, 2
ENVELOPE_HEADER, ENVELOPE_MIN = 152, 232
KEYS_ANSWER_KEYS = {"name", "at_unix_s", "cells", "keys"}
EPOCH_KEY_FIELDS = ["cell", "cell_id", "epoch", "key", "starts_unix_s", "ends_unix_s"]
SEALED_DATAGRAM_KEYS = {"name", "keys", "tags", "sender", "hex", "game_data", "reject", "why"}
SEALED_STEPS = ["sealed_malformed", "sealed_version", "sealed_no_key", "sealed_replay", "sealed_bad"]

# Keys of an entry that describe it rather than give a field to check.
DESCRIPTIVE = {"name", "type", "keys", "hex", "why", "note", "notes", "comment",
               "comments", "description", "desc"}


def norm(s):
    return "".join(c for c in str(s).lower() if c.isalnum())


def names_to_int(table, value):
    """A name from `table` (int -> name), compared loosely, or None."""
    for k, v in table.items():
        if norm(v) == norm(value):
            return k
    return None


def mac16(key, data):
    return hmac.new(key, data, hashlib.sha256).digest()[:16]


def hmac_full(key, data):
    return hmac.new(key, data, hashlib.sha256).digest()


# ---------------------------------------------------------------------------
# Keys (document section "Keys").
# ---------------------------------------------------------------------------

def token_mac(secret, token16):
    return mac16(secret, b"reflector-token-v1" + token16)


def derive_keys(secret, token):
    k = hmac_full(secret, b"reflector-session-v2" + token)
    km = hmac_full(k, b"reflector-mac-v2")
    kt = hmac_full(k, b"reflector-tag-v2")[:16]
    return k, km, kt


def cookie_for(cookie_key, ip_bytes, port, group, player, slot):
    """The cookie, or None if a value does not fit its field."""
    if not (0 <= port <= 0xFFFF and 0 <= group <= 0xFFFF and 0 <= player <= 0xFFFFFFFF
            and 0 <= slot < 1 << 64):
        return None
    return mac16(cookie_key, b"reflector-cookie-v1" + ip_bytes + struct.pack(">H", port)
                 + struct.pack(">HIQ", group, player, slot))


def parse_address(s):
    """'ip:port' or '[ipv6]:port' -> (ip bytes, port)."""
    s = str(s)
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        if not rest.startswith(":"):
            raise ValueError("no port in %r" % s)
        port = rest[1:]
    else:
        host, _, port = s.rpartition(":")
        if not host:
            raise ValueError("no port in %r" % s)
    ip = ipaddress.ip_address(host)
    port = int(port)
    if not 0 <= port <= 65535:
        raise ValueError("port out of range in %r" % s)
    return ip.packed, port


# ---------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------

class Report:
    def __init__(self, out=None):
        self.groups = {}
        self.order = []
        self.out = out if out is not None else sys.stdout

    def _g(self, group):
        if group not in self.groups:
            self.groups[group] = [0, 0]
            self.order.append(group)
        return self.groups[group]

    def check(self, group, cond, msg):
        g = self._g(group)
        if cond:
            g[0] += 1
        else:
            g[1] += 1
            print("FAIL [%s] %s" % (group, msg), file=self.out)
        return bool(cond)

    def ok(self, group):
        self._g(group)[0] += 1

    def fail(self, group, msg):
        return self.check(group, False, msg)

    def totals(self):
        p = sum(g[0] for g in self.groups.values())
        f = sum(g[1] for g in self.groups.values())
        return p, f

    def finish(self):
        for name in self.order:
            p, f = self.groups[name]
            print("%s: %d passed, %d failed" % (name, p, f), file=self.out)
        p, f = self.totals()
        print("%d passed, %d failed" % (p, f), file=self.out)
        return 1 if f else 0


class Bad(Exception):
    """A value in the vectors cannot be read at all."""


def hexbytes(v, what, length=None):
    if not isinstance(v, str):
        raise Bad("%s is not a hex string" % what)
    s = v.strip()
    if s.startswith("0x") or s.startswith("0X"):
        s = s[2:]
    try:
        b = bytes.fromhex(s)
    except ValueError:
        raise Bad("%s is not valid hex" % what)
    if length is not None and len(b) != length:
        raise Bad("%s is %d bytes, the document says %d" % (what, len(b), length))
    return b


def bytes8(v, what):
    """An 8-byte field given as hex, or as a number read big-endian (Conventions)."""
    if isinstance(v, int) and not isinstance(v, bool):
        if not 0 <= v < 1 << 64:
            raise Bad("%s: %d does not fit 8 bytes" % (what, v))
        return v.to_bytes(8, "big")
    return hexbytes(v, what, 8)


def as_int(v, what):
    if isinstance(v, bool):
        raise Bad("%s is a boolean, not an integer" % what)
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        s = v.strip()
        try:
            if s.lower().startswith("0x"):
                return int(s, 16)
            return int(s, 10)
        except ValueError:
            pass
    raise Bad("%s is not an integer: %r" % (what, v))


# ---------------------------------------------------------------------------
# Field comparison: a field "given beside" a message against the bytes.
# ---------------------------------------------------------------------------

class F:
    """A field at a fixed place: kind 'int' (big-endian) or 'bytes'."""

    def __init__(self, off, size, kind="int", names=None):
        self.off, self.size, self.kind, self.names = off, size, kind, names

    def raw(self, b):
        end = len(b) if self.size is None else self.off + self.size
        return b[self.off:end]

    def value(self, b):
        r = self.raw(b)
        return int.from_bytes(r, "big") if self.kind == "int" else r


def compare_field(field, b, given, what):
    """Returns None if the given value matches, else a message."""
    raw = field.raw(b)
    have = field.value(b)
    if field.kind == "bytes":
        if isinstance(given, int) and not isinstance(given, bool):
            # A number given for a byte field: read as the big-endian value.
            if int.from_bytes(raw, "big") == given:
                return None
            return "%s: bytes are %s, given %d" % (what, raw.hex(), given)
        try:
            want = hexbytes(given, what)
        except Bad as e:
            return str(e)
        if want == raw:
            return None
        return "%s: bytes are %s, given %s" % (what, raw.hex(), want.hex())
    # integer field
    if isinstance(given, bool):
        return "%s: given a boolean (%r) for an integer field" % (what, given)
    if isinstance(given, int):
        return None if given == have else "%s: datagram has %d, given %d" % (what, have, given)
    if isinstance(given, str):
        if field.names is not None:
            k = names_to_int(field.names, given)
            if k is not None:
                return None if k == have else "%s: datagram has %d (%s), given %r" % (
                    what, have, field.names.get(have, "?"), given)
        s = given.strip()
        if s.lower().startswith("0x"):
            try:
                return None if int(s, 16) == have else "%s: datagram has %d, given %s" % (what, have, s)
            except ValueError:
                pass
        if s.isdigit():
            return None if int(s) == have else "%s: datagram has %d, given %s" % (what, have, s)
        try:
            want = bytes.fromhex(s)
            if len(want) == len(raw):
                return None if want == raw else "%s: bytes are %s, given %s" % (what, raw.hex(), s)
        except ValueError:
            pass
        return "%s: cannot read given value %r" % (what, given)
    if isinstance(given, (list, dict)) and field.names is FLAG_BITS:
        return None
    return "%s: cannot read given value %r" % (what, given)


def flags_value(given, what):
    """Flags given as an int, a list of names, or an object of name -> bool."""
    if isinstance(given, bool):
        raise Bad("%s: a boolean for flags" % what)
    if isinstance(given, int):
        return given
    names = []
    if isinstance(given, list):
        names = given
    elif isinstance(given, dict):
        names = [k for k, v in given.items() if v]
        for k in given:
            if norm(k) not in FLAG_BITS:
                raise Bad("%s: flag %r is not one the document names" % (what, k))
    elif isinstance(given, str):
        return as_int(given, what)
    else:
        raise Bad("%s: cannot read flags %r" % (what, given))
    v = 0
    for n in names:
        if norm(n) not in FLAG_BITS:
            raise Bad("%s: flag %r is not one the document names" % (what, n))
        v |= 1 << FLAG_BITS[norm(n)]
    return v


def datagram_fields(t, b):
    """normalised field name -> F, for a version-2 datagram of type t."""
    f = {
        "magic": F(0, 2), "version": F(2, 1), "type": F(3, 1, names=TYPE_NAMES),
        "group": F(4, 2), "port": F(4, 2), "length": F(6, 2),
        "player": F(8, 4), "membership": F(12, 4), "membershipid": F(12, 4),
        "sequence": F(16, 8), "seq": F(16, 8), "header": F(0, 24, "bytes"),
    }
    n = len(b)
    if t == JOIN:
        f["token"] = F(24, 32, "bytes")
        if n == 88:
            f["cookie"] = F(56, 16, "bytes")
        f["mac"] = F(n - 16, 16, "bytes")
    elif t == JOIN_CHALLENGE:
        f.update(cookie=F(24, 16, "bytes"), mac=F(40, 16, "bytes"))
    elif t == JOIN_ACK:
        f.update(members=F(24, 2), keepalivems=F(26, 2), keepalive=F(26, 2),
                 keepaliveintervalms=F(26, 2), flags=F(28, 1, names=FLAG_BITS),
                 reserved=F(29, 1), checkpointport=F(30, 2), mac=F(32, 16, "bytes"))
    elif t in (LEAVE, KEEPALIVE):
        f["mac"] = F(24, 16, "bytes")
    elif t == DATA:
        f.update(tag=F(24, 8, "bytes"), payload=F(32, None, "bytes"))
        if n >= 40:
            f["instance"] = F(32, 8, "bytes")
            f["instanceid"] = F(32, 8, "bytes")
    elif t == ERROR:
        f.update(code=F(24, 2, names=ERROR_CODES), reserved=F(26, 2))
    elif t in SHORT_MAC:
        f.update(nonce=F(24, 8, "bytes"), mac=F(32, 8, "bytes"), shortmac=F(32, 8, "bytes"))
    elif t == MOVED:
        f.update(reason=F(24, 2, names=MOVED_REASONS), withinms=F(26, 2), within=F(26, 2),
                 reserved=F(28, 4), mac=F(32, 16, "bytes"))
    return f


def v1_error_fields():
    return {"magic": F(0, 2), "version": F(2, 1), "type": F(3, 1, names=TYPE_NAMES),
            "group": F(4, 2), "port": F(4, 2), "length": F(6, 2), "player": F(8, 4),
            "membership": F(12, 4), "code": F(16, 2, names=ERROR_CODES)}


# ---------------------------------------------------------------------------
# The checker.
# ---------------------------------------------------------------------------


def channel_kind(m, b):
    name = norm(m.get("name", ""))
    if len(b) >= 6 and struct.unpack(">I", b[:4])[0] == CHANNEL_MAGIC:
        return {1: "HELLO", 2: "REQUEST", 3: "REPLY"}.get(b[5], "UNKNOWN")
    if "body" in name or len(b) == BODY_MAC_LEN:
        return "BODY"
    return "UNKNOWN"
