#!/usr/bin/env python3
"""Independent conformance checker for the reflector protocol's test vectors.

Written from docs/protocol.md (version 2, revision 2.2) alone.  It reads the
vectors file described in the document's "Test vectors" section and checks
every token, key, cookie, datagram, checkpoint-channel message, area,
sealed payload and sealed checkpoint in it against the document's rules
(HKDF-SHA256, AES-256-GCM and Ed25519 written here from RFC 5869, FIPS
197 with NIST SP 800-38D, and RFC 8032, and checked against their published
examples, since the standard library has none of them), and that every entry under `invalid` is
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

# The parts live beside this script (scripts/vectorcheck/).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from vectorcheck.common import *  # noqa: E402,F401,F403
from vectorcheck.crypto import *  # noqa: E402,F401,F403
from vectorcheck.datagrams import DatagramChecks  # noqa: E402
from vectorcheck.channel import ChannelChecks  # noqa: E402
from vectorcheck.sealed import AreaSealedChecks  # noqa: E402
from vectorcheck.invalid import InvalidChecks  # noqa: E402


class Checker(DatagramChecks, ChannelChecks, AreaSealedChecks, InvalidChecks):
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
                "HKDF, AES-256-GCM or Ed25519 disagrees with its published example: %s" % "; ".join(bad))
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
