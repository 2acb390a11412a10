"""vLLM's tensor-parallel communication buffers by release, and where they sit against ``gpu_memory_utilization``.

Every row was read in vLLM's source as shipped in the release's wheel on PyPI (``pip download vllm==X --no-deps``);
``read_at`` lists the releases read.  ``serve/vllm.py`` ``_budget`` charges these bytes to each TP rank when
``parallel.tp > 1`` (docs/serving.md, "Tensor parallelism: the buffers outside the profile").

Where the buffers are created (``init_worker_distributed_environment`` -> ``CudaCommunicator.__init__``) against the
memory snapshot that ``gpu_memory_utilization`` is measured from:

* V0 (0.6.x-0.7.x, ``vllm/worker/worker.py`` ``Worker.init_device``) and V1 0.8.0-0.10.x
  (``vllm/v1/worker/gpu_worker.py`` ``Worker.init_device``: ``self.init_snapshot = MemorySnapshot()`` at line 163 of
  0.10.0, ``init_worker_distributed_environment(...)`` at line 181): the snapshot is taken first, so NCCL's and the
  all-reduce buffers appear in the profile's non-torch increase and are taken from the budget;
  V1's ``memory_profiling`` (0.9.1-0.10.x) counts the non-torch increase and the torch peak from after the
  weights load, so custom all-reduce's torch-allocated ``rank_data`` is seen by neither and stays outside; V0's
  (0.6.5-0.7.3 ``vllm/utils.py``: used - baseline - weights - the profile's torch change) counts it;
* from 0.11.0 (``gpu_worker.py`` 0.11.0 line 169 ``init_worker_distributed_environment``, line 182 the snapshot;
  0.14.0: "Initialize the distributed environment BEFORE taking memory snapshot", the same at 0.19.0, 0.24.0, 0.28.0,
  0.33.0): they are created first and sit outside the budget, like the CUDA context (``COMM_OUTSIDE_FROM``).

The buffers (per TP rank):

* custom all-reduce (``vllm/distributed/device_communicators/custom_all_reduce.py`` ``CustomAllreduce.__init__``,
  ``max_size=8192 * 1024``): ``meta_ptrs`` = ``create_shared_buffer(ops.meta_size() + max_size)``, ``buffer_ptrs`` =
  ``create_shared_buffer(max_size)`` (cudaMalloc'd, IPC-shared; 0.6.3: two torch tensors of the same sizes) and
  ``rank_data = torch.empty(8 * 1024 * 1024)``, the table of registered graph-buffer pointers.  From 0.28.0 the IPC
  buffer is ``max(max_size, max_all_gather_size, max_reduce_scatter_size)`` = max(8, 2, 16) MiB = 16 MiB
  (``_DEFAULT_REDUCE_SCATTER_MAX_SIZE = 16 * 1024 * 1024``).  With the symmetric-memory communicator enabled,
  ``max_size`` is ``min(CUSTOM_ALL_REDUCE_MAX_SIZES[capability][world_size], max_size)`` (9.0: 64, 32 MiB,
  512, 256 KiB at 2, 4, 6, 8 GPUs; 10.0: 2, 2, 1, 1 MiB); the 10.3 row (0.19.0 on) is not applied (8 MiB, the
  larger).  ``ops.meta_size()`` (the C++ ``Signal`` struct, a few KiB)
  is not counted.  Enabled for world sizes 2, 4, 6, 8 within one node; above 2 GPUs only when fully connected by
  NVLink ("Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"), and only when the
  P2P check passes (``_can_p2p``), which a plan cannot see: for two PCIe GPUs the buffers are counted (the larger
  case).  Capturing CUDA graphs adds no device memory here: ``register_graph_buffers`` opens IPC handles of the peers'
  graph buffers and writes their pointers into ``rank_data``, allocated above.
* torch symmetric memory all-reduce (``symm_mem.py`` ``SymmMemCommunicator.__init__``: ``torch_symm_mem.empty(max_size
  // dtype.itemsize)``, ``max_size = SYMM_MEM_ALL_REDUCE_MAX_SIZES[capability][world_size]``, ``all_reduce_utils.py``):
  created unless ``VLLM_ALLREDUCE_USE_SYMM_MEM=0``, default on from 0.11.0 (``vllm/envs.py`` 0.11.0: ``"1"``; 0.10.2:
  ``"0"``), on compute capability 9.0 and 10.0 (10.3 from 0.19.0, read; 0.17.0 has no 10.3 row).
* NCCL's own buffers, through vLLM's ``PyNcclCommunicator`` (``pynccl.py``: ``ncclCommInitRank`` and a one-element
  warm-up all-reduce): ``NCCL_BUFFSIZE`` (4 MiB) per channel for the Simple protocol, per ring neighbour sent to and
  received from (the point, ``analytic/overhead.py`` ``nccl_bytes``: 16 channels).  What NCCL allocates depends on its
  version and the topology, which a plan cannot know: NCCL 2.22 and later connect each algorithm's and protocol's
  buffers at its first use (``NCCL_RUNTIME_CONNECT``, default 1), so those that the profile run's one large all-reduce
  does not use are connected afterwards, during graph capture or serving, outside the budget.  The band's high end
  (``nccl_high_bytes``) takes NCCL's largest channel count, ``MAXCHANNELS`` 32 (``src/include/device.h``), times send and
  receive, times each protocol's buffer (``src/init.cc``: ``DEFAULT_BUFFSIZE (1 << 22)``, ``DEFAULT_LL_BUFFSIZE`` =
  ``NCCL_LL_LINES_PER_THREAD`` 8 x ``NCCL_LL_MAX_NTHREADS`` 512 x ``NCCL_STEPS`` 8 x 16 B = 524,288 B,
  ``DEFAULT_LL128_BUFFSIZE`` = ``NCCL_LL128_ELEMS_PER_THREAD`` 120 x ``NCCL_LL128_MAX_NTHREADS`` 640 x 8 x 8 B =
  4,915,200 B); LL128 only over NVLink (``src/graph/tuning.cc`` ``ncclTopoTuneModel`` enables it by default only when
  ``typeIntra <= PATH_NVL``).
"""

