"""torch.distributed for one engine instance: the process groups, the all-reduce the sharded model
calls, and the channel that carries rank 0's step messages to the workers.

Two groups, because they need opposite timeouts:
- ``ctrl`` (gloo, CPU byte tensors): step and control messages, the start-up handshake. Workers wait
  on it between requests, so its timeout is long (rank 0 pings an idle channel, see launcher.py);
- ``model`` (the device's backend: gloo, nccl or hccl; npu_ops.distributed): the forward's all-reduces.
  Ranks enter each one within milliseconds of each other, so a short timeout turns a hung rank into
  EngineDeadError promptly. A rank that dies closes its sockets, which fails a collective at once.

Messages are pickled: rank traffic belongs on a private network (torch.distributed's transports
carry no TLS and its own object collectives pickle too). One broadcast of a fixed buffer carries a
decode step's message; a larger one takes a second broadcast for the rest."""
from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mindie_service.engine.step import SchedulerOutput
from mindie_service.errors import EngineDeadError
from npu_ops.distributed import backend_for, new_group

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 900.0  # rendezvous, model loading on every rank, the longest idle gap (pings are 5 s)
COLLECTIVE_TIMEOUT_S = 10.0  # the longest one rank may wait for another inside a forward
BUFFER_BYTES = 16384  # one broadcast for messages up to this size (a decode step of ~100 requests)
_HEAD = 8


@dataclass
class StepMessage:
    """What rank 0 sends: control messages first (applied in order), then the step, if any. A message
    with neither is a ping; ``stop`` ends the worker."""

    out: SchedulerOutput | None = None
    lora_slots: tuple[tuple[int, str], ...] = ()  # (pool slot, adapter name) of the slots the step uses
    controls: tuple[tuple[Any, ...], ...] = ()  # ("lora_load", name, path) | ("lora_unload", name)
    stop: bool = False


@dataclass
class Dist:
    rank: int
    world: int
    store: Any  # the instance's TCPStore (rank 0 hosts it): rendezvous and start-up handshake
    ctrl: Any  # gloo ProcessGroup: step messages
    model: Any  # the device backend's ProcessGroup: the forward's all-reduces
    _buf: torch.Tensor = field(default_factory=lambda: torch.zeros(BUFFER_BYTES, dtype=torch.uint8))

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks in place (the row-parallel layers' reduce)."""
        try:
            self.model.allreduce([t]).wait()
        except Exception as exc:  # noqa: BLE001 - any transport failure means a rank is gone
            raise EngineDeadError(f"tensor-parallel all-reduce failed: a rank died or stopped answering ({exc})") \
                from exc
        return t

    def _bcast(self, t: torch.Tensor) -> None:
        self.ctrl.broadcast([t]).wait()  # root: rank 0

    # ------------------------------------------------------------ step channel
    def send(self, msg: StepMessage) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        buf = self._buf.numpy()
        first = min(len(data), BUFFER_BYTES - _HEAD)
        buf[:_HEAD] = np.frombuffer(len(data).to_bytes(_HEAD, "little"), dtype=np.uint8)
        buf[_HEAD:_HEAD + first] = np.frombuffer(data, dtype=np.uint8, count=first)
        self._bcast(self._buf)
        if len(data) > first:
            self._bcast(torch.frombuffer(bytearray(data[first:]), dtype=torch.uint8))

    def recv(self) -> StepMessage:
        self._bcast(self._buf)
        buf = self._buf.numpy()
        n = int.from_bytes(buf[:_HEAD].tobytes(), "little")
        first = min(n, BUFFER_BYTES - _HEAD)
        data = buf[_HEAD:_HEAD + first].tobytes()
        if n > first:
            rest = torch.empty(n - first, dtype=torch.uint8)
            self._bcast(rest)
            data += rest.numpy().tobytes()
        msg = pickle.loads(data)  # noqa: S301 - from rank 0 of this instance, over the private rank network
        if not isinstance(msg, StepMessage):
            raise RuntimeError(f"unexpected tensor-parallel message {type(msg).__name__}")
        return msg

    # ------------------------------------------------------------ start-up
    def handshake(self, problem: str | None, sizes: tuple[int, ...] | None) -> tuple[int, ...]:
        """Every rank says whether it loaded; rank 0 then gives the pool sizes (device KV blocks, host swap
        blocks) every rank allocates. Raises RuntimeError naming the ranks that failed (on every rank)."""
        self.store.set(f"status/{self.rank}", pickle.dumps(problem))
        if self.rank == 0:
            problems = [pickle.loads(self.store.get(f"status/{r}")) for r in range(self.world)]  # noqa: S301
            failed = [f"rank {r}: {p}" for r, p in enumerate(problems) if p]
            self.store.set("sizes", pickle.dumps(("failed", failed) if failed else ("ok", sizes)))
        kind, value = pickle.loads(self.store.get("sizes"))  # noqa: S301 - rank 0's answer
        if kind == "failed":
            raise RuntimeError("tensor-parallel start-up failed: " + "; ".join(value))
        return tuple(value)

    def close(self) -> None:
        for group in (self.model, self.ctrl):
            try:
                group.shutdown() if hasattr(group, "shutdown") else None
            except Exception:  # noqa: BLE001 - a peer already gone; nothing left to release
                logger.debug("process group shutdown failed", exc_info=True)


def init(rank: int, world: int, device_type: str, addr: str, port: int) -> Dist:
    """Join the instance's ranks: rank 0 hosts the rendezvous store on ``addr:port``. The groups are the
    instance's own (no torch.distributed default group), so engine instances in one process stay apart."""
    backend = backend_for(device_type)
    logger.info("rank %d/%d: joining the %s rendezvous at %s:%d", rank, world, backend, addr, port)
    store = dist.TCPStore(addr, port, world, rank == 0, timedelta(seconds=START_TIMEOUT_S))
    ctrl = dist.ProcessGroupGloo(dist.PrefixStore("ctrl/", store), rank, world, timedelta(seconds=START_TIMEOUT_S))
    model = new_group(backend, dist.PrefixStore("model/", store), rank, world,
                      timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return Dist(rank, world, store, ctrl, model)
