"""Checks the mechanism behind verl's weight-sync copy (analytic/verl.py): FSDP1's SHARDED_STATE_DICT gives each rank
a copy of its chunk of every parameter, in fp32 under MixedPrecision(bf16), with its own storage (not a view of the
flat parameter), so ``module.state_dict()`` in ``FSDPVLLMShardingManager.__enter__`` holds one more copy of the
actor's fp32 shards until ``del params``.

Two CPU ranks over gloo (no GPU needed), a two-layer model wrapped as verl wraps the actor (``device_mesh``,
``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=fp32)``, FULL_SHARD).  Output on torch 2.13
(CPU): every local shard fp32, its storage exactly the chunk's elements (0.weight: 64 x 64 = 4,096 of 128 x 64),
"shares flat storage: False".

    PYTHONPATH=src python benchmarks/check_fsdp_sharded_state_dict.py
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _run(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardedStateDictConfig, StateDictType

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29518")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 64))
    fsdp = FSDP(model, device_mesh=mesh, device_id=torch.device("cpu"),
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                               buffer_dtype=torch.float32))
    FSDP.set_state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig())
    flat = {p.untyped_storage().data_ptr() for p in fsdp.parameters()}
    sd = fsdp.state_dict()
    if rank == 0:
        for name, value in sd.items():
            local = value.to_local()
            elems = local.untyped_storage().nbytes() // local.element_size()
            print(f"{name}: {type(value).__name__} {local.dtype} {tuple(local.shape)} storage {elems} elements, "
                  f"shares flat storage: {local.untyped_storage().data_ptr() in flat}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_run, nprocs=2)
