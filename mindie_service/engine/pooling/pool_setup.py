"""What an engine serves (its tasks) and its pooling room, from the checkpoint and the config (``task``,
``pooling``). Built by the async facade and the offline ``LLM`` from the engine's parts, never the engine."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.contract import PoolRequest
from mindie_service.engine.kv.block_manager import BlockManager
from mindie_service.engine.pooling.pool_batch import HiddenFn, PoolBatcher
from mindie_service.errors import ValidationError
from mindie_service.engine.contract import check_task
from mindie_service.models.pooling_spec import PoolingSpec, checkpoint_tasks, read_pooling, served_tasks

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pooling:
    tasks: frozenset[str]  # of "generate", "embed", "score"
    spec: PoolingSpec
    width: int  # an embedding's dimensions (the hidden size)
    batcher: PoolBatcher | None  # None where the engine pools nothing


def setup_pooling(cfg: EngineConfig, architecture: str, hf_config: Any, multimodal: bool, parallel: bool,
                  blocks: BlockManager, hidden: HiddenFn | None, head: Callable[[torch.Tensor], torch.Tensor],
                  width: int) -> Pooling:
    """``hidden`` None: the runner cannot pool (a tensor-parallel one): the checkpoint then only generates."""
    folder = Path(cfg.model) if Path(cfg.model).is_dir() else None
    possible = checkpoint_tasks(architecture, folder, multimodal)
    if parallel or hidden is None:
        if cfg.task in ("embed", "score"):
            raise ValueError(f"Parameter task {cfg.task!r} needs worldSize 1 (pooling runs on one device)")
        if possible - {"generate"}:
            logger.info("%s: %s not served with worldSize > 1 (pooling runs on one device)", cfg.model_name or cfg.model,
                        " and ".join(sorted(possible - {"generate"})))
        possible = possible & {"generate"}
    tasks = served_tasks(possible, cfg.task)
    override = dict(cfg.pooling)
    spec = read_pooling(folder, hf_config, override) if "embed" in tasks else PoolingSpec()
    if "score" in tasks and int(getattr(hf_config, "num_labels", 1)) != 1:
        raise ValueError(f"Parameter model must be a one-label sequence classifier to serve scores, got num_labels "
                         f"{getattr(hf_config, 'num_labels', None)}")
    if "embed" in tasks:
        logger.info("embeddings: %s pooling, %s (%s)", spec.method, "normalised" if spec.normalize else "not normalised",
                    spec.source)
    batcher = None
    if tasks & {"embed", "score"} and hidden is not None:
        batcher = PoolBatcher(blocks, hidden, head, spec, cfg.max_prefill_tokens)
    return Pooling(tasks, spec, width, batcher)


def check_pool_request(p: Pooling, req: PoolRequest, model: str) -> None:
    check_task(p.tasks, req.task, model)
    if req.dimensions is not None:
        why = p.spec.check_dimensions(req.dimensions, p.width)
        if why is not None:
            raise ValidationError(why)

