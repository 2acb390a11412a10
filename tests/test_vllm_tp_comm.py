"""vLLM's tensor-parallel communication buffers (facts/vllm_tp_comm.py; serve/vllm.py ``_tp_comm``, ``_charged``,
``_start_risk``): custom all-reduce, torch symmetric memory, NCCL's band, and whether they sit inside
gpu_memory_utilization (created after the memory snapshot, before 0.11.0) or outside it (0.11.0 on)."""

from __future__ import annotations

from typing import Any

from vramplan.catalog.resolve import resolve
from vramplan.facts.vllm_tp_comm import (
    COMM_OUTSIDE_FROM,
    custom_all_reduce_bytes,
    custom_all_reduce_on,
    nccl_high_bytes,
    symm_mem_bytes,
)
from vramplan.serve.vllm import decide

MiB = 1 << 20


def _doc(gpu: str, tp: int, version: str, **serve: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.1-8B-Instruct", "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp},
            "framework": "vllm", "parallel": {"tp": tp},
            "serve": {"vllm_version": version, "max_model_len": 4096, **serve}}


def test_custom_all_reduce_buffers() -> None:
    # meta 8 MiB (+ meta_size, not counted) + IPC buffer 8 MiB + rank_data 8 MiB = 25,165,824 B
    assert custom_all_reduce_bytes((0, 14, 0), 2, nvlink=False) == 25_165_824
    # from 0.28.0 the IPC buffer is max(8, 2, 16) MiB: 8 + 16 + 8 MiB = 33,554,432 B
    assert custom_all_reduce_bytes((0, 28, 0), 8, nvlink=True) == 33_554_432
    # above two GPUs only over NVLink; 3 GPUs is not a supported world size
    assert not custom_all_reduce_on(4, nvlink=False) and custom_all_reduce_on(4, nvlink=True)
    assert custom_all_reduce_bytes((0, 14, 0), 4, nvlink=False) == 0
    assert custom_all_reduce_bytes((0, 14, 0), 3, nvlink=True) == 0
    # symmetric memory on (0.11.0 on, 9.0, NVLink): max_size = min(256 KiB, 8 MiB) at 8 GPUs:
    # 262,144 + 262,144 + 8,388,608 = 8,912,896 B; at 2 GPUs min(64 MiB, 8 MiB) keeps 25,165,824 B
    assert custom_all_reduce_bytes((0, 14, 0), 8, nvlink=True, capability="9.0") == 8_912_896
    assert custom_all_reduce_bytes((0, 14, 0), 2, nvlink=True, capability="9.0") == 25_165_824
    # before 0.11.0 symmetric memory is off by default: 8 MiB
    assert custom_all_reduce_bytes((0, 10, 2), 8, nvlink=True, capability="9.0") == 25_165_824
    # 0.28.0: the IPC buffer is at least 16 MiB: 262,144 + 16,777,216 + 8,388,608 = 25,427,968 B
    assert custom_all_reduce_bytes((0, 28, 0), 8, nvlink=True, capability="9.0") == 25_427_968


def test_symmetric_memory_by_release_and_capability() -> None:
    assert symm_mem_bytes((0, 14, 0), 2, "9.0") == 64 * MiB  # 67,108,864 B
    assert symm_mem_bytes((0, 14, 0), 4, "9.0") == 32 * MiB
    assert symm_mem_bytes((0, 14, 0), 2, "10.0") == 8 * MiB
    assert symm_mem_bytes((0, 10, 2), 2, "9.0") == 0  # VLLM_ALLREDUCE_USE_SYMM_MEM default "0" before 0.11.0
    assert symm_mem_bytes((0, 14, 0), 2, "8.9") == 0  # no row for the L4
    assert symm_mem_bytes((0, 17, 0), 2, "10.3") == 0 and symm_mem_bytes((0, 19, 0), 2, "10.3") == 4 * MiB


