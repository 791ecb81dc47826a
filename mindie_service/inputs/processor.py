"""The one path from a parsed request to the engine's immutable ``EngineRequest``.

    validate (no tokenizer, no I/O: media kinds, truncate, adapter name)
    -> prompt ids (tokenize | token ids as given | fetched media -> the model's processor with placeholders)
    -> truncate + length rule -> vocabulary -> media placeholders -> EngineRequest

Every front door goes through it: the MindIE and TGI routes (``process_async``: media fetched on the IO
loop, the rest in the tokenizer pool) and the offline ``LLM.generate`` (``process``). The engine trusts
what comes out. A text prompt's tokenization is bounded by what the length rule keeps (text_bound.py).
Where the next parts go: chat templates and batch-job messages are new ``Prompt`` kinds rendered in
``_prompt_ids``; a session continuation prepends its ids there, before the length rule.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable, Collection

from mindie_service.engine.contract import EngineRequest, InputFacts
from mindie_service.errors import ValidationError, check
from mindie_service.inputs.chat import ChatRenderer, check_chat_chars
from mindie_service.inputs.limits import InputLimits, fit_prompt
from mindie_service.inputs.text_bound import TextBound, tokenize_bounded
from mindie_service.inputs.types import (ChatMessage, ChatPrompt, MediaEncoder, PartsPrompt, Prompt,
                                         SessionLookup, TextPrompt, TokensPrompt)
from mindie_service.params.adapter_name import check_adapter_id
from mindie_service.sampling_params import SamplingParams
from multimodal import MediaItem, MediaPolicy

if TYPE_CHECKING:
    from mindie_service.structured.grammar_spec import StructuredSpec
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


def _shortest_edge(enc: Any) -> int | None:
    """The image processor's shortest-edge resize (CLIP, LLaVA), so the media layer can bound the pixels
    after resizing; None when it resizes otherwise."""
    size = getattr(getattr(getattr(enc, "processor", None), "image_processor", None), "size", None)
    edge = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
    return int(edge) if isinstance(edge, int) and edge > 0 else None


class InputProcessor:
    """Built once per engine (``from_facts``, or by hand in tests); stateless per request and
    safe to call from the tokenizer pool's threads."""

    def __init__(self, tokenize: Tokenize, limits: InputLimits, *,
                 adapter_names: Callable[[], Collection[str]] = frozenset,
                 mm_encoder: MediaEncoder | None = None, decode_options: DecodeOptions | None = None,
                 chat: ChatRenderer | None = None) -> None:
        self.tokenize = tokenize
        self.chat = chat or ChatRenderer()  # no tokenizer: the role-prefix form (the StandardMock)
        self.limits = limits
        self.adapter_names = adapter_names  # live: adapters load and unload at run time
        self.mm_encoder = mm_encoder
        self.modalities = frozenset(mm_encoder.modalities) if mm_encoder is not None else frozenset()
        self.decode_options = decode_options  # None: the media layer's defaults
        self.sessions: SessionLookup | None = None  # the engine's kept sessions (from_facts sets it)
        self.text_bound: TextBound | None = None  # bounds tokenization of long texts (from_facts sets it)
        self.grammars: Any = None  # the engine's structured.compiler.GrammarCompiler (from_facts sets it)

    @classmethod
    def from_facts(cls, facts: InputFacts) -> "InputProcessor":
        """Built by the serving core from what an engine client tells it (``EngineClient.input_facts``): its
        tokenizer, limits, vocabulary, media encoder, adapters and kept sessions. The engine never builds it."""
        limits = InputLimits.of(effective_max_input_len=facts.max_input_len, pool_tokens=facts.pool_tokens,
                                truncation=facts.truncation, vocab_size=facts.vocab_size)
        enc, decode = facts.mm_encoder, None
        if enc is not None:
            from multimodal import DecodeOptions  # the decoders load only with a media model, not with the protocol

            decode = DecodeOptions(num_video_frames=facts.video_frames,
                                   audio_sampling_rate=enc.sampling_rate or 16000,
                                   resize_shortest_edge=_shortest_edge(enc))
        chat = ChatRenderer(facts.tokenizer) if facts.chat_prefixes is None else \
            ChatRenderer(facts.tokenizer, facts.chat_prefixes)
        proc = cls(facts.tokenize, limits, adapter_names=facts.adapter_names, mm_encoder=enc,
                   decode_options=decode, chat=chat)
        proc.sessions = facts.sessions
        proc.grammars = facts.grammars
        if facts.tokenizer is not None:
            proc.text_bound = TextBound.of(facts.tokenizer, proc.tokenize)
        return proc

    # ------------------------------------------------------------ stages
    def validate(self, prompt: Prompt, params: SamplingParams, truncate: int | None = None) -> SamplingParams:
        """The checks that need neither the tokenizer nor I/O (run before any media is fetched). Returns
        ``params`` with the adapter resolved: the base model's name ("None") becomes None."""
        if isinstance(prompt, ChatPrompt):
            self._check_media_kinds(prompt)
        if isinstance(prompt, PartsPrompt):
            self._check_media_kinds(prompt)
            check(truncate is None, "truncate", "absent for inputs holding media (it would cut placeholders)",
                  truncate)
        name = check_adapter_id(params.adapter_id, self.adapter_names())
        return params if name == params.adapter_id else dataclasses.replace(params, adapter_id=name)

    def _check_media_kinds(self, prompt: PartsPrompt | ChatPrompt) -> None:
        takes = ", ".join(sorted(self.modalities)) or "text only"
        if isinstance(prompt, ChatPrompt):
            parts: tuple[Any, ...] = tuple(p for m in prompt.messages if not isinstance(m.content, str)
                                           for p in m.content if not isinstance(p, str))
            if not parts:
                return  # text-only chat: any model takes it
        else:
            parts = prompt.parts
        for position, part in enumerate(parts):
            kind, index, shown = _part_kind(part, position)
            if kind == "text" or not isinstance(kind, str):
                continue  # unknown types are the model's processor's to name
            if ("image" if kind == "video" else kind) not in self.modalities:
                raise ValidationError(f"Parameter inputs[{index}] must be a media type this model takes ({takes}); "
                                      f"it takes no {kind} input, got {shown}")
        if self.mm_encoder is None:
            raise ValidationError("Parameter inputs must be a string or token ids (this model takes no media), "
                                  "got a list of parts")

    def _prompt_ids(self, prompt: Prompt, truncate: int | None = None) -> tuple[list[int], Any, tuple[str, ...]]:
        """(ids, media inputs, media hashes) before the length rule."""
        if isinstance(prompt, TextPrompt):  # tokenizes no more than the length rule can keep
            lim = self.limits
            keep = min(truncate or lim.max_input_len, lim.max_input_len) if lim.truncation else truncate
            return tokenize_bounded(self.tokenize, prompt.text, self.text_bound, keep=keep,
                                    limit=lim.max_input_len), None, ()
        if isinstance(prompt, TokensPrompt):
            return list(prompt.token_ids), None, ()
        if isinstance(prompt, ChatPrompt):  # bounded before rendering, as a text prompt is (chat.py)
            lim = self.limits
            if self.mm_encoder is None:
                keep = min(truncate or lim.max_input_len, lim.max_input_len) if lim.truncation else truncate
                return self.chat.encode(prompt.messages, self.tokenize, bound=self.text_bound, keep=keep,
                                        limit=lim.max_input_len, tools=prompt.tools, fmt=prompt.tool_format,
                                        template_kwargs=prompt.template_kwargs), None, ()
            check(not prompt.template_kwargs, "chat_template_kwargs", "absent for a multimodal model (its processor "
                  "renders the chat)", dict(prompt.template_kwargs))
            check_chat_chars(prompt.messages, self.text_bound, lim.max_input_len)  # a media prompt is never cut
            return self._media_ids(self.mm_encoder.prepare_chat(
                [(m.role, m.content if isinstance(m.content, str) else
                  [{"type": "text", "text": p} if isinstance(p, str) else p for p in m.content])
                 for m in prompt.messages]))
        assert self.mm_encoder is not None  # validate() refused media for text-only models
        if any(isinstance(p, MediaItem) for p in prompt.parts):
            raise TypeError("media references must be loaded first (InputProcessor.process_async)")
        return self._media_ids(self.mm_encoder.prepare(prompt.parts))

    @staticmethod
    def _media_ids(mp: Any) -> tuple[list[int], Any, tuple[str, ...]]:
        return list(mp.prompt_token_ids), mp.mm_inputs, tuple(mp.mm_hashes)

    def _check_ids(self, ids: tuple[int, ...], mm_inputs: Any) -> None:
        vocab = self.limits.vocab_size
        bad = [i for i in ids if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab)]
        check(not bad, "inputs", f"token ids in [0, {vocab})", bad[:3])
        if self.mm_encoder is not None:  # placeholders typed as text, or without their media, are refused
            self.mm_encoder.check_prompt(list(ids), mm_inputs)

    # ------------------------------------------------------------ entry points
    def check_structured(self, spec: StructuredSpec) -> None:
        """Compile ``spec`` (cached; CPU work: off the IO loop): a bad grammar is a ValidationError naming
        ``spec.where`` and llguidance's reason, as is a model without a tokenizer for structured output."""
        check(self.grammars is not None, spec.where, "absent (this model has no tokenizer for structured "
              "output)", spec.kind)
        self.grammars.compile(spec)

    def process(self, prompt: Prompt, params: SamplingParams, *, request_id: str,
                truncate: int | None = None, session_id: str | None = None) -> EngineRequest:
        """The whole path, synchronously (CPU work: run it off the IO loop). ValidationError on bad input.
        ``session_id`` (the /api/* routes' request_id): when the engine keeps a finished session under it, the
        prompt is ignored and the session's tokens (prompt + all it generated) are the prompt (continuation)."""
        params = self.validate(prompt, params, truncate)
        if params.structured_outputs is not None:
            self.check_structured(params.structured_outputs)
        kept = self.sessions.tokens(session_id) if self.sessions is not None and session_id is not None else None
        if kept is not None:
            raw, mm_inputs, mm_hashes = list(kept), None, ()
        else:
            raw, mm_inputs, mm_hashes = self._prompt_ids(prompt, truncate)
        ids = fit_prompt(raw, truncate, self.limits, media=mm_inputs is not None,
                         field="messages" if isinstance(prompt, ChatPrompt) else "inputs")
        check(len(ids) > 0, "inputs", "at least one token after tokenization", len(ids))
        self._check_ids(ids, mm_inputs)
        if mm_hashes:
            logger.debug("%s: %d prompt tokens, %d media items", request_id, len(ids), len(mm_hashes))
        return EngineRequest(request_id, ids, params, mm_inputs=mm_inputs, mm_hashes=mm_hashes,
                             session_id=session_id if self.sessions is not None else None,
                             continued=kept is not None)

    async def process_async(self, prompt: Prompt, params: SamplingParams, *, request_id: str,
                            truncate: int | None, executor: Executor,
                            media_policy: MediaPolicy | None = None,
                            session_id: str | None = None, media_executor: Executor | None = None) -> EngineRequest:
        """The HTTP path: media references are fetched (guarded by ``media_policy``) and decoded in
        ``media_executor`` (default ``executor``: a pool of its own keeps text requests from queueing behind
        image decodes); everything else runs in ``executor``, never on the IO loop."""
        media_pool = media_executor or executor
        if isinstance(prompt, PartsPrompt) and any(isinstance(p, MediaItem) for p in prompt.parts):
            from multimodal import load_media

            self.validate(prompt, params, truncate)  # refuse before fetching anything
            loaded = await load_media(list(prompt.parts), media_policy or MediaPolicy(), media_pool,
                                      self.decode_options)
            prompt = PartsPrompt(tuple(loaded), prompt.text)
        elif isinstance(prompt, ChatPrompt) and self._chat_media(prompt):
            prompt = await self._load_chat_media(prompt, params, truncate, media_policy, media_pool)
        run = functools.partial(self.process, prompt, params, request_id=request_id, truncate=truncate,
                                session_id=session_id)
        return await asyncio.get_running_loop().run_in_executor(executor, run)

    @staticmethod
    def _chat_media(prompt: ChatPrompt) -> list[Any]:
        return [p for m in prompt.messages if not isinstance(m.content, str) for p in m.content
                if isinstance(p, MediaItem)]

    async def _load_chat_media(self, prompt: ChatPrompt, params: SamplingParams, truncate: int | None,
                               media_policy: MediaPolicy | None, executor: Executor) -> ChatPrompt:
        """Fetch and decode every message's media references (one guarded load for the whole request)."""
        from multimodal import load_media

        self.validate(prompt, params, truncate)  # refuse before fetching anything
        items = self._chat_media(prompt)
        loaded = iter(await load_media(items, media_policy or MediaPolicy(), executor, self.decode_options))
        return ChatPrompt(tuple(
            m if isinstance(m.content, str) else
            ChatMessage(m.role, tuple(next(loaded) if isinstance(p, MediaItem) else p for p in m.content))
            for m in prompt.messages))
