"""What an inference gateway reads of one server (its model-server protocol), summed over model instances.

The Gateway API Inference Extension's endpoint picker (and llm-d's, built on it) scrapes each pod as
one endpoint: its queue, running requests, KV-cache utilisation, LoRA adapters running and waiting and
the adapter slots, and the cache's shape (block size, blocks). ``gateway_state(client)`` reads these
from an engine client: a lone engine (``AsyncEngine``: its ``engine``), model instances
(``InstanceRouter``: its ``engines``), or an engine without a step (the StandardMock: only its stats).

The adapters are read from the scheduler's queues off the engine thread: a copy is retried when the
engine changed a queue while it was being read (a scrape never waits for a step)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from mindie_service.sampling_params import is_base_adapter

_COPY_TRIES = 5


@dataclass(frozen=True)
class GatewayState:
    running: int
    waiting: int  # waiting to be scheduled, and preempted waiting to resume (swapped)
    kv_cache_usage: float  # 0..1 over every instance's blocks
    running_adapters: tuple[str, ...]
    waiting_adapters: tuple[str, ...]
    max_lora: int  # adapter slots of one instance (the bound a new adapter meets)
    block_size: int
    num_gpu_blocks: int  # every instance's KV pool
    num_cpu_blocks: int  # host pool for swapped-out K/V
    cache_dtype: str
    enable_prefix_caching: bool
    kv_events_published: int = 0
    kv_events_dropped: int = 0


def _steps(client: Any) -> list[Any]:
    """Each instance's ``LLMEngine`` (None for an engine without one)."""
    return [getattr(e, "engine", None) for e in getattr(client, "engines", [client])]


def _adapters(seqs: Iterable[Any]) -> set[str]:
    for _ in range(_COPY_TRIES):
        try:
            return {s.params.adapter_id for s in list(seqs) if not is_base_adapter(s.params.adapter_id)}
        except RuntimeError:  # changed while copied: read again
            continue
    return set()


def gateway_state(client: Any) -> GatewayState:
    st = client.stats()
    running: set[str] = set()
    waiting: set[str] = set()
    cpu_blocks = published = dropped = 0
    max_lora, block_size, dtype, prefix = 0, 0, "auto", False
    for llm in _steps(client):
        if llm is None:
            continue
        s, cfg = llm.scheduler, llm.cfg
        running |= _adapters(s.running)
        waiting |= _adapters(s.waiting) | _adapters(s.swapped)
        cpu_blocks += getattr(getattr(s, "host", None), "num_blocks", 0)
        max_lora, block_size, dtype, prefix = cfg.max_loras, cfg.cache_block_size, cfg.kv_cache_dtype, \
            cfg.enable_prefix_caching
        if llm.kv_events is not None:
            ks = llm.kv_events.stats()
            published, dropped = published + ks.published_batches, dropped + ks.dropped_batches
    cfg = getattr(client, "config", None)
    if block_size == 0 and cfg is not None:  # no step to read (the StandardMock): its config
        max_lora, block_size = getattr(cfg, "max_loras", 0), getattr(cfg, "cache_block_size", 0)
        prefix = getattr(cfg, "enable_prefix_caching", False)
    return GatewayState(running=st.running, waiting=st.waiting + st.swapped, kv_cache_usage=float(st.cache_usage),
                        running_adapters=tuple(sorted(running)), waiting_adapters=tuple(sorted(waiting)),
                        max_lora=max_lora, block_size=block_size, num_gpu_blocks=st.total_blocks,
                        num_cpu_blocks=cpu_blocks, cache_dtype=dtype, enable_prefix_caching=prefix,
                        kv_events_published=published, kv_events_dropped=dropped)
