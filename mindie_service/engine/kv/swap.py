"""The host pool for swapped-out KV blocks (ModelConfig.cpuMemSize): which host blocks are free.

Plain Python, like the block manager: the scheduler decides swaps and writes them into the step's
plain data (SchedulerOutput.swap_out / swap_in as block-id pairs); the runner copies the blocks at
the start of its next execute (ModelRunner.apply_swaps), allocating the host tensor at the first
swap. A host block freed by a swap-in is handed out again only from the next step on, so a swap-out
scheduled in the same step never overwrites K/V that the step's swap-in still has to read."""
from __future__ import annotations

import logging

from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.sequence import Sequence
from mindie_service.engine.step import SchedulerOutput

logger = logging.getLogger(__name__)


def host_pool_blocks(cpu_mem_gb: float, bytes_per_block: int, max_useful: int) -> int:
    """Blocks of ``bytes_per_block`` in ``cpu_mem_gb`` GB, at most ``max_useful`` (more could never be
    filled: every swapped sequence fits in maxSeqLen tokens and at most maxBatchSize run at once)."""
    if cpu_mem_gb <= 0 or bytes_per_block <= 0:
        return 0
    return max(0, min(int(cpu_mem_gb * (1 << 30)) // bytes_per_block, max_useful))


class HostBlockPool:
    """Free-list allocator over ``num_blocks`` host blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._released: list[int] = []  # freed by this step's swap-ins: free from the next step on

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise ValueError(f"host pool: {n} blocks wanted, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        """Blocks nobody will read again (an aborted swapped sequence's)."""
        self._free.extend(blocks)

    def release_after_step(self, blocks: list[int]) -> None:
        """Blocks a swap-in of the step being scheduled still reads: free once that step has run."""
        self._released.extend(blocks)

    def step_done(self) -> None:
        """The previous step's copies have run (called as the next step is scheduled)."""
        if self._released:
            self._free.extend(self._released)
            self._released = []


def swap_out(blocks: BlockManager, host: HostBlockPool, seq: Sequence, out: SchedulerOutput) -> bool:
    """Copy ``seq``'s computed blocks to host blocks (pairs in ``out.swap_out``) and free its device blocks,
    keeping its computed-token count; False, changing nothing, when the host pool lacks room. Every computed
    block is copied, prefix-cache-shared ones too: whichever are still cached when it comes back are taken
    from the cache (``swap_in``), the others get new blocks and the host copies."""
    n = blocks.blocks_needed(seq.num_computed_tokens)
    if n == 0 or not host.can_allocate(n):
        return False
    seq.host_blocks = host.allocate(n)
    out.swap_out.extend(zip(seq.block_table[:n], seq.host_blocks))
    computed, cached = seq.num_computed_tokens, seq.num_cached_tokens
    blocks.free_seq(seq)
    seq.num_computed_tokens, seq.num_cached_tokens = computed, cached
    logger.debug("swapped out %s (%d blocks)", seq.request_id, n)
    return True


def swap_in(blocks: BlockManager, host: HostBlockPool, seq: Sequence, out: SchedulerOutput, reserve: int = 0) -> bool:
    """Device blocks for a swapped sequence's tokens (its next one included): its leading blocks still in the
    prefix cache as they are, new ones for the rest with the copies back (pairs in ``out.swap_in``). Its
    host blocks are free once this step has run. False, changing nothing, when the device pool lacks the
    blocks (``reserve``: its reservation with maxPreemptCount 0)."""
    cached = blocks.allocate_resumed(seq, blocks.blocks_needed(seq.num_tokens), reserve)
    if cached is None:
        return False
    out.swap_in.extend(zip(seq.host_blocks[cached:], seq.block_table[cached:]))
    host.release_after_step(seq.host_blocks)
    seq.host_blocks = []
    logger.debug("swapped in %s", seq.request_id)
    return True
