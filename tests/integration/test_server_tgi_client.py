"""TGI's official client (text-generation 0.7) against the real server. It talks to `/`:
``generate`` reads the MindIE list body, ``generate_stream`` needs integer ids in the stream frames
(ServerConfig.streamTokenIdFormat = "int", the alt server)."""
from __future__ import annotations

import pytest
from text_generation import Client
from text_generation.errors import ValidationError

from tests.server_utils import alt_server, plain_server

PROMPT = "Once upon a time in a quiet harbor"


@pytest.fixture(scope="session")
def client(request, tiny_model):
    return Client(plain_server(request, tiny_model).url(), timeout=60)


@pytest.fixture(scope="session")
def stream_client(request, tiny_model):
    return Client(alt_server(request, tiny_model).url(), timeout=60)


def test_generate_with_details(client):
    r = client.generate(PROMPT, max_new_tokens=8, decoder_input_details=True)
    d = r.details
    assert d.generated_tokens == len(d.tokens) and 0 < d.generated_tokens <= 8
    assert d.finish_reason.value in ("length", "eos_token", "stop_sequence")
    assert len(d.prefill) > 1 and d.prefill[0].logprob is None and d.prefill[1].logprob is not None
    assert all(t.logprob is not None and isinstance(t.special, bool) for t in d.tokens)
    assert isinstance(r.generated_text, str)


def test_generate_stream_matches_generate(client, stream_client):
    whole = client.generate(PROMPT, max_new_tokens=10).generated_text
    responses = list(stream_client.generate_stream(PROMPT, max_new_tokens=10))
    assert responses and all(isinstance(r.token.id, int) for r in responses)
    assert all(r.generated_text is None for r in responses[:-1])
    assert responses[-1].generated_text == whole
    assert responses[-1].details.generated_tokens == len(responses)
    # fullTextEnabled on this server: each frame's text is the text so far
    assert responses[-1].token.text == whole


def test_seeded_sampling_is_reproducible(client):
    a = client.generate(PROMPT, do_sample=True, temperature=1.2, seed=42, max_new_tokens=12)
    b = client.generate(PROMPT, do_sample=True, temperature=1.2, seed=42, max_new_tokens=12)
    c = client.generate(PROMPT, do_sample=True, temperature=1.2, seed=43, max_new_tokens=12)
    assert a.generated_text == b.generated_text and a.details.seed == 42
    assert [t.id for t in a.details.tokens] == [t.id for t in b.details.tokens]
    assert c.details.seed == 43


def test_best_of(client):
    r = client.generate(PROMPT, do_sample=True, best_of=2, max_new_tokens=6)
    assert len(r.details.best_of_sequences) == 1
    other = r.details.best_of_sequences[0]

    def mean(tokens):
        return sum(t.logprob for t in tokens) / len(tokens)

    assert mean(r.details.tokens) >= mean(other.tokens)


def test_top_n_tokens(client):
    r = client.generate(PROMPT, max_new_tokens=3, top_n_tokens=2)
    assert len(r.details.top_tokens) == r.details.generated_tokens
    assert all(len(top) == 2 for top in r.details.top_tokens)
    # greedy: the chosen token is the most likely one
    assert all(top[0].id == t.id for top, t in zip(r.details.top_tokens, r.details.tokens))


def test_server_422_maps_to_the_clients_validation_error(client):
    with pytest.raises(ValidationError, match="max_new_tokens"):
        client.generate(PROMPT, max_new_tokens=0)
    with pytest.raises(ValidationError, match="inputs must be at most"):
        client.generate("word " * 400)
