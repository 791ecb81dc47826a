"""The mask fill overlapped with the forward (structuredOutput.overlapFill): the masks a step's constrained rows
lack are filled on the fill thread while the model runs; the same masks, so the same tokens, as filling them
after the forward."""
from __future__ import annotations

import pytest

from mindie_service.llm import LLM
from mindie_service.sampling_params import SamplingParams
from mindie_service.structured.backend import StructuredLimits

SCHEMA = {"type": "object", "required": ["name", "n", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "maximum": 999},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}}
PROMPTS = ["Hello", "The weather today", "Once upon a time", "Tell me", "A list of", "Numbers"]


@pytest.fixture(scope="module")
def llms(tiny_model):
    # forced runs off: every constrained row's mask is filled in the step (with them on, only the rows that
    # ask for logprobs, and the rest come from the forcing pass after the previous step)
    return {o: LLM(str(tiny_model), structured=StructuredLimits(forced_runs=False, overlap_fill=o))
            for o in (True, False)}


def test_overlapped_fill_gives_the_same_tokens(llms):
    # half the rows constrained (one asking for logprobs), seeded sampling
    params = [SamplingParams(max_tokens=48, temperature=1.0, seed=i, logprobs=1 if i == 2 else None,
                             structured_outputs={"json": SCHEMA} if i % 2 == 0 else None)
              for i in range(len(PROMPTS))]
    got = {}
    for overlap in (True, False):
        llm = llms[overlap]
        before = llm.engine.grammar.stats.overlapped_rows
        got[overlap] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        assert (llm.engine.grammar.stats.overlapped_rows > before) == overlap  # the thread did fill them
    assert got[True] == got[False]
    assert all(got[True][i] for i in range(len(PROMPTS)))
