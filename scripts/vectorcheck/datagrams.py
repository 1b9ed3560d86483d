"""Tokens, cookies and datagrams (document sections Keys, Header, Types, Join, DATA and tags)."""

import hashlib
import hmac
import ipaddress
import json
import os
import sys
import struct

from .common import *  # noqa: F401,F403

class DatagramChecks:
    """Methods of the checker (see check-vectors.py's Checker)."""

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
