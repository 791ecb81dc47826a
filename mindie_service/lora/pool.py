"""The stacked adapter pool (S-LoRA / Punica layout) with LRU residency and pin counts.

Per layer and per packed module the pool holds ``A [slots, width, in]`` and ``B [slots, width, out]``
with ``width = subs x rank``: a slot packs its sub-projections' A rows one after another (q, k, v
share the input, so one shrink matmul serves all three) and B is block-diagonal over the packed
output (sub i's rows write only its own output slice). Scaling is folded into B. Slot 0 is the
base model and stays empty. ``rank`` grows to the largest resident adapter's rank, up to
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

Pair = tuple[torch.Tensor, torch.Tensor]  # (A [w, in], B [w, out]) views into the pool


class AdapterPool:
    def __init__(self, model: nn.Module, num_slots: int, device: torch.device, dtype: torch.dtype) -> None:
        self.shapes = target_shapes(model)
        self.layers = len(model.layers)
        self.num_slots, self.device, self.dtype = num_slots, device, dtype
        self.dims = {m: (self.shapes[subs[0]].in_features, sum(self.shapes[s].out_features for s in subs))
                     for m, subs in SUBS.items()}
        self.rank = 0
        self.A: list[dict[str, torch.Tensor]] = []
        self.B: list[dict[str, torch.Tensor]] = []
        # entries[slot][(layer, module)] -> (A, B) views over the slot's used width; empty for slot 0.
        self.entries: list[dict[tuple[int, str], Pair]] = [{} for _ in range(num_slots + 1)]
        self.resident: list[LoraAdapter | None] = [None] * (num_slots + 1)
        self.pins = [0] * (num_slots + 1)
        self.lru: OrderedDict[int, None] = OrderedDict()  # occupied slots, least recently used first
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
            self._write(slot, adapter)
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
        for layer in range(self.layers):
            a_layer, b_layer = {}, {}
            for m, (d_in, d_out) in self.dims.items():
                width = len(SUBS[m]) * rank
                a_layer[m] = torch.zeros(self.num_slots + 1, width, d_in, device=self.device, dtype=self.dtype)
                b_layer[m] = torch.zeros(self.num_slots + 1, width, d_out, device=self.device, dtype=self.dtype)
                if old_rank:
                    old_w = len(SUBS[m]) * old_rank
                    a_layer[m][:, :old_w].copy_(old_a[layer][m])
                    b_layer[m][:, :old_w].copy_(old_b[layer][m])
            self.A.append(a_layer)
            self.B.append(b_layer)
        for slot, entries in enumerate(self.entries):  # re-point every view at the new tensors
            for (layer, m), (a, _) in list(entries.items()):
                w = a.shape[0]
                entries[(layer, m)] = (self.A[layer][m][slot, :w], self.B[layer][m][slot, :w])
        logger.info("LoRA pool: %d slots of rank %d", self.num_slots, rank)

    @torch.inference_mode()
    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        if adapter.rank > self.rank:
            self._grow(adapter.rank)
        entries: dict[tuple[int, str], Pair] = {}
        for layer in range(self.layers):
            for m, subs in SUBS.items():
                present = [(s, adapter.weights[(layer, s)]) for s in subs if (layer, s) in adapter.weights]
                if not present:
                    continue
                a_slot, b_slot = self.A[layer][m][slot], self.B[layer][m][slot]
                w = sum(a.shape[0] for _, (a, _) in present)
                b_slot[:w].zero_()
                row = 0
                for s, (a, b) in present:
                    r, shape = a.shape[0], self.shapes[s]
                    a_slot[row:row + r].copy_(a)
                    b_slot[row:row + r, shape.offset:shape.offset + shape.out_features].copy_(b.T)
                    row += r
                entries[(layer, m)] = (a_slot[:w], b_slot[:w])
        self.entries[slot] = entries
        self.resident[slot] = adapter
        adapter.slot = slot
        self.lru[slot] = None
        self.loads += 1
