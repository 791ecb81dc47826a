"""The one path from a parsed request to the engine's immutable ``EngineRequest``.

    validate (no tokenizer, no I/O: media kinds, truncate, adapter name)
    -> prompt ids (tokenize | token ids as given | fetched media -> the model's processor with placeholders)
    -> truncate + length rule -> vocabulary -> media placeholders -> EngineRequest

Every front door goes through it: the MindIE and TGI routes (``process_async``: media fetched on the IO
loop, the rest in the tokenizer pool) and the offline ``LLM.generate`` (``process``). The engine trusts
what comes out. Where the next parts go: a cheap character-count length check belongs at the end of
``validate`` (before tokenizing); chat templates and batch-job messages are new ``Prompt`` kinds rendered in
``_prompt_ids``; a session continuation prepends its ids there, before the length rule.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable, Collection

from mindie_service.engine.types import EngineRequest
from mindie_service.errors import ValidationError, check
from mindie_service.inputs.limits import InputLimits, fit_prompt
from mindie_service.inputs.types import MediaEncoder, PartsPrompt, Prompt, TextPrompt, TokensPrompt
from mindie_service.sampling_params import SamplingParams, is_base_adapter, unknown_adapter_message
from multimodal import MediaItem, MediaPolicy

if TYPE_CHECKING:
    from mindie_service.engine.core import LLMEngine
    from multimodal import DecodeOptions

logger = logging.getLogger(__name__)

Tokenize = Callable[[str], list[int]]


def hf_tokenize(tokenizer: Any) -> Tokenize:
    """A Hugging Face tokenizer as a ``Tokenize`` (special tokens added as the tokenizer does)."""
    def tokenize(text: str) -> list[int]:
        return list(tokenizer(text).input_ids)
    return tokenize


def _part_kind(part: Any, position: int) -> tuple[Any, int, str]:
    """(kind, index in the request's inputs, the type the caller wrote) of one prompt part."""
    kind = part.get("type") if isinstance(part, dict) else getattr(part, "kind", None)
    shown = f"{kind}_url" if isinstance(part, MediaItem) else str(kind)
    return kind, getattr(part, "index", position), shown


class InputProcessor:
    """Built once per engine (``for_engine``, or by hand for the StandardMock); stateless per request and
    safe to call from the tokenizer pool's threads."""

    def __init__(self, tokenize: Tokenize, limits: InputLimits, *,
                 adapter_names: Callable[[], Collection[str]] = frozenset,
                 mm_encoder: MediaEncoder | None = None, decode_options: DecodeOptions | None = None) -> None:
        self.tokenize = tokenize
        self.limits = limits
        self.adapter_names = adapter_names  # live: adapters load and unload at run time
        self.mm_encoder = mm_encoder
        self.modalities = frozenset(mm_encoder.modalities) if mm_encoder is not None else frozenset()
        self.decode_options = decode_options  # None: the media layer's defaults

    @classmethod
    def for_engine(cls, engine: "LLMEngine", tokenize: Tokenize | None = None) -> "InputProcessor":
        """From the engine's facts: its config, KV pool, vocabulary, media encoder and adapters. ``tokenize``
        defaults to the engine's tokenizer (the async facade passes its own frontend instance)."""
        from multimodal import DecodeOptions  # the decoders load only with an engine, not with the protocol

        cfg, enc = engine.cfg, engine.mm_encoder
        limits = InputLimits.of(effective_max_input_len=cfg.effective_max_input_len, pool_tokens=engine.pool_tokens,
                                truncation=cfg.truncation, vocab_size=engine.vocab_size)
        decode = DecodeOptions(num_video_frames=min(cfg.video_frames, cfg.max_video_frames),
                               audio_sampling_rate=(enc.sampling_rate if enc is not None else None) or 16000)
        return cls(tokenize or hf_tokenize(engine.tokenizer), limits, adapter_names=engine.lora.names,
                   mm_encoder=enc, decode_options=decode)

    # ------------------------------------------------------------ stages
    def validate(self, prompt: Prompt, params: SamplingParams, truncate: int | None = None) -> SamplingParams:
        """The checks that need neither the tokenizer nor I/O (run before any media is fetched). Returns
        ``params`` with the adapter resolved: the base model's name ("None") becomes None."""
        if isinstance(prompt, PartsPrompt):
            self._check_media_kinds(prompt)
            check(truncate is None, "truncate", "absent for inputs holding media (it would cut placeholders)",
                  truncate)
        name = params.adapter_id
        if is_base_adapter(name):
            return params if name is None else dataclasses.replace(params, adapter_id=None)
        if name not in self.adapter_names():
            raise ValidationError(unknown_adapter_message(name))
        return params

    def _check_media_kinds(self, prompt: PartsPrompt) -> None:
        takes = ", ".join(sorted(self.modalities)) or "text only"
        for position, part in enumerate(prompt.parts):
            kind, index, shown = _part_kind(part, position)
            if kind == "text" or not isinstance(kind, str):
                continue  # unknown types are the model's processor's to name
            if ("image" if kind == "video" else kind) not in self.modalities:
                raise ValidationError(f"Parameter inputs[{index}] must be a media type this model takes ({takes}); "
                                      f"it takes no {kind} input, got {shown}")
        if self.mm_encoder is None:
            raise ValidationError("Parameter inputs must be a string or token ids (this model takes no media), "
                                  "got a list of parts")

    def _prompt_ids(self, prompt: Prompt) -> tuple[list[int], Any, tuple[str, ...]]:
        """(ids, media inputs, media hashes) before the length rule."""
        if isinstance(prompt, TextPrompt):
            return self.tokenize(prompt.text), None, ()
        if isinstance(prompt, TokensPrompt):
            return list(prompt.token_ids), None, ()
        assert self.mm_encoder is not None  # validate() refused media for text-only models
        if any(isinstance(p, MediaItem) for p in prompt.parts):
            raise TypeError("media references must be loaded first (InputProcessor.process_async)")
        mp = self.mm_encoder.prepare(prompt.parts)
        return list(mp.prompt_token_ids), mp.mm_inputs, tuple(mp.mm_hashes)

    def _check_ids(self, ids: tuple[int, ...], mm_inputs: Any) -> None:
        vocab = self.limits.vocab_size
        bad = [i for i in ids if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab)]
        check(not bad, "inputs", f"token ids in [0, {vocab})", bad[:3])
        if self.mm_encoder is not None:  # placeholders typed as text, or without their media, are refused
            self.mm_encoder.check_prompt(list(ids), mm_inputs)

    # ------------------------------------------------------------ entry points
    def process(self, prompt: Prompt, params: SamplingParams, *, request_id: str,
                truncate: int | None = None) -> EngineRequest:
        """The whole path, synchronously (CPU work: run it off the IO loop). ValidationError on bad input."""
        params = self.validate(prompt, params, truncate)
        raw, mm_inputs, mm_hashes = self._prompt_ids(prompt)
        ids = fit_prompt(raw, truncate, self.limits, media=isinstance(prompt, PartsPrompt))
        check(len(ids) > 0, "inputs", "at least one token after tokenization", len(ids))
        self._check_ids(ids, mm_inputs)
        if mm_hashes:
            logger.debug("%s: %d prompt tokens, %d media items", request_id, len(ids), len(mm_hashes))
        return EngineRequest(request_id, ids, params, mm_inputs=mm_inputs, mm_hashes=mm_hashes)

    async def process_async(self, prompt: Prompt, params: SamplingParams, *, request_id: str,
                            truncate: int | None, executor: Executor,
                            media_policy: MediaPolicy | None = None) -> EngineRequest:
        """The HTTP path: media references are fetched (guarded by ``media_policy``) and decoded in
        ``executor``; everything else runs in ``executor`` too, never on the IO loop."""
        if isinstance(prompt, PartsPrompt) and any(isinstance(p, MediaItem) for p in prompt.parts):
            from multimodal import load_media

            self.validate(prompt, params, truncate)  # refuse before fetching anything
            loaded = await load_media(list(prompt.parts), media_policy or MediaPolicy(), executor,
                                      self.decode_options)
            prompt = PartsPrompt(tuple(loaded), prompt.text)
        run = functools.partial(self.process, prompt, params, request_id=request_id, truncate=truncate)
        return await asyncio.get_running_loop().run_in_executor(executor, run)
