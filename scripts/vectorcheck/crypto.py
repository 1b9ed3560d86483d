"""The primitives the document names, written from their definitions: SipHash-2-4,
HKDF-SHA256 (RFC 5869) and ChaCha20-Poly1305 (RFC 8439), each with a self-test
against its published vectors."""

import hashlib
import hmac
import ipaddress
import json
import os
import sys
import struct

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
