"""Entries under `invalid`: each must be rejected by a rule of the document."""

import hashlib
import hmac
import ipaddress
import json
import os
import sys
import struct

from .common import *  # noqa: F401,F403

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


class InvalidChecks:
    """Methods of the checker (see check-vectors.py's Checker)."""

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
