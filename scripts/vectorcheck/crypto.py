"""The primitives the document names, written from their definitions: SipHash-2-4,
HKDF-SHA256 (RFC 5869), ChaCha20-Poly1305 (RFC 8439) and Ed25519 (RFC 8032),
each with a self-test against its published vectors."""

import functools
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


# ---------------------------------------------------------------------------
# Ed25519 (RFC 8032 §5.1), from its definitions: the twisted Edwards curve
# -x^2 + y^2 = 1 + d x^2 y^2 over GF(2^255 - 19), points in extended
# coordinates (X, Y, Z, T) with x = X/Z, y = Y/Z, x y = T/Z.
# ---------------------------------------------------------------------------

_P = 2 ** 255 - 19
_D = (-121665 * pow(121666, _P - 2, _P)) % _P
_L = 2 ** 252 + 27742317777372353535851937790883648493  # the group order
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _ed_add(a, b):
    """RFC 8032 §5.1.4's addition (complete: it doubles too)."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    A = (y1 - x1) * (y2 - x2) % _P
    B = (y1 + x1) * (y2 + x2) % _P
    C = t1 * 2 * _D * t2 % _P
    D = z1 * 2 * z2 % _P
    E, F, G, H = B - A, D - C, D + C, B + A
    return (E * F % _P, G * H % _P, F * G % _P, E * H % _P)


def _ed_mul(k, pt):
    q = (0, 1, 1, 0)  # the neutral element
    while k > 0:
        if k & 1:
            q = _ed_add(q, pt)
        pt = _ed_add(pt, pt)
        k >>= 1
    return q


def _ed_equal(a, b):
    return (a[0] * b[2] - b[0] * a[2]) % _P == 0 and (a[1] * b[2] - b[1] * a[2]) % _P == 0


def _ed_encode(pt):
    """§5.1.2: y little-endian, the top bit the parity of x."""
    zi = pow(pt[2], _P - 2, _P)
    x, y = pt[0] * zi % _P, pt[1] * zi % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _ed_decode(b):
    """§5.1.3; None if b is not the encoding of a point."""
    if len(b) != 32:
        return None
    v = int.from_bytes(b, "little")
    sign, y = v >> 255, v & ((1 << 255) - 1)
    if y >= _P:
        return None
    u, w = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = u * pow(w, 3, _P) * pow(u * pow(w, 7, _P), (_P - 5) // 8, _P) % _P
    if (w * x * x - u) % _P != 0:
        if (w * x * x + u) % _P != 0:
            return None
        x = x * _SQRT_M1 % _P
    if x == 0 and sign == 1:
        return None
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P)


_BY = 4 * pow(5, _P - 2, _P) % _P
_B = _ed_decode(_BY.to_bytes(32, "little"))  # x even: the base point of §5.1


def _ed_secret(seed):
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8  # clear the lowest three bits and bit 255
    a |= 1 << 254
    return a, h[32:]


@functools.lru_cache(maxsize=1024)
def ed25519_public(seed):
    """§5.1.5: the public key of a 32-byte private key (seed)."""
    a, _ = _ed_secret(seed)
    return _ed_encode(_ed_mul(a, _B))


@functools.lru_cache(maxsize=1024)
def ed25519_sign(seed, msg):
    """§5.1.6 (deterministic: the same key and message give the same bytes)."""
    a, prefix = _ed_secret(seed)
    A = _ed_encode(_ed_mul(a, _B))
    r = int.from_bytes(hashlib.sha512(prefix + msg).digest(), "little") % _L
    R = _ed_encode(_ed_mul(r, _B))
    k = int.from_bytes(hashlib.sha512(R + A + msg).digest(), "little") % _L
    return R + ((r + k * a) % _L).to_bytes(32, "little")


@functools.lru_cache(maxsize=1024)
def ed25519_verify(public, msg, sig):
    """§5.1.7, with the cofactored equation [8][S]B = [8]R + [8][k]A."""
    if len(sig) != 64 or len(public) != 32:
        return False
    A, R = _ed_decode(public), _ed_decode(sig[:32])
    s = int.from_bytes(sig[32:], "little")
    if A is None or R is None or s >= _L:
        return False
    k = int.from_bytes(hashlib.sha512(sig[:32] + public + msg).digest(), "little") % _L
    return _ed_equal(_ed_mul(8 * s, _B), _ed_mul(8, _ed_add(R, _ed_mul(k, A))))


# The three functions above are pure and take bytes: they are memoised, so a
# process that checks many near-identical files (the checker's self-test
# runs it hundreds of times) pays for each distinct curve operation once.

# RFC 8032 §7.1, TESTs 1 to 3: (secret key, public key, message, signature).
ED25519_REFERENCE = [
    ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
     "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
     "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
     "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
     "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
     "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
     "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
]


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
    # RFC 8032 §7.1
    for i, (sk, pk, msg, sig) in enumerate(ED25519_REFERENCE, 1):
        sk, pk, msg, sig = (bytes.fromhex(x) for x in (sk, pk, msg, sig))
        if ed25519_public(sk) != pk:
            bad.append("Ed25519 public key (RFC 8032 7.1 TEST %d)" % i)
        if ed25519_sign(sk, msg) != sig:
            bad.append("Ed25519 signature (RFC 8032 7.1 TEST %d)" % i)
        if not ed25519_verify(pk, msg, sig):
            bad.append("Ed25519 does not verify RFC 8032 7.1 TEST %d" % i)
        if ed25519_verify(pk, msg + b"x", sig) or ed25519_verify(pk, msg, sig[:63] + bytes([sig[63] ^ 1])):
            bad.append("Ed25519 verified an altered message or signature (TEST %d)" % i)
    return bad
