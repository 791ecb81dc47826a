"""LoRA adapters: PEFT folders read and validated (adapter), a stacked slot pool with LRU residency
(pool), the batched per-token applier the model calls (apply), the engine-facing registry
(manager) and a random demo adapter builder (demo)."""
from mindie_service.lora.adapter import LoraAdapter, read_adapter
from mindie_service.lora.manager import LoraManager

__all__ = ["LoraAdapter", "LoraManager", "read_adapter"]
