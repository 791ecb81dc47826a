"""A running sequence -> its ScheduledChunk for this step (engine.step): the scheduler's plain-data
output, built from the sequence's token state. Plain Python (no torch)."""
from __future__ import annotations

from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import ScheduledChunk


def prefilling(seq: Sequence) -> bool:
    """More than the last token left to compute, or a prompt token (media placeholders, prompt logprobs)."""
    done = seq.num_computed_tokens
    return done < seq.num_tokens - 1 or done < seq.num_prompt_tokens


def chunk(seq: Sequence, n: int, steps: int = 1) -> ScheduledChunk:
    start = seq.num_computed_tokens
    end = start + n
    tokens = (seq.token_at(start),) if n == 1 else tuple(seq.token_ids()[start:end])
    in_prompt = start < seq.num_prompt_tokens
    mm = seq.mm_inputs is not None and in_prompt
    return ScheduledChunk(
        request_id=seq.request_id, start=start, token_ids=tokens, block_table=tuple(seq.block_table),
        sample=end == seq.num_tokens, adapter_slot=seq.adapter_slot,
        prompt_logprobs=seq.params.prompt_logprobs and in_prompt and not seq.output_token_ids,
        mm_inputs=seq.mm_inputs if mm else None, prompt_token_ids=tuple(seq.prompt_token_ids) if mm else None,
        steps=steps)


def spec_chunk(seq: Sequence) -> ScheduledChunk:
    """A decode that verifies draft tokens: its last token, then the drafts (engine.spec.speculator)."""
    start = seq.num_computed_tokens
    return ScheduledChunk(request_id=seq.request_id, start=start,
                          token_ids=(seq.token_at(start), *seq.draft_token_ids), block_table=tuple(seq.block_table),
                          sample=True, adapter_slot=seq.adapter_slot, num_draft=len(seq.draft_token_ids))
