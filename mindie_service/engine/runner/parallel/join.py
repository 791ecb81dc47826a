"""``mindie-service worker``: a rank on another host joins a multi-node instance.

torch.distributed's env rendezvous: ``MASTER_ADDR`` (rank 0's host: the server's), ``MASTER_PORT``
(default: the config's multiNodesInferPort), ``WORLD_SIZE`` (must equal worldSize when set) and
``RANK`` (or ``--rank``). The worker is given the engine config the server's config.json yields for its
instance (the CLI loads it; modelWeightPath must name the checkpoint on this host) and serves until rank 0
stops or dies."""
from __future__ import annotations

import logging
import os

from mindie_service.engine.configs.engine_config import EngineConfig
from mindie_service.engine.runner.parallel.worker import run_worker
from mindie_service.errors import ConfigError

logger = logging.getLogger(__name__)


def join_instance(cfg: EngineConfig, rank: int | None, env: dict[str, str] | None = None) -> None:
    """Check the rendezvous settings against ``cfg`` (ConfigError naming each problem), then serve as ``rank``."""
    env = dict(os.environ) if env is None else env
    problems = []
    if not cfg.multi_node:
        problems.append("BackendConfig.multiNodesInferEnabled must be true for `mindie-service worker`")
    rank = rank if rank is not None else int(env.get("RANK", "-1"))
    if not 1 <= rank < cfg.world_size:
        problems.append(f"--rank (or RANK) must be in [1, {cfg.world_size - 1}] (worldSize {cfg.world_size}), "
                        f"got {rank}")
    if "WORLD_SIZE" in env and int(env["WORLD_SIZE"]) != cfg.world_size:
        problems.append(f"WORLD_SIZE must equal worldSize ({cfg.world_size}), got {env['WORLD_SIZE']}")
    addr = env.get("MASTER_ADDR")
    if not addr:
        problems.append("MASTER_ADDR must name rank 0's host (the server)")
    port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT") else cfg.dist_port
    if port is None:
        problems.append("MASTER_PORT (or BackendConfig.multiNodesInferPort) must give rank 0's rendezvous port")
    if problems:
        raise ConfigError(problems)
    logger.info("joining as rank %d of %d at %s:%s", rank, cfg.world_size, addr, port)
    run_worker(cfg, rank, str(addr), int(port))  # type: ignore[arg-type]