def test_nccl_band_high_end() -> None:
    # 32 channels x 2 x (4,194,304 + 524,288 + 4,915,200) = 616,562,688 B over NVLink; without LL128 on PCIe:
    # 32 x 2 x 4,718,592 = 301,989,888 B
    assert nccl_high_bytes(nvlink=True) == 616_562_688
    assert nccl_high_bytes(nvlink=False) == 301_989_888


def test_h100_tp2_outside_the_budget_from_0_11() -> None:
    d = decide(resolve(_doc("H100-80GB", 2, "0.14")), "0.14")
    # custom all-reduce 25,165,824 + symmetric memory 67,108,864 = 92,274,688 B; the high end adds NCCL's
    # 616,562,688 - 134,217,728 (the 16-channel point) = 482,344,960 B
    assert d.tp_comm_bytes == 92_274_688
    assert d.tp_comm_bytes_high == 92_274_688 + 482_344_960
    assert d.tp_comm_outside_budget
    assert d.to_dict()["tp_comm_bytes"] == 92_274_688


def test_before_0_11_the_buffers_come_from_the_kv_budget() -> None:
    # 0.10.2 takes the snapshot before init_worker_distributed_environment: NCCL 134,217,728 B and the custom
    # all-reduce's cudaMalloc'd meta and IPC buffers 2 x 8 MiB = 16,777,216 B (L4: PCIe, tp 2, no symmetric memory)
    # are in the non-torch increase; its torch-allocated rank_data (8 MiB) is seen by neither term: outside
    assert COMM_OUTSIDE_FROM == (0, 11, 0)
    d = decide(resolve(_doc("L4", 2, "0.10.2")), "0.10.2")
    assert d.tp_comm_bytes == 25_165_824 and not d.tp_comm_outside_budget
    assert d.non_kv_bytes == (d.weights_bytes + d.activation_peak_bytes + d.non_torch_bytes + 134_217_728
                              + 16_777_216)


def test_tp1_has_no_comm_keys() -> None:
    d = decide(resolve(_doc("H100-80GB", 1, "0.14")), "0.14")
    assert d.tp_comm_bytes == 0 and "tp_comm_bytes" not in d.to_dict()


def test_nccl_high_end_makes_a_tight_start_a_may_not_start() -> None:
    # eager (no graphs), L4 at tp 2 under 0.14: what is left outside gpu_memory_utilization is total - requested -
    # context - NCCL - all-reduce buffers; a utilisation that leaves less than NCCL's extra high end
    # (301,989,888 - 134,217,728 = 167,772,160 B) beyond that gives "may not start", one that leaves more does not
    base = decide(resolve(_doc("L4", 2, "0.14", cuda_graphs=False)), "0.14")
    assert base.start_risk == ""
    fixed = base.cuda_context_bytes + base.nccl_bytes + base.tp_comm_bytes
    room_at = (lambda util: base.total_memory_bytes - int(base.total_memory_bytes * util) - fixed)
    tight = next(u / 1000 for u in range(990, 800, -1) if 0 < room_at(u / 1000) < 167_772_160)
    d = decide(resolve(_doc("L4", 2, "0.14", cuda_graphs=False, gpu_memory_utilization=tight)), "0.14")
    assert d.starts and d.may_not_start and "NCCL's buffers may take up to 0.16 GiB more" in d.start_risk


def test_free_memory_check_counts_the_buffers_from_0_11() -> None:
    # from 0.11.0 the snapshot follows the communicators: free at start = total - context - NCCL - all-reduce
    # buffers (L4, tp 2: 25,165,824 B); a utilisation of 0.99 asks for more than that
    d = decide(resolve(_doc("L4", 2, "0.14", gpu_memory_utilization=0.99)), "0.14")
    free = d.total_memory_bytes - d.cuda_context_bytes - d.nccl_bytes - 25_165_824
    without = free + 25_165_824
    assert f"{free / 2**30:.2f}" != f"{without / 2**30:.2f}"  # the check can tell them apart
    assert not d.starts and f"Free memory on device ({free / 2**30:.2f}/" in d.problem
