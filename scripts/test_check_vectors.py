#!/usr/bin/env python3
"""Self-test of scripts/check-vectors.py.

Builds a small vectors file with its own implementation of docs/protocol.md's
rules (separate from the checker's code, SipHash included), checks that the
checker passes it, and that flipping any single byte of any MAC, tag, key or
digest, emptying the file, breaking its JSON, dropping or emptying a section
makes the checker fail.  The sealed section is the committed file's (made by
the Rust implementation with ring, so not by the checker's own AES-256-GCM),
re-tagged under this file's keys; corrupting any key, header or AEAD byte of it,
or naming a rejection at the wrong step, makes the checker fail.  Its sealed
checkpoints too: a flipped signature or certificate bit, another group's cell,
an expired certificate or a refusal named at the wrong check make it fail.

Run: python3 scripts/test_check_vectors.py
"""

import copy
import hashlib
import hmac
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest
import importlib.util

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check-vectors.py")
VECTORS = os.path.join(os.path.dirname(HERE), "docs", "protocol-vectors.json")


def load_checker():
    spec = importlib.util.spec_from_file_location("check_vectors", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- an independent implementation of the document's rules -----------------

def H(key, data, n=32):
    return hmac.new(key, data, hashlib.sha256).digest()[:n]


def sip(key, msg):
    """SipHash-2-4, written again here so the generator does not share the checker's code."""
    M = (1 << 64) - 1
    rot = lambda x, b: ((x << b) | (x >> (64 - b))) & M
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    a, b, c, d = (k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D,
                  k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573)

    def rnd(a, b, c, d):
        a = (a + b) & M; b = rot(b, 13) ^ a; a = rot(a, 32)
        c = (c + d) & M; d = rot(d, 16) ^ c
        a = (a + d) & M; d = rot(d, 21) ^ a
        c = (c + b) & M; b = rot(b, 17) ^ c; c = rot(c, 32)
        return a, b, c, d

    words = [int.from_bytes(msg[i:i + 8], "little") for i in range(0, len(msg) - len(msg) % 8, 8)]
    tail = msg[len(msg) - len(msg) % 8:]
    words.append(int.from_bytes(tail + bytes(7 - len(tail)) + bytes([len(msg) & 255]), "little"))
    for m in words:
        d ^= m
        a, b, c, d = rnd(*rnd(a, b, c, d))
        a ^= m
    c ^= 0xFF
    for _ in range(4):
        a, b, c, d = rnd(a, b, c, d)
    return a ^ b ^ c ^ d


SECRET = bytes(range(0x40, 0x60))
COOKIE_KEY = bytes(range(0xA0, 0xB0))
NOW_MS = 1_700_000_123_456
GROUP, PLAYER, REFLECTOR = 7000, 42, 3
MEMBERSHIP = 0x1234ABCD
ADDRESS = ("192.0.2.10", 40000)


def make_token(player, group, refl, expiry):
    head = struct.pack(">IHHQ", player, group, refl, expiry)
    return head + H(SECRET, b"reflector-token-v1" + head, 16)


def keys_of(token):
    k = H(SECRET, b"reflector-session-v2" + token)
    return k, H(k, b"reflector-mac-v2"), H(k, b"reflector-tag-v2", 16)


def header(t, length, membership, seq, group=GROUP, player=PLAYER, version=2):
    return struct.pack(">HBBHHIIQ", 0x5246, version, t, group, length, player, membership, seq)


def with_mac(km, body):
    return body + H(km, body, 16)


def with_short(km, body):
    return body + H(km, body, 8)


class Builder:
    """Builds the vectors and remembers where each MAC, tag, key and digest sits."""

    def __init__(self):
        self.spots = []  # (path tuple to a hex string, start byte, end byte, label)

    def build(self):
        now_s = NOW_MS // 1000
        t0 = make_token(PLAYER, GROUP, REFLECTOR, now_s + 300)
        t1 = make_token(PLAYER, GROUP, REFLECTOR, now_s + 600)  # the renewal's newer token
        toks = []
        for i, t in enumerate((t0, t1)):
            k, km, kt = keys_of(t)
            toks.append({"player": PLAYER, "group": GROUP, "reflector": REFLECTOR,
                         "expires_unix_s": int.from_bytes(t[8:16], "big"), "token": t.hex(),
                         "session_key": k.hex(), "mac_key": km.hex(), "tag_key": kt.hex()})
            self.spots.append((("tokens", i, "token"), 16, 32, "token MAC"))
            for key in ("session_key", "mac_key", "tag_key"):
                self.spots.append((("tokens", i, key), 0, None, key))
        _, km, kt = keys_of(t0)
        slot = NOW_MS // 10000
        ip = bytes(int(x) for x in ADDRESS[0].split("."))
        cookie = H(COOKIE_KEY, b"reflector-cookie-v1" + ip + struct.pack(">HHIQ", ADDRESS[1], GROUP,
                                                                            PLAYER, slot), 16)
        cookies = [{"address": "%s:%d" % ADDRESS, "group": GROUP, "player": PLAYER, "slot": slot,
                    "cookie": cookie.hex()}]
        self.spots.append((("cookies", 0, "cookie"), 0, 16, "cookie"))

        dgs = []

        def add(name, t, keys, b, macs, **fields):
            e = {"name": name, "type": t, "keys": keys, "hex": b.hex()}
            e.update(fields)
            for (s, end, label) in macs:
                self.spots.append((("datagrams", len(dgs), "hex"), s, end, "%s %s" % (name, label)))
            dgs.append(e)

        addr = "%s:%d" % ADDRESS
        add("JOIN", 1, 0, with_mac(km, header(1, 48, 0, 1) + t0),
            [(40, 56, "token MAC"), (56, 72, "MAC")], player=PLAYER, membership=0, sequence=1)
        add("JOIN_CHALLENGE", 2, 0, with_mac(km, header(2, 32, 0, 1) + cookie),
            [(24, 40, "cookie"), (40, 56, "MAC")], address=addr, cookie=cookie.hex())
        add("JOIN with cookie", 1, 0, with_mac(km, header(1, 64, 0, 2) + t0 + cookie),
            [(40, 56, "token MAC"), (56, 72, "cookie"), (72, 88, "MAC")], address=addr, sequence=2)
        add("JOIN_ACK", 3, 0, with_mac(km, header(3, 24, MEMBERSHIP, 2) + struct.pack(">HHBBH", 1, 1000, 3, 0, 7100)),
            [(32, 48, "MAC")], membership=MEMBERSHIP, members=1, keepalive_ms=1000, flags=3,
            checkpoint_port=7100)
        add("KEEPALIVE", 5, 0, with_mac(km, header(5, 16, MEMBERSHIP, 3)), [(24, 40, "MAC")], sequence=3)
        payload = bytes.fromhex("0102030405060708") + b"game state delta"
        body = header(6, 8 + len(payload), MEMBERSHIP, 4) + bytes(8) + payload
        tag = sip(kt, body).to_bytes(8, "big")
        add("DATA with tag", 6, 0, body[:24] + tag + body[32:], [(24, 32, "tag")],
            sequence=4, instance="0102030405060708", tag=tag.hex())
        add("DATA stripped", 6, None, body, [])
        add("ERROR NotMember", 7, None, header(7, 4, 0, 0) + struct.pack(">HH", 4, 0), [], code=4)
        nonce = bytes.fromhex("a1a2a3a4a5a6a7a8")
        for t, name, seq in ((8, "PROBE", 3), (9, "PROBE_REPLY", 5), (10, "CHECKPOINT_REQUEST", 4),
                             (11, "ECHO", 6), (12, "ECHO_REPLY", 5)):
            add(name, t, 0, with_short(km, header(t, 16, MEMBERSHIP, seq) + nonce),
                [(32, 40, "short MAC")], nonce=nonce.hex(), sequence=seq)
        add("MOVED", 13, 0, with_mac(km, header(13, 24, MEMBERSHIP, 7) + struct.pack(">HHI", 1, 5000, 0)),
            [(32, 48, "MAC")], reason=1, within_ms=5000)
        add("LEAVE", 4, 0, with_mac(km, header(4, 16, MEMBERSHIP, 8)), [(24, 40, "MAC")])
        add("renewal JOIN", 1, 0, with_mac(km, header(1, 48, MEMBERSHIP, 9) + t1),
            [(40, 56, "token MAC"), (56, 72, "MAC")], membership=MEMBERSHIP)
        v1 = struct.pack(">HBBHH", 0x5246, 1, 7, GROUP, 2) + struct.pack(">I", PLAYER) + bytes(4) + b"\x00\x06"
        add("version-1 ERROR(Version)", 7, None, v1, [], code=6)

        # checkpoint channel, version 2
        challenge = bytes.fromhex("c1c2c3c4c5c6c7c8")
        state = b"opaque game state at tick 77"
        tick = 77
        msgs = []

        def addm(name, b, spots, **fields):
            e = {"name": name, "hex": b.hex()}
            e.update(fields)
            for (s, end, label) in spots:
                self.spots.append((("channel", "messages", len(msgs), "hex"), s, end, "%s %s" % (name, label)))
            msgs.append(e)

        MAG = struct.pack(">IB", 0x5246434B, 2)
        addm("HELLO", MAG + struct.pack(">BH8sQII", 1, 0, challenge, 1 << 24, 2000, 0), [],
             max_state=1 << 24)

        def request(op, nonce_, blen, tk):
            head = MAG + struct.pack(">BBBHHIII8sQQ", 2, op, 0, GROUP, 0, PLAYER, MEMBERSHIP, 0,
                                     nonce_, blen, tk)
            return head + H(km, b"reflector-channel-v2-request" + challenge + head, 16)

        up = request(1, nonce, len(state), tick)
        fe = request(2, bytes(8), 0, 0)
        fo = request(3, bytes(8), 0, 0)
        addm("REQUEST UPLOAD", up, [(48, 64, "request MAC")], op="UPLOAD", tick=tick)
        addm("REQUEST FETCH", fe, [(48, 64, "request MAC")], op=2)
        addm("REQUEST FETCH_OTHER", fo, [(48, 64, "request MAC")], op=3)

        def reply(req, status, refusal=0, number=0, blen=0, tk=0, frm=0, age=0, digest=bytes(32), mac=True):
            head = MAG + struct.pack(">BBBQQQII32s", 3, status, refusal, number, blen, tk, frm, age, digest)
            m = H(km, b"reflector-channel-v2-reply" + challenge + req[48:64] + head, 16) if mac else bytes(16)
            return head + m

        addm("REPLY CONTINUE", reply(up, 1), [(72, 88, "reply MAC")], request="REQUEST UPLOAD")
        bmac = H(km, b"reflector-channel-v2-body" + challenge + up[48:64] + state, 16)
        addm("body MAC", bmac, [(0, 16, "body MAC")], state=state.hex())
        digest = hashlib.sha256(state).digest()
        addm("REPLY STORED", reply(up, 2, number=1, tk=tick, frm=PLAYER, digest=digest),
             [(40, 72, "digest"), (72, 88, "reply MAC")], request="REQUEST UPLOAD", state=state.hex())
        addm("REPLY CHECKPOINT", reply(fe, 3, number=1, blen=len(state), tk=tick, frm=PLAYER, age=1500,
                                       digest=digest) + state,
             [(40, 72, "digest"), (72, 88, "reply MAC")], request="REQUEST FETCH", age_ms=1500)
        addm("REPLY EMPTY", reply(fo, 4), [(72, 88, "reply MAC")], request="REQUEST FETCH_OTHER")
        addm("REPLY REFUSED Busy", reply(fe, 5, refusal=6), [(72, 88, "reply MAC")], request="REQUEST FETCH",
             refusal="Busy")
        addm("REPLY REFUSED before MAC", reply(fe, 5, refusal=2, mac=False), [(72, 88, "zero MAC")])

        bad_keepalive = bytearray(with_mac(km, header(5, 16, MEMBERSHIP, 10)))
        bad_keepalive[30] ^= 1
        bad_req = bytearray(fe)
        bad_req[50] ^= 1
        invalid = [
            {"name": "KEEPALIVE with a wrong MAC", "keys": 0, "hex": bytes(bad_keepalive).hex(),
             "why": "MAC does not verify"},
            {"name": "channel REQUEST with a wrong MAC", "hex": bytes(bad_req).hex(),
             "why": "request MAC does not verify"},
        ]
        return {"secret": SECRET.hex(), "cookie_key": COOKIE_KEY.hex(), "now_unix_ms": NOW_MS,
                "tokens": toks, "cookies": cookies, "datagrams": dgs,
                "channel": {"challenge": challenge.hex(), "keys": 0, "messages": msgs},
                "invalid": invalid, "areas": areas(), "sealed": self.sealed(t0, km, kt)}

    def sealed(self, t0, km, kt):
        """The committed file's sealed section (made by the Rust implementation
        with ring, not by the checker's code), its tagged datagrams tagged again
        under this file's token 0: the AEAD's associated data leaves the tag
        field out, so they still open."""
        with open(VECTORS) as f:
            sec = json.load(f)["sealed"]
        for i, d in enumerate(sec["datagrams"]):
            b = bytearray.fromhex(d["hex"])
            if d.get("tags"):
                d["keys"] = 0
                b[24:32] = sip(kt, bytes(b[:24]) + bytes(8) + bytes(b[32:])).to_bytes(8, "big")
                d["hex"] = bytes(b).hex()
            if "game_data" in d:
                n = len(b)
                # The tag field, the sealed header, the first and last
                # ciphertext bytes and the whole AEAD tag.
                for lo, hi, label in ((24, 32, "sealed DATA tag"), (32, 57, "sealed header"),
                                      (n - 17, n, "sealed ciphertext end and AEAD tag")):
                    self.spots.append((("sealed", "datagrams", i, "hex"), lo, hi, label))
        for i in range(len(sec["cells"])):
            for at in (0, 17, 31):
                self.spots.append((("sealed", "cells", i, "epoch_key"), at, at + 1, "epoch key"))
        for i in range(len(sec["senders"])):
            for at in (0, 17, 31):
                self.spots.append((("sealed", "senders", i, "sender_key"), at, at + 1, "sender key"))
        self.spots.append((("sealed", "world_id"), 0, 4, "world id"))
        ck = sec["checkpoints"]
        self.spots.append((("sealed", "checkpoints", "control_public"), 0, 1, "control public key"))
        self.spots.append((("sealed", "checkpoints", "control_seed"), 31, 32, "control seed"))
        for i in range(len(ck["players"])):
            self.spots.append((("sealed", "checkpoints", "players", i, "certificate"), 63, 64, "certificate"))
            self.spots.append((("sealed", "checkpoints", "players", i, "public_key"), 0, 1, "player key"))
        for i, e in enumerate(ck["envelopes"]):
            if "state" in e:
                n = len(bytes.fromhex(e["hex"]))
                # The header's cell, certificate and key; the end of the
                # ciphertext, the AEAD tag and the signature.
                for lo, hi, label in ((16, 24, "envelope cell id"), (56, 57, "envelope public key"),
                                      (151, 152, "envelope certificate"), (n - 81, n - 79, "envelope AEAD tag"),
                                      (n - 64, n - 63, "envelope signature"), (n - 1, n, "envelope signature end")):
                    self.spots.append((("sealed", "checkpoints", "envelopes", i, "hex"), lo, hi, label))
                self.spots.append((("sealed", "checkpoints", "envelopes", i, "checkpoint_key"), 0, 1,
                                   "checkpoint key"))
        at = NOW_MS // 1000
        sec["keys_request"] = {"keys": 0, "token": t0.hex(), "at_unix_s": at,
                               "mac": H(km, b"reflector-keys-v1" + t0 + struct.pack(">Q", at), 16).hex()}
        self.spots.append((("sealed", "keys_request", "mac"), 0, 16, "keys request MAC"))
        for i, answer in enumerate(sec["keys_answers"]):
            for j in range(len(answer["keys"])):
                self.spots.append((("sealed", "keys_answers", i, "keys", j, "key"), 0, 1, "handed-out key"))
                self.spots.append((("sealed", "keys_answers", i, "keys", j, "cell_id"), 7, 8, "handed-out cell id"))
        return sec


def areas():
    """Two areas worked out by hand from the document's rule (ring, then
    row, then column; one grant per group not yet seen)."""
    # 4 x 2 grid, groups round-robin over 3: a b c a / b c a b; center (1,0)
    # is b. Ring 1: (0,0) a, (2,0) c, (0,1) b, (1,1) c, (2,1) a.
    g1 = ["a", "b", "c", "a", "b", "c", "a", "b"]
    first = {"grid": [4, 2], "groups": g1, "center": [1, 0], "radius": 1,
             "cells": [[0, 0], [2, 0], [0, 1], [1, 1], [2, 1]], "granted": [[0, 0], [2, 0]]}
    # 3 x 3 grid, every cell its own group, corner (2,2), radius 1.
    second = {"grid": [3, 3], "groups": list("abcdefghi"), "center": [2, 2], "radius": 1,
              "cells": [[1, 1], [2, 1], [1, 2]], "granted": [[1, 1], [2, 1], [1, 2]]}
    return [first, second]


def get_parent(doc, path):
    o = doc
    for p in path[:-1]:
        o = o[p]
    return o, path[-1]


def flip(doc, path, i):
    parent, k = get_parent(doc, path)
    b = bytearray.fromhex(parent[k])
    b[i] ^= 0x01
    parent[k] = bytes(b).hex()


class CheckVectorsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cv = load_checker()
        cls.builder = Builder()
        cls.doc = cls.builder.build()
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_inproc(self, doc=None, raw=None):
        path = os.path.join(self.tmp.name, "v.json")
        with open(path, "w" if raw is None or isinstance(raw, str) else "wb") as f:
            f.write(raw if raw is not None else json.dumps(doc))
        out = io.StringIO()
        old = sys.stdout
        sys.stdout = out
        try:
            rc = self.cv.main([path])
        finally:
            sys.stdout = old
        return rc, out.getvalue()

    def run_process(self, doc=None, raw=None):
        path = os.path.join(self.tmp.name, "p.json")
        with open(path, "w") as f:
            f.write(raw if raw is not None else json.dumps(doc))
        p = subprocess.run([sys.executable, CHECKER, path], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    def assertFails(self, rc, out, what):
        self.assertNotEqual(rc, 0, "%s: the checker passed it\n%s" % (what, out))
        last = out.strip().splitlines()[-1]
        self.assertRegex(last, r"^\d+ passed, [1-9]\d* failed$", what)

    def test_keys_answers_follow_the_overlap_rule(self):
        answers = self.doc["sealed"]["keys_answers"]
        inside = next(i for i, a in enumerate(answers) if len(a["keys"]) > len(a["cells"]))
        outside = next(i for i, a in enumerate(answers) if len(a["keys"]) == len(a["cells"]))
        # The next epoch's key left out inside the window.
        doc = copy.deepcopy(self.doc)
        doc["sealed"]["keys_answers"][inside]["keys"] = [
            k for k in doc["sealed"]["keys_answers"][inside]["keys"]
            if k["epoch"] == doc["sealed"]["keys_answers"][inside]["keys"][0]["epoch"]]
        rc, out = self.run_process(doc)
        self.assertFails(rc, out, "a missing next-epoch key")
        # A next-epoch key handed out before the window opens.
        doc = copy.deepcopy(self.doc)
        keys = doc["sealed"]["keys_answers"][outside]["keys"]
        early = dict(keys[0], epoch=keys[0]["epoch"] + 1)
        keys.insert(1, early)
        rc, out = self.run_process(doc)
        self.assertFails(rc, out, "a next-epoch key before the overlap window")
        # An end that is not the next epoch's start.
        doc = copy.deepcopy(self.doc)
        doc["sealed"]["keys_answers"][outside]["keys"][0]["ends_unix_s"] += 1
        rc, out = self.run_process(doc)
        self.assertFails(rc, out, "a wrong end")

    def test_siphash_reference(self):
        key = bytes(range(16))
        self.assertEqual(self.cv.siphash24(key, bytes(range(15))), 0xA129CA6149BE45E5)
        self.assertEqual(self.cv.siphash24(key, b""), 0x726FDB47DD0E0E31)
        self.assertEqual(self.cv.siphash_selftest(), [])
        for n in range(64):  # the generator's own SipHash agrees too
            self.assertEqual(sip(key, bytes(range(n))), self.cv.siphash24(key, bytes(range(n))))

    def test_valid_file_passes(self):
        rc, out = self.run_process(self.doc)
        self.assertEqual(rc, 0, out)
        lines = out.strip().splitlines()
        self.assertRegex(lines[-1], r"^\d+ passed, 0 failed$")
        self.assertNotIn("FAIL", out)
        for g in ("tokens:", "cookies:", "datagrams:", "channel:", "invalid:", "coverage:", "sealed:",
                  "crypto self-test:"):
            self.assertTrue(any(l.startswith(g) for l in lines), g)

    def test_flipping_any_byte_of_any_mac_tag_key_or_digest_fails(self):
        n = 0
        for path, start, end, label in self.builder.spots:
            parent, k = get_parent(self.doc, path)
            stop = end if end is not None else len(bytes.fromhex(parent[k]))
            for i in range(start, stop):
                doc = copy.deepcopy(self.doc)
                flip(doc, path, i)
                rc, out = self.run_inproc(doc)
                self.assertFails(rc, out, "%s byte %d (%s)" % (label, i, "/".join(map(str, path))))
                n += 1
        self.assertGreater(n, 300)

    def test_invalid_entry_that_is_valid_fails(self):
        doc = copy.deepcopy(self.doc)
        doc["invalid"].append({"name": "a valid KEEPALIVE", "keys": 0,
                               "hex": doc["datagrams"][4]["hex"], "why": "none"})
        self.assertFails(*self.run_inproc(doc), "a valid datagram under invalid")

    def test_unknown_field_beside_is_reported_as_ambiguous(self):
        doc = copy.deepcopy(self.doc)
        doc["datagrams"][4]["colour"] = "blue"
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "a field the document does not define")
        self.assertIn("AMBIGUOUS", out)

    def test_invalid_entry_rejected_by_no_stated_rule_is_ambiguous(self):
        # A valid KEEPALIVE listed as invalid: nothing in the datagram alone breaks a stated rule
        # (a replay, for instance, would need the receiver's state), so the checker cannot confirm it.
        doc = copy.deepcopy(self.doc)
        keepalive = next(d for d in doc["datagrams"] if d["type"] == 5)
        doc["invalid"].append({"name": "a valid KEEPALIVE", "hex": keepalive["hex"], "why": "replayed",
                               "keys": keepalive["keys"]})
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "an invalid entry no stated rule rejects")
        self.assertIn("AMBIGUOUS", out)

    def test_unused_reply_field_is_rejected(self):
        # A FETCH REPLY (EMPTY) with a nonzero tick under a correct MAC: unused fields must be zero.
        doc = copy.deepcopy(self.doc)
        km = bytes.fromhex(doc["tokens"][0]["mac_key"])
        ch = bytes.fromhex(doc["channel"]["challenge"])
        req = bytes.fromhex(doc["channel"]["messages"][3]["hex"])  # REQUEST FETCH_OTHER
        head = bytearray.fromhex(doc["channel"]["messages"][8]["hex"])[:72]  # REPLY EMPTY
        head[31] = 1
        mac = H(km, b"reflector-channel-v2-reply" + ch + req[48:64] + bytes(head), 16)
        doc["invalid"].append({"name": "EMPTY with a tick", "hex": (bytes(head) + mac).hex(), "why": "tick"})
        rc, out = self.run_inproc(doc)
        self.assertEqual(rc, 0, out)
        self.assertIn("unused fields must be zero", out)

    def test_wrong_field_beside_fails(self):
        doc = copy.deepcopy(self.doc)
        doc["datagrams"][4]["sequence"] = 4
        self.assertFails(*self.run_inproc(doc), "wrong sequence beside")

    def test_wrong_length_field_fails(self):
        doc = copy.deepcopy(self.doc)
        b = bytearray.fromhex(doc["datagrams"][6]["hex"])  # DATA stripped: no MAC covers it
        b[7] += 1
        doc["datagrams"][6]["hex"] = bytes(b).hex()
        self.assertFails(*self.run_inproc(doc), "length field")

    def test_empty_file_fails(self):
        rc, out = self.run_process(raw="")
        self.assertFails(rc, out, "empty file")
        self.assertIn("empty", out)

    def test_malformed_json_fails(self):
        rc, out = self.run_process(raw='{"secret": "00",')
        self.assertFails(rc, out, "malformed JSON")
        self.assertIn("not valid JSON", out)

    def test_missing_and_empty_sections_fail(self):
        for section in ("secret", "cookie_key", "now_unix_ms", "tokens", "cookies", "datagrams",
                        "channel", "invalid", "areas", "sealed"):
            doc = copy.deepcopy(self.doc)
            del doc[section]
            rc, out = self.run_inproc(doc)
            self.assertFails(rc, out, "missing " + section)
            self.assertIn(repr(section), out)
            if isinstance(self.doc[section], (list, dict, str)):
                doc = copy.deepcopy(self.doc)
                doc[section] = type(self.doc[section])()
                self.assertFails(*self.run_inproc(doc), "empty " + section)

    def test_a_wrong_area_order_or_grant_fails(self):
        doc = copy.deepcopy(self.doc)
        doc["areas"][0]["cells"][0], doc["areas"][0]["cells"][1] = doc["areas"][0]["cells"][1], doc["areas"][0]["cells"][0]
        self.assertFails(*self.run_inproc(doc), "area cells out of order")
        doc = copy.deepcopy(self.doc)
        doc["areas"][0]["granted"].append([0, 1])  # the center's own group
        self.assertFails(*self.run_inproc(doc), "the center's own group granted")
        doc = copy.deepcopy(self.doc)
        doc["areas"][1]["groups"] = doc["areas"][1]["groups"][:-1]
        self.assertFails(*self.run_inproc(doc), "one group short")

    def test_crypto_reference(self):
        self.assertEqual(self.cv.crypto_selftest(), [])
        key, nonce = bytes(range(32)), bytes(12)
        sealed = self.cv.aead_seal(key, nonce, b"ad", b"game data")
        self.assertEqual(self.cv.aead_open(key, nonce, b"ad", sealed), b"game data")
        self.assertIsNone(self.cv.aead_open(key, nonce, b"aD", sealed))
        self.assertIsNone(self.cv.aead_open(key, bytes(11) + b"\x01", b"ad", sealed))

    def test_a_corrupted_sealed_datagram_fails(self):
        doc = copy.deepcopy(self.doc)
        d = next(d for d in doc["sealed"]["datagrams"] if d.get("game_data"))
        b = bytearray.fromhex(d["hex"])
        b[60] ^= 0x01  # one ciphertext byte
        d["hex"] = bytes(b).hex()
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "a sealed datagram with an altered ciphertext byte")
        self.assertIn("must open, refused at sealed_bad", out)
        doc = copy.deepcopy(self.doc)
        d = next(d for d in doc["sealed"]["datagrams"] if d.get("game_data"))
        d["game_data"] = "00" + d["game_data"][2:]
        self.assertFails(*self.run_inproc(doc), "a sealed datagram given the wrong game data")

    def test_a_sealed_rejection_that_opens_or_fails_elsewhere_fails(self):
        doc = copy.deepcopy(self.doc)
        dgs = doc["sealed"]["datagrams"]
        good = next(d for d in dgs if d.get("game_data"))
        bad = next(d for d in dgs if d.get("reject") == "sealed_bad")
        bad["hex"] = good["hex"]
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "a datagram listed as rejected that opens")
        self.assertIn("opens", out)
        doc = copy.deepcopy(self.doc)
        d = next(d for d in doc["sealed"]["datagrams"] if d.get("reject") == "sealed_no_key")
        d["reject"] = "sealed_bad"
        self.assertFails(*self.run_inproc(doc), "a rejection named at the wrong step")
        doc = copy.deepcopy(self.doc)
        doc["sealed"]["cells"][0]["starts_unix_s"] += 1
        self.assertFails(*self.run_inproc(doc), "a wrong epoch start")
        doc = copy.deepcopy(self.doc)
        doc["sealed"]["cells"][0]["cell"] = [4, 1]
        self.assertFails(*self.run_inproc(doc), "a cell id that is not its cell's")

    def checkpoint_doc(self):
        doc = copy.deepcopy(self.doc)
        ck = doc["sealed"]["checkpoints"]
        good = next(e for e in ck["envelopes"] if "state" in e)
        return doc, ck, good

    def test_a_flipped_checkpoint_signature_bit_fails(self):
        doc, ck, good = self.checkpoint_doc()
        b = bytearray.fromhex(good["hex"])
        b[-20] ^= 0x10
        good["hex"] = bytes(b).hex()
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "an envelope with a flipped signature bit")
        self.assertIn("must open, refused at checkpoint_bad_signature", out)
        # A flipped certificate bit in the header (the envelope then signed
        # over it, so only the certificate check can catch it) fails too.
        doc, ck, good = self.checkpoint_doc()
        b = bytearray.fromhex(good["hex"])
        b[100] ^= 0x01
        good["hex"] = bytes(b).hex()
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "an envelope with a flipped certificate bit")
        self.assertIn("refused at checkpoint_bad_certificate", out)

    def test_another_groups_checkpoint_fails(self):
        # The joiner's group made another: its own checkpoint is now another group's.
        doc, ck, good = self.checkpoint_doc()
        ck["group_cells"] = [[0, 2]]
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "a checkpoint of another group's cell listed as opening")
        self.assertIn("refused at checkpoint_wrong_cell", out)
        # The refused other group's envelope listed as opening.
        doc, ck, good = self.checkpoint_doc()
        other = next(e for e in ck["envelopes"] if e.get("reject") == "checkpoint_wrong_cell")
        other["state"] = good["state"]
        other["checkpoint_key"] = good["checkpoint_key"]
        del other["reject"]
        self.assertFails(*self.run_inproc(doc), "another group's envelope listed as opening")

    def test_an_expired_certificate_fails(self):
        doc, ck, good = self.checkpoint_doc()
        expires = ck["players"][good["signer"]]["expires_unix_s"]
        good["reply_unix_ms"] = expires * 1000 + good["age_ms"]
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "a checkpoint uploaded when its certificate expired")
        self.assertIn("refused at checkpoint_expired_certificate", out)
        # A millisecond earlier it opens: the refused one then fails as listed.
        doc, ck, good = self.checkpoint_doc()
        exp = next(e for e in ck["envelopes"] if e.get("reject") == "checkpoint_expired_certificate")
        exp["reply_unix_ms"] -= 1
        rc, out = self.run_inproc(doc)
        self.assertFails(rc, out, "an expired-certificate refusal that opens")
        self.assertIn("must be refused at checkpoint_expired_certificate, opens", out)

    def test_a_checkpoint_refusal_named_at_the_wrong_check_fails(self):
        doc, ck, _ = self.checkpoint_doc()
        garbage = next(e for e in ck["envelopes"] if e.get("reject") == "checkpoint_bad")
        garbage["reject"] = "checkpoint_bad_signature"
        self.assertFails(*self.run_inproc(doc), "a garbage state named at the signature")
        doc, ck, _ = self.checkpoint_doc()
        ck["envelopes"][0]["reject"] = "checkpoint_unheard_of"
        del ck["envelopes"][0]["state"]
        self.assertFails(*self.run_inproc(doc), "a refusal the document does not name")

    def test_ed25519_reference(self):
        self.assertEqual(self.cv.crypto_selftest(), [])
        seed = bytes(range(32))
        pk = self.cv.ed25519_public(seed)
        sig = self.cv.ed25519_sign(seed, b"checkpoint")
        self.assertTrue(self.cv.ed25519_verify(pk, b"checkpoint", sig))
        self.assertFalse(self.cv.ed25519_verify(pk, b"checkpoinT", sig))
        self.assertFalse(self.cv.ed25519_verify(self.cv.ed25519_public(bytes(32)), b"checkpoint", sig))
        # S at or above the group order is refused (RFC 8032 5.1.7).
        big = (int.from_bytes(sig[32:], "little") + 2 ** 252 + 27742317777372353535851937790883648493)
        self.assertFalse(self.cv.ed25519_verify(pk, b"checkpoint", sig[:32] + big.to_bytes(32, "little")))

    def test_missing_file_fails(self):
        p = subprocess.run([sys.executable, CHECKER, os.path.join(self.tmp.name, "nope.json")],
                           capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("cannot read", p.stdout)


if __name__ == "__main__":
    unittest.main()
