"""Areas of interest and sealed payloads (document sections Area of interest and Sealed payloads)."""

import hashlib
import hmac
import ipaddress
import json
import os
import sys
import struct

from .common import *  # noqa: F401,F403

class AreaSealedChecks:
    """Methods of the checker (see check-vectors.py's Checker)."""

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
        self.check_keys_answers(G, sec, prk, want_world, length, jitter_bound)
        self.check_checkpoints(G, sec.get("checkpoints"), prk, want_world, held)

    # -- sealed checkpoints --------------------------------------------------

    def check_checkpoints(self, G, ck, prk, world_id, held):
        """Sealed checkpoints: the control key from the master secret, each
        player's key and certificate (Ed25519 is deterministic: recomputed and
        compared), and each envelope judged by the joiner's checks in the
        document's order, holding the keys of `cells` for `group_cells` only."""
        what = "sealed.checkpoints"
        if not isinstance(ck, dict) or not ck:
            self.r.fail(G, "%s is missing or empty (Test vectors)" % what)
            return
        for k in ck:
            if k not in CHECKPOINTS_KEYS:
                self.r.fail(G, "AMBIGUOUS: %s.%s is not described by the document; not checked" % (what, k))
        try:
            seed = hexbytes(ck.get("control_seed"), what + ".control_seed", 32)
            public = hexbytes(ck.get("control_public"), what + ".control_public", 32)
            cells = [self.cell_pair(c, what + ".group_cells") for c in ck.get("group_cells") or []]
            if not cells:
                raise Bad("%s.group_cells is missing or empty" % what)
        except Bad as e:
            self.r.fail(G, str(e))
            return
        want_seed = hkdf_expand(prk, b"reflector-control-sign-v1" + world_id, 32)
        self.r.check(G, seed == want_seed, "%s.control_seed differs from HKDF-Expand(PRK, ...)" % what)
        self.r.check(G, public == ed25519_public(want_seed),
                     "%s.control_public is not the public key of the control seed" % what)
        group = {world_id + struct.pack(">HH", c, r) for c, r in cells}
        group_held = {k: v for k, v in held.items() if k[0] in group}

        players = []
        for _, pw, p in self.entries(G, what + ".players", self.listed_in(ck, "players", what)):
            for k in p:
                if k not in CHECKPOINT_PLAYER_KEYS:
                    self.r.fail(G, "AMBIGUOUS: %s.%s is not described by the document; not checked" % (pw, k))
            try:
                player = as_int(p.get("player"), pw + ".player")
                pseed = hexbytes(p.get("seed"), pw + ".seed", 32)
                pk = hexbytes(p.get("public_key"), pw + ".public_key", 32)
                expires = as_int(p.get("expires_unix_s"), pw + ".expires_unix_s")
                cert = hexbytes(p.get("certificate"), pw + ".certificate", 64)
            except Bad as e:
                self.r.fail(G, str(e))
                players.append(None)
                continue
            self.r.check(G, pk == ed25519_public(pseed), "%s: public_key is not the seed's" % pw)
            msg = b"reflector-player-cert-v1" + world_id + struct.pack(">I", player) + pk + struct.pack(">Q", expires)
            self.r.check(G, cert == ed25519_sign(want_seed, msg),
                         "%s: certificate is not the control key's signature of the document's message" % pw)
            self.r.check(G, ed25519_verify(public, msg, cert),
                         "%s: certificate does not verify under control_public" % pw)
            players.append((player, pseed, pk, expires, cert))

        opened = rejected = 0
        for _, ew, e in self.entries(G, what + ".envelopes", self.listed_in(ck, "envelopes", what)):
            for k in e:
                if k not in ENVELOPE_KEYS:
                    self.r.fail(G, "AMBIGUOUS: %s.%s is not described by the document; not checked" % (ew, k))
            try:
                b = hexbytes(e.get("hex"), ew + ".hex")
                idx = as_int(e.get("signer"), ew + ".signer")
                signer = players[idx] if 0 <= idx < len(players) else None
                if signer is None:
                    raise Bad("%s: signer %d names no readable entry of players" % (ew, idx))
                instance = as_int(e.get("instance"), ew + ".instance")
                reply = (as_int(e.get("reply_tick"), ew + ".reply_tick"),
                         as_int(e.get("reply_from_player"), ew + ".reply_from_player"),
                         as_int(e.get("reply_unix_ms"), ew + ".reply_unix_ms"),
                         as_int(e.get("age_ms"), ew + ".age_ms"))
                step, state, key = self.judge_envelope(b, reply, group_held, public)
                if "state" in e:
                    want = hexbytes(e.get("state"), ew + ".state")
                    if not self.r.check(G, step is None, "%s: must open, refused at %s" % (ew, step)):
                        continue
                    self.r.check(G, state == want, "%s: opens to %s, given %s" % (ew, state.hex(), want.hex()))
                    ck_key = hexbytes(e.get("checkpoint_key"), ew + ".checkpoint_key", 32)
                    self.r.check(G, ck_key == key, "%s: checkpoint_key differs from HKDF-Expand(E, ...)" % ew)
                    player, pseed, pk, expires, cert = signer
                    self.r.check(G, (struct.unpack(">I", b[12:16])[0], struct.unpack(">Q", b[32:40])[0],
                                     struct.unpack(">Q", b[48:56])[0], b[56:88], b[88:152])
                                 == (player, instance, expires, pk, cert),
                                 "%s: its player, instance, expiry, key or certificate is not its signer's" % ew)
                    sig = ed25519_sign(pseed, b"reflector-checkpoint-sig-v1" + b[:-64])
                    self.r.check(G, b[-64:] == sig, "%s: the signature is not the signer's over the document's "
                                                    "message" % ew)
                    opened += 1
                elif "reject" in e:
                    reject = e.get("reject")
                    if reject not in CHECKPOINT_STEPS:
                        raise Bad("%s: reject %r is not a check the document names" % (ew, reject))
                    self.r.check(G, step == reject, "%s: must be refused at %s, %s" % (
                        ew, reject, "opens" if step is None else "refused at %s" % step))
                    self.r.check(G, "why" in e, "%s: a refused envelope says why" % ew)
                    rejected += 1
                else:
                    self.r.fail(G, "%s: neither state nor reject" % ew)
            except Bad as ex:
                self.r.fail(G, str(ex))
        self.r.check(G, opened > 0 and rejected > 0,
                     "%s.envelopes: needs at least one that opens and one refused (%d, %d)" % (what, opened, rejected))

    def judge_envelope(self, b, reply, group_held, control_public):
        """A joiner's checks in order: (None, state, checkpoint key) if the
        envelope passes them all, else (the name of the first that fails,
        None, None).  reply = (tick, from player, arrival Unix ms, age ms)."""
        if len(b) < ENVELOPE_MIN or b[0:4] != ENVELOPE_MAGIC or b[5:8] != bytes(3):
            return "checkpoint_malformed", None, None
        if b[4] != ENVELOPE_VERSION:
            return "checkpoint_version", None, None
        epoch, player = struct.unpack(">II", b[8:16])
        cid = b[16:24]
        tick, instance, seq, expires = struct.unpack(">QQQQ", b[24:56])
        pk, cert = b[56:88], b[88:152]
        if cid not in {c for c, _ in group_held}:
            return "checkpoint_wrong_cell", None, None
        if (reply[0], reply[1]) != (tick, player):
            return "checkpoint_mismatch", None, None
        msg = b"reflector-player-cert-v1" + cid[:4] + struct.pack(">I", player) + pk + struct.pack(">Q", expires)
        if not ed25519_verify(control_public, msg, cert):
            return "checkpoint_bad_certificate", None, None
        if reply[2] - reply[3] >= expires * 1000:
            return "checkpoint_expired_certificate", None, None
        if not ed25519_verify(pk, b"reflector-checkpoint-sig-v1" + b[:-64], b[-64:]):
            return "checkpoint_bad_signature", None, None
        ek = group_held.get((cid, epoch))
        if ek is None:
            return "checkpoint_no_key", None, None
        key = hkdf_expand(ek, b"reflector-checkpoint-key-v1" + cid + struct.pack(">IIQ", epoch, player, instance), 32)
        state = aead_open(key, bytes(4) + b[40:48], b[:ENVELOPE_HEADER], b[ENVELOPE_HEADER:-64])
        if state is None:
            return "checkpoint_bad", None, None
        return None, state, key

    def check_keys_answers(self, G, sec, prk, world_id, length, jitter_bound):
        """Handing out keys: for each cell, in the order given, the epoch
        current at `at` (the newest that has started; 0 before any) and,
        only from W = 60 s before the next one starts, that one too; each
        entry's cell id, key, start and end (the next epoch's start) as the
        document derives them."""
        W = 60

        def start(cid, e):
            raw = int.from_bytes(hkdf_expand(prk, b"reflector-epoch-jitter-v1" + cid + struct.pack(">I", e), 8), "big")
            return e * length + (raw % jitter_bound if jitter_bound else 0)

        windows = 0
        for _, what, a in self.entries(G, "sealed.keys_answers", self.listed(sec, "keys_answers")):
            for k in a:
                if k not in KEYS_ANSWER_KEYS:
                    self.r.fail(G, "AMBIGUOUS: %s.%s is not described by the document; not checked" % (what, k))
            try:
                at = as_int(a.get("at_unix_s"), what + ".at_unix_s")
                cells = [self.cell_pair(c, what + ".cells") for c in a.get("cells") or []]
                keys = a.get("keys")
                if not cells or not isinstance(keys, list):
                    raise Bad("%s: needs cells and a keys array" % what)
            except Bad as e:
                self.r.fail(G, str(e))
                continue
            want = []
            for col, row in cells:
                cid = world_id + struct.pack(">HH", col, row)
                e = at // length
                while e > 0 and start(cid, e) > at:
                    e -= 1
                epochs = [e]
                if at + W >= start(cid, e + 1):
                    epochs.append(e + 1)
                    windows += 1
                for ep in epochs:
                    key = hkdf_expand(prk, b"reflector-epoch-key-v1" + cid + struct.pack(">I", ep), 32)
                    want.append({"cell": [col, row], "cell_id": cid.hex(), "epoch": ep, "key": key.hex(),
                                 "starts_unix_s": start(cid, ep), "ends_unix_s": start(cid, ep + 1)})
            for i, k in enumerate(keys):
                if isinstance(k, dict) and sorted(k) != sorted(EPOCH_KEY_FIELDS):
                    self.r.fail(G, "%s.keys[%d]: fields %s, the document names %s"
                                % (what, i, sorted(k), EPOCH_KEY_FIELDS))
            self.r.check(G, len(keys) == len(want),
                         "%s: %d keys, the document's rule hands out %d" % (what, len(keys), len(want)))
            for i, (got, w) in enumerate(zip(keys, want)):
                self.r.check(G, got == w, "%s.keys[%d]: %s, the document gives %s" % (what, i, got, w))
        self.r.check(G, windows > 0, "sealed.keys_answers: none is inside an overlap window")

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

    def listed_in(self, obj, name, where):
        v = obj.get(name)
        if not isinstance(v, list) or not v:
            self.r.fail("sealed", "%s.%s is missing or empty (Test vectors)" % (where, name))
            return []
        return v

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
        if b[40] != SEALED_VERSION:
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
