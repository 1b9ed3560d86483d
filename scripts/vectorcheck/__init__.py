"""The independent checker of docs/protocol-vectors.json, in parts (check-vectors.py is its entry point)."""
