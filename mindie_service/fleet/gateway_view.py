"""What an inference gateway reads of one server (its model-server protocol), summed over model instances.

The Gateway API Inference Extension's endpoint picker (and llm-d's, built on it) scrapes each pod as
one endpoint: its queue, running requests, KV-cache utilisation, LoRA adapters running and waiting and
the adapter slots, and the cache's shape (block size, blocks). ``gateway_state(client)`` reads all of it
from the ``EngineStats`` the client produces: it never reaches into an engine."""
from __future__ import annotations

from dataclasses import dataclass

from mindie_service.engine.client import EngineClient


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


def gateway_state(client: EngineClient) -> GatewayState:
    """``client``'s stats (an engine, instances summed by fleet.instances.sum_stats, or the StandardMock's)."""
    st = client.stats()
    return GatewayState(running=st.running, waiting=st.waiting + st.swapped, kv_cache_usage=float(st.cache_usage),
                        running_adapters=st.running_adapters, waiting_adapters=st.waiting_adapters,
                        max_lora=st.max_loras, block_size=st.block_size, num_gpu_blocks=st.total_blocks,
                        num_cpu_blocks=st.host_blocks, cache_dtype=st.kv_cache_dtype,
                        enable_prefix_caching=st.prefix_caching, kv_events_published=st.kv_events_published,
                        kv_events_dropped=st.kv_events_dropped)
