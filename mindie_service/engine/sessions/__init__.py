"""Kept /api/* sessions: the store and its pins on KV blocks (session_store.py), the session file
(session_file.py), spilling to disk and reading back (session_spill.py), the writer off the engine thread
(spill_writer.py). Handed the block manager, the store and the KV pool; never the engine."""
