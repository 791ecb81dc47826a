"""Durable batch inference jobs (llama-stack's batch inference API): a JSONL file of conversations in,
JSONL result files out, state in SQLite so that a job survives a restart, loses no line and writes
no record twice. Batch lines run at low priority beside online traffic."""