from __future__ import annotations

from vramplan.units import MiB

__all__ = ["COMM_OUTSIDE_FROM", "CUSTOM_AR_BIG_BUFFER_FROM", "CUSTOM_AR_RANK_DATA_BYTES", "CUSTOM_AR_WORLD_SIZES", "NCCL_LL128_BUFFSIZE_BYTES",
           "NCCL_LL_BUFFSIZE_BYTES", "NCCL_MAX_CHANNELS", "NCCL_SIMPLE_BUFFSIZE_BYTES", "SYMM_MEM_DEFAULT_FROM",
           "SYMM_MEM_MAX_BYTES", "TP_COMM_READ_AT", "TP_COMM_SOURCES", "custom_all_reduce_bytes", "custom_all_reduce_on",
           "nccl_high_bytes", "symm_mem_bytes"]

Release = tuple[int, int, int]

TP_COMM_READ_AT: tuple[Release, ...] = ((0, 6, 3), (0, 6, 6), (0, 8, 0), (0, 9, 1), (0, 10, 0), (0, 10, 2), (0, 11, 0),
                                       (0, 12, 0), (0, 13, 0), (0, 14, 0), (0, 17, 0), (0, 19, 0), (0, 24, 0),
                                       (0, 28, 0), (0, 33, 0))
COMM_OUTSIDE_FROM: Release = (0, 11, 0)
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)  # CustomAllreduce._SUPPORTED_WORLD_SIZES
_CUSTOM_AR_MAX_BYTES = 8192 * 1024  # CustomAllreduce.__init__ max_size default
CUSTOM_AR_RANK_DATA_BYTES = 8 * 1024 * 1024
CUSTOM_AR_BIG_BUFFER_FROM: Release = (0, 28, 0)
_CUSTOM_AR_BIG_BUFFER_BYTES = 16 * 1024 * 1024  # max(8 MiB, all-gather 2 MiB, reduce-scatter 16 MiB), 0.28.0 on
SYMM_MEM_DEFAULT_FROM: Release = (0, 11, 0)
_SYMM_MEM_103_FROM: Release = (0, 19, 0)
# all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES (the same 9.0 and 10.0 rows at 0.11.0, 0.12.0, 0.17.0, 0.19.0,
# 0.24.0, 0.28.0, 0.33.0; 10.3 from 0.19.0)
SYMM_MEM_MAX_BYTES: dict[str, dict[int, int]] = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
}
# all_reduce_utils.py CUSTOM_ALL_REDUCE_MAX_SIZES (0.11.0, 0.14.0): custom all-reduce's max_size is the smaller of
# this and 8 MiB when the symmetric-memory communicator is enabled (CustomAllreduce.__init__ symm_mem_enabled)
_CUSTOM_AR_SYMM_MAX_BYTES: dict[str, dict[int, int]] = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: MiB, 8: MiB},
}
NCCL_MAX_CHANNELS = 32  # NCCL src/include/device.h MAXCHANNELS
NCCL_SIMPLE_BUFFSIZE_BYTES = 1 << 22  # src/init.cc DEFAULT_BUFFSIZE
NCCL_LL_BUFFSIZE_BYTES = 8 * 512 * 8 * 16  # DEFAULT_LL_BUFFSIZE: lines/thread x threads x steps x sizeof(ncclLLFifoLine)
NCCL_LL128_BUFFSIZE_BYTES = 120 * 640 * 8 * 8  # DEFAULT_LL128_BUFFSIZE: elems/thread x threads x steps x 8 B

