"""Rank 0's side of tensor parallelism: start the worker ranks, wrap the runner, watch the ranks.

Single host: rank 0 (the engine's own process) spawns ranks 1 .. worldSize-1 with
torch.multiprocessing's spawn start method and hosts the rendezvous on a free local port. Multi-node
(``multi_node``): nothing is spawned; the other ranks run ``mindie-service worker --config ... --rank R``
and join through torch.distributed's env rendezvous on ``dist_port`` (multiNodesInferPort).

``ParallelRunner.execute(out)`` first sends the step to the workers, then runs rank 0's own shard; the
engine above it (scheduler, sampler, outputs) does not know the model is split. A rank that dies
fails the step with EngineDeadError: its closed sockets fail the next collective at once, a hung one
times out (comm.COLLECTIVE_TIMEOUT_S), and the monitor thread notices a dead process while idle."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

import torch.multiprocessing as mp

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.parallel.comm import Dist, StepMessage, init
from mindie_service.engine.runner.parallel.worker import spawn_entry
from mindie_service.engine.step import ModelOutput, SchedulerOutput
from mindie_service.errors import ConfigError, EngineDeadError
from mindie_service.lora.manager import LoraManager
from npu_ops.device import select_device

logger = logging.getLogger(__name__)

PING_S = 5.0  # an idle channel is pinged this often: workers' receives never reach the start-up timeout
MONITOR_S = 0.5
JOIN_S = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RankGroup:
    """The ranks of one engine instance, seen from rank 0."""

    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg, self.world = cfg, cfg.world_size
        # Rank 0 hosts the rendezvous store, which listens on every interface; it reaches it locally.
        addr = "127.0.0.1"
        port = cfg.dist_port or (int(os.environ["MASTER_PORT"]) if cfg.multi_node and os.environ.get("MASTER_PORT")
                                 else None)
        if port is None:
            if cfg.multi_node:
                raise ConfigError("BackendConfig.multiNodesInferPort (or env MASTER_PORT) must be set when "
                                  "multiNodesInferEnabled is true: the other hosts' ranks join on it")
            port = free_port()
        self.procs: list[Any] = []
        if cfg.multi_node:
            logger.info("waiting for %d worker rank(s) to join on port %d (mindie-service worker --rank R)",
                        self.world - 1, port)
        else:
            ctx = mp.get_context("spawn")
            for rank in range(1, self.world):
                p = ctx.Process(target=spawn_entry, args=(cfg, rank, addr, port, logging.getLogger().level),
                                name=f"mindie-rank{rank}", daemon=True)
                p.start()
                self.procs.append(p)
        self.dead: str | None = None
        self._lock = threading.Lock()  # one sender on the step channel (engine thread, monitor pings)
        self._controls: list[tuple[Any, ...]] = []
        self._last_send = time.monotonic()
        self._stop = threading.Event()
        try:
            self.dist: Dist = init(0, self.world, select_device(cfg.device).type, addr, port)
        except Exception:
            self._kill()
            raise
        self._monitor = threading.Thread(target=self._watch, name="tp-monitor", daemon=True)

    @property
    def shard(self) -> tuple[int, int, Callable[..., Any]]:
        return 0, self.world, self.dist.all_reduce

    def handshake(self, num_blocks: int, host_blocks: int) -> None:
        """After rank 0 loaded: fails if any rank did not, then gives every rank the pool sizes."""
        self.dist.handshake(None, (num_blocks, host_blocks, self.cfg.cache_block_size))
        self._monitor.start()

    def start_failed(self, exc: BaseException) -> None:
        """Rank 0 could not load: tell the workers (they wait in the handshake), then stop them."""
        try:
            self.dist.handshake(f"{type(exc).__name__}: {exc}", None)
        except Exception:  # noqa: BLE001 - the handshake raises by design here
            pass
        self.close()

    # ------------------------------------------------------------ messages
    def with_control(self, change: Callable[[], Any], message: tuple[Any, ...]) -> Any:
        """Run ``change`` on rank 0 (any thread) and, if it succeeds, queue ``message`` for the workers: both
        under the channel's lock, so no step that sees the change is sent before the message."""
        with self._lock:
            result = change()
            self._controls.append(message)
            return result

    def send(self, out: SchedulerOutput | None, lora_slots: tuple[tuple[int, str], ...] = (),
             stop: bool = False) -> None:
        with self._lock:
            self.check_alive()
            msg = StepMessage(out, lora_slots, tuple(self._controls), stop)
            self._controls.clear()
            try:
                self.dist.send(msg)
            except Exception as exc:  # noqa: BLE001 - a closed socket: a worker is gone
                # The socket can close before the dead worker is reaped: wait briefly to name the rank.
                self._mark_dead(self._exited_rank(wait_s=2.0)
                                or f"sending the step to the tensor-parallel ranks failed ({exc})")
                raise EngineDeadError(self.dead or "") from exc
            self._last_send = time.monotonic()

    def _exited_rank(self, wait_s: float) -> str | None:
        """Why the engine is dead when a worker process has exited (waiting up to ``wait_s`` for one)."""
        deadline = time.monotonic() + wait_s
        for rank, p in enumerate(self.procs, start=1):
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is not None:
                return f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
        return None

    def check_alive(self) -> None:
        if self.dead is None:
            for rank, p in enumerate(self.procs, start=1):
                if p.exitcode is not None:
                    self._mark_dead(f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.exitcode}")
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    def fail(self, why: str) -> None:
        """A collective failed: name the rank whose process ended if one did (it may take a moment to be
        reaped), else ``why``. Raises EngineDeadError."""
        deadline = time.monotonic() + 1.0
        while self.procs and all(p.exitcode is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            self.check_alive()
        finally:
            self._mark_dead(why)
        raise EngineDeadError(self.dead or why)

    def _mark_dead(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
            logger.critical("%s", why)

    def _watch(self) -> None:
        while not self._stop.wait(MONITOR_S):
            try:
                self.check_alive()
                if time.monotonic() - self._last_send >= PING_S:
                    self.send(None)
            except EngineDeadError:
                return

    # ------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stop the workers (a stop message, then terminate what is left) and leave the group."""
        self._stop.set()
        if self.dead is None:
            try:
                self.send(None, stop=True)
            except EngineDeadError:
                pass
        deadline = time.monotonic() + JOIN_S
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        self._kill()
        self.dist.close()

    def _kill(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
                p.join(timeout=5)


class ParallelRunner:
    """Rank 0's runner: each step goes to the workers, then through rank 0's own shard."""

    def __init__(self, runner: Any, ranks: RankGroup, lora: LoraManager) -> None:
        self.runner, self.ranks, self.lora = runner, ranks, lora

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        pool = self.lora.pool
        slots = sorted({c.adapter_slot for c in out.chunks if c.adapter_slot})
        names = tuple((s, a.name) for s in slots for a in [pool.resident[s] if pool else None] if a is not None)
        self.ranks.send(out, names)
        try:
            return self.runner.execute(out)
        except EngineDeadError as exc:
            self.ranks.fail(str(exc))
            raise

    def apply_swaps(self, out: SchedulerOutput) -> None:
        """A step with KV swaps but no forward: every rank copies its own shard's blocks."""
        self.ranks.send(out)
        self.runner.apply_swaps(out)

    def __getattr__(self, name: str) -> Any:  # kv_caches, host_blocks, ...: the wrapped runner's
        return getattr(self.runner, name)
