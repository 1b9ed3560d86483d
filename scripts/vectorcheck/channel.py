"""The checkpoint channel's messages (document section Checkpoints, the channel version 2)."""

import hashlib
import hmac
import ipaddress
import json
import os
import sys
import struct

from .common import *  # noqa: F401,F403

class ChannelChecks:
    """Methods of the checker (see check-vectors.py's Checker)."""

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
