#!/usr/bin/env python3
"""Independent conformance checker for the reflector protocol's test vectors.

Written from docs/protocol.md (version 2, revision 2.2) alone.  It reads the
vectors file described in the document's "Test vectors" section and checks
every token, key, cookie, datagram, checkpoint-channel message, area and
sealed payload in it against the document's rules (HKDF-SHA256 and
ChaCha20-Poly1305 written here from RFC 5869 and RFC 8439 and checked
against their examples, since the standard library has neither), and that every entry under `invalid` is
rejected by one of those rules.

Usage: python3 scripts/check-vectors.py [docs/protocol-vectors.json]

Prints a line per failure, one line per check group with its counts, and a
last line "N passed, M failed".  Exits 0 only if nothing failed.

Where the document is silent or ambiguous about something the vectors
contain, the check fails with a message starting "AMBIGUOUS:" instead of
guessing.
"""

import argparse
import hashlib
import hmac
import ipaddress
import json
import os
import struct
import sys

# ---------------------------------------------------------------------------
# SipHash-2-4 (Aumasson and Bernstein), from the paper's definition.
# The 16-byte key is read as two little-endian 64-bit words; message words are
# little-endian; the last word holds the remaining bytes and, in its top byte,
# the message length mod 256.  The output is a 64-bit number.
# ---------------------------------------------------------------------------

_M64 = 0xFFFFFFFFFFFFFFFF


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash24(key, msg):
    if len(key) != 16:
        raise ValueError("SipHash key must be 16 bytes")
    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D,
         k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rounds(n):
        v0, v1, v2, v3 = v
        for _ in range(n):
            v0 = (v0 + v1) & _M64
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _M64
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _M64
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _M64
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)
        v[:] = [v0, v1, v2, v3]

    n = len(msg)
    end = n - (n % 8)
    for i in range(0, end, 8):
        (m,) = struct.unpack_from("<Q", msg, i)
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    last = bytes(msg[end:]) + bytes(7 - (n % 8)) + bytes([n & 0xFF])
    (m,) = struct.unpack("<Q", last)
    v[3] ^= m
    rounds(2)
    v[0] ^= m
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


# The 64 published SipHash-2-4 vectors: key 00..0f, message 00..(n-1),
# output bytes as published (little-endian order of the 64-bit number).
SIPHASH_REFERENCE = """
310e0edd47db6f72 fd67dc93c539f874 5a4fa9d909806c0d 2d7efbd796666785
b7877127e09427cf 8da699cd64557618 cee3fe586e46c9cb 37d1018bf50002ab
6224939a79f5f593 b0e4a90bdf82009e f3b9dd94c5bb5d7a a7ad6b22462fb3f4
fbe50e86bc8f1e75 903d84c02756ea14 eef27a8e90ca23f7 e545be4961ca29a1
db9bc2577fcc2a3f 9447be2cf5e99a69 9cd38d96f0b3c14b bd6179a71dc96dbb
98eea21af25cd6be c7673b2eb0cbf2d0 883ea3e395675393 c8ce5ccd8c030ca8
94af49f6c650adb8 eab8858ade92e1bc f315bb5bb835d817 adcf6b0763612e2f
a5c91da7acaa4dde 716595876650a2a6 28ef495c53a387ad 42c341d8fa92d832
ce7cf2722f512771 e37859f94623f3a7 381205bb1ab0e012 ae97a10fd434e015
b4a31508beff4d31 81396229f0907902 4d0cf49ee5d4dcca 5c73336a76d8bf9a
d0a704536ba93e0e 925958fcd6420cad a915c29bc8067318 952b79f3bc0aa6d4
f21df2e41d4535f9 87577519048f53a9 10a56cf5dfcd9adb eb75095ccd986cd0
51a9cb9ecba312e6 96afadfc2ce666c7 72fe52975a4364ee 5a1645b276d592a1
b274cb8ebf87870a 6f9bb4203de7b381 eaecb2a30b22a87f 9924a43cc1315724
bd838d3aafbf8db7 0b1a2a3265d51aea 135079a3231ce660 932b2846e4d70666
e1915f5cb1eca46c f325965ca16d629f 575ff28e60381be5 724506eb4c328a95
""".split()


def siphash_selftest():
    """Returns a list of failure messages (empty if the implementation is right)."""
    key = bytes(range(16))
    bad = []
    if siphash24(key, bytes(range(15))) != 0xA129CA6149BE45E5:
        bad.append("n=15 is not 0xa129ca6149be45e5")
    if siphash24(key, b"") != 0x726FDB47DD0E0E31:
        bad.append("n=0 is not 0x726fdb47dd0e0e31")
    for n, want in enumerate(SIPHASH_REFERENCE):
        got = siphash24(key, bytes(range(n))).to_bytes(8, "little").hex()
        if got != want:
            bad.append("n=%d: got %s, published %s" % (n, got, want))
    return bad


# ---------------------------------------------------------------------------
# HKDF-SHA256 (RFC 5869) and ChaCha20-Poly1305 (RFC 8439), written from the
# RFCs: the standard library has neither an AEAD nor HKDF.  Slow (pure
# Python) but the vectors are short.
# ---------------------------------------------------------------------------

def hkdf_extract(salt, ikm):
    return hmac.new(salt, ikm, hashlib.sha256).digest()


def hkdf_expand(prk, info, length):
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


_M32 = 0xFFFFFFFF


def _quarter_round(s, a, b, c, d):
    def rotl(x, n):
        return ((x << n) | (x >> (32 - n))) & _M32
    s[a] = (s[a] + s[b]) & _M32
    s[d] = rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _M32
    s[b] = rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & _M32
    s[d] = rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _M32
    s[b] = rotl(s[b] ^ s[c], 7)


def chacha20_block(key, counter, nonce):
    """RFC 8439 §2.3: one 64-byte block; 32-byte key, 32-bit counter, 12-byte nonce."""
    state = ([0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
             + list(struct.unpack("<8I", key)) + [counter & _M32]
             + list(struct.unpack("<3I", nonce)))
    w = list(state)
    for _ in range(10):
        _quarter_round(w, 0, 4, 8, 12)
        _quarter_round(w, 1, 5, 9, 13)
        _quarter_round(w, 2, 6, 10, 14)
        _quarter_round(w, 3, 7, 11, 15)
        _quarter_round(w, 0, 5, 10, 15)
        _quarter_round(w, 1, 6, 11, 12)
        _quarter_round(w, 2, 7, 8, 13)
        _quarter_round(w, 3, 4, 9, 14)
    return struct.pack("<16I", *[(w[i] + state[i]) & _M32 for i in range(16)])


def chacha20_xor(key, counter, nonce, data):
    """RFC 8439 §2.4: encryption and decryption alike."""
    out = bytearray()
    for i in range(0, len(data), 64):
        stream = chacha20_block(key, counter + i // 64, nonce)
        out += bytes(x ^ y for x, y in zip(data[i:i + 64], stream))
    return bytes(out)


def poly1305(key, msg):
    """RFC 8439 §2.5: the 16-byte tag of msg under a 32-byte one-time key."""
    r = int.from_bytes(key[:16], "little") & 0x0FFFFFFC0FFFFFFC0FFFFFFC0FFFFFFF
    s = int.from_bytes(key[16:32], "little")
    p = (1 << 130) - 5
    acc = 0
    for i in range(0, len(msg), 16):
        acc = ((acc + int.from_bytes(msg[i:i + 16] + b"\x01", "little")) * r) % p
    return ((acc + s) & ((1 << 128) - 1)).to_bytes(16, "little")


def _pad16(b):
    return bytes((16 - len(b) % 16) % 16)


def aead_tag(key, nonce, aad, ciphertext):
    """RFC 8439 §2.8: Poly1305 under the block-0 key over aad, ciphertext and their lengths."""
    one_time = chacha20_block(key, 0, nonce)[:32]
    data = (aad + _pad16(aad) + ciphertext + _pad16(ciphertext)
            + struct.pack("<QQ", len(aad), len(ciphertext)))
    return poly1305(one_time, data)


def aead_seal(key, nonce, aad, plaintext):
    ct = chacha20_xor(key, 1, nonce, plaintext)
    return ct + aead_tag(key, nonce, aad, ct)


def aead_open(key, nonce, aad, sealed):
    """The plaintext, or None if the tag does not verify."""
    if len(sealed) < 16:
        return None
    ct, tag = sealed[:-16], sealed[-16:]
    if not hmac.compare_digest(aead_tag(key, nonce, aad, ct), tag):
        return None
    return chacha20_xor(key, 1, nonce, ct)


def crypto_selftest():
    """The RFCs' own examples; a list of failure messages (empty if right)."""
    bad = []
    # RFC 5869 A.1
    prk = hkdf_extract(bytes(range(13)), b"\x0b" * 22)
    if prk.hex() != "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5":
        bad.append("HKDF-Extract (RFC 5869 A.1)")
    okm = hkdf_expand(prk, bytes(range(0xF0, 0xFA)), 42)
    if okm.hex() != ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                     "34007208d5b887185865"):
        bad.append("HKDF-Expand (RFC 5869 A.1)")
    # RFC 8439 §2.3.2
    block = chacha20_block(bytes(range(32)), 1, bytes.fromhex("000000090000004a00000000"))
    if block.hex() != ("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
                       "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"):
        bad.append("ChaCha20 block (RFC 8439 2.3.2)")
    # RFC 8439 §2.5.2
    tag = poly1305(bytes.fromhex("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b"),
                   b"Cryptographic Forum Research Group")
    if tag.hex() != "a8061dc1305136c6c22b8baf0c0127a9":
        bad.append("Poly1305 (RFC 8439 2.5.2)")
    # RFC 8439 §2.8.2
    key = bytes(range(0x80, 0xA0))
    nonce = bytes.fromhex("070000004041424344454647")
    aad = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
    text = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip "
            b"for the future, sunscreen would be it.")
    sealed = aead_seal(key, nonce, aad, text)
    if sealed[:16].hex() != "d31a8d34648e60db7b86afbc53ef7ec2" or \
            sealed[-16:].hex() != "1ae10b594f09e26a7e902ecbd0600691":
        bad.append("ChaCha20-Poly1305 (RFC 8439 2.8.2)")
    if aead_open(key, nonce, aad, sealed) != text:
        bad.append("ChaCha20-Poly1305 does not open its own output")
    if aead_open(key, nonce, aad, sealed[:-1] + bytes([sealed[-1] ^ 1])) is not None:
        bad.append("ChaCha20-Poly1305 opened an altered tag")
    return bad


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
               "cells", "senders", "datagrams", "keys_request"}
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

