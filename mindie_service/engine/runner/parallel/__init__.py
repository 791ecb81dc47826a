"""Tensor parallelism over torch.distributed: rank 0 (the engine) broadcasts each step's plain data,
every rank runs its shard of the model (models/shard.py). comm: process groups and the step channel;
launcher: rank 0's side (spawning, the wrapped runner, the monitor); worker: ranks 1..; join: the
`mindie-service worker` command of multi-node instances."""
