"""The engine client: what the server, the model catalog and batch jobs hold of an engine.

The real engine's async facade (engine.async_engine.AsyncEngine) and the StandardMock
(devkit.mock_engine.MockEngine) implement it; a tensor-parallel engine will too. The server reads
nothing else, so it never needs to probe an engine for what it has."""
from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, runtime_checkable

from mindie_service.engine.contract import EngineRequest, EngineStats, InputFacts, PoolRequest, PoolResult, TokenEvent


@runtime_checkable
class EngineClient(Protocol):
    # Model facts (fixed once the engine is built).
    model_name: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    device_type: str  # npu | cuda | cpu
    device_reason: str  # why that device (shown in /info)
    dtype: str  # e.g. "float32", without the "torch." prefix
    modalities: frozenset[str]  # media kinds the model takes ("image", "audio"); empty for text models
    # What loading did to each tensor kind of the checkpoint (a GGUF's ggml type -> "11 tensors: kept", ...;
    # models/loader.LoadedModel.weights_report); empty when loading changed nothing worth saying.
    weights_report: dict[str, str]
    # What the serving core builds this engine's input processor from (tokenizer, limits, media, adapters,
    # sessions); the engine itself never imports input processing.
    input_facts: InputFacts
    # What it serves: "generate", "embed", "score" (engine.contract.check_task words a refusal), and how it pools
    # embeddings (models/pooling_spec.PoolingSpec.to_json; empty where it does not embed).
    tasks: frozenset[str]
    pooling_info: dict[str, Any]

    # Lifecycle.
    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def healthy(self) -> bool: ...

    def stats(self) -> EngineStats: ...

    # Requests. Closing or cancelling the iterator aborts the request and frees its KV blocks; an engine
    # failure of this request alone raises GenerationError from the iterator.
    def generate(self, request: EngineRequest) -> AsyncIterator[TokenEvent]: ...

    def abort(self, request_id: str) -> None: ...

    # A prefill-only request (embeddings, scores): ValidationError when the model does not serve its task.
    async def pool(self, request: PoolRequest) -> PoolResult: ...

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: list[int]) -> str: ...  # special tokens kept: the text as the model saw it

    # LoRA adapters: ConflictError (409) name taken or in use, NotFoundError (404) unknown, ValidationError
    # (422) bad folder, or an engine without adapters.
    async def load_adapter(self, name: str, path: str) -> dict[str, Any]: ...

    def unload_adapter(self, name: str) -> None: ...

    def list_adapters(self) -> list[dict[str, Any]]: ...

    def adapter_names(self) -> list[str]: ...
