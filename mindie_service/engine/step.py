"""The step contract: plain data between the scheduler, the model runner and the engine.

One step is three calls::

    out = scheduler.schedule()            # SchedulerOutput: which requests compute how many tokens
    result = runner.execute(out)          # ModelOutput: logits of the rows that sample (no bookkeeping)
    scheduler.update(out, sampled, done)  # counters, computed blocks registered, tokens appended, finishes

A request is never "in prefill mode" or "in decode mode": each step it computes ``num_tokens``
tokens from position ``start`` (one for a decode; a piece of its prompt under chunked prefill),
and it samples only when that reaches the end of its known tokens. Everything here is plain
Python (no torch), so a tensor-parallel rank 0 can send a step to its workers as it is."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScheduledChunk:
    """One request's work in one step: compute the K/V of ``token_ids`` at positions
    ``start .. start + len(token_ids) - 1`` into the blocks of ``block_table``."""

    request_id: str
    start: int
    token_ids: tuple[int, ...]
    block_table: tuple[int, ...]
    sample: bool  # the chunk ends at the request's last known token: its next token is sampled
    adapter_slot: int = 0  # LoRA pool slot (0 = base model)
    prompt_logprobs: bool = False  # return the logits of every prompt row of this chunk
    mm_inputs: Any = None  # the model's media inputs (placeholders are in the prompt ids)
    prompt_token_ids: tuple[int, ...] | None = None  # set with mm_inputs: where the placeholders are
    # Speculative decoding: the last ``num_draft`` tokens are drafts to verify; a sampling chunk then has
    # 1 + num_draft logits rows (its last rows), one per draft position plus the one after the last.
    num_draft: int = 0
    # Multi-step decode (engine.sched.bursts): a greedy decode run ``steps`` times in one call, each step's argmax
    # the next one's token (slots reserved for positions start .. start + steps - 1); its run of tokens comes
    # back in ModelOutput.tokens, cut by the engine at the token that finishes the request.
    steps: int = 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def out_rows(self) -> int:
        """Tokens this chunk can yield: a verify chunk's 1 + num_draft, a multi-step chunk's steps, else 1."""
        return self.steps if self.steps > 1 else 1 + self.num_draft

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass
class SchedulerOutput:
    """A step's rows: ``num_decodes`` single-token chunks first, then prefill chunks."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    num_decodes: int = 0
    preempted: list[str] = field(default_factory=list)  # request ids moved back to the waiting (or swapped) queue
    # KV block copies the runner makes before this step's forward, swap-outs first (engine.kv.swap):
    # (device block, host block) pairs to save, then (host block, device block) pairs to restore.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Nothing runs yet: the prompts that just arrived wait this many more seconds for others to join their
    # prefill batch (maxQueueDelayMicroseconds); the engine sleeps a little and schedules again.
    hold_s: float = 0.0

    @property
    def empty(self) -> bool:
        """No forward to run (there may still be swaps: ``has_swaps``)."""
        return not self.chunks

    @property
    def has_swaps(self) -> bool:
        return bool(self.swap_out or self.swap_in)

    @property
    def decodes(self) -> list[ScheduledChunk]:
        return self.chunks[:self.num_decodes]

    @property
    def prefills(self) -> list[ScheduledChunk]:
        return self.chunks[self.num_decodes:]

    @property
    def sampled(self) -> list[ScheduledChunk]:
        """The chunks with rows in ModelOutput.logits, in order (1 + num_draft rows each)."""
        return [c for c in self.chunks if c.sample]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    def only(self, chunk: ScheduledChunk) -> "SchedulerOutput":
        """This step restricted to one chunk (the engine re-runs a failed step one request at a time). The
        swaps are left out: they ran once, before the step's forward."""
        return SchedulerOutput([chunk], 1 if chunk in self.decodes else 0)


@dataclass
class ModelOutput:
    """What the runner returns: ``logits`` [sum of 1 + num_draft over out.sampled, vocab] (a torch tensor), and for
    chunks that asked, ``prompt_logits[request_id]`` [rows, vocab]: the logits at positions
    ``start ..`` of every chunk row that predicts a prompt token."""

    logits: Any
    prompt_logits: dict[str, Any] = field(default_factory=dict)
    # A multi-step decode (chunks with steps > 1): each sampled chunk's greedy tokens and their log-probabilities,
    # as many for every chunk (the logits are then empty); None for a plain step.
    tokens: list[list[int]] | None = None
    token_logprobs: list[list[float]] | None = None
