"""A worker rank (1 .. worldSize-1): load its shard, then run every step rank 0 sends.

The worker owns no scheduler, sampler or tokenizer work: each message holds the step's plain-data
SchedulerOutput (engine/step.py) and the worker runs its own ModelRunner on it, so KV swaps and
media placeholders happen on every rank as they do on rank 0. Its LoRA pool mirrors rank 0's:
adapters are loaded and unloaded in the order rank 0 sent them, and each step names the adapter in
every pool slot it uses. The media encoder is replicated (each rank embeds the step's media itself:
simpler than broadcasting embeddings, and the inputs are in the step already).

A worker ends on a stop message, or when rank 0 is gone (its socket closes, failing the next
receive), so killing the server never leaves ranks behind."""
from __future__ import annotations

import logging
import os
from typing import Any

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.engine_parts import load_parts
from mindie_service.engine.runner.parallel.comm import Dist, StepMessage, init
from mindie_service.engine.runner.model_runner import ModelRunner
from mindie_service.errors import EngineDeadError
from mindie_service.lora.manager import LoraManager
from npu_ops.device import select_device

logger = logging.getLogger(__name__)


def spawn_entry(cfg: EngineConfig, rank: int, addr: str, port: int, log_level: int) -> None:
    """The target of a process rank 0 spawns (torch.multiprocessing, spawn start method)."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run_worker(cfg, rank, addr, port)


def run_worker(cfg: EngineConfig, rank: int, addr: str, port: int) -> None:
    d = init(rank, cfg.world_size, select_device(cfg.device).type, addr, port)
    try:
        Worker(cfg, d).loop()
    finally:
        d.close()


class Worker:
    def __init__(self, cfg: EngineConfig, d: Dist) -> None:
        self.d = d
        problem: str | None = None
        try:
            parts = load_parts(cfg, (d.rank, d.world, d.all_reduce))
        except Exception as exc:  # noqa: BLE001 - reported to rank 0, which refuses to start
            logger.exception("rank %d failed to load", d.rank)
            problem = f"{type(exc).__name__}: {exc}"
        # Rank 0's sizes: the block size too, since a slot id means block x size + offset on every rank.
        num_blocks, host_blocks, block_size = d.handshake(problem, None)
        loaded = parts.loaded
        self.lora = LoraManager(loaded.model, cfg.max_loras, cfg.max_lora_rank, parts.device_info.torch_device,
                                loaded.dtype, [(m.name, m.path) for m in cfg.lora_modules], reserved=(cfg.model_name,))
        enc = loaded.encoder
        self.runner = ModelRunner(loaded.model, num_blocks, block_size, parts.device_info.torch_device,
                                  loaded.dtype, lora_hook=self.lora.step_applier,
                                  embeds_hook=enc.embeds_hook if enc else None, host_blocks=host_blocks)
        logger.info("rank %d ready: %d KV blocks", d.rank, num_blocks)

    def loop(self) -> None:
        while True:
            try:
                msg = self.d.recv()
            except Exception as exc:  # noqa: BLE001 - rank 0 is gone: nothing left to serve
                logger.warning("rank %d: rank 0 is gone (%s); exiting", self.d.rank, exc)
                return
            for control in msg.controls:
                self._control(control)
            if msg.stop:
                logger.info("rank %d: stopping", self.d.rank)
                return
            if msg.out is not None:
                self._step(msg)

    def _control(self, control: tuple[Any, ...]) -> None:
        kind = control[0]
        try:
            if kind == "lora_load":
                self.lora.load(control[1], control[2])
            elif kind == "lora_unload":
                self.lora.unload(control[1])
            else:
                logger.error("rank %d: unknown control %r", self.d.rank, kind)
        except Exception:  # noqa: BLE001 - rank 0 checked it first; a later step using it fails alone
            logger.exception("rank %d: %s failed", self.d.rank, kind)

    def _step(self, msg: StepMessage) -> None:
        assert msg.out is not None
        pool = self.lora.pool
        for slot, name in msg.lora_slots:
            adapter = self.lora.registry.get(name)
            if pool is not None and adapter is not None:
                pool.place(slot, adapter)
        # A failure that is not a lost rank happened on rank 0 too (same inputs, same code): rank 0 re-runs
        # the requests one at a time, and so does this loop, message by message.
        try:
            if msg.out.empty:  # only KV swaps this step (engine.kv.swap)
                self.runner.apply_swaps(msg.out)
            else:
                self.runner.execute(msg.out)
        except EngineDeadError:
            raise
        except Exception as exc:  # noqa: BLE001
            logger.warning("rank %d: step failed (%s)", self.d.rank, exc)