class Checker:
    def __init__(self, doc, report):
        self.doc = doc
        self.r = report
        self.secret = None
        self.cookie_key = None
        self.now_ms = None
        self.tokens = []  # list of dicts (or None where unreadable)
        self.notes = {}  # undocumented vector keys the checker interprets -> how
        self.ambiguities = {}  # what the document leaves open -> the entries it concerns

    def note(self, key, how):
        self.notes.setdefault(key, how)

    def ambiguity(self, text, where):
        self.ambiguities.setdefault(text, []).append(where)

    # -- top level ---------------------------------------------------------

    def guard(self, group, what, fn, *args):
        """Runs one entry's checks; a value that cannot be read fails that entry, not the run."""
        try:
            return fn(*args)
        except Bad as e:
            self.r.fail(group, "%s: %s" % (what, e))
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, struct.error) as e:
            self.r.fail(group, "%s: cannot be read (%s: %s)" % (what, type(e).__name__, e))
        return None

    def run(self):
        r = self.r
        G = "file"
        bad = siphash_selftest()
        r.check("siphash self-test", not bad,
                "SipHash-2-4 implementation disagrees with the published vectors: %s" % "; ".join(bad[:4]))
        bad = crypto_selftest()
        r.check("crypto self-test", not bad,
                "HKDF or ChaCha20-Poly1305 disagrees with its RFC's example: %s" % "; ".join(bad))
        if not isinstance(self.doc, dict):
            r.fail(G, "the vectors file is not one JSON object (Test vectors)")
            return
        for s in REQUIRED_SECTIONS:
            if s not in self.doc:
                r.fail(G, "missing section %r (Test vectors)" % s)
            elif self.doc[s] is None or self.doc[s] == "" or self.doc[s] == [] or self.doc[s] == {}:
                r.fail(G, "section %r is empty" % s)
            else:
                r.ok(G)
        extra = [k for k in self.doc if k not in REQUIRED_SECTIONS]
        for k in extra:
            r.fail(G, "AMBIGUOUS: top-level key %r is not described by the document's Test vectors "
                      "section; not checked" % k)
        self.read_globals()
        self.check_tokens()
        self.check_cookies()
        self.check_datagrams()
        self.check_channel()
        self.check_invalid()
        self.check_areas()
        self.check_sealed()
        for text, where in self.ambiguities.items():
            self.r.fail("ambiguities", "AMBIGUOUS: %s; concerns %d entr%s: %s"
                        % (text, len(where), "y" if len(where) == 1 else "ies", ", ".join(where)))
        for key in sorted(self.notes):
            print("NOTE: %r is not described by the document's Test vectors section; read as %s"
                  % (key, self.notes[key]), file=self.r.out)

    def read_globals(self):
        G = "file"
        try:
            if "secret" in self.doc:
                self.secret = hexbytes(self.doc["secret"], "secret")
                self.r.check(G, len(self.secret) > 0, "secret is empty")
        except Bad as e:
            self.r.fail(G, str(e))
        try:
            if "cookie_key" in self.doc:
                self.cookie_key = hexbytes(self.doc["cookie_key"], "cookie_key")
                self.r.check(G, len(self.cookie_key) > 0, "cookie_key is empty")
        except Bad as e:
            self.r.fail(G, str(e))
        try:
            if "now_unix_ms" in self.doc:
                self.now_ms = as_int(self.doc["now_unix_ms"], "now_unix_ms")
                if not self.r.check(G, self.now_ms >= 0, "now_unix_ms is negative"):
                    self.now_ms = None
        except Bad as e:
            self.r.fail(G, str(e))

    def section_list(self, name):
        v = self.doc.get(name)
        if isinstance(v, list):
            return v
        if name in self.doc and v not in (None, "", [], {}):
            self.r.fail("file", "section %r is not a list" % name)
        return []

    def entries(self, group, label, items):
        """(index, description, entry) for each entry of items that is an
        object; any other entry is a failure of the group."""
        for i, e in enumerate(items):
            what = "%s[%d]" % (label, i)
            if isinstance(e, dict) and "name" in e:
                what += " (%s)" % e["name"]
            if not isinstance(e, dict):
                self.r.fail(group, "%s is not an object" % what)
                continue
            yield i, what, e

    def token_at(self, idx, what):
        """The derived-key record for token index idx, or raises Bad."""
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise Bad("%s: keys %r is not an index into tokens" % (what, idx))
        if not 0 <= idx < len(self.tokens) or self.tokens[idx] is None:
            raise Bad("%s: keys %d names no readable token" % (what, idx))
        return self.tokens[idx]

    def expired(self, expiry_s):
        """True / False, or None where the document does not decide."""
        if self.now_ms is None:
            return None
        # Token: "valid while now < expiry x 1000 ms".
        return self.now_ms >= expiry_s * 1000

    # -- tokens ------------------------------------------------------------

    def check_tokens(self):
        G = "tokens"
        listed = self.section_list("tokens")
        self.tokens = [None] * len(listed)
        for i, what, t in self.entries(G, "tokens", listed):
            try:
                tok = hexbytes(t.get("token"), what + ".token", 32)
            except Bad as e:
                self.r.fail(G, str(e))
                continue
            player, group, refl, expiry = struct.unpack(">IHHQ", tok[:16])
            rec = {"token": tok, "player": player, "group": group, "reflector": refl,
                   "expires": expiry}
            for key, val in (("player", player), ("group", group), ("reflector", refl),
                             ("expires_unix_s", expiry)):
                if key not in t:
                    self.r.fail(G, "%s: field %r missing (Test vectors)" % (what, key))
                    continue
                try:
                    given = as_int(t[key], "%s.%s" % (what, key))
                    self.r.check(G, given == val, "%s.%s is %d but the token's bytes say %d (Token)"
                                 % (what, key, given, val))
                except Bad as e:
                    self.r.fail(G, str(e))
            if self.secret is not None:
                want = token_mac(self.secret, tok[:16])
                self.r.check(G, tok[16:] == want,
                             "%s: token MAC (bytes 16..32) is %s, HMAC(secret, \"reflector-token-v1\" "
                             "|| bytes 0..16)[..16] is %s (Token)" % (what, tok[16:].hex(), want.hex()))
                k, km, kt = derive_keys(self.secret, tok)
                rec.update(K=k, Km=km, Kt=kt)
                for key, val, rule in (("session_key", k, "HMAC(secret, \"reflector-session-v2\" || T)"),
                                       ("mac_key", km, "HMAC(K, \"reflector-mac-v2\")"),
                                       ("tag_key", kt, "HMAC(K, \"reflector-tag-v2\")[..16]")):
                    if key not in t:
                        self.r.fail(G, "%s: %s missing (Test vectors)" % (what, key))
                        continue
                    try:
                        given = hexbytes(t[key], "%s.%s" % (what, key), len(val))
                        self.r.check(G, given == val, "%s.%s is %s, %s is %s (Keys)"
                                     % (what, key, given.hex(), rule, val.hex()))
                    except Bad as e:
                        self.r.fail(G, str(e))
                self.tokens[i] = rec
            known = {"player", "group", "reflector", "expires_unix_s", "token", "session_key",
                     "mac_key", "tag_key"} | DESCRIPTIVE
            for k in t:
                if k not in known:
                    self.r.fail(G, "AMBIGUOUS: %s has field %r, which the document's Test vectors "
                                   "section does not describe; not checked" % (what, k))

    # -- cookies -----------------------------------------------------------

    def check_cookies(self):
        G = "cookies"
        for _, what, c in self.entries(G, "cookies", self.section_list("cookies")):
            try:
                ip, port = parse_address(c.get("address"))
                group = as_int(c.get("group"), what + ".group")
                player = as_int(c.get("player"), what + ".player")
                slot = as_int(c.get("slot"), what + ".slot")
                cookie = hexbytes(c.get("cookie"), what + ".cookie", 16)
            except (Bad, ValueError) as e:
                self.r.fail(G, "%s: %s" % (what, e))
                continue
            self.r.check(G, 0 <= group <= 0xFFFF and 0 <= player <= 0xFFFFFFFF and slot >= 0,
                         "%s: group, player or slot out of its field's range (Cookie)" % what)
            if self.cookie_key is not None:
                want = cookie_for(self.cookie_key, ip, port, group, player, slot) or b""
                self.r.check(G, cookie == want,
                             "%s: cookie is %s, HMAC(cookie key, \"reflector-cookie-v1\" || address || "
                             "group || player || slot)[..16] is %s (Cookie)" % (what, cookie.hex(), want.hex()))
            if self.now_ms is not None:
                now_slot = self.now_ms // 10000
                self.r.check(G, slot in (now_slot, now_slot - 1),
                             "%s: slot %d is not accepted at now_unix_ms (slot %d; a cookie is accepted "
                             "in its own slot and the next) (Cookie)" % (what, slot, now_slot))
            for k in c:
                if k not in {"address", "group", "player", "slot", "cookie"} | DESCRIPTIVE:
                    self.r.fail(G, "AMBIGUOUS: %s has field %r, which the document's Test vectors "
                                   "section does not describe; not checked" % (what, k))

    def find_cookie(self, cookie):
        for c in self.section_list("cookies"):
            if isinstance(c, dict) and isinstance(c.get("cookie"), str):
                try:
                    if hexbytes(c["cookie"], "cookie") == cookie:
                        return c
                except Bad:
                    pass
        return None

    # -- datagrams -----------------------------------------------------------

    def check_datagrams(self):
        G = "datagrams"
        seen = set()
        for _, what, d in self.entries(G, "datagrams", self.section_list("datagrams")):
            for k in ("name", "type", "keys", "hex"):
                if k not in d:
                    self.r.fail(G, "%s: %r missing (Test vectors)" % (what, k))
            if "name" in d:
                self.r.check(G, isinstance(d["name"], str) and d["name"].strip(),
                             "%s: name is not a non-empty string" % what)
            try:
                b = hexbytes(d.get("hex"), what + ".hex")
            except Bad as e:
                self.r.fail(G, str(e))
                continue
            seen |= self.guard(G, what, self.check_one_datagram, G, what, d, b) or set()
        # "Every message of this document has test vectors."
        C = "coverage"
        for t, name in TYPE_NAMES.items():
            self.r.check(C, name in seen, "no valid datagram of type %d (%s) among datagrams "
                                       "(intro: every message has test vectors)" % (t, name))
        self.r.check(C, "JOIN88" in seen, "no JOIN with cookie (88 bytes) among datagrams")
        self.r.check(C, "DATA_TAG" in seen, "no DATA with a tag among datagrams")
        self.r.check(C, "V1ERROR" in seen, "no version-1 ERROR(Version) among datagrams "
                                           "(Header: the 18-byte reply is a message of the document)")

    def check_one_datagram(self, G, what, d, b):
        """Checks one valid datagram; returns a coverage tag or None."""
        r = self.r
        t_given = d.get("type")
        try:
            if isinstance(t_given, str) and names_to_int(TYPE_NAMES, t_given) is not None:
                t_given = names_to_int(TYPE_NAMES, t_given)
            else:
                t_given = as_int(t_given, what + ".type")
        except Bad as e:
            r.fail(G, str(e))
            t_given = None
        if len(b) >= 3 and b[:2] == struct.pack(">H", MAGIC) and b[2] == 1:
            return self.check_v1_error(G, what, d, b, t_given)
        if not r.check(G, len(b) >= HEADER, "%s: %d bytes, shorter than the 24-byte header (Header)"
                       % (what, len(b))):
            return None
        magic, version, t, group, length, player, membership, seq = struct.unpack(">HBBHHIIQ", b[:24])
        r.check(G, magic == MAGIC, "%s: magic 0x%04x, not 0x5246 (Header)" % (what, magic))
        r.check(G, version == 2, "%s: version %d, not 2 (Header)" % (what, version))
        r.check(G, t_given is None or t == t_given,
                "%s: type byte %d but entry says type %r (Types)" % (what, t, d.get("type")))
        if not r.check(G, t in TYPE_NAMES, "%s: type %d is not in the Types table" % (what, t)):
            return None
        tn = TYPE_NAMES[t]
        what = "%s %s" % (what, tn)
        if t == DATA:
            r.check(G, 32 <= len(b) <= MAX_DATA,
                    "%s: %d bytes; a DATA is 32 + n bytes and at most 1,472 (DATA: maximum payload)"
                    % (what, len(b)))
        else:
            r.check(G, len(b) in SIZES[t], "%s: %d bytes, the Types table says %s"
                    % (what, len(b), " or ".join(str(s) for s in SIZES[t])))
        r.check(G, length == len(b) - HEADER, "%s: length field %d, datagram length - 24 is %d (Header)"
                % (what, length, len(b) - HEADER))
        sized = len(b) in SIZES.get(t, ()) or (t == DATA and len(b) >= 32)
        if not sized:
            return None

        # keys and the MAC / tag
        keys = d.get("keys")
        rec = None
        if keys is not None:
            try:
                rec = self.token_at(keys, what)
            except Bad as e:
                r.fail(G, str(e))
        if t in FULL_MAC or t in SHORT_MAC:
            if keys is None:
                r.fail(G, "%s: keys is null but %s carries a MAC (Types)" % (what, tn))
            elif rec is not None and "Km" in rec:
                self.check_mac(G, what, t, b, rec)
        elif t == ERROR:
            r.check(G, keys is None, "%s: keys %r, but ERROR is not MAC'd (Types: \"ERROR is not "
                                     "MAC'd\"); expected null" % (what, keys))
        elif t == DATA:
            tag = b[24:32]
            if keys is None:
                r.check(G, tag == bytes(8), "%s: keys null (tags off or stripped) but tag field is %s, "
                                            "not zero (DATA and tags)" % (what, tag.hex()))
            elif rec is not None and "Kt" in rec:
                want = siphash24(rec["Kt"], b[:24] + bytes(8) + b[32:])
                r.check(G, tag == want.to_bytes(8, "big"),
                        "%s: tag %s, SipHash-2-4(Kt, datagram with bytes 24..32 zero) big-endian is %016x "
                        "(DATA and tags)" % (what, tag.hex(), want))

        # header against the signing token
        if rec is not None and t != JOIN:
            r.check(G, player == rec["player"], "%s: header player %d, the keys' token is player %d (Header)"
                    % (what, player, rec["player"]))
            r.check(G, group == rec["group"], "%s: header group %d, the keys' token is for group %d (Header)"
                    % (what, group, rec["group"]))
        if t != ERROR:
            r.check(G, seq >= 1, "%s: sequence 0; a window accepts only s >= 1 (Sequence numbers)" % what)

        cov = {tn}
        # type-specific rules
        if t == JOIN:
            if self.check_join(G, what, d, b, rec, group, player, membership):
                cov.add("JOIN88")
        elif t == JOIN_CHALLENGE:
            self.check_cookie_in(G, what, d, b[24:40], group, player)
        elif t == JOIN_ACK:
            flags = b[28]
            r.check(G, b[29] == 0, "%s: reserved byte 29 is %d, not 0 (Types)" % (what, b[29]))
            r.check(G, not flags & 0x04, "%s: flags 0x%02x set bit 2 (sealed); \"a reflector of this "
                                          "revision never sets it\" (JOIN_ACK flags)" % (what, flags))
            r.check(G, not flags & 0xF8, "%s: flags 0x%02x set bits 3..7, which are zero (JOIN_ACK flags)"
                    % (what, flags))
            r.check(G, membership != 0, "%s: membership id 0; 0 means \"asks for a new membership\" "
                                        "(Header)" % what)
        elif t == ERROR:
            r.check(G, seq == 0, "%s: sequence %d; an ERROR carries sequence 0 (Types)" % (what, seq))
            code, res = struct.unpack(">HH", b[24:28])
            r.check(G, code in ERROR_CODES, "%s: code %d is not in the ERROR codes table" % (what, code))
            r.check(G, code != 6, "%s: code 6 (Version) is sent in a version-1 ERROR, not a version-2 one "
                                  "(ERROR codes, Header)" % what)
            r.check(G, res == 0, "%s: reserved u16 is %d, not 0 (Types)" % (what, res))
        elif t == MOVED:
            reason, _within, res = struct.unpack(">HHI", b[24:32])
            r.check(G, reason in MOVED_REASONS, "%s: reason %d is not 1, 2 or 3 (Moved)" % (what, reason))
            r.check(G, res == 0, "%s: reserved u32 is %d, not 0 (Moved)" % (what, res))
        elif t == DATA:
            if keys is not None and b[24:32] != bytes(8):
                cov.add("DATA_TAG")
        if t in (JOIN_ACK, LEAVE, KEEPALIVE, PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO,
                 ECHO_REPLY, MOVED, DATA):
            r.check(G, membership != 0, "%s: membership id 0 in a member datagram; 0 is the JOIN's "
                                        "\"new membership\" value (Header)" % what)

        self.check_given_fields(G, what, d, b, datagram_fields(t, b), t, rec)
        return cov

    def check_mac(self, G, what, t, b, rec):
        if t in FULL_MAC:
            want = mac16(rec["Km"], b[:-16])
            return self.r.check(G, b[-16:] == want, "%s: MAC %s, HMAC(Km, bytes before it)[..16] is %s (Keys)"
                                % (what, b[-16:].hex(), want.hex()))
        want = mac16(rec["Km"], b[:32])[:8]
        return self.r.check(G, b[32:40] == want, "%s: short MAC %s, HMAC(Km, bytes 0..32)[..8] is %s (Keys)"
                            % (what, b[32:40].hex(), want.hex()))

    def check_join(self, G, what, d, b, rec, group, player, membership):
        r = self.r
        tok = b[24:56]
        tp, tg, trefl, texp = struct.unpack(">IHHQ", tok[:16])
        if self.secret is not None:
            want = token_mac(self.secret, tok[:16])
            r.check(G, tok[16:] == want, "%s: the token's MAC does not verify under the secret (Token)" % what)
        r.check(G, tp == player, "%s: token player %d, header player %d; a reflector accepts a token only "
                                 "if its player id is the header's (Token)" % (what, tp, player))
        r.check(G, tg == group, "%s: token group %d, header group %d (Token: its group is the port it "
                                "arrived on)" % (what, tg, group))
        ex = self.expired(texp)
        if ex is None and self.now_ms is not None:
            r.fail(G, "AMBIGUOUS: %s: now_unix_ms %d falls within the token's expiry second %d; the "
                      "document does not say whether a token expires at or after that second (Token)"
                   % (what, self.now_ms, texp))
        else:
            r.check(G, ex is False, "%s: the token expired (%d s) before now_unix_ms (%s) (Token)"
                    % (what, texp, self.now_ms))
        renewal = rec is not None and rec["token"] != tok
        given_renewal = None
        for k, v in d.items():
            if norm(k) == "renewal":
                given_renewal = bool(v)
        if given_renewal is not None:
            r.check(G, given_renewal == renewal,
                    "%s: entry says renewal=%r, but the keys' token %s the embedded token"
                    % (what, given_renewal, "differs from" if renewal else "is"))
        if renewal:
            # Membership lifetime and renewal: 72 bytes, current membership id, newer token for the
            # same player/group/reflector with a later expiry, MAC under the membership's key.
            r.check(G, len(b) == 72, "%s: MAC'd under another token's keys (a renewal) but %d bytes; a "
                                     "renewal is a JOIN of 72 bytes, no cookie (Lifetime)" % (what, len(b)))
            r.check(G, membership != 0, "%s: renewal with membership 0; it carries the current "
                                        "membership id (Lifetime)" % what)
            r.check(G, (tp, tg, trefl) == (rec["player"], rec["group"], rec["reflector"]),
                    "%s: renewal token is not for the same player, group and reflector as the "
                    "membership's (Lifetime)" % what)
            r.check(G, texp > rec["expires"], "%s: renewal token expiry %d is not later than the "
                                              "membership's %d (Lifetime)" % (what, texp, rec["expires"]))
        if len(b) == 88:
            self.check_cookie_in(G, what, d, b[56:72], group, player)
            return "JOIN88"
        return None

    def check_cookie_in(self, G, what, d, cookie, group, player):
        """A cookie inside a JOIN or JOIN_CHALLENGE: recomputed if the entry gives its address."""
        addr = None
        slot = None
        for k, v in d.items():
            if norm(k) in ("address", "source", "sourceaddress", "addr"):
                addr = v
            if norm(k) == "slot":
                slot = v
        if addr is not None and self.cookie_key is not None:
            try:
                ip, port = parse_address(addr)
            except ValueError as e:
                self.r.fail(G, "%s: address %r: %s" % (what, addr, e))
                return
            if slot is not None:
                slots = [as_int(slot, what + ".slot")]
            elif self.now_ms is not None:
                ns = self.now_ms // 10000
                slots = [ns, ns - 1]
            else:
                self.r.fail(G, "%s: no slot given and no now_unix_ms: the cookie cannot be checked" % what)
                return
            ok = any(cookie == cookie_for(self.cookie_key, ip, port, group, player, s) for s in slots)
            self.r.check(G, ok, "%s: cookie %s is not HMAC(cookie key, ...) of address %s, group %d, player "
                                "%d, slot %s (Cookie)" % (what, cookie.hex(), addr, group, player, slots))
            return
        c = self.find_cookie(cookie)
        if c is not None:
            try:
                self.r.check(G, as_int(c.get("group"), "group") == group and
                             as_int(c.get("player"), "player") == player,
                             "%s: carries the cookie of cookies entry for group %s player %s, but the header "
                             "is group %d player %d (Cookie)" % (what, c.get("group"), c.get("player"),
                                                                group, player))
            except Bad as e:
                self.r.fail(G, "%s: %s" % (what, e))

    def check_given_fields(self, G, what, d, b, fields, t, rec):
        r = self.r
        for k, given in d.items():
            if k in DESCRIPTIVE:
                continue
            n = norm(k)
            fw = "%s.%s" % (what, k)
            if n in ("address", "source", "sourceaddress", "addr", "slot", "renewal"):
                continue  # used by the cookie / renewal checks
            if n == "direction":
                self.check_direction(G, fw, t, given)
                continue
            if t == DATA and n in ("tags", "tagged"):
                on = b[24:32] != bytes(8)
                r.check(G, bool(given) == on and (not given or d.get("keys") is not None),
                        "%s: given %r, but the tag field is %s (with tags off the field is zero) (DATA)"
                        % (fw, given, b[24:32].hex()))
                continue
            if t == DATA and n == "stripped":
                r.check(G, not given or b[24:32] == bytes(8),
                        "%s: stripped but the tag field is %s, not zero (DATA)" % (fw, b[24:32].hex()))
                continue
            if t == DATA and n in ("payloadlength", "payloadlen", "n"):
                try:
                    r.check(G, as_int(given, fw) == len(b) - 32, "%s: payload is %d bytes, given %r"
                            % (fw, len(b) - 32, given))
                except Bad as e:
                    r.fail(G, str(e))
                continue
            if n.endswith("name") and n[:-4] in fields and fields[n[:-4]].names not in (None, FLAG_BITS):
                f = fields[n[:-4]]
                self.note(k, "the document's name for %s's value" % n[:-4])
                have = f.value(b)
                r.check(G, isinstance(given, str) and names_to_int(f.names, given) == have,
                        "%s: %r is not the document's name for %d (%s)" % (fw, given, have, f.names.get(have, "?")))
                continue
            if t == JOIN and n == "tokenindex":
                self.note(k, "the index in tokens of the token the JOIN carries")
                try:
                    tr = self.token_at(given, fw)
                    r.check(G, tr["token"] == b[24:56], "%s: the JOIN's token is not tokens[%r]" % (fw, given))
                except Bad as e:
                    r.fail(G, str(e))
                continue
            if t == JOIN and n == "token" and isinstance(given, int) and not isinstance(given, bool):
                try:
                    tr = self.token_at(given, fw)
                    r.check(G, tr["token"] == b[24:56], "%s: the JOIN's token is not tokens[%d]" % (fw, given))
                except Bad as e:
                    r.fail(G, str(e))
                continue
            if t == JOIN_ACK and n == "flags":
                try:
                    r.check(G, flags_value(given, fw) == b[28], "%s: datagram flags 0x%02x, given %r"
                            % (fw, b[28], given))
                except Bad as e:
                    r.fail(G, str(e))
                continue
            if n in ("size", "len", "bytes", "total", "totallength", "datagramlength"):
                try:
                    r.check(G, as_int(given, fw) == len(b), "%s: datagram is %d bytes, given %r"
                            % (fw, len(b), given))
                except Bad as e:
                    r.fail(G, str(e))
                continue
            f = fields.get(n)
            if f is None:
                r.fail(G, "AMBIGUOUS: %s: the document defines no field %r for %s; not checked"
                       % (what, k, TYPE_NAMES.get(t, t)))
                continue
            msg = compare_field(f, b, given, fw)
            r.check(G, msg is None, msg)

    def check_direction(self, G, fw, t, given):
        s = str(given).lower()
        words = [w for w in ("client", "member", "reflector", "both") if w in s]
        order = sorted(words, key=lambda w: s.index(w))
        want = DIRECTIONS[t]
        if not order:
            self.r.fail(G, "AMBIGUOUS: %s: cannot read direction %r" % (fw, given))
            return
        sender = order[0]
        ok = (sender == want[0] or (sender in ("client", "member") and want[0] in ("client", "member"))
              or want[0] == "both")
        self.r.check(G, ok, "%s: given %r, the Types table says %s -> %s" % (fw, given, want[0], want[1]))

    def check_v1_error(self, G, what, d, b, t_given):
        r = self.r
        what += " version-1 ERROR"
        ok = r.check(G, len(b) == 18, "%s: %d bytes; the version-1 ERROR(Version) is 18 (Header)"
                     % (what, len(b)))
        r.check(G, t_given is None or t_given == ERROR,
                "%s: entry type %r; the version-1 reply is type 7 (Header)" % (what, d.get("type")))
        if not ok:
            return None
        r.check(G, b[3] == 7, "%s: type byte %d, not 7 (Header)" % (what, b[3]))
        r.check(G, b[6:8] == b"\x00\x02", "%s: length (bytes 6..8) is %s, not 2 (Header)" % (what, b[6:8].hex()))
        r.check(G, b[12:16] == bytes(4), "%s: bytes 12..16 are %s, not zero (Header)" % (what, b[12:16].hex()))
        r.check(G, b[16:18] == b"\x00\x06", "%s: code (bytes 16..18) is %s, not 6 (Header)" % (what, b[16:18].hex()))
        r.check(G, d.get("keys") is None, "%s: keys %r, but an ERROR is not MAC'd; expected null"
                % (what, d.get("keys")))
        if "membership" in d:
            self.note("membership (version-1 ERROR)", "bytes 12..16, which the Header section says are zero")
        d = dict(d)
        if "request" in d:
            self.note("request (version-1 ERROR)", "the version-1 datagram it answers")
            try:
                q = hexbytes(d.pop("request"), what + ".request")
                r.check(G, len(q) >= HEADER and q[:2] == b"RF" and q[2] == 1,
                        "%s: the request is not a version-1 datagram of at least 24 bytes; only those are "
                        "answered (Header)" % what)
                r.check(G, q[4:6] == b[4:6], "%s: group %s is not the request's %s (Header)"
                        % (what, b[4:6].hex(), q[4:6].hex()))
                r.check(G, q[8:12] == b[8:12], "%s: bytes 8..12 %s are not the request's %s (Header)"
                        % (what, b[8:12].hex(), q[8:12].hex()))
            except Bad as e:
                r.fail(G, str(e))
        self.check_given_fields(G, what, d, b, v1_error_fields(), ERROR, None)
        return {"V1ERROR"}

    # -- checkpoint channel -------------------------------------------------

    def check_channel(self):
        G = "channel"
        ch = self.doc.get("channel")
        if not isinstance(ch, dict):
            if "channel" in self.doc and ch not in (None, "", [], {}):
                self.r.fail(G, "channel is not an object (Test vectors)")
            return
        for k in ("challenge", "keys", "messages"):
            self.r.check(G, k in ch, "channel.%s missing (Test vectors)" % k)
        requester = {}
        for k in ch:
            if norm(k) in ("group", "player", "membership"):
                self.note("channel." + k, "the requester's %s, compared with every REQUEST" % k)
                requester[norm(k)] = ch[k]
            elif k not in ("challenge", "keys", "messages") and k not in DESCRIPTIVE:
                self.r.fail(G, "AMBIGUOUS: channel.%s is not described by the document; not checked" % k)
        if isinstance(ch.get("challenge"), int):
            self.note("channel.challenge as a number", "the 8-byte challenge read big-endian (Conventions)")
        try:
            challenge = bytes8(ch.get("challenge"), "channel.challenge")
        except Bad as e:
            self.r.fail(G, str(e))
            challenge = None
        try:
            rec = self.token_at(ch.get("keys"), "channel")
        except Bad as e:
            self.r.fail(G, str(e))
            rec = None
        msgs = ch.get("messages")
        if not isinstance(msgs, list) or not msgs:
            self.r.fail(G, "channel.messages is missing, not a list, or empty")
            return
        self.ch_challenge, self.ch_rec = challenge, rec
        self.requests = []  # (name, bytes)
        self.hello = None
        self.body = None
        seen_ops, seen_status, seen = set(), set(), set()
        parsed = []
        for i, what, m in self.entries(G, "channel.messages", msgs):
            self.r.check(G, "name" in m and "hex" in m, "%s: name or hex missing (Test vectors)" % what)
            try:
                b = hexbytes(m.get("hex"), what + ".hex")
            except Bad as e:
                self.r.fail(G, str(e))
                continue
            parsed.append((what, m, b, channel_kind(m, b)))
        # requests first: replies and the body refer to them
        for what, m, b, kind in parsed:
            if kind == "REQUEST":
                self.requests.append((m.get("name"), b))
                if len(b) == REQUEST_LEN:
                    for n, f in (("group", F(8, 2)), ("player", F(12, 4)), ("membership", F(16, 4))):
                        if n in requester:
                            msg = compare_field(f, b, requester[n], "channel.%s against %s" % (n, what))
                            self.r.check(G, msg is None, msg)
            if kind == "HELLO" and self.hello is None:
                self.hello = b
        for what, m, b, kind in parsed:
            if kind == "HELLO":
                self.guard(G, what, self.check_hello, G, what, m, b)
            elif kind == "REQUEST":
                op = self.guard(G, what, self.check_request, G, what, m, b)
                if op:
                    seen_ops.add(op)
            elif kind == "BODY":
                self.guard(G, what, self.check_body, G, what, m, b)
                seen.add("BODY")
            elif kind == "REPLY":
                st = self.guard(G, what, self.check_reply, G, what, m, b)
                if st:
                    seen_status.add(st)
            else:
                self.r.fail(G, "%s: not a HELLO, REQUEST, REPLY or body MAC by its bytes (channel, "
                               "version 2)" % what)
            seen.add(kind)
        C = "coverage"
        self.r.check(C, "HELLO" in seen, "no channel HELLO")
        for op, n in OPS.items():
            self.r.check(C, op in seen_ops, "no channel REQUEST with op %d (%s)" % (op, n))
        self.r.check(C, "BODY" in seen, "no channel body MAC")
        for st, n in STATUSES.items():
            self.r.check(C, st in seen_status, "no channel REPLY with status %d (%s)" % (st, n))

    def msg_challenge(self, m, what):
        for k, v in m.items():
            if norm(k) == "challenge" and not (isinstance(v, str) and len(v) == 0):
                try:
                    return bytes8(v, what + ".challenge")
                except Bad:
                    return self.ch_challenge
        return self.ch_challenge

    def msg_rec(self, m, what):
        if "keys" in m:
            try:
                return self.token_at(m["keys"], what)
            except Bad as e:
                self.r.fail("channel", str(e))
                return None
        return self.ch_rec

    def check_hello(self, G, what, m, b):
        r = self.r
        what += " HELLO"
        if not r.check(G, len(b) == HELLO_LEN, "%s: %d bytes, HELLO is 32" % (what, len(b))):
            return
        magic, ver, msg, res1, chal, max_state, deadline, res2 = struct.unpack(">IBBH8sQII", b)
        r.check(G, magic == CHANNEL_MAGIC, "%s: magic 0x%08x, not 0x5246434B" % (what, magic))
        r.check(G, ver == 2, "%s: version %d, not 2" % (what, ver))
        r.check(G, msg == 1, "%s: message %d, not 1" % (what, msg))
        r.check(G, res1 == 0, "%s: reserved bytes 6..8 are %d, not zero" % (what, res1))
        r.check(G, res2 == 0, "%s: reserved bytes 28..32 are %d, not zero" % (what, res2))
        if self.ch_challenge is not None:
            r.check(G, chal == self.ch_challenge, "%s: challenge %s, channel.challenge is %s"
                    % (what, chal.hex(), self.ch_challenge.hex()))
        fields = {"magic": F(0, 4), "version": F(4, 1), "message": F(5, 1), "reserved": F(6, 2),
                  "challenge": F(8, 8, "bytes"), "maxstate": F(16, 8), "maxstatebytes": F(16, 8),
                  "hellodeadlinems": F(24, 4), "deadlinems": F(24, 4), "hellodeadline": F(24, 4)}
        self.channel_fields(G, what, m, b, fields)

    def channel_fields(self, G, what, m, b, fields, skip=()):
        for k, given in m.items():
            if k in DESCRIPTIVE:
                continue
            n = norm(k)
            if n in skip:
                continue
            f = fields.get(n)
            if f is None:
                self.r.fail(G, "AMBIGUOUS: %s: the document defines no field %r for this message; "
                               "not checked" % (what, k))
                continue
            msg = compare_field(f, b, given, "%s.%s" % (what, k))
            self.r.check(G, msg is None, msg)

    def check_request(self, G, what, m, b):
        r = self.r
        what += " REQUEST"
        if not r.check(G, len(b) == REQUEST_LEN, "%s: %d bytes, REQUEST is 64" % (what, len(b))):
            return None
        (magic, ver, msg, op, flags, group, res1, player, membership, res2,
         nonce, blen, tick) = struct.unpack(">IBBBBHHIII8sQQ", b[:48])
        r.check(G, magic == CHANNEL_MAGIC, "%s: magic 0x%08x, not 0x5246434B" % (what, magic))
        r.check(G, ver == 2, "%s: version %d, not 2" % (what, ver))
        r.check(G, msg == 2, "%s: message %d, not 2" % (what, msg))
        r.check(G, op in OPS, "%s: op %d is not 1, 2 or 3" % (what, op))
        r.check(G, flags == 0, "%s: flags %d, not zero" % (what, flags))
        r.check(G, res1 == 0, "%s: reserved bytes 10..12 are %d, not zero" % (what, res1))
        r.check(G, res2 == 0, "%s: reserved bytes 20..24 are %d, not zero" % (what, res2))
        what += " " + OPS.get(op, "op %d" % op)
        if op == 1:
            r.check(G, nonce != bytes(8), "%s: UPLOAD nonce is zero; it is the CHECKPOINT_REQUEST's "
                                          "(fresh, unpredictable)" % what)
            if self.hello is not None and len(self.hello) == HELLO_LEN:
                max_state = struct.unpack(">Q", self.hello[16:24])[0]
                r.check(G, blen <= max_state, "%s: body length %d exceeds the HELLO's max state %d"
                        % (what, blen, max_state))
        else:
            r.check(G, nonce == bytes(8), "%s: nonce %s, zero for a fetch" % (what, nonce.hex()))
            r.check(G, blen == 0, "%s: body length %d, zero for a fetch" % (what, blen))
            r.check(G, tick == 0, "%s: tick %d, zero for a fetch" % (what, tick))
        rec = self.msg_rec(m, what)
        challenge = self.msg_challenge(m, what)
        if rec is not None:
            r.check(G, player == rec["player"], "%s: player %d, the keys' token is player %d"
                    % (what, player, rec["player"]))
            r.check(G, group == rec["group"], "%s: group %d, the keys' token is for group %d"
                    % (what, group, rec["group"]))
            if "Km" in rec and challenge is not None:
                want = mac16(rec["Km"], b"reflector-channel-v2-request" + challenge + b[:48])
                r.check(G, b[48:64] == want, "%s: request MAC %s, HMAC(Km, \"reflector-channel-v2-request\" "
                                             "|| challenge || bytes 0..48)[..16] is %s"
                        % (what, b[48:64].hex(), want.hex()))
        r.check(G, membership != 0, "%s: membership 0 (Header: 0 only in a JOIN)" % what)
        fields = {"magic": F(0, 4), "version": F(4, 1), "message": F(5, 1),
                  "op": F(6, 1, names=OPS), "flags": F(7, 1), "group": F(8, 2), "player": F(12, 4),
                  "membership": F(16, 4), "nonce": F(24, 8, "bytes"), "bodylength": F(32, 8),
                  "bodylen": F(32, 8), "length": F(32, 8), "tick": F(40, 8),
                  "mac": F(48, 16, "bytes"), "requestmac": F(48, 16, "bytes")}
        self.channel_fields(G, what, m, b, fields, skip=("challenge", "keys"))
        return op if op in OPS else None

    def request_for(self, G, what, m, ops):
        """Candidate REQUESTs a reply/body answers: one named by a 'request' field, else those whose op fits."""
        for k, v in m.items():
            if norm(k) in ("request", "inreplyto", "answers", "requestname"):
                hits = [q for q in self.requests if q[0] == v]
                if not hits:
                    self.r.fail(G, "%s: %s names no REQUEST among the messages" % (what, k))
                return hits
        return [q for q in self.requests if len(q[1]) == REQUEST_LEN and q[1][6] in ops]

    def check_request_mac_field(self, G, what, m, answered):
        """'request_mac' beside a body MAC or REPLY: the MAC of the REQUEST it answers."""
        for k, v in m.items():
            if norm(k) == "requestmac":
                self.note(k + " (body MAC, REPLY)", "the request MAC of the REQUEST it answers")
                try:
                    rm = hexbytes(v, "%s.%s" % (what, k), 16)
                except Bad as e:
                    self.r.fail(G, str(e))
                    continue
                if answered is not None:
                    self.r.check(G, rm == answered[48:64], "%s.%s is %s, the answered REQUEST's MAC is %s"
                                 % (what, k, rm.hex(), answered[48:64].hex()))

    def state_of(self, m, what):
        for k, v in m.items():
            if norm(k) in ("state", "body", "statehex"):
                return hexbytes(v, "%s.%s" % (what, k))
        return None

    def check_body(self, G, what, m, b):
        r = self.r
        what += " body MAC"
        try:
            state = self.state_of(m, what)
        except Bad as e:
            r.fail(G, str(e))
            return
        if state is None:
            r.fail(G, "%s: the state is not given beside the body MAC; the MAC cannot be recomputed" % what)
            return
        if len(b) == BODY_MAC_LEN:
            mac = b
        elif len(b) == len(state) + BODY_MAC_LEN and b[:len(state)] == state:
            mac = b[len(state):]
        else:
            r.fail(G, "%s: hex is %d bytes; a body MAC is 16 (or the state then the MAC)" % (what, len(b)))
            return
        self.body = state
        rec = self.msg_rec(m, what)
        challenge = self.msg_challenge(m, what)
        cands = self.request_for(G, what, m, (1,))
        if not r.check(G, cands, "%s: no UPLOAD REQUEST in the messages for its request MAC" % what):
            return
        if rec is None or "Km" not in rec or challenge is None:
            return
        good = [q for q in cands if mac == mac16(rec["Km"], b"reflector-channel-v2-body" + challenge
                                                 + q[1][48:64] + state)]
        r.check(G, good, "%s: body MAC %s is not HMAC(Km, \"reflector-channel-v2-body\" || challenge || "
                         "request MAC || state)[..16] for any UPLOAD REQUEST" % (what, mac.hex()))
        self.check_request_mac_field(G, what, m, good[0][1] if good else None)
        for q in good[:1]:
            blen = struct.unpack(">Q", q[1][32:40])[0]
            r.check(G, blen == len(state), "%s: state is %d bytes, the UPLOAD REQUEST's body length is %d"
                    % (what, len(state), blen))
        fields = {"mac": F(0, 16, "bytes"), "bodymac": F(0, 16, "bytes")}
        self.channel_fields(G, what, m, mac, fields,
                            skip=("state", "body", "statehex", "challenge", "keys", "request",
                                  "inreplyto", "answers", "requestname", "requestmac"))

    def check_reply(self, G, what, m, b):
        r = self.r
        what += " REPLY"
        if not r.check(G, len(b) >= REPLY_LEN, "%s: %d bytes, REPLY is 88" % (what, len(b))):
            return None
        (magic, ver, msg, status, refusal, number, blen, tick, from_player, age,
         digest) = struct.unpack(">IBBBBQQQII32s", b[:72])
        mac = b[72:88]
        r.check(G, magic == CHANNEL_MAGIC, "%s: magic 0x%08x, not 0x5246434B" % (what, magic))
        r.check(G, ver == 2, "%s: version %d, not 2" % (what, ver))
        r.check(G, msg == 3, "%s: message %d, not 3" % (what, msg))
        if not r.check(G, status in STATUSES, "%s: status %d is not 1..5" % (what, status)):
            return None
        sn = STATUSES[status]
        what += " " + sn
        stored_or_cp = status in (2, 3)
        if status == 5:
            r.check(G, refusal in REFUSALS, "%s: refusal code %d is not 1..7" % (what, refusal))
        else:
            r.check(G, refusal == 0, "%s: refusal code %d, zero unless REFUSED" % (what, refusal))
        if not stored_or_cp:
            r.check(G, number == 0, "%s: checkpoint number %d, zero unless STORED or CHECKPOINT" % (what, number))
            r.check(G, tick == 0, "%s: tick %d, zero unless STORED or CHECKPOINT" % (what, tick))
            r.check(G, from_player == 0, "%s: from player %d, zero unless STORED or CHECKPOINT"
                    % (what, from_player))
            r.check(G, digest == bytes(32), "%s: SHA-256 field not zero (only STORED, CHECKPOINT)" % what)
        if status != 3:
            r.check(G, blen == 0, "%s: body length %d, zero unless CHECKPOINT" % (what, blen))
            r.check(G, age == 0, "%s: age ms %d, zero unless CHECKPOINT" % (what, age))
            r.check(G, len(b) == REPLY_LEN, "%s: %d bytes; only a CHECKPOINT is followed by a state"
                    % (what, len(b)))
        # the state and its digest
        try:
            state = self.state_of(m, what)
        except Bad as e:
            r.fail(G, str(e))
            state = None
        if status == 3:
            if len(b) > REPLY_LEN:
                follow = b[REPLY_LEN:]
                if state is not None:
                    r.check(G, state == follow, "%s: the state beside it differs from the bytes after the REPLY"
                            % what)
                state = follow
            if state is not None:
                r.check(G, blen == len(state), "%s: body length %d, the state is %d bytes" % (what, blen, len(state)))
        if status == 2 and state is None:
            state = self.body
        if stored_or_cp:
            if state is None:
                r.fail(G, "%s: no state given (beside it, after it, or in the body) to check the SHA-256" % what)
            else:
                want = hashlib.sha256(state).digest()
                r.check(G, digest == want, "%s: SHA-256 field %s, SHA-256 of the state is %s"
                        % (what, digest.hex(), want.hex()))
        # MAC against the request it answers
        ops = {1: (1,), 2: (1,), 3: (2, 3), 4: (2, 3), 5: (1, 2, 3)}[status]
        cands = self.request_for(G, what, m, ops)
        rec = self.msg_rec(m, what)
        challenge = self.msg_challenge(m, what)
        answered = None
        if status == 5 and mac == bytes(16):
            r.ok(G)  # "all zero in a REFUSED sent before the request MAC verified"
        elif not cands:
            r.fail(G, "%s: no REQUEST among the messages that a %s answers; the reply MAC covers the "
                      "request MAC" % (what, sn))
        elif rec is not None and "Km" in rec and challenge is not None:
            good = [q for q in cands if mac == mac16(rec["Km"], b"reflector-channel-v2-reply" + challenge
                                                     + q[1][48:64] + b[:72])]
            r.check(G, good, "%s: reply MAC %s is not HMAC(Km, \"reflector-channel-v2-reply\" || challenge || "
                             "request MAC || bytes 0..72)[..16] for any fitting REQUEST (%s)"
                    % (what, mac.hex(), ", ".join(str(q[0]) for q in cands)))
            answered = good[0][1] if good else None
        if answered is None and len(cands) == 1:
            answered = cands[0][1]
        self.check_request_mac_field(G, what, m, answered)
        for k, v in m.items():
            if norm(k) == "authenticated":
                self.note(k + " (REPLY)", "whether the reply MAC is a real MAC (true) or all zero (false)")
                r.check(G, isinstance(v, bool) and v == (mac != bytes(16)),
                        "%s.%s is %r but the reply MAC is %s" % (what, k, v, "all zero" if mac == bytes(16)
                                                                else "not zero"))
                r.check(G, v or status == 5, "%s: unauthenticated (all-zero MAC) but only a REFUSED may be "
                                             "(REPLY)" % what)
        if answered is not None and status == 2:
            q_tick = struct.unpack(">Q", answered[40:48])[0]
            q_player = struct.unpack(">I", answered[12:16])[0]
            q_len = struct.unpack(">Q", answered[32:40])[0]
            r.check(G, tick == q_tick, "%s: tick %d, the UPLOAD's tick is %d" % (what, tick, q_tick))
            r.check(G, from_player == q_player, "%s: from player %d, the uploader is %d"
                    % (what, from_player, q_player))
            if state is not None:
                r.check(G, len(state) == q_len, "%s: stored state is %d bytes, the UPLOAD said %d"
                        % (what, len(state), q_len))
        fields = {"magic": F(0, 4), "version": F(4, 1), "message": F(5, 1),
                  "status": F(6, 1, names=STATUSES), "refusal": F(7, 1, names=REFUSALS),
                  "refusalcode": F(7, 1, names=REFUSALS), "code": F(7, 1, names=REFUSALS),
                  "checkpoint": F(8, 8), "checkpointnumber": F(8, 8), "number": F(8, 8),
                  "bodylength": F(16, 8), "bodylen": F(16, 8), "length": F(16, 8), "tick": F(24, 8),
                  "fromplayer": F(32, 4), "from": F(32, 4), "agems": F(36, 4), "age": F(36, 4),
                  "sha256": F(40, 32, "bytes"), "digest": F(40, 32, "bytes"),
                  "statesha256": F(40, 32, "bytes"),
                  "mac": F(72, 16, "bytes"), "replymac": F(72, 16, "bytes")}
        self.channel_fields(G, what, m, b, fields,
                            skip=("state", "body", "statehex", "challenge", "keys", "request",
                                  "inreplyto", "answers", "requestname", "requestmac", "authenticated"))
        return status

    # -- areas ---------------------------------------------------------------

    def check_areas(self):
        """Area of interest: the covered cells are those within `radius` of
        the center in both directions, inside the grid, the center left out,
        ordered by ring (the larger of the two distances), then row, then
        column; a cell is granted when its group is neither the center's nor
        one granted before."""
        G = "areas"
        for _, what, a in self.entries(G, "areas", self.section_list("areas")):
            try:
                cols, rows = self.cell_pair(a.get("grid"), what + ".grid")
                cx, cy = self.cell_pair(a.get("center"), what + ".center")
                radius = as_int(a.get("radius"), what + ".radius")
                groups = a.get("groups")
                if not isinstance(groups, list) or len(groups) != cols * rows:
                    raise Bad("%s.groups: not one group per cell of a %dx%d grid" % (what, cols, rows))
                if not (cx < cols and cy < rows):
                    raise Bad("%s.center: outside the grid" % what)
                want_cells = [self.cell_pair(c, what + ".cells") for c in a.get("cells", [])]
                want_granted = [self.cell_pair(c, what + ".granted") for c in a.get("granted", [])]
            except Bad as ex:
                self.r.fail(G, str(ex))
                continue
            covered = [(x, y)
                       for y in range(max(0, cy - radius), min(rows - 1, cy + radius) + 1)
                       for x in range(max(0, cx - radius), min(cols - 1, cx + radius) + 1)
                       if (x, y) != (cx, cy)]
            covered.sort(key=lambda c: (max(abs(c[0] - cx), abs(c[1] - cy)), c[1], c[0]))
            group = lambda c: groups[c[1] * cols + c[0]]
            seen = [group((cx, cy))]
            granted = []
            for c in covered:
                if group(c) not in seen:
                    seen.append(group(c))
                    granted.append(c)
            self.r.check(G, covered == want_cells,
                         "%s: covered cells %s, the document's rule gives %s" % (what, want_cells, covered))
            self.r.check(G, granted == want_granted,
                         "%s: granted cells %s, the document's rule gives %s" % (what, want_granted, granted))

    def cell_pair(self, v, what):
        if not (isinstance(v, list) and len(v) == 2):
            raise Bad("%s: not a pair [column, row]" % what)
        return as_int(v[0], what), as_int(v[1], what)

    # -- sealed payloads -----------------------------------------------------

    def check_sealed(self):
        """Sealed payloads: the cell ids, epoch keys, jitters and starts, the
        sender keys, and every sealed DATA judged by the receiving steps with
        exactly the epoch keys of `cells` held."""
        G = "sealed"
        sec = self.doc.get("sealed")
        if not isinstance(sec, dict) or not sec:
            return  # a missing or empty section already failed
        for k in sec:
            if k not in SEALED_KEYS:
                self.r.fail(G, "AMBIGUOUS: sealed.%s is not described by the document; not checked" % k)
        try:
            master = hexbytes(sec.get("master_secret"), "sealed.master_secret")
            world = sec.get("world")
            if not isinstance(world, str):
                raise Bad("sealed.world is not a string")
            world_id = hexbytes(sec.get("world_id"), "sealed.world_id", 4)
            length = as_int(sec.get("epoch_length_s"), "sealed.epoch_length_s")
            jitter_bound = as_int(sec.get("jitter_bound_s"), "sealed.jitter_bound_s")
        except Bad as e:
            self.r.fail(G, str(e))
            return
        self.r.check(G, len(master) >= 32, "sealed.master_secret: %d bytes, at least 32" % len(master))
        want_world = hashlib.sha256(b"reflector-world-v1" + world.encode("utf-8")).digest()[:4]
        self.r.check(G, world_id == want_world, "sealed.world_id %s, the world name gives %s"
                     % (world_id.hex(), want_world.hex()))
        self.r.check(G, length >= 1 and 0 <= jitter_bound <= length // 2,
                     "sealed: jitter bound %d is not within half the epoch length %d" % (jitter_bound, length))
        prk = hkdf_extract(b"reflector-sealed-v1", master)

        held = {}  # (cell id, epoch) -> epoch key
        for _, what, c in self.entries(G, "sealed.cells", self.listed(sec, "cells")):
            try:
                col, row = self.cell_pair(c.get("cell"), what + ".cell")
                cid = hexbytes(c.get("cell_id"), what + ".cell_id", 8)
                epoch = as_int(c.get("epoch"), what + ".epoch")
                key = hexbytes(c.get("epoch_key"), what + ".epoch_key", 32)
                jitter = as_int(c.get("jitter"), what + ".jitter")
                starts = as_int(c.get("starts_unix_s"), what + ".starts_unix_s")
            except Bad as e:
                self.r.fail(G, str(e))
                continue
            if not (0 <= col < 1 << 16 and 0 <= row < 1 << 16 and 0 <= epoch < 1 << 32):
                self.r.fail(G, "%s: column, row or epoch out of range" % what)
                continue
            want_cid = want_world + struct.pack(">HH", col, row)
            self.r.check(G, cid == want_cid, "%s: cell_id %s, the document gives %s" % (what, cid.hex(), want_cid.hex()))
            e = struct.pack(">I", epoch)
            want_key = hkdf_expand(prk, b"reflector-epoch-key-v1" + want_cid + e, 32)
            self.r.check(G, key == want_key, "%s: epoch_key differs from HKDF-Expand(PRK, ...)" % what)
            raw = int.from_bytes(hkdf_expand(prk, b"reflector-epoch-jitter-v1" + want_cid + e, 8), "big")
            want_jitter = raw % jitter_bound if jitter_bound else 0
            self.r.check(G, jitter == want_jitter, "%s: jitter %d, the document gives %d" % (what, jitter, want_jitter))
            self.r.check(G, starts == epoch * length + want_jitter,
                         "%s: starts_unix_s %d, the document gives %d" % (what, starts, epoch * length + want_jitter))
            held[(want_cid, epoch)] = want_key

        senders = []
        for _, what, s in self.entries(G, "sealed.senders", self.listed(sec, "senders")):
            try:
                cid = hexbytes(s.get("cell_id"), what + ".cell_id", 8)
                epoch = as_int(s.get("epoch"), what + ".epoch")
                player = as_int(s.get("player"), what + ".player")
                instance = as_int(s.get("instance"), what + ".instance")
                key = hexbytes(s.get("sender_key"), what + ".sender_key", 32)
            except Bad as e:
                self.r.fail(G, str(e))
                senders.append(None)
                continue
            ek = held.get((cid, epoch))
            if not self.r.check(G, ek is not None, "%s: no entry of cells has its cell and epoch" % what):
                senders.append(None)
                continue
            want = hkdf_expand(ek, b"reflector-sender-key-v1" + cid + struct.pack(">IIQ", epoch, player, instance), 32)
            self.r.check(G, key == want, "%s: sender_key differs from HKDF-Expand(E, ...)" % what)
            senders.append((cid, epoch, player, instance, want))

        opened = rejected = 0
        for _, what, d in self.entries(G, "sealed.datagrams", self.listed(sec, "datagrams")):
            for k in d:
                if k not in SEALED_DATAGRAM_KEYS:
                    self.r.fail(G, "AMBIGUOUS: %s.%s is not described by the document; not checked" % (what, k))
            try:
                b = hexbytes(d.get("hex"), what + ".hex")
                idx = as_int(d.get("sender"), what + ".sender")
                sender = senders[idx] if 0 <= idx < len(senders) else None
                if sender is None:
                    raise Bad("%s: sender %d names no readable entry of senders" % (what, idx))
                step, game = self.receive_sealed(b, held)
                if "game_data" in d:
                    want = hexbytes(d.get("game_data"), what + ".game_data")
                    if not self.r.check(G, step is None, "%s: must open, refused at %s" % (what, step)):
                        continue
                    self.r.check(G, game == want, "%s: opens to %s, given %s" % (what, game.hex(), want.hex()))
                    self.r.check(G, len(b) <= MAX_DATA and len(game) <= MAX_DATA - 72,
                                 "%s: %d bytes, beyond the kernel path's %d" % (what, len(b), MAX_DATA))
                    cid, epoch, player, instance, _ = sender
                    self.r.check(G, (b[48:56], struct.unpack(">I", b[44:48])[0], struct.unpack(">I", b[8:12])[0],
                                     struct.unpack(">Q", b[32:40])[0]) == (cid, epoch, player, instance),
                                 "%s: its cell, epoch, player or instance is not its sender's" % what)
                    self.check_sealed_tag(G, what, d, b)
                    opened += 1
                elif "reject" in d:
                    reject = d.get("reject")
                    if reject not in SEALED_STEPS:
                        raise Bad("%s: reject %r is not a counter the document names" % (what, reject))
                    self.r.check(G, step == reject, "%s: must be refused at %s, %s" % (
                        what, reject, "opens" if step is None else "refused at %s" % step))
                    self.r.check(G, "why" in d, "%s: a rejected datagram says why" % what)
                    rejected += 1
                else:
                    self.r.fail(G, "%s: neither game_data nor reject" % what)
            except Bad as e:
                self.r.fail(G, str(e))
        self.r.check(G, opened > 0 and rejected > 0,
                     "sealed.datagrams: needs at least one that opens and one rejected (%d, %d)" % (opened, rejected))
        self.check_keys_request(G, sec.get("keys_request"))

    def check_keys_request(self, G, req):
        """/keys: mac = HMAC(Km, "reflector-keys-v1" || token || at as u64)[..16]."""
        what = "sealed.keys_request"
        if not isinstance(req, dict):
            self.r.fail(G, "%s is missing (Test vectors)" % what)
            return
        for k in req:
            if k not in ("keys", "token", "at_unix_s", "mac"):
                self.r.fail(G, "AMBIGUOUS: %s.%s is not described by the document; not checked" % (what, k))
        try:
            rec = self.token_at(req.get("keys"), what)
            token = hexbytes(req.get("token"), what + ".token", 32)
            at = as_int(req.get("at_unix_s"), what + ".at_unix_s")
            mac = hexbytes(req.get("mac"), what + ".mac", 16)
            if "Km" not in rec or not 0 <= at < 1 << 64:
                raise Bad("%s: no MAC key to check it with, or at_unix_s out of range" % what)
        except Bad as e:
            self.r.fail(G, str(e))
            return
        self.r.check(G, token == rec["token"], "%s: the token is not the one its keys belong to" % what)
        want = mac16(rec["Km"], b"reflector-keys-v1" + token + struct.pack(">Q", at))
        self.r.check(G, mac == want, "%s: mac %s, the document gives %s" % (what, mac.hex(), want.hex()))

    def listed(self, sec, name):
        v = sec.get(name)
        if not isinstance(v, list) or not v:
            self.r.fail("sealed", "sealed.%s is missing or empty (Test vectors)" % name)
            return []
        return v

    def receive_sealed(self, b, held):
        """The receiving steps of a sealed group: (None, game data) if the
        datagram opens, else (the counter of the step that refused it, None).
        Step 3 (the replay window) needs a receiver's state; each datagram is
        judged alone, so only a sequence of 0 fails it."""
        if (len(b) < 72 or struct.unpack(">H", b[0:2])[0] != MAGIC or b[2] != 2 or b[3] != DATA
                or struct.unpack(">H", b[6:8])[0] != len(b) - HEADER):
            return "sealed_malformed", None
        if b[40] != 1:
            return "sealed_version", None
        cid, epoch = b[48:56], struct.unpack(">I", b[44:48])[0]
        ek = held.get((cid, epoch))
        if ek is None:
            return "sealed_no_key", None
        player, seq, instance = struct.unpack(">I", b[8:12])[0], struct.unpack(">Q", b[16:24])[0], b[32:40]
        if seq == 0:
            return "sealed_replay", None
        key = hkdf_expand(ek, b"reflector-sender-key-v1" + cid + struct.pack(">II", epoch, player) + instance, 32)
        aad = b[:24] + bytes(8) + b[32:56]
        game = aead_open(key, bytes(4) + b[16:24], aad, b[56:])
        if game is None:
            return "sealed_bad", None
        return None, game

    def check_sealed_tag(self, G, what, d, b):
        tags = d.get("tags")
        if not isinstance(tags, bool):
            raise Bad("%s: tags is not true or false" % what)
        if not tags:
            self.r.check(G, b[24:32] == bytes(8), "%s: tags off, but the tag field is not zero" % what)
            return
        rec = self.token_at(d.get("keys"), what)
        if "Kt" not in rec:
            raise Bad("%s: no secret to derive the tag key of keys %r" % (what, d.get("keys")))
        want = siphash24(rec["Kt"], b[:24] + bytes(8) + b[32:])
        self.r.check(G, b[24:32] == want.to_bytes(8, "big"),
                     "%s: DATA tag over the sealed datagram is %s, the document gives %016x" % (what, b[24:32].hex(), want))

    # -- invalid -------------------------------------------------------------

    def check_invalid(self):
        G = "invalid"
        kinds = set()
        for _, what, e in self.entries(G, "invalid", self.section_list("invalid")):
            if not self.r.check(G, "why" in e and "hex" in e, "%s: hex or why missing (Test vectors)" % what):
                continue
            self.r.check(G, isinstance(e.get("why"), str) and e["why"].strip(),
                         "%s: why is not a non-empty string (Test vectors: each with why)" % what)
            try:
                b = hexbytes(e.get("hex"), what + ".hex")
            except Bad as ex:
                self.r.fail(G, str(ex))
                continue
            kind = invalid_kind(e, b)
            kinds.add(kind)
            for k in e:
                n = norm(k)
                if n in ("kind", "message", "tags"):
                    self.note(k + " (invalid)", {"kind": "datagram or channel message",
                                                 "message": "which channel message it is meant as",
                                                 "tags": "whether the DATA's group has tags on"}[n])
                elif k not in DESCRIPTIVE and n not in ("requestmac", "request", "address", "slot",
                                                        "challenge", "state", "keys"):
                    self.r.fail(G, "AMBIGUOUS: %s has field %r, which the document does not describe; "
                                   "not used" % (what, k))
            if kind == "channel":
                reasons, doubts = self.guard(G, what, self.channel_rejections, e, b, what) or ([], ["unreadable"])
            else:
                reasons, doubts = self.guard(G, what, self.datagram_rejections, e, b, what) or ([], ["unreadable"])
            if reasons:
                self.r.ok(G)
                print("  %s rejected: %s  [why: %s]" % (what, "; ".join(reasons), e.get("why")),
                      file=self.r.out)
            elif doubts:
                self.r.fail(G, "AMBIGUOUS: %s (why: %s): %s" % (what, e.get("why"), "; ".join(doubts)))
            else:
                self.r.fail(G, "%s (why: %s): no rule of the document rejects it as given"
                            % (what, e.get("why")))
        C = "coverage"
        if self.section_list("invalid"):
            self.r.check(C, "datagram" in kinds, "no invalid datagram under invalid")
            self.r.check(C, "channel" in kinds, "no invalid channel message under invalid")

    def datagram_rejections(self, e, b, what):
        """(reasons the document rejects it, doubts where the document is silent)."""
        R, D = [], []
        if len(b) < 2 or b[:2] != struct.pack(">H", MAGIC):
            R.append("magic is not 0x5246: not a datagram of this protocol (Header)")
            return R, D
        if len(b) < 3:
            R.append("shorter than a header: a reflector looks at nothing shorter (Header)")
            return R, D
        if b[2] != 2:
            R.append("version %d is not 2: counted in version_errors, never served%s (Header)"
                     % (b[2], "; answered with a version-1 ERROR(Version)" if b[2] == 1 and len(b) >= 24 else ""))
            return R, D
        if len(b) < HEADER:
            R.append("%d bytes, shorter than the 24-byte header (Header)" % len(b))
            return R, D
        magic, version, t, group, length, player, membership, seq = struct.unpack(">HBBHHIIQ", b[:24])
        if t not in TYPE_NAMES:
            R.append("type %d is not in the Types table: malformed (Types)" % t)
            return R, D
        tn = TYPE_NAMES[t]
        if t == DATA:
            if len(b) < 32:
                R.append("DATA of %d bytes, less than 32: malformed (Types)" % len(b))
            elif len(b) > MAX_DATAGRAM:
                R.append("larger than the largest datagram, 65,507 bytes (Header)")
            elif len(b) > MAX_DATA:
                D.append("DATA of %d bytes exceeds 1,472: the client library refuses to send it but a "
                         "reflector still forwards up to 65,507 bytes (DATA: maximum payload)" % len(b))
        elif len(b) not in SIZES[t]:
            R.append("%s of %d bytes, the Types table says %s: malformed (Types)"
                     % (tn, len(b), " or ".join(str(s) for s in SIZES[t])))
        if length != len(b) - HEADER:
            R.append("length field %d disagrees with the datagram's size (%d - 24 = %d): malformed (Types)"
                     % (length, len(b), len(b) - HEADER))
        if R:
            return R, D
        if seq == 0 and t != ERROR:
            R.append("sequence 0: no window accepts it, a fresh window accepts only s >= 1 "
                     "(Sequence numbers and the replay window)")
        keys = e.get("keys")
        rec = None
        if keys is not None:
            try:
                rec = self.token_at(keys, what)
            except Bad as ex:
                D.append(str(ex))
        if t == JOIN:
            tok = b[24:56]
            tp, tg, trefl, texp = struct.unpack(">IHHQ", tok[:16])
            if self.secret is not None and tok[16:] != token_mac(self.secret, tok[:16]):
                R.append("the token's MAC does not verify under the secret: ERROR(BadToken) (Token)")
            if tp != player:
                R.append("token player %d is not the header's %d: ERROR(BadToken) (Token)" % (tp, player))
            if tg != group:
                R.append("token group %d is not the port it arrived on (%d): ERROR(BadToken) (Token)" % (tg, group))
            ex = self.expired(texp)
            if ex:
                R.append("token expired at %d s, before now_unix_ms %d: ERROR(ExpiredToken) (Token)"
                         % (texp, self.now_ms))
            elif ex is None and self.now_ms is not None:
                D.append("now_unix_ms is within the token's expiry second; the document does not say "
                         "whether it has expired")
            if rec is None and self.secret is not None:
                # The reflector derives the key from the token itself (Keys).
                k, km, kt = derive_keys(self.secret, tok)
                rec = {"Km": km, "Kt": kt, "token": tok, "player": tp, "group": tg,
                       "reflector": trefl, "expires": texp}
            if rec is not None and "Km" in rec and b[-16:] != mac16(rec["Km"], b[:-16]):
                R.append("the JOIN's MAC does not verify under %s: ERROR(BadMac) (Keys, ERROR codes)"
                         % ("the keys' token" if keys is not None else "the token's own key"))
            if rec is not None and rec.get("token") != tok and len(b) == 72:
                if (tp, tg, trefl) != (rec["player"], rec["group"], rec["reflector"]):
                    R.append("a renewal whose token is for another player, group or reflector (Lifetime)")
                elif texp <= rec["expires"]:
                    R.append("a renewal whose token does not expire later than the membership's (Lifetime)")
                if membership == 0:
                    R.append("a renewal with membership 0 (Lifetime)")
            if len(b) == 88:
                addr = None
                slot = None
                for k, v in e.items():
                    if norm(k) in ("address", "source", "sourceaddress", "addr"):
                        addr = v
                    if norm(k) == "slot":
                        slot = v
                if addr is not None and self.cookie_key is not None:
                    try:
                        ip, port = parse_address(addr)
                        if self.now_ms is None:
                            raise ValueError("no now_unix_ms to date the cookie")
                        ns = self.now_ms // 10000
                        if not any(b[56:72] == cookie_for(self.cookie_key, ip, port, group, player, s)
                                   for s in (ns, ns - 1)):
                            R.append("the cookie is not valid for address %s at now_unix_ms (own slot or the "
                                     "next): ERROR(BadCookie) (Cookie)" % addr)
                    except ValueError as ex:
                        D.append("address %r: %s" % (addr, ex))
                else:
                    c = self.find_cookie(b[56:72])
                    if c is not None and self.now_ms is not None:
                        try:
                            sl = as_int(c.get("slot"), "slot")
                            if sl not in (self.now_ms // 10000, self.now_ms // 10000 - 1):
                                R.append("its cookie (slot %d) is too old at now_unix_ms: ERROR(BadCookie) "
                                         "(Cookie)" % sl)
                            if as_int(c.get("group"), "g") != group or as_int(c.get("player"), "p") != player:
                                R.append("its cookie was made for another group or player: ERROR(BadCookie) "
                                         "(Cookie)")
                        except Bad:
                            pass
                    elif not R:
                        D.append("a JOIN with cookie whose cookie cannot be checked: the entry gives no "
                                 "source address and the cookie is not in cookies")
            return R, D
        if t in FULL_MAC or t in SHORT_MAC:
            if rec is None:
                if not R:
                    D.append("%s with keys null: its MAC cannot be checked from the vectors (the receiver "
                             "needs the member's keys)" % tn)
            elif "Km" in rec:
                if t in FULL_MAC and b[-16:] != mac16(rec["Km"], b[:-16]):
                    R.append("MAC does not verify under the keys' MAC key (Keys)")
                if t in SHORT_MAC and b[32:40] != mac16(rec["Km"], b[:32])[:8]:
                    R.append("short MAC does not verify under the keys' MAC key (Keys)")
                if player != rec["player"] or group != rec["group"]:
                    D.append("header player/group differ from the keys' token (the MAC was checked as given)")
        elif t == DATA:
            tags_off = any(norm(k) == "tags" and v is False for k, v in e.items())
            if tags_off:
                if not R:
                    D.append("DATA in a group with tags off: the tag is not checked (DATA and tags)")
            elif rec is not None and "Kt" in rec:
                want = siphash24(rec["Kt"], b[:24] + bytes(8) + b[32:]).to_bytes(8, "big")
                if b[24:32] != want:
                    R.append("tag does not verify under the keys' tag key: dropped, never forwarded (DATA)")
            elif not R:
                D.append("DATA with keys null: with tags off the tag is not checked")
        if t == JOIN_ACK:
            if b[29] != 0:
                D.append("reserved byte is %d; the document writes reserved u8 (0) but does not say a "
                         "receiver rejects a nonzero one" % b[29])
            if b[28] & 0xF8:
                D.append("unknown flag bits 0x%02x: \"a client ignores bits it does not know\" (JOIN_ACK "
                         "flags), so they do not reject it" % (b[28] & 0xF8))
        if t == ERROR:
            code, res = struct.unpack(">HH", b[24:28])
            if code not in ERROR_CODES:
                D.append("ERROR code %d is not in the table; the document does not say how a client "
                         "treats an unknown code" % code)
            if res:
                D.append("ERROR reserved u16 is %d; the document does not say a receiver rejects it" % res)
        if t == MOVED:
            reason, _w, res = struct.unpack(">HHI", b[24:32])
            if reason not in MOVED_REASONS:
                D.append("MOVED reason %d is not 1..3; the document does not say it is rejected" % reason)
            if res:
                D.append("MOVED reserved u32 is %d; the document does not say a receiver rejects it" % res)
        if not R and not D:
            D.append("nothing in the datagram alone breaks a rule; if it is rejected by state (replay "
                     "window, membership, address), the entry gives no state to check that with")
        return R, D

    def channel_rejections(self, e, b, what):
        R, D = [], []
        rec = self.ch_rec if hasattr(self, "ch_rec") else None
        if "keys" in e:
            try:
                rec = self.token_at(e["keys"], what)
            except Bad as ex:
                D.append(str(ex))
        challenge = getattr(self, "ch_challenge", None)
        for k, v in e.items():
            if norm(k) == "challenge":
                try:
                    challenge = bytes8(v, what + ".challenge")
                except Bad as ex:
                    D.append(str(ex))
        if len(b) < 6:
            R.append("%d bytes: shorter than any channel message's magic, version and message" % len(b))
            return R, D
        magic, ver, msg = struct.unpack(">IBB", b[:6])
        if magic != CHANNEL_MAGIC:
            R.append("magic 0x%08x is not 0x5246434B (checks: magic first)" % magic)
        if ver != 2:
            R.append("channel version %d is not 2 (version 1 is no longer served)" % ver)
        if msg not in (1, 2, 3):
            R.append("message %d is not HELLO, REQUEST or REPLY" % msg)
        if R:
            return R, D
        want_len = {1: HELLO_LEN, 2: REQUEST_LEN, 3: REPLY_LEN}[msg]
        if len(b) != want_len and not (msg == 3 and len(b) > REPLY_LEN and b[6] == 3):
            R.append("%d bytes; the message is %d (fixed binary messages): Malformed" % (len(b), want_len))
            return R, D
        if msg == 1:
            if b[6:8] != bytes(2) or b[28:32] != bytes(4):
                R.append("HELLO reserved bytes nonzero: a client fails the exchange on such a HELLO (The channel)")
            elif challenge is not None and b[8:16] != challenge:
                D.append("HELLO challenge differs from channel.challenge; a HELLO's challenge is the reflector's "
                         "choice, nothing rejects it")
            return R, D
        if msg == 2:
            op, flags = b[6], b[7]
            if op not in OPS:
                R.append("op %d unknown: refused before any body (order of checks: op known)" % op)
            if flags != 0 or b[10:12] != bytes(2) or b[20:24] != bytes(4):
                R.append("flags or reserved fields nonzero: refused (order of checks: reserved fields zero)")
            if op in (2, 3) and (b[24:48] != bytes(24)):
                R.append("a fetch with nonzero nonce, body length or tick: unused fields must be zero, "
                         "refused Malformed (The channel)")
            if rec is not None and "Km" in rec and challenge is not None:
                want = mac16(rec["Km"], b"reflector-channel-v2-request" + challenge + b[:48])
                if b[48:64] != want:
                    R.append("request MAC does not verify under the keys: REFUSED BadMac (order of checks)")
            if op == 1:
                blen = struct.unpack(">Q", b[32:40])[0]
                hello = getattr(self, "hello", None)
                if hello is not None and len(hello) == HELLO_LEN and blen > struct.unpack(">Q", hello[16:24])[0]:
                    R.append("body length %d exceeds the HELLO's max state: REFUSED TooLarge" % blen)
                if b[24:32] == bytes(8) and not R:
                    D.append("UPLOAD with nonce zero: rejected only if no request with that nonce is pending "
                             "(NotRequested), which needs state")
            if not R and not D:
                D.append("nothing in the REQUEST alone breaks a rule; membership or a pending nonce would need state")
            return R, D
        # REPLY
        status, refusal = b[6], b[7]
        if status not in STATUSES:
            R.append("status %d unknown" % status)
            return R, D
        mac = b[72:88]
        if status == 5 and mac == bytes(16):
            D.append("a REFUSED with an all-zero MAC is a valid \"this exchange failed\"")
        elif rec is not None and "Km" in rec and challenge is not None:
            rmacs = [q[1][48:64] for q in getattr(self, "requests", []) if len(q[1]) == REQUEST_LEN]
            for k, v in e.items():
                if norm(k) in ("request", "inreplyto", "answers", "requestname"):
                    rmacs = [q[1][48:64] for q in getattr(self, "requests", []) if q[0] == v]
            for k, v in e.items():
                if norm(k) == "requestmac":
                    self.note(k + " (invalid)", "the request MAC of the REQUEST the REPLY answers")
                    try:
                        rmacs = [hexbytes(v, what + "." + k, 16)]
                    except Bad as ex:
                        D.append(str(ex))
            if not rmacs:
                D.append("no REQUEST to check the reply MAC against")
            elif not any(mac == mac16(rec["Km"], b"reflector-channel-v2-reply" + challenge + rm + b[:72])
                         for rm in rmacs):
                R.append("reply MAC does not verify under the requester's key (for the request MAC it answers): "
                         "a client acts only on a REPLY whose MAC verifies")
        unused = "unused fields must be zero: a client fails the exchange on such a REPLY (The channel)"
        if status != 5 and b[7] != 0:
            R.append("refusal code %d in a %s: %s" % (b[7], STATUSES[status], unused))
        if status not in (2, 3) and (b[8:16] != bytes(8) or b[24:36] != bytes(12) or b[40:72] != bytes(32)):
            R.append("a %s with a nonzero checkpoint number, tick, from player or SHA-256: %s"
                     % (STATUSES[status], unused))
        if status != 3 and (b[16:24] != bytes(8) or b[36:40] != bytes(4)):
            R.append("a %s with a nonzero body length or age: %s" % (STATUSES[status], unused))
        if status == 3:
            state = b[REPLY_LEN:] if len(b) > REPLY_LEN else None
            for k, v in e.items():
                if norm(k) in ("state", "body", "statehex"):
                    try:
                        state = hexbytes(v, what + "." + k)
                    except Bad as ex:
                        D.append(str(ex))
            if state is not None and hashlib.sha256(state).digest() != b[40:72]:
                R.append("the state's SHA-256 is not the REPLY's: a client does not take the state")
        if not R and not D:
            D.append("nothing in the REPLY alone breaks a rule the document states for a receiver")
        return R, D


def channel_kind(m, b):
    name = norm(m.get("name", ""))
    if len(b) >= 6 and struct.unpack(">I", b[:4])[0] == CHANNEL_MAGIC:
        return {1: "HELLO", 2: "REQUEST", 3: "REPLY"}.get(b[5], "UNKNOWN")
    if "body" in name or len(b) == BODY_MAC_LEN:
        return "BODY"
    return "UNKNOWN"


def invalid_kind(e, b):
    for k, v in e.items():
        n = norm(k)
        if n in ("kind", "category", "class", "what", "section", "layer"):
            if "channel" in norm(v) or norm(v) in ("hello", "request", "reply", "body", "bodymac"):
                return "channel"
            if "datagram" in norm(v) or "udp" in norm(v):
                return "datagram"
        if n == "channel" and isinstance(v, bool):
            return "channel" if v else "datagram"
    if len(b) >= 4 and struct.unpack(">I", b[:4])[0] == CHANNEL_MAGIC:
        return "channel"
    name = norm(e.get("name", ""))
    if "channel" in name:
        return "channel"
    return "datagram"


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(os.path.dirname(here), "docs", "protocol-vectors.json")
    ap = argparse.ArgumentParser(description="Check protocol-vectors.json against docs/protocol.md.")
    ap.add_argument("path", nargs="?", default=default, help="vectors file (default: %(default)s)")
    args = ap.parse_args(argv)
    rep = Report()
    try:
        with open(args.path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        rep.fail("file", "cannot read %s: %s" % (args.path, e.strerror or e))
        return rep.finish()
    if not raw.strip():
        rep.fail("file", "%s is empty" % args.path)
        return rep.finish()
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        rep.fail("file", "%s is not valid JSON: %s" % (args.path, e))
        return rep.finish()
    try:
        Checker(doc, rep).run()
    except Bad as e:
        rep.fail("file", "unreadable value: %s" % e)
    except Exception as e:  # a malformed file must fail with a message, not a traceback
        rep.fail("file", "could not check the file (%s: %s)" % (type(e).__name__, e))
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