TP_COMM_SOURCES = (
    ("vllm/v1/worker/gpu_worker.py Worker.init_device: the memory snapshot before init_worker_distributed_environment "
     "in 0.9.1-0.10.2 (0.10.0 lines 163 and 181), after it from 0.11.0 (lines 169 and 182; 0.14.0: 'Initialize the "
     "distributed environment BEFORE taking memory snapshot')"),
    ("vllm/distributed/device_communicators/custom_all_reduce.py CustomAllreduce.__init__: max_size=8192 * 1024; "
     "create_shared_buffer(meta_size() + max_size), create_shared_buffer(max_size), rank_data = torch.empty(8 MiB); "
     "0.28.0: the buffer is max(max_size, max_all_gather_size, max_reduce_scatter_size) = 16 MiB"),
    ("vllm/distributed/device_communicators/symm_mem.py SymmMemCommunicator.__init__: torch_symm_mem.empty(max_size), "
     "all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES; vllm/envs.py VLLM_ALLREDUCE_USE_SYMM_MEM default '1' from 0.11.0"),
    ("NCCL src/init.cc DEFAULT_BUFFSIZE / DEFAULT_LL_BUFFSIZE / DEFAULT_LL128_BUFFSIZE, src/include/device.h MAXCHANNELS "
     "32, NCCL_RUNTIME_CONNECT (2.22: buffers connected at first use)"),
)


def custom_all_reduce_on(tp: int, nvlink: bool) -> bool:
    """Whether vLLM builds its custom all-reduce for ``tp`` GPUs of one node: a supported world size, and above two
    GPUs only when NVLink connects them all (``CustomAllreduce.__init__``); two PCIe GPUs are assumed to pass the P2P
    check (the larger case)."""
    return tp in CUSTOM_AR_WORLD_SIZES and (tp == 2 or nvlink)


def custom_all_reduce_bytes(rel: Release, tp: int, nvlink: bool, capability: str | None = None) -> int:
    """The custom all-reduce's device buffers on one rank: meta (max_size) + IPC buffer + rank_data (module docstring).

    0.11-0.27, 2 GPUs: 8 MiB + 8 MiB + 8 MiB = 25,165,824 B; from 0.28.0: 8 + 16 + 8 MiB = 33,554,432 B.  With the
    symmetric-memory communicator enabled (0.11.0 on, a listed capability, NVLink assumed to give it multicast)
    max_size is min(CUSTOM_ALL_REDUCE_MAX_SIZES, 8 MiB): H100 at 8 GPUs under 0.14, 256 KiB + 256 KiB + 8 MiB =
    8,912,896 B."""
    if not custom_all_reduce_on(tp, nvlink):
        return 0
    max_size = _CUSTOM_AR_MAX_BYTES
    if nvlink and symm_mem_bytes(rel, tp, capability) and capability in _CUSTOM_AR_SYMM_MAX_BYTES:
        max_size = min(_CUSTOM_AR_SYMM_MAX_BYTES[capability][tp], max_size)
    buffer = max(max_size, _CUSTOM_AR_BIG_BUFFER_BYTES) if rel >= CUSTOM_AR_BIG_BUFFER_FROM else max_size
    return max_size + buffer + CUSTOM_AR_RANK_DATA_BYTES


def symm_mem_bytes(rel: Release, tp: int, capability: str | None) -> int:
    """torch symmetric-memory all-reduce buffer on one rank (0 before 0.11.0, off the listed capabilities or world
    sizes): H100 (9.0) at tp 2: 64 MiB = 67,108,864 B."""
    if rel < SYMM_MEM_DEFAULT_FROM or capability is None:
        return 0
    if capability == "10.3" and rel < _SYMM_MEM_103_FROM:
        return 0
    return SYMM_MEM_MAX_BYTES.get(capability, {}).get(tp, 0)


def nccl_high_bytes(nvlink: bool) -> int:
    """The high end of one NCCL communicator's buffers on one rank: 32 channels x (send + receive) x the protocols'
    buffers.  NVLink (Simple + LL + LL128): 32 x 2 x (4,194,304 + 524,288 + 4,915,200) = 616,562,688 B; PCIe (Simple +
    LL): 32 x 2 x 4,718,592 = 301,989,888 B."""
    per = NCCL_SIMPLE_BUFFSIZE_BYTES + NCCL_LL_BUFFSIZE_BYTES + (NCCL_LL128_BUFFSIZE_BYTES if nvlink else 0)
    return NCCL_MAX_CHANNELS * 2 * per
