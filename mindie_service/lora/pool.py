"""The stacked adapter pool (S-LoRA / Punica layout) with LRU residency and pin counts.

Per layer the pool holds, for each packed module, ``A [slots, subs x rank, in]`` (a slot packs its
sub-projections' A rows one after another: q, k, v share the input, so one shrink matmul serves
all three) and, for each checkpoint sub-module, ``B [slots, rank, out_sub]`` (each expand writes
only its own slice of the packed output; a block-diagonal B over the packed output would read a
third zeros for q/k/v, and decode on CPU is bound by memory traffic). Scaling is folded into B.
Slot 0 is the base model and stays empty. ``rank`` grows to the largest resident adapter's rank, up to
maxLoraRank, so a pool of rank-8 adapters does not pay for rank 64.

Residency: at most ``num_slots`` adapters; acquiring one that is not resident takes a free slot or
evicts the least recently used adapter with no pins. Pins count the running sequences that use a
slot; a pinned adapter is never evicted. Not thread-safe: the LoRA manager serialises access."""
from __future__ import annotations

import logging
from collections import OrderedDict

import torch
from torch import nn

from mindie_service.lora.adapter import TARGETS, LoraAdapter, target_shapes

logger = logging.getLogger(__name__)

# our module -> its checkpoint sub-modules, in output order
SUBS: dict[str, list[str]] = {}
for _sub, (_, _module, _) in TARGETS.items():
    SUBS.setdefault(_module, []).append(_sub)

# Per (layer, module) of a slot: A [w, in] over the slot's used width, and per present sub-module
# (first row in xa, last row, first output column, last column, B [r, out_sub]). Views into the pool.
Expand = tuple[int, int, int, int, torch.Tensor]
Entry = tuple[torch.Tensor, tuple[Expand, ...]]


