#!/usr/bin/env python3
"""One HS256 ticket (the game backend's JWT) per player 1..N, a line each,
under the key KEY_HEX with kid "bench", valid for an hour: what the control
server benchmarks send in their /join requests.

usage: bench/tickets.py KEY_HEX N > tickets.txt"""
import base64, hashlib, hmac, json, sys, time

if len(sys.argv) != 3:
    sys.exit(__doc__)
key = bytes.fromhex(sys.argv[1])
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "bench"}).encode())
exp = int(time.time()) + 3600
for player in range(1, int(sys.argv[2]) + 1):
    body = b64(json.dumps({"sub": str(player), "exp": exp}).encode())
    sig = b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
    print(f"{head}.{body}.{sig}")