class AdapterPool:
    def __init__(self, model: nn.Module, num_slots: int, device: torch.device, dtype: torch.dtype) -> None:
        self.shapes = target_shapes(model)
        self.layers = len(model.layers)
        self.num_slots, self.device, self.dtype = num_slots, device, dtype
        self.dims = {m: (self.shapes[subs[0]].in_features, sum(self.shapes[s].out_features for s in subs))
                     for m, subs in SUBS.items()}
        self.rank = 0
        self.A: list[dict[str, torch.Tensor]] = []  # [layer][module] -> [slots + 1, subs x rank, in]
        self.B: list[dict[str, torch.Tensor]] = []  # [layer][sub-module] -> [slots + 1, rank, out_sub]
        # entries[slot][(layer, module)]: what the applier reads; empty for slot 0 and untargeted modules.
        self.entries: list[dict[tuple[int, str], Entry]] = [{} for _ in range(num_slots + 1)]
        self.resident: list[LoraAdapter | None] = [None] * (num_slots + 1)
        self.pins = [0] * (num_slots + 1)
        self.lru: OrderedDict[int, None] = OrderedDict()  # occupied slots, least recently used first
        self.pending: dict[int, LoraAdapter] = {}  # slots claimed but not yet written (flush_writes)
        self.loads = 0
        self.evictions = 0

    # ------------------------------------------------------------ residency
    def acquire(self, adapter: LoraAdapter) -> bool:
        """Pin ``adapter`` in a slot (loading it, maybe evicting an idle one); False when every slot is pinned."""
        slot = adapter.slot
        if slot == 0:
            slot = self._free_slot()
            if slot == 0:
                return False
            self._claim(slot, adapter)
        self.pins[slot] += 1
        self.lru.move_to_end(slot)
        return True

    def release(self, adapter: LoraAdapter) -> None:
        if adapter.slot and self.pins[adapter.slot] > 0:
            self.pins[adapter.slot] -= 1

    def drop(self, adapter: LoraAdapter) -> None:
        """Forget an unpinned adapter (unload). The slot's tensors stay until the next write."""
        slot = adapter.slot
        if slot:
            assert self.pins[slot] == 0, "dropping a pinned adapter"
            self.resident[slot] = None
            self.lru.pop(slot, None)
            adapter.slot = 0

    def place(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` in exactly ``slot`` (written by the next ``flush_writes``): a tensor-parallel
        worker mirrors the residency rank 0's pool chose. No pins: the worker never schedules."""
        if self.resident[slot] is adapter:
            return
        if adapter.slot:
            self.resident[adapter.slot] = None
            self.lru.pop(adapter.slot, None)
            self.entries[adapter.slot] = {}
        victim = self.resident[slot]
        if victim is not None:
            victim.slot = 0
        self._claim(slot, adapter)

    def _free_slot(self) -> int:
        for slot in range(1, self.num_slots + 1):
            if self.resident[slot] is None:
                return slot
        for slot in self.lru:
            if self.pins[slot] == 0:
                victim = self.resident[slot]
                assert victim is not None
                logger.info("evicting LoRA adapter %r from slot %d", victim.name, slot)
                victim.slot = 0
                self.resident[slot] = None
                self.evictions += 1
                return slot
        return 0

    # ------------------------------------------------------------ tensors
    def _grow(self, rank: int) -> None:
        old_a, old_b, old_rank = self.A, self.B, self.rank
        self.A, self.B, self.rank = [], [], rank
        kw = {"device": self.device, "dtype": self.dtype}
        for layer in range(self.layers):
            a_layer, b_layer = {}, {}
            for m, (d_in, _) in self.dims.items():
                a_layer[m] = torch.zeros(self.num_slots + 1, len(SUBS[m]) * rank, d_in, **kw)
                if old_rank:
                    a_layer[m][:, :len(SUBS[m]) * old_rank].copy_(old_a[layer][m])
            for sub, shape in self.shapes.items():
                b_layer[sub] = torch.zeros(self.num_slots + 1, rank, shape.out_features, **kw)
                if old_rank:
                    b_layer[sub][:, :old_rank].copy_(old_b[layer][sub])
            self.A.append(a_layer)
            self.B.append(b_layer)
        for slot, adapter in enumerate(self.resident):  # re-point every view at the new tensors
            if adapter is not None and slot not in self.pending:
                self.entries[slot] = self._views(slot, adapter)
        logger.info("LoRA pool: %d slots of rank %d", self.num_slots, rank)

    def _views(self, slot: int, adapter: LoraAdapter) -> dict[tuple[int, str], Entry]:
        entries: dict[tuple[int, str], Entry] = {}
        for layer in range(self.layers):
            for m, subs in SUBS.items():
                expands: list[Expand] = []
                row = 0
                for s in subs:
                    if (layer, s) in adapter.weights:
                        r, shape = adapter.weights[(layer, s)][0].shape[0], self.shapes[s]
                        expands.append((row, row + r, shape.offset, shape.offset + shape.out_features,
                                        self.B[layer][s][slot, :r]))
                        row += r
                if expands:
                    entries[(layer, m)] = (self.A[layer][m][slot, :row], tuple(expands))
        return entries

    def _claim(self, slot: int, adapter: LoraAdapter) -> None:
        """Give ``adapter`` the slot now (bookkeeping only); its tensors are written by ``flush_writes``."""
        self.resident[slot] = adapter
        adapter.slot = slot
        self.lru[slot] = None
        self.pending[slot] = adapter
        self.entries[slot] = {}

    def flush_writes(self) -> None:
        """Write the adapters given a slot since the last call (the runner calls this before a forward)."""
        for slot, adapter in list(self.pending.items()):
            if self.resident[slot] is adapter:
                self._write(slot, adapter)
        self.pending.clear()

    @torch.inference_mode()
    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        if adapter.rank > self.rank:
            self._grow(adapter.rank)
        for layer in range(self.layers):
            for m, subs in SUBS.items():
                row = 0
                for s in subs:
                    if (layer, s) in adapter.weights:
                        a, b = adapter.weights[(layer, s)]
                        self.A[layer][m][slot, row:row + a.shape[0]].copy_(a)
                        self.B[layer][s][slot, :a.shape[0]].copy_(b.T)
                        row += a.shape[0]
        self.entries[slot] = self._views(slot, adapter)
        self.loads += 1
