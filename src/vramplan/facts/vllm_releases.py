"""vLLM's start-up memory rules by release, as data: one row per release where a rule changed.

Each row holds from its ``first`` release until the next row's.  Every field was read from vLLM's
source as shipped in the release's wheel on PyPI (``pip download vllm==X --no-deps``); ``sources``
names the file and function, and ``read_at`` lists the releases whose source was read and found to
follow the row.  ``serve/vllm.py`` ``decide`` reads the row of the scenario's ``serve.vllm_version``;
a release between ``read_at`` releases uses the nearest earlier row and the report says so.

The fields (docs/serving.md, "vLLM by release"):

* ``engine``: ``v0`` (``vllm/worker/worker.py``) or ``v1`` (``vllm/v1/worker/gpu_worker.py``), the
  engine ``vllm serve`` runs by default.  V1 became the default in 0.8.0 (``vllm/envs.py``
  ``VLLM_USE_V1`` default "1").
* ``budget``: what ``gpu_memory_utilization`` is a fraction of and what is taken from it:

  - ``free_delta`` (V0 0.6.0-0.6.3, ``Worker.determine_num_available_blocks``): ``total x util -
    (free memory at worker start - free memory after the profile run)``; the CUDA context is already
    in use at the first snapshot, NCCL's buffers (initialised after it) are counted.
  - ``peak_plus_non_torch`` (V0 0.6.4, V1 0.8.0-0.9.0): ``total x util - (torch's allocated peak +
    every byte on the device that torch did not allocate)``: the weights, the activation peak, the
    CUDA context, NCCL and the non-torch increase all come out of the budget.
  - ``profiled_increase`` (V0 0.6.5-0.7.3 ``memory_profiling``; V1 from 0.9.1): ``total x util -
    (weights + torch peak increase + non-torch increase)`` measured from a snapshot taken after the
    CUDA context started: the context is outside the budget.  NCCL's and the all-reduce buffers are
    created after that snapshot up to 0.10.x (in the non-torch increase, inside the budget) and before
    it from 0.11.0 (outside): ``facts/vllm_tp_comm.py`` ``COMM_OUTSIDE_FROM``.

* ``batch_defaults``: ``max_num_batched_tokens`` / ``max_num_seqs`` when ``vllm serve`` is given none
  (``vllm/config.py`` ``SchedulerConfig`` for V0, ``EngineArgs._set_default_args_v1`` for V1):

  - ``v0-512``: ``max(max_model_len, 2048)`` tokens, or 512 with chunked prefill (on by default above
    32K tokens), 256 sequences;
  - ``v0-2048``: as ``v0-512`` with 2048 tokens under chunked prefill;
  - ``v1-h100-name``: 8192 tokens when the device name contains h100 or h200, else 2048; 1024 sequences;
  - ``v1-70gib``: 8192 tokens and 1024 sequences on a device of >= 70 GiB, else 2048 and 256;
  - ``v1-70gib-not-a100``: as ``v1-70gib`` but never for an A100;
  - ``v1-160gib``: 16384 tokens and 1024 sequences on a device of >= 160 GiB, else as ``v1-70gib-not-a100``;
  - ``v1-160gib-not-gb10``: as ``v1-160gib`` with a GB10 (DGX Spark) never among the >= 70 GiB devices.

* ``profile_compiled``: the profile run's forward is torch.compile'd (V1) or eager (V0).
* ``sampler``: the top-k/top-p path of the profile run's dummy sampling (``native``: PyTorch sort;
  ``flashinfer``), see ``serve/vllm.py`` ``SAMPLER_EXTRA_BYTES``.  The path of a plain ``pip install vllm``
  (scenario ``serve.vllm_sampler: auto``).
* ``flashinfer_sampler``: when the release takes FlashInfer's top-k/top-p path instead (scenario
  ``serve.vllm_sampler: flashinfer``, docs/serving.md "The sampler"):

  - ``v0-env``: only with ``VLLM_USE_FLASHINFER_SAMPLER=1`` and flashinfer installed (0.6.0-0.7.3
    ``vllm/model_executor/layers/sampler.py`` module level: ``if envs.VLLM_USE_FLASHINFER_SAMPLER and
    find_spec("flashinfer")``; ``vllm/envs.py`` default off);
  - ``installed``: whenever flashinfer is installed, unless ``VLLM_USE_FLASHINFER_SAMPLER=0`` (0.8.0-0.11.x
    ``vllm/v1/sample/ops/topk_topp_sampler.py`` ``TopKTopPSampler.__init__``: ``envs.VLLM_USE_FLASHINFER_SAMPLER
    is not False``, default None; 0.8.x also needs ``flashinfer.__version__ < "0.2.3"``, 0.9.0 on ``>= 0.2.3``).
    flashinfer is not a dependency of the wheel (0.8.x-0.9.x: none; 0.10.1-0.11.0: only the extra
    ``vllm[flashinfer]``, wheel METADATA ``Requires-Dist``), but the ``vllm/vllm-openai`` image installs it
    (vLLM ``docker/Dockerfile``: ``uv pip install .../flashinfer_python-0.2.1.post2+cu124torch2.6...whl`` in the
    0.8 era; ``FLASHINFER_GIT_REF`` 0.2.6.post1 at v0.9.2, v0.3.1 for the 0.11 image, as image rebuilds quote it),
    so the image's path differs from pip's: it logs "Using FlashInfer for top-p & top-k sampling.";
  - ``env``: only with ``VLLM_USE_FLASHINFER_SAMPLER=1`` (0.12.0-0.23.x ``TopKTopPSampler.__init__``:
    ``if envs.VLLM_USE_FLASHINFER_SAMPLER``, default None), although flashinfer-python is a dependency
    (0.12.0 ``Requires-Dist: flashinfer-python==0.5.3``); the image and pip agree;
  - ``default``: unless ``VLLM_USE_FLASHINFER_SAMPLER=0`` or the GPU's compute capability is unsupported
    (0.24.0-0.33.0 ``vllm/envs.py`` default True; ``topk_topp_sampler.py`` ``flashinfer_sampler_supported``).

* ``native_sorts``: the PyTorch path (``forward_native``) sorts the logits (36 B per entry); False from 0.17.0,
  whose ``apply_top_k_top_p`` calls ``apply_top_k_top_p_triton`` (the 12 B class).
* ``non_torch_tp1_bytes`` / ``non_torch_tp_bytes``: the non-torch increase vLLM printed on an H100 at
  tp = 1 and tp > 1 (measured, with the log in ``sources``).
* ``cudagraph_bytes`` and ``cudagraph_subtracted``: the CUDA-graph figure vLLM 0.19.0 printed (kept for
  reference: the decision derives the graphs' bytes from the capture mechanism, ``facts/vllm_cudagraphs.py``),
  and whether the release subtracts its estimate from the KV budget by default (else the graphs are captured
  after the KV cache, outside ``gpu_memory_utilization``).
* ``kv_cache_memory_bytes``: the release accepts ``--kv-cache-memory-bytes`` (an explicit KV budget that
  skips the utilisation rule; ``Worker.determine_available_memory``, first in 0.10.2).
* ``block_size``: the default KV block size on CUDA.
* ``lora_ranks``: the ``max_lora_rank`` values the release accepts (``LoRAConfig``).
* ``lora_in_budget``: the preallocated LoRA slots are taken from the KV budget.  V1 builds them inside the
  ``DeviceMemoryProfiler`` that measures the weights (``GPUModelRunner.load_model`` -> ``load_lora_model``, 0.8.0
  on); V0 0.6.0-0.6.4 sees them in its free-memory or allocated-peak rule.  V0 0.6.5-0.7.3 creates them after the
  weights are measured (``vllm/worker/model_runner.py`` ``GPUModelRunner.load_model``: ``model_memory_usage`` is
  read, then ``create_lora_manager``) and before the profile run's first snapshot (``vllm/utils.py``
  ``memory_profiling``: the torch peak increase is counted from ``before_profile``), so neither term holds them:
  the slots sit outside ``gpu_memory_utilization`` (vllm issue #14450: "using different LoRa Rank and Max LoRas did
  not affect the number of kv cache blocks").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AUTO_DTYPE_FALLBACK_FROM",
    "LINEAR_MIXER_PROFILE_READ_BEFORE",
    "LINEAR_MIXER_V1_FROM",
    "MAMBA1_V1_FROM",
    "MAMBA_CAPTURE_CAP_FROM",
    "MAMBA_HYBRID_FIRST",
    "MAMBA_HYBRID_PREFIX_CACHING_FROM",
    "MAMBA_HYBRID_REMOVED",
    "MAMBA_HYBRID_RULES",
    "MAMBA_SEQS_CHECK_FROM",
    "MAMBA_SSM_DTYPE_DEFAULT",
    "MAMBA_SSM_DTYPE_FROM_CONFIG",
    "MIXER_TP_SHARDED",
    "MLLAMA_SERVED",
    "MLLAMA_SOURCES",
    "MODEL_RUNNER_RULES",
    "MODEL_RUNNER_V2_FIRST",
    "MXFP4_FIRST",
    "MXFP4_HOPPER_SOURCES",
    "MXFP4_HOPPER_SWIZZLE_FROM",
    "NEWEST",
    "OLDEST",
    "SHARED_BLOCK_TP_SHARDED_LISTS",
    "STATE_SPACE_V1_FROM",
    "V0_ENGINE_STANDIN",
    "V0_ENGINE_UNTIL",
    "V0_FALLBACK_RULES",
    "V0_FALLBACK_UNTIL",
    "VLLM_RELEASES",
    "BatchDefaults",
    "Budget",
    "FlashinferSampler",
    "MambaHybridRule",
    "ModelRunnerRule",
    "V0FallbackCause",
    "V0FallbackRule",
    "VllmRelease",
    "mamba_hybrid_rule",
    "model_runner_rule",
    "mxfp4_triton_installed",
    "parse_release",
    "release_row",
    "release_text",
    "v0_fallback_rule",
]

Release = tuple[int, int, int]
Budget = Literal["free_delta", "peak_plus_non_torch", "profiled_increase"]
FlashinferSampler = Literal["v0-env", "installed", "env", "default"]
BatchDefaults = Literal["v0-512", "v0-2048", "v1-h100-name", "v1-70gib", "v1-70gib-not-a100", "v1-160gib",
                        "v1-160gib-not-gb10"]

_GIB = 1 << 30
# vllm/config.py LoRAConfig.__post_init__ ``possible_max_ranks``: (8, ..., 256) in 0.6.0-0.7.3, with 320 and 512
# from 0.8.0 (also vllm/config/lora.py 0.10.2-0.11.0); vllm/config/lora.py ``MaxLoRARanks`` adds 1 from 0.12.0.
_LORA_RANKS_06 = (8, 16, 32, 64, 128, 256)
_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
_LORA_RANKS_012 = (1, *_LORA_RANKS)
# measured, vLLM 0.11.0 on H100 (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md)
_NT_011 = (int(0.13 * _GIB), int(0.55 * _GIB))
_CG = int(0.84 * _GIB)  # vLLM 0.19.0 "Estimated CUDA graph memory: 0.84 GiB" (llm-d-planner v0.19.0 logs)
# The estimate 0.20+ subtracts is a measurement: vllm/v1/worker/gpu_model_runner.py
# GPUModelRunner.profile_cudagraph_memory (0.20-0.33) captures the first two graphs of each mode and charges the first
# capture's free-memory drop plus (graphs - 1) x the second's; serve/cudagraphs.py derives it from the capture sizes
# and modes (facts/vllm_cudagraphs.py), and _CG is one of the printed figures that bound its per-graph share.

_V0_WORKER = "vllm/worker/worker.py Worker.determine_num_available_blocks"
_V1_WORKER = "vllm/v1/worker/gpu_worker.py Worker.determine_available_memory"
_V0_SAMPLER = "vllm/model_executor/layers/sampler.py _apply_top_k_top_p (fp32 logits, torch.sort)"
_NT_ASSUMED = ("non-torch increase not printed apart by this release: the values vLLM 0.11.0 printed on H100 are "
               "used (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md)")


@dataclass(frozen=True, kw_only=True)
class VllmRelease:
    """One row: the start-up rules of vLLM from release ``first`` on (module docstring)."""

    first: Release
    read_at: tuple[Release, ...]
    engine: Literal["v0", "v1"]
    budget: Budget
    batch_defaults: BatchDefaults
    profile_compiled: bool
    sampler: Literal["native", "flashinfer"]
    non_torch_tp1_bytes: int
    non_torch_tp_bytes: int
    non_torch_release: str  # the release whose printed log gave the non-torch values
    cudagraph_bytes: int
    cudagraph_subtracted: bool
    kv_cache_memory_bytes: bool
    block_size: int
    lora_ranks: tuple[int, ...]
    sources: tuple[str, ...]
    lora_in_budget: bool = True
    flashinfer_sampler: FlashinferSampler = "installed"
    native_sorts: bool = True

    @property
    def name(self) -> str:
        return release_text(self.first)


VLLM_RELEASES: tuple[VllmRelease, ...] = (
    VllmRelease(
        first=(0, 6, 0), read_at=((0, 6, 0), (0, 6, 2), (0, 6, 3)), engine="v0", budget="free_delta", batch_defaults="v0-512",
        profile_compiled=False, sampler="native", non_torch_tp1_bytes=_NT_011[0], non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11",
        cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=False, block_size=16,
        lora_ranks=_LORA_RANKS_06,
        flashinfer_sampler="v0-env",
        sources=(
            (f"0.6.0 {_V0_WORKER}: peak_memory = self.init_gpu_memory - free_gpu_memory; "
            "available = total_gpu_memory * gpu_memory_utilization - peak_memory"),
            ("0.6.0 vllm/worker/worker.py Worker.init_device: init_gpu_memory taken after torch.cuda.set_device, "
            "before init_worker_distributed_environment (NCCL inside the peak)"),
            ("0.6.0 vllm/config.py SchedulerConfig.__init__: 512 with chunked prefill else max(max_model_len, 2048); "
            "vllm/engine/arg_utils.py EngineArgs: max_num_seqs 256, chunked prefill on when max_model_len > 32768"),
            f"0.6.0 {_V0_SAMPLER}", _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 6, 4), read_at=((0, 6, 4),), engine="v0", budget="peak_plus_non_torch", batch_defaults="v0-512",
        profile_compiled=False, sampler="native", non_torch_tp1_bytes=_NT_011[0], non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11",
        cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=False, block_size=16,
        lora_ranks=_LORA_RANKS_06,
        flashinfer_sampler="v0-env",
        sources=(
            (f"0.6.4 {_V0_WORKER}: peak_memory = memory_stats()['allocated_bytes.all.peak'] + non_torch_allocations "
            "(total - free - torch allocated: CUDA context, NCCL, non-torch increase)"),
            "0.6.4 vllm/config.py SchedulerConfig.__post_init__: 512 under chunked prefill", _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 6, 5), read_at=((0, 6, 5), (0, 6, 6), (0, 7, 0), (0, 7, 2), (0, 7, 3)), engine="v0",
        budget="profiled_increase", batch_defaults="v0-2048", profile_compiled=False, sampler="native",
        non_torch_tp1_bytes=_NT_011[0], non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11", cudagraph_bytes=_CG,
        cudagraph_subtracted=False, kv_cache_memory_bytes=False, block_size=16, lora_ranks=_LORA_RANKS_06,
        flashinfer_sampler="v0-env",
        lora_in_budget=False,
        sources=(
            ("0.6.5-0.7.3 vllm/worker/model_runner.py GPUModelRunner.load_model: model_memory_usage measured "
             "before create_lora_manager; vllm/utils.py memory_profiling counts the torch peak increase from the "
             "profile's first snapshot, so the LoRA slots are outside the budget"),
            (f"0.6.6 {_V0_WORKER}: memory_profiling(baseline_memory_in_bytes=total - init_gpu_memory, "
            "weights_memory_in_bytes=model_memory_usage); available = total * util - non_kv_cache_memory_in_bytes "
            "(vllm PR 10511; 0.6.5 wheel read: the same)"),
            "0.6.6 vllm/config.py SchedulerConfig.__post_init__: 2048 under chunked prefill",
            "0.7.3 vllm/envs.py VLLM_USE_V1 default '0' (V0 engine)", _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 8, 0), read_at=((0, 8, 0), (0, 8, 2), (0, 8, 3)), engine="v1", budget="peak_plus_non_torch",
        batch_defaults="v1-h100-name", profile_compiled=True, sampler="native", non_torch_tp1_bytes=_NT_011[0],
        non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11", cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=False,
        block_size=16, lora_ranks=_LORA_RANKS,
        flashinfer_sampler="installed",
        sources=(
            "0.8.0 vllm/envs.py VLLM_USE_V1 default '1' (V1 engine by default)",
            (f"0.8.0 {_V1_WORKER}: peak_memory = allocated_bytes.all.peak + non_torch_allocations; "
            "available = total_gpu_memory * gpu_memory_utilization - peak_memory"),
            ("0.8.0 vllm/engine/arg_utils.py EngineArgs._set_default_args_v1: 'h100' or 'h200' in the device name "
            "-> 8192 (serve), else 2048; max_num_seqs 1024"),
            "0.8.0 vllm/v1/worker/gpu_model_runner.py GPUModelRunner.profile_run -> _dummy_sampler_run",
            ("0.8.0-0.8.5 vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: forward_cuda (FlashInfer, "
             "'Using FlashInfer for top-p & top-k sampling.') when flashinfer is installed, its __version__ < '0.2.3' "
             "and VLLM_USE_FLASHINFER_SAMPLER is not False; not a dependency of the wheel (forward_native)"),
            _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 8, 5), read_at=((0, 8, 5),), engine="v1", budget="peak_plus_non_torch", batch_defaults="v1-70gib",
        profile_compiled=True, sampler="native", non_torch_tp1_bytes=_NT_011[0], non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11",
        cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=False, block_size=16,
        lora_ranks=_LORA_RANKS,
        flashinfer_sampler="installed",
        sources=(
            ("0.8.5 vllm/engine/arg_utils.py EngineArgs._set_default_args_v1: device_memory >= 70 * GiB_bytes -> "
            "8192 tokens, 1024 sequences, else 2048 and 256"),
            f"0.8.5 {_V1_WORKER}: allocated peak + non-torch allocations", _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 9, 0), read_at=((0, 9, 0),), engine="v1", budget="peak_plus_non_torch",
        batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="native", non_torch_tp1_bytes=_NT_011[0],
        non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11", cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=False,
        block_size=16, lora_ranks=_LORA_RANKS,
        flashinfer_sampler="installed",
        sources=(
            ("0.9.0 vllm/engine/arg_utils.py EngineArgs._set_default_args_v1: device_memory >= 70 * GiB_bytes and "
            "'a100' not in device_name"),
            ("0.9.0-0.11.0 vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: FlashInfer when installed "
             "at >= 0.2.3 and VLLM_USE_FLASHINFER_SAMPLER is not False (flashinfer_sample -> "
             "top_k_top_p_sampling_from_logits)"),
            f"0.9.0 {_V1_WORKER}: allocated peak + non-torch allocations", _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 9, 1), read_at=((0, 9, 1), (0, 9, 2), (0, 10, 0), (0, 10, 1)), engine="v1", budget="profiled_increase",
        batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="native", non_torch_tp1_bytes=_NT_011[0],
        non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11", cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=False,
        block_size=16, lora_ranks=_LORA_RANKS,
        flashinfer_sampler="installed",
        sources=(
            (f"0.9.1 {_V1_WORKER}: memory_profiling(self.init_snapshot, weights_memory=model_memory_usage); "
            "available = requested_memory - non_kv_cache_memory"),
            ("0.10.0 vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: FlashInfer only when "
            "installed (not a dependency of the wheel); PyTorch sort otherwise"),
            _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 10, 2), read_at=((0, 10, 2), (0, 11, 0)), engine="v1",
        budget="profiled_increase", batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="native",
        non_torch_tp1_bytes=_NT_011[0], non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11", cudagraph_bytes=_CG,
        cudagraph_subtracted=False, kv_cache_memory_bytes=True, block_size=16, lora_ranks=_LORA_RANKS,
        flashinfer_sampler="installed",
        sources=(
            (f"0.10.2 {_V1_WORKER}: 'if kv_cache_memory_bytes := self.cache_config.kv_cache_memory_bytes' returns it "
            "after a profile run, skipping gpu_memory_utilization; vllm/config/cache.py CacheConfig.kv_cache_memory_bytes"),
            ("llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md (vLLM v0.11.0 on H100: "
             "non-torch 0.13 GiB at tp=1 for Llama-3.1-8B, Qwen3-0.6B, gpt-oss-20b; 0.54-0.55 GiB at tp=2)"),
            "vllm/v1/sample/ops/topk_topp_sampler.py forward_native (sort-based top-k/top-p)",
            ("0.12.0-0.16.0 vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: FlashInfer only when "
            "VLLM_USE_FLASHINFER_SAMPLER is set (vllm/envs.py default None); apply_top_k_top_p sorts"),
        ),
    ),
    VllmRelease(
        first=(0, 12, 0), read_at=((0, 12, 0), (0, 13, 0), (0, 14, 0), (0, 15, 0), (0, 16, 0)), engine="v1",
        budget="profiled_increase", batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="native",
        non_torch_tp1_bytes=_NT_011[0], non_torch_tp_bytes=_NT_011[1], non_torch_release="0.11", cudagraph_bytes=_CG,
        cudagraph_subtracted=False, kv_cache_memory_bytes=True, block_size=16, lora_ranks=_LORA_RANKS_012,
        flashinfer_sampler="env",
        sources=(
            "0.12.0 vllm/config/lora.py MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]",
            ("0.12.0 vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: with VLLM_USE_FLASHINFER_SAMPLER "
             "set, RuntimeError unless FlashInferBackend.supports_compute_capability (7.5 <= capability <= 12.1)"),
            ("0.12.0-0.16.0 vllm/v1/sample/ops/topk_topp_sampler.py TopKTopPSampler.__init__: FlashInfer only when "
            "VLLM_USE_FLASHINFER_SAMPLER is set (vllm/envs.py default None); apply_top_k_top_p sorts"),
            _NT_ASSUMED,
        ),
    ),
    VllmRelease(
        first=(0, 17, 0), read_at=((0, 17, 0), (0, 18, 0), (0, 19, 0)), engine="v1", budget="profiled_increase",
        batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="flashinfer",
        non_torch_tp1_bytes=int(0.25 * _GIB), non_torch_tp_bytes=int(0.67 * _GIB), non_torch_release="0.19",
        cudagraph_bytes=_CG, cudagraph_subtracted=False, kv_cache_memory_bytes=True, block_size=16,
        lora_ranks=_LORA_RANKS_012, flashinfer_sampler="env", native_sorts=False,
        sources=(
            ("llm-d-incubation/llm-d-planner accuracy/results/v0.19.0/logs (vLLM 0.19.0 on H100: 'non-torch "
             "forward increase memory: 0.25GiB' for three models; 'Estimated CUDA graph memory: 0.84 GiB')"),
            ("0.17.0 vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p -> apply_top_k_top_p_triton (no full "
            "sort: fp32 logits, masked logits, probabilities, the 12 B/entry class named 'flashinfer' here)"),
            "0.18.0 vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default '0' (estimate printed, not subtracted)",
        ),
    ),
    VllmRelease(
        first=(0, 20, 0), read_at=((0, 20, 0), (0, 21, 0), (0, 22, 0), (0, 23, 0)), engine="v1",
        budget="profiled_increase", batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="flashinfer",
        non_torch_tp1_bytes=int(0.25 * _GIB), non_torch_tp_bytes=int(0.67 * _GIB), non_torch_release="0.19",
        cudagraph_bytes=_CG, cudagraph_subtracted=True, kv_cache_memory_bytes=True, block_size=16,
        lora_ranks=_LORA_RANKS_012, flashinfer_sampler="env", native_sorts=False,
        sources=(
            ("0.20.0 vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default '1'; "
            f"{_V1_WORKER}: cudagraph_memory_estimate_applied subtracted from the KV budget"),
            "0.20.0 vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p_triton (as 0.17.0)",
            "non-torch increase: vLLM 0.19.0's printed values (llm-d-planner v0.19.0 logs)",
        ),
    ),
    VllmRelease(
        first=(0, 24, 0), read_at=((0, 24, 0), (0, 25, 0), (0, 26, 0), (0, 27, 0)), engine="v1",
        budget="profiled_increase", batch_defaults="v1-70gib-not-a100", profile_compiled=True, sampler="flashinfer",
        non_torch_tp1_bytes=int(0.25 * _GIB), non_torch_tp_bytes=int(0.67 * _GIB), non_torch_release="0.19",
        cudagraph_bytes=_CG, cudagraph_subtracted=True, kv_cache_memory_bytes=True, block_size=16,
        lora_ranks=_LORA_RANKS_012, flashinfer_sampler="default", native_sorts=False,
        sources=(
            ("0.24.0 vllm/envs.py VLLM_USE_FLASHINFER_SAMPLER default True; vllm/v1/sample/ops/topk_topp_sampler.py "
            "TopKTopPSampler.__init__: forward_cuda (FlashInfer) when flashinfer_sampler_supported()"),
            "0.24.0 vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default '1'",
            ("0.27.0 vllm/utils/mem_utils.py memory_profiling: non_kv_cache_memory = total_consumed (free memory at "
             "the init snapshot - free after the profile) + transient_peak_headroom (torch peak - allocated): the "
             "same terms measured from free memory"),
            "non-torch increase: vLLM 0.19.0's printed values (llm-d-planner v0.19.0 logs)",
        ),
    ),
    VllmRelease(
        first=(0, 28, 0), read_at=((0, 28, 0), (0, 29, 0), (0, 30, 0), (0, 31, 0), (0, 32, 0)), engine="v1",
        budget="profiled_increase", batch_defaults="v1-160gib", profile_compiled=True, sampler="flashinfer",
        non_torch_tp1_bytes=int(0.25 * _GIB), non_torch_tp_bytes=int(0.67 * _GIB), non_torch_release="0.19",
        cudagraph_bytes=_CG, cudagraph_subtracted=True, kv_cache_memory_bytes=True, block_size=16,
        lora_ranks=_LORA_RANKS_012, flashinfer_sampler="default", native_sorts=False,
        sources=(
            ("0.28.0 vllm/engine/arg_utils.py EngineArgs._set_default_args: device_memory >= 160 * GiB_bytes -> "
            "16384 tokens and 1024 sequences for vllm serve (B200/B300)"),
            ("0.28.0-0.32.0 vllm/envs.py VLLM_USE_FLASHINFER_SAMPLER default True, "
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default '1'; vllm/config/cache.py DEFAULT_BLOCK_SIZE 16"),
            "non-torch increase: vLLM 0.19.0's printed values (llm-d-planner v0.19.0 logs)",
        ),
    ),
    VllmRelease(
        first=(0, 33, 0), read_at=((0, 33, 0),), engine="v1", budget="profiled_increase",
        batch_defaults="v1-160gib-not-gb10", profile_compiled=True, sampler="flashinfer",
        non_torch_tp1_bytes=int(0.25 * _GIB), non_torch_tp_bytes=int(0.67 * _GIB), non_torch_release="0.19",
        cudagraph_bytes=_CG, cudagraph_subtracted=True, kv_cache_memory_bytes=True, block_size=16,
        lora_ranks=_LORA_RANKS_012, flashinfer_sampler="default", native_sorts=False,
        sources=(
            ("0.33.0 vllm/engine/arg_utils.py EngineArgs._set_default_args: the >= 70 GiB defaults exclude a GB10 "
            "(is_gb10)"),
            (f"0.33.0 {_V1_WORKER}: requested - non_kv_cache_memory - cudagraph_memory_estimate_applied; "
            "vllm/v1/worker/utils.py request_memory: ceil(total x gpu_memory_utilization)"),
            "non-torch increase: vLLM 0.19.0's printed values (llm-d-planner v0.19.0 logs)",
        ),
    ),
)

OLDEST: Release = VLLM_RELEASES[0].first
# --dtype auto on a GPU without the checkpoint's dtype (bf16 below compute capability 8.0): from 0.9.0
# _get_and_verify_dtype (vllm/config.py) warns "Your ... device ... doesn't support torch.bfloat16. Falling back to
# torch.float16 for compatibility." and takes current_platform.supported_dtypes[0] (vllm/platforms/cuda.py: fp16
# for 6.0 <= capability < 8.0), PR vllm-project/vllm#17265; 0.8.5's _get_and_verify_dtype keeps the checkpoint's
# bf16 and vllm/v1/worker/gpu_worker.py _check_if_gpu_supports_dtype raises "Bfloat16 is only supported on GPUs
# with compute capability of at least 8.0" (both read in the release wheels)
AUTO_DTYPE_FALLBACK_FROM: Release = (0, 9, 0)
# The vLLM releases that serve Llama 3.2 Vision (MllamaForConditionalGeneration), first and last, both included:
# added by PR #8811 (merged 2024-09-25, released in 0.6.2; the release-day guide, issue #8826, runs
# ``vllm serve meta-llama/Llama-3.2-11B-Vision-Instruct --enforce-eager --max-num-seqs 16``), served by the V0
# engine's encoder-decoder model runner only, and removed with it by PR #24907 ("Remove V0 Encoder-Decoder Support",
# 2025-09-15: Whisper stays the only encoder-decoder model); vllm/model_executor/models/registry.py
# ``_PREVIOUSLY_SUPPORTED_MODELS`` names 0.10.2 as its last release.
MLLAMA_SERVED: tuple[Release, Release] = ((0, 6, 2), (0, 10, 2))
MLLAMA_SOURCES = ("vllm-project/vllm PR #8811 (mllama added, 2024-09-25) and issue #8826",
                  "vllm-project/vllm PR #24907 (V0 encoder-decoder support removed, 2025-09-15)",
                  ("vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS: "
                   "'MllamaForConditionalGeneration': '0.10.2'"))
NEWEST: Release = (0, 33, 0)  # the newest vLLM release on PyPI when this table was written
# MXFP4 MoE experts (gpt-oss): quantization/mxfp4.py first in 0.10.1 (absent from 0.10.0).  On Hopper (9.0) the
# Triton backend swizzles them for triton_kernels, and the swizzled scales are a second copy beside the loaded ones
# (serve/vllm.py ``hopper_swizzle_bytes``), from the release whose plain install takes that path:
MXFP4_FIRST: Release = (0, 10, 1)
MXFP4_HOPPER_SWIZZLE_FROM: Release = (0, 12, 0)
MXFP4_HOPPER_SOURCES = (
    ("0.10.1 vllm/model_executor/layers/quantization/mxfp4.py Mxfp4MoEMethod._should_use_marlin: Marlin on Hopper "
     "without triton_kernels or below torch 2.8.0; the wheel requires torch==2.7.1 (METADATA): Marlin"),
    ("0.11.0 vllm/utils/__init__.py has_triton_kernels: _has_module('triton_kernels'), not a dependency of the wheel "
     "(METADATA: torch==2.8.0, no triton_kernels); where installed, quantization/utils/mxfp4_utils.py _swizzle_mxfp4 "
     "keeps StridedLayout below torch 2.8.1 (StridedLayout.swizzle_data returns the data: no copy)"),
    ("0.12.0 vllm/third_party/triton_kernels vendored; vllm/utils/import_utils.py has_triton_kernels: "
     "triton_kernels or vllm.third_party.triton_kernels; torch 2.9: _swizzle_mxfp4 takes HopperMXValueLayout and "
     "HopperMXScaleLayout (the same at 0.14.0, 0.14.1, 0.17.0, 0.20.0, 0.24.0, 0.28.0, 0.33.0)"),
    ("0.12.0-0.17.0 quantization/mxfp4.py process_weights_after_loading (TRITON): del layer.w13_weight / w2_weight, "
     "the scales kept; 0.20.0-0.33.0 fused_moe/oracle/mxfp4.py: the same"),
)


def mxfp4_triton_installed(version: str | None) -> bool:
    """Whether a plain install of vLLM ``version`` has the triton_kernels module its Triton MXFP4 backend needs on
    Hopper and Blackwell (``MXFP4_HOPPER_SOURCES``): 0.10.1-0.11.x do not (0.11.0 quantization/mxfp4.py
    ``get_mxfp4_backend`` lines 94-102: no ``triton_kernels`` module, capability below 9 or torch below 2.8.0 ->
    MARLIN; 0.10.2 the same, lines 89-94; triton_kernels is in neither release's CUDA requirements nor Dockerfile);
    from 0.12.0 it is vendored.
    No release given, or one vramplan refuses (answered elsewhere with the accepted range): taken as the newest."""
    if not version:
        return True
    try:
        return parse_release(version) >= MXFP4_HOPPER_SWIZZLE_FROM
    except ValueError:
        return True


_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.?post\d+|rc\d+)?$")


def release_text(r: Release) -> str:
    return f"{r[0]}.{r[1]}.{r[2]}"


def parse_release(text: str) -> Release:
    """``"0.11"``, ``"0.11.2"``, ``"v0.8.5.post1"``, ``"0.10.1.1"`` -> (major, minor, patch); a ValueError
    names the accepted form and range when the text is not a release from ``OLDEST`` to ``NEWEST``."""
    m = _RELEASE.match(text.strip())
    span = f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"
    if m is None:
        raise ValueError(f"{text!r} is not a vLLM release string (like '0.11' or '0.10.2'); "
                         f"accepted: {span}")
    rel = (int(m[1]), int(m[2]), int(m[3] or 0))
    if rel < OLDEST:
        raise ValueError(f"vLLM {text} is older than the releases modelled ({span}); the nearest is "
                         f"{release_text(OLDEST)}")
    if rel > NEWEST:
        raise ValueError(f"vLLM {text} is newer than the releases modelled ({span}); the nearest is "
                         f"{release_text(NEWEST)}")
    return rel


def release_row(text: str) -> tuple[VllmRelease, bool]:
    """The row for a release string, and whether that release's own source was read (``read_at``);
    False: the nearest earlier row is assumed to hold."""
    rel = parse_release(text)
    row = [r for r in VLLM_RELEASES if r.first <= rel][-1]
    return row, rel in row.read_at


# Speculative decoding's share of the profile run (serve/vllm.py ``_speculative_terms``), read in the source of
# 0.17.0-0.33.0 and the same in each: vllm/v1/worker/gpu_model_runner.py GPUModelRunner._dummy_sampler_run runs the
# rejection sampler on randn(2 x requests, vocab) logits (one draft token per dummy request);
# vllm/v1/sample/rejection_sampler.py RejectionSampler.forward keeps a bonus-token fp32 copy ("raw_logits"), an fp32
# target copy and its clone, and rejection_sample / sample_recovered_tokens add fp32 probabilities, q and 1/q;
# GPUModelRunner._dummy_run runs the proposer's forward (SpecDecodeBaseProposer.dummy_run) over the same tokens;
# SpecDecodeBaseProposer.__init__ (v1/spec_decode/eagle.py in 0.17.0, llm_base_proposer.py from 0.20.0) allocates its
# max_num_batched_tokens-sized buffers before the weights are loaded.  0.15.0/0.16.0 sample recovered tokens without
# 1/q and are not modelled: older releases keep the earlier assumption (the proposer's profile peaks below the target's).
SPECULATIVE_PROFILE_FROM: Release = (0, 17, 0)


# Hybrid attention + Mamba2 models (``ModelSpec.mamba``) in V1, by release: how vLLM lays out the mixers' state beside
# the attention KV cache (serve/vllm.py ``_hybrid_blocks``).  Read in each release's source, as the rows above.
#
# * Which release serves them in V1 by default: 0.10.0 and 0.10.1 fall back to V0 for a model with inner state
#   unless VLLM_USE_V1=1 is set (vllm/engine/arg_utils.py ``_is_v1_supported_oracle``: "V1 mamba models are
#   unoptimized", ``model_config.has_inner_state and _warn_or_fallback``); 0.10.2 drops that fallback.  Older
#   releases run them on V0 (vllm/model_executor/models/mamba_cache.py ``MambaCacheManager``), not modelled.
# * From 0.26.0 ``ModelConfig.is_prefix_caching_supported`` returns True for generative hybrid models ("Generative
#   hybrid models support prefix caching", vllm/config/model.py), so prefix caching is on by default and
#   ``MambaModelConfig.verify_and_update_config`` sets ``mamba_cache_mode`` "all" or "align" (a state page per block
#   of tokens, or two per request): not modelled.  0.10.2-0.11.x force prefix caching off for these models
#   (``MambaModelConfig``: "disabling prefix caching since it is not yet supported"), 0.12.0-0.25.x leave it off by
#   default (``is_prefix_caching_supported``: "Hybrid models do not support prefix caching"), so one state page
#   serves a request: ``mamba_block_size = max_model_len`` and ``MambaSpec.max_memory_usage_bytes`` is one page.
MAMBA_HYBRID_FIRST: Release = (0, 10, 2)
MAMBA_HYBRID_PREFIX_CACHING_FROM: Release = (0, 26, 0)

HybridBlockRule = Literal["raise", "align"]
HybridNeeded = Literal["layers", "first_group", "groups"]


@dataclass(frozen=True, kw_only=True)
class MambaHybridRule:
    """One row: how a release sizes the pages and counts the blocks of a hybrid attention + Mamba2 model.

    * ``block_rule``: ``raise`` (0.10.2-0.19.x, ``HybridAttentionMambaModelConfig.verify_and_update_config`` in
      vllm/model_executor/models/config.py): the attention block is ``max(block_size, 16 * cdiv(mamba_page,
      16 * attention_page_per_token))``; ``align`` (0.20.0 on, ``Platform._align_hybrid_block_size`` in
      vllm/platforms/interface.py): with ``a = max(smallest kernel block of the backend, block_size)``, the block
      is ``a * cdiv(mamba_page, a * attention_page_per_token)``.  Either way the mixers' page is padded to the
      attention page (``cache_config.mamba_page_size_padded``).
    * ``blackwell_head256``: the kernel alignment is 32 on compute capability 10.x with head size 256 and the
      FlashInfer backend (flashinfer issue 1993), 0.12.0-0.17.x.
    * ``group_ratio``: ``_get_kv_cache_groups_uniform_page_size`` (vllm/v1/core/kv_cache_utils.py) makes groups of
      the smallest type's layer count, or of the largest's when it is below ``ratio`` x the smallest (None: never).
    * ``needed``: what ``max_model_len`` needs at start-up: ``layers`` (to 0.14.x, ``max_memory_usage_bytes`` over
      every layer's spec), ``first_group`` (0.15.0-0.18.x, ``_max_memory_usage_bytes_from_groups``: group size x
      page x the first group's blocks per request), ``groups`` (0.19.0 on: the sum over all groups).
    * ``tokens_from_concurrency``: "GPU KV cache size" is ``int(max_concurrency x max_model_len)``
      (``get_kv_cache_capacity``, 0.24.0 on); before, ``num_blocks // groups x min block size``.
    """

    first: Release
    read_at: tuple[Release, ...]
    block_rule: HybridBlockRule
    blackwell_head256: bool
    group_ratio: float | None
    needed: HybridNeeded
    tokens_from_concurrency: bool
    sources: tuple[str, ...]


_HYB = "vllm/model_executor/models/config.py HybridAttentionMambaModelConfig.verify_and_update_config"
_GROUPS = "vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size"
MAMBA_HYBRID_RULES: tuple[MambaHybridRule, ...] = (
    MambaHybridRule(
        first=(0, 10, 2), read_at=((0, 10, 2), (0, 11, 0)), block_rule="raise", blackwell_head256=False,
        group_ratio=None, needed="layers", tokens_from_concurrency=False,
        sources=((f"0.10.2 {_HYB}: attn_block_size = 16 * cdiv(mamba_page_size, 16 * attn_page_size_1_token); "
                 "mamba_page_size_padded = attn_page_size"),
                 f"0.11.0 {_GROUPS}: group_size = min(len(layers))",
                 ("0.11.0 vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory: max_memory_usage_bytes over "
                 "every layer's spec; get_kv_cache_config_from_groups: num_tokens = num_blocks // len(groups) * "
                 "min_block_size"))),
    MambaHybridRule(
        first=(0, 12, 0), read_at=((0, 12, 0), (0, 13, 0), (0, 14, 0)), block_rule="raise", blackwell_head256=True,
        group_ratio=1.25, needed="layers", tokens_from_concurrency=False,
        sources=((f"0.12.0 {_HYB}: kernel_block_alignment_size 32 on device capability 100 with head size 256 "
                 "(FlashInfer)"), f"0.12.0 {_GROUPS}: max_num_layers < min_num_layers * 1.25 -> max")),
    MambaHybridRule(
        first=(0, 15, 0), read_at=((0, 15, 0), (0, 16, 0), (0, 17, 0)), block_rule="raise", blackwell_head256=True,
        group_ratio=1.25, needed="first_group", tokens_from_concurrency=False,
        sources=(("0.15.0 vllm/v1/core/kv_cache_utils.py _max_memory_usage_bytes_from_groups: group_size * "
                 "page_size * cdiv(kv_cache_groups[0].kv_cache_spec.max_memory_usage_bytes, page_size)"),)),
    MambaHybridRule(
        first=(0, 18, 0), read_at=((0, 18, 0),), block_rule="raise", blackwell_head256=False,
        group_ratio=1.5, needed="first_group", tokens_from_concurrency=False,
        sources=(f"0.18.0 {_GROUPS}: max_num_layers < min_num_layers * 1.5 -> max",
                 f"0.18.0 {_HYB}: the capability-100 head-256 alignment removed")),
    MambaHybridRule(
        first=(0, 19, 0), read_at=((0, 19, 0),), block_rule="raise", blackwell_head256=False,
        group_ratio=1.5, needed="groups", tokens_from_concurrency=False,
        sources=(("0.19.0 vllm/v1/core/kv_cache_utils.py _max_memory_usage_bytes_from_groups: blocks_needed = sum "
                 "over groups of cdiv(max_memory_usage_bytes, page_size)"),)),
    MambaHybridRule(
        first=(0, 20, 0), read_at=((0, 20, 0), (0, 21, 0), (0, 22, 0), (0, 23, 0)), block_rule="align",
        blackwell_head256=False, group_ratio=1.5, needed="groups", tokens_from_concurrency=False,
        sources=(("0.20.0 vllm/platforms/interface.py Platform._align_hybrid_block_size: kernel_block_alignment_size "
                 "= max(min(backend kernel block sizes), cache_config.block_size); attn_block_size = "
                 "kernel_block_alignment_size * cdiv(mamba_page_size, kernel_block_alignment_size * "
                 "attn_page_size_1_token)"),)),
    MambaHybridRule(
        first=(0, 24, 0), read_at=((0, 24, 0), (0, 25, 0)), block_rule="align", blackwell_head256=False,
        group_ratio=1.5, needed="groups", tokens_from_concurrency=True,
        sources=(("0.24.0 vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity: num_tokens = int(max_concurrency * "
                 "max_model_len)"),)),
)


# Hybrid architectures vLLM dropped, by config model_type: the first release without them.  vLLM 0.24.0 lists
# "BambaForCausalLM": "0.23.0" in vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS (its
# bamba.py is gone), so 0.23.x is the last release that serves Bamba.
MAMBA_HYBRID_REMOVED: dict[str, Release] = {"bamba": (0, 24, 0)}

# Families whose SSM state dtype vLLM takes from the config.json from a release on, when mamba_ssm_cache_dtype is
# "auto": 0.13.0's NemotronHForCausalLMConfig.verify_and_update_config (vllm/model_executor/models/config.py) sets it
# to the config's mamba_ssm_cache_dtype, or float16 where the config has none; before, "auto" is the model dtype.
MAMBA_SSM_DTYPE_FROM_CONFIG: dict[str, Release] = {"nemotron_h": (0, 13, 0)}
MAMBA_SSM_DTYPE_DEFAULT = "float16"


# Mamba-1 mixers (``MambaSpec.kind`` "mamba1") and attention-free models (every layer a mixer) in V1, read in the source
# of 0.11.0 to 0.18.0 (each minor), 0.21.0 and 0.26.0 (and 0.10.0 for Jamba):
#
# * Jamba: 0.10.0's ``JambaForCausalLM`` is ``SupportsV0Only`` (vllm/model_executor/models/jamba.py); 0.11.0 drops
#   it (V1 only from then on: V0 is gone).  0.10.1 and 0.10.2 were not read, so Jamba is served from 0.11.0.
# * ``mamba``, ``falcon_mamba``, ``mamba2`` (``MambaForCausalLM``, ``FalconMambaForCausalLM``,
#   ``Mamba2ForCausalLM``): 0.11.0 maps them to ``MambaModelConfig`` (vllm/model_executor/models/config.py
#   ``MODELS_CONFIG_MAP``), which turns prefix caching off; 0.12.0-0.26.0 leave it off by default
#   (vllm/config/model.py ``is_prefix_caching_supported``: "Attention free models do not support prefix caching")
#   and set ``mamba_block_size = max_model_len``.  0.10.x was not read for them.  Every layer's ``MambaSpec`` is the
#   same, so ``get_kv_cache_groups`` makes one group of all layers (``is_kv_cache_spec_uniform``): a request takes
#   one block, ``num_blocks = available // page // layers``.
# * Both: the state dtypes are ``MambaStateDtypeCalculator.mamba1_state_dtype`` = ``_mamba_state_dtype``, Mamba2's
#   rule ("auto": the model dtype for both states), and the shape ``mamba1_state_shape``: conv ``(d_conv - 1) x
#   intermediate``, SSM ``intermediate x d_state`` (vllm/model_executor/layers/mamba/mamba_utils.py).
# Releases after 0.25.x are refused as for the hybrids (MAMBA_HYBRID_PREFIX_CACHING_FROM; the layout of
# attention-free models there was not read beyond the prefix-caching default).
MAMBA1_V1_FROM: Release = (0, 11, 0)
STATE_SPACE_V1_FROM: Release = (0, 11, 0)

# Hybrid families whose mixers are neither Mamba kind, by ``MambaSpec.kind``: the first release that serves them (the
# model class in vllm/model_executor/models/registry.py, read in the 0.10.0-0.10.2 wheels), and the first release whose
# profile run of the mixer was not read (None: every release the hybrid rules cover).  Each family's state page is the
# same in 0.10.2-0.24.0 (vllm/model_executor/layers/mamba/mamba_utils.py, read in 0.10.2, 0.13.0, 0.17.0, 0.20.0,
# 0.24.0: the shapes change orientation only; every dtype "auto" is the model dtype):
#
# * "gated_deltanet" (Qwen3-Next): ``Qwen3NextForCausalLM`` is first registered in 0.10.2 ("Qwen3NextForCausalLM":
#   ("qwen3_next", ...), registry.py:77; absent in 0.10.1).  State: ``gated_delta_net_state_shape``
#   (mamba_utils.py:177-202 at 0.10.2) conv ``(linear_conv_kernel_dim - 1 + num_spec) x (2 nk dk + nv dv)``, temporal
#   ``nv x dk x dv``; ``gated_delta_net_state_dtype`` (mamba_utils.py:73-80): both ``mamba_cache_dtype`` or the model
#   dtype (0.17.0 on: the temporal one ``mamba_ssm_cache_dtype``, "auto": the same).  Profile run: 0.10.2-0.11.x run the
#   whole layer in the custom op ``gdn_attention``, whose ``_forward`` returns at "V1 profile run" before ``in_proj``
#   (qwen3_next.py:403-405 at 0.10.2); 0.12.0 moves ``in_proj_qkvz``, ``in_proj_ba``, the concatenated qkv, a zeroed
#   ``core_attn_out`` and the gated norm outside it (qwen3_next.py:433-488 at 0.12.0), into the compiled graph: those
#   tensors' lifetimes there were not read.
# * "short_conv" (LFM2): ``Lfm2ForCausalLM`` is first registered in 0.10.2 (registry.py:101; absent in 0.10.1).
#   State: ``short_conv_state_shape`` (mamba_utils.py:150-162 at 0.10.2) ``(conv_L_cache - 1) x conv_dim``,
#   ``short_conv_state_dtype`` (mamba_utils.py:63-71) the model dtype.  Profile run (``ShortConv.forward_cuda`` "V1
#   profile run", vllm/model_executor/layers/mamba/short_conv.py:131-143 at 0.10.2, the same branch at 0.24.0:141-146):
#   ``in_proj``'s B|C|x, ``B x x`` made contiguous, ``C x Bx`` and ``out_proj``'s result, all inside the custom op
#   ``short_conv``.
# * Zamba2's Mamba2 layers (kind "mamba2" with ``shared_attention_layers``) are served from MAMBA_HYBRID_FIRST:
#   ``Zamba2ForCausalLM`` is ``IsHybrid`` from 0.10.0 (zamba2.py:834), which 0.10.0-0.10.1 run on V0.
LINEAR_MIXER_V1_FROM: dict[str, Release] = {"gated_deltanet": (0, 10, 2), "short_conv": (0, 10, 2)}
LINEAR_MIXER_PROFILE_READ_BEFORE: dict[str, Release | None] = {"gated_deltanet": (0, 12, 0), "short_conv": None}

# Tensor parallelism of the mixers (``MambaSpec.kind``): the mixer tensors that vLLM shards over the tp ranks while
# transformers' modules (whose names the model's parameters keep) hold them whole, read in 0.10.2, 0.11.0 and 0.24.0
# (the layers' constructors are the same in the three; Gated DeltaNet in 0.10.2 and 0.11.0, the releases it is modelled
# in).  Column- and row-parallel projections (``in_proj``, ``in_proj_qkvz``, ``in_proj_ba``, ``out_proj``) are split
# already as the dense layers are; Mamba2's ``in_proj`` and ``conv1d`` also carry the extra groups
# (``serve/mamba_pages.py`` ``extra_groups_for_head_shards``).  What stays whole on every rank: Jamba's
# ``dt_layernorm``, ``b_layernorm``, ``c_layernorm`` (``RMSNorm`` of time_step_rank and state_size,
# mamba_mixer.py:130-147 at 0.11.0) and Qwen3-Next's ``norm`` (``RMSNormGated(head_v_dim)``, qwen3_next.py:294).
#
# * mamba2 (``MambaMixer2.__init__``, vllm/model_executor/layers/mamba/mamba_mixer2.py:289-447 at 0.11.0):
#   ``conv1d`` a (Merged)ColumnParallelLinear over conv_dim, ``A``/``D``/``dt_bias`` ``num_heads // tp_size``,
#   ``norm`` ``Mixer2RMSNormGated`` of ``intermediate_size // tp_size`` (``per_rank_hidden_size``).
# * mamba1 (``MambaMixer.__init__``, mamba_mixer.py:72-128 at 0.11.0): ``conv1d`` ColumnParallelLinear,
#   ``x_proj`` RowParallelLinear (its input split), ``dt_proj`` ColumnParallelLinear (weight and bias),
#   ``A`` ``intermediate_size // tp_size`` x state, ``D`` ``intermediate_size // tp_size``.
# * gated_deltanet (``Qwen3NextGatedDeltaNet.__init__``, vllm/model_executor/models/qwen3_next.py:236-292 at 0.11.0):
#   ``conv1d`` ColumnParallelLinear over conv_dim, ``dt_bias`` and ``A_log`` ``num_v_heads // tp_size``.
# * short_conv (``ShortConv.__init__``, mamba/short_conv.py:46-69 at 0.11.0): ``conv`` ColumnParallelLinear.
MIXER_TP_SHARDED: dict[str, frozenset[str]] = {
    "mamba2": frozenset({"conv1d", "A_log", "D", "dt_bias", "norm"}),
    "mamba1": frozenset({"conv1d", "x_proj", "dt_proj", "A_log", "D"}),
    "gated_deltanet": frozenset({"conv1d", "A_log", "dt_bias"}),
    "short_conv": frozenset({"conv"}),
}
# Zamba2's shared transformer blocks (``MambaSpec.shared_attention_layers``): their adapters' two matrices
# (``Zamba2LoRA``: ``A`` a ColumnParallelLinear of the rank with ``gather_output=True``, ``B`` a (Merged)ColumnParallel-
# Linear of the output, vllm/model_executor/models/zamba2.py:69-83 at 0.11.0, :76-86 at 0.10.2, :78-91 at 0.24.0), which
# transformers' ``linear_*_adapter_list`` and ``gate_up_proj_adapter_list`` hold whole: each rank holds ``1 / tp`` of
# both; the per-layer ``linear`` is a ``ReplicatedLinear`` (zamba2.py:583), whole as in transformers.
SHARED_BLOCK_TP_SHARDED_LISTS: frozenset[str] = frozenset({"linear_q_adapter_list", "linear_k_adapter_list",
                                                           "linear_v_adapter_list", "gate_up_proj_adapter_list"})

# Models with mixers (``MambaSpec`` layers) under FULL CUDA graphs (the default FULL_AND_PIECEWISE): each decode
# request needs one state block.  0.18.0 caps the capture sizes to the blocks (vllm/config/compilation.py
# ``adjust_cudagraph_sizes_for_mamba_cache``, called from gpu_model_runner.py); 0.21.0 and 0.26.0 instead raise
# "max_num_seqs (N) exceeds available Mamba cache blocks (B)" (``CompilationConfig`` ... ``max_num_reqs >
# kv_cache_config.num_blocks``, outside the profiling pass); 0.17.0 and earlier do neither.  0.19.x-0.20.x were not
# read (the report says so).
MAMBA_CAPTURE_CAP_FROM: Release = (0, 18, 0)
MAMBA_SEQS_CHECK_FROM: Release = (0, 21, 0)


def mamba_hybrid_rule(text: str) -> MambaHybridRule | None:
    """The hybrid-model row of a release string; None where vLLM does not serve such a model in V1 with one state
    page per request (before ``MAMBA_HYBRID_FIRST``, or from ``MAMBA_HYBRID_PREFIX_CACHING_FROM``)."""
    rel = parse_release(text)
    if rel < MAMBA_HYBRID_FIRST or rel >= MAMBA_HYBRID_PREFIX_CACHING_FROM:
        return None
    return [r for r in MAMBA_HYBRID_RULES if r.first <= rel][-1]


# Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``) by release: when ``vllm serve`` runs it instead of the V1
# ``GPUModelRunner`` on CUDA, and what its profile run's sampler holds (serve/vllm.py ``model_runner``).  Read in each
# release's wheel: ``VllmConfig.use_v2_model_runner`` (vllm/config/vllm.py) with ``_is_default_v2_model_runner_model``
# and ``_get_v2_model_runner_unsupported_features``; ``VLLM_USE_V2_MODEL_RUNNER`` (vllm/envs.py) set overrides it.
# 0.12.0-0.21.0 leave it off (envs.py ``VLLM_USE_V2_MODEL_RUNNER: bool = False``; 0.21.0 line 251); 0.22.0 turns the
# default to None, where the property decides.
#
# * ``models``: which models default to V2 (before the unsupported features are checked):
#   ``listed-dense`` (0.22-0.23): an architecture in ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``, not MoE, not quantized
#   (``return not model_config.is_moe and not model_config.is_quantized``); ``listed`` (0.24): a listed architecture;
#   ``dense-or-listed`` (0.25-0.28): a listed architecture or any non-MoE model (``... or not model_config.is_moe``),
#   never a hybrid (0.25-0.26: ``is_hybrid`` -> False; 0.27-0.28: unless listed, and no listed architecture is a
#   hybrid vramplan serves: hybrids from 0.26 are refused, MAMBA_HYBRID_PREFIX_CACHING_FROM) or attention-free; ``all``
#   (0.29 on): every model, the check of ``_is_default_v2_model_runner_model`` gone (ROCm keeps V1 for a list).
# * ``architectures``: ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` of the release.
# * ``hybrid_v2``: a hybrid attention + Mamba model can run V2 (0.22: "hybrid/mamba models" is an unsupported feature;
#   0.23-0.28 never default (not listed / ``is_hybrid``); 0.29 on: yes).
# * ``speculative``: the vramplan ``serve.speculative.method`` values V2 runs (vLLM's "draft_model" is ``draft``):
#   eagle, eagle3, mtp through 0.30 (0.30 lists "draft_model" and "ngram" as unsupported), draft from 0.31 (ngram
#   still listed), ngram from 0.32 (only "suffix", "medusa", "mlp_speculator", "custom_class" listed).
# * ``eagle3_pp``: EAGLE3 with pipeline parallelism runs V2 (0.22-0.29: "EAGLE3 with pipeline parallelism" listed).
# * ``draft_same_vocab``: 0.32 on: "heterogeneous-vocabulary draft models" fall back to V1.
# * ``sampler``: what ``GPUModelRunner._dummy_sampler_run`` (v1/worker/gpu/model_runner.py) holds beyond the logits
#   in the model dtype.  The dummy requests keep the sampling states' defaults (``SamplingStates.__init__``, sample/
#   states.py: top_k = vocab, top_p = 1.0), so top-k/top-p is skipped ("the sampler may skip top_k, top_p, and
#   logprobs", 0.22.0-0.32.0) and ``gumbel_sample`` (sample/gumbel.py) runs on blocks of 1024 entries:
#   ``fp32-copy``: ``apply_sampling_params`` copies the logits to fp32 first (``torch.empty_like(logits,
#   dtype=torch.float32).copy_(logits)``, 0.22.0-0.25.0 sample/sampler.py); ``in-place``: no copy (0.26.0: "the
#   input dtype is kept and mutated in place"; 0.27.0 ``_requires_logits_processing``, 0.28.0-0.32.0 ``if not
#   np.any(self.needs_logits_processing[idx_mapping_np]): return logits``: False for the dummy slots);
#   ``warmup-pass``: 0.33.0 runs a second pass with ``SamplingParams.for_sampler_warmup()`` (penalties, logit bias,
#   bad words, top-k 50, top-p, min-p, logprobs 5, watermarking: "the profiled peak must too" pay the fp32 pipeline),
#   not read term by term here.
RunnerModels = Literal["listed-dense", "listed", "dense-or-listed", "all"]
V2Sampler = Literal["fp32-copy", "in-place", "warmup-pass"]
_V2_ARCHS_025 = frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"})
_V2_ARCHS_026 = _V2_ARCHS_025 | {"InklingForCausalLM", "InklingForConditionalGeneration",
                                 "LongcatFlashNgramForCausalLM"}
_V2_ARCHS_027 = _V2_ARCHS_026 | {"KimiK3ForConditionalGeneration"}
_V2_SPEC = frozenset({"eagle", "eagle3", "mtp"})
V2_GUMBEL_BLOCK = 1024  # sample/gumbel.py gumbel_sample BLOCK_SIZE (0.22.0-0.33.0)
# per (request, block of 1024 entries): local_argmax int64 8 + local_max fp32 4 (``use_fp64_gumbel`` off by default)
V2_GUMBEL_BYTES_PER_BLOCK = 12


@dataclass(frozen=True, kw_only=True)
class ModelRunnerRule:
    first: Release
    read_at: tuple[Release, ...]
    models: RunnerModels
    architectures: frozenset[str]
    hybrid_v2: bool
    speculative: frozenset[str]
    eagle3_pp: bool
    draft_same_vocab: bool
    sampler: V2Sampler
    sources: tuple[str, ...]


_CFG = "vllm/config/vllm.py VllmConfig.use_v2_model_runner"
MODEL_RUNNER_V2_FIRST: Release = (0, 22, 0)
MODEL_RUNNER_RULES: tuple[ModelRunnerRule, ...] = (
    ModelRunnerRule(
        first=(0, 22, 0), read_at=((0, 22, 0),), models="listed-dense", architectures=frozenset({"Qwen3ForCausalLM"}),
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="fp32-copy",
        sources=("0.22.0 vllm/envs.py VLLM_USE_V2_MODEL_RUNNER: bool | None = None (line 264)",
                 (f"0.22.0 {_CFG}; _is_default_v2_model_runner_model: not is_moe and not is_quantized; "
                 "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES = frozenset({'Qwen3ForCausalLM'}) (line 69)"),
                 "0.22.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: fp32 copy (line 133)")),
    ModelRunnerRule(
        first=(0, 23, 0), read_at=((0, 23, 0),), models="listed-dense",
        architectures=frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="fp32-copy",
        sources=(f"0.23.0 {_CFG} (line 519); DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (line 69)",
                 "0.23.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: fp32 copy (line 144)")),
    ModelRunnerRule(
        first=(0, 24, 0), read_at=((0, 24, 0),), models="listed",
        architectures=_V2_ARCHS_025 | {"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"},
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="fp32-copy",
        sources=((f"0.24.0 {_CFG}; _is_default_v2_model_runner_model (line 550): any listed architecture "
                 "(DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, line 68)"),
                 "0.24.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: fp32 copy (line 157)")),
    ModelRunnerRule(
        first=(0, 25, 0), read_at=((0, 25, 0),), models="dense-or-listed", architectures=_V2_ARCHS_025,
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="fp32-copy",
        sources=((f"0.25.0 {_CFG}; _is_default_v2_model_runner_model: is_hybrid or is_attention_free -> False; "
                 "listed architecture or not is_moe"),
                 "0.25.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: fp32 copy (line 157)")),
    ModelRunnerRule(
        first=(0, 26, 0), read_at=((0, 26, 0),), models="dense-or-listed", architectures=_V2_ARCHS_026,
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="in-place",
        sources=(f"0.26.0 {_CFG} (line 550); _is_default_v2_model_runner_model (line 605)",
                 "0.26.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: no fp32 copy (line 152)")),
    ModelRunnerRule(
        first=(0, 27, 0), read_at=((0, 27, 0),), models="dense-or-listed", architectures=_V2_ARCHS_027,
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="in-place",
        sources=(f"0.27.0 {_CFG} (line 578); _is_default_v2_model_runner_model (line 637): a hybrid only if listed",
                 ("0.27.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: the fp32 copy (line 159) only "
                 "if _requires_logits_processing (line 200), False for the dummy slots (temperature 0, top_k = "
                 "vocab, top_p = 1: buffer_utils.py UvaBackedTensor torch.zeros, states.py fills)"))),
    ModelRunnerRule(
        first=(0, 28, 0), read_at=((0, 28, 0),), models="dense-or-listed",
        architectures=_V2_ARCHS_027 | {"DeepseekV4ForCausalLM"},
        hybrid_v2=False, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="in-place",
        sources=(f"0.28.0 {_CFG}; default_v2_model_runner_architectures (line 84)",
                 ("0.28.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: needs_logits_processing "
                 "(line 192)"))),
    ModelRunnerRule(
        first=(0, 29, 0), read_at=((0, 29, 0),), models="all", architectures=frozenset(),
        hybrid_v2=True, speculative=_V2_SPEC, eagle3_pp=False, draft_same_vocab=False, sampler="in-place",
        sources=(f"0.29.0 {_CFG} (line 645): no model check on CUDA; _get_v2_model_runner_unsupported_features",
                 "0.29.0 vllm/v1/worker/gpu/sample/sampler.py apply_sampling_params: needs_logits_processing")),
    ModelRunnerRule(
        first=(0, 30, 0), read_at=((0, 30, 0),), models="all", architectures=frozenset(),
        hybrid_v2=True, speculative=_V2_SPEC, eagle3_pp=True, draft_same_vocab=False, sampler="in-place",
        sources=(f"0.30.0 {_CFG} (line 675); unsupported: 'draft_model', 'ngram' methods; no EAGLE3 + pp line",)),
    ModelRunnerRule(
        first=(0, 31, 0), read_at=((0, 31, 0),), models="all", architectures=frozenset(),
        hybrid_v2=True, speculative=_V2_SPEC | {"draft"}, eagle3_pp=True, draft_same_vocab=False, sampler="in-place",
        sources=((f"0.31.0 {_CFG} (lines 701-759); unsupported methods: ngram, ngram_gpu, suffix, medusa, "
                 "mlp_speculator, custom_class"),)),
    ModelRunnerRule(
        first=(0, 32, 0), read_at=((0, 32, 0),), models="all", architectures=frozenset(),
        hybrid_v2=True, speculative=_V2_SPEC | {"draft", "ngram"}, eagle3_pp=True, draft_same_vocab=True,
        sampler="in-place",
        sources=((f"0.32.0 {_CFG} (line 703); unsupported: suffix, medusa, mlp_speculator, custom_class, "
                 "heterogeneous-vocabulary draft models"),
                 "0.32.0 vllm/v1/worker/gpu/model_runner.py _dummy_sampler_run: one pass on the default states")),
    ModelRunnerRule(
        first=(0, 33, 0), read_at=((0, 33, 0),), models="all", architectures=frozenset(),
        hybrid_v2=True, speculative=_V2_SPEC | {"draft", "ngram"}, eagle3_pp=True, draft_same_vocab=True,
        sampler="warmup-pass",
        sources=(f"0.33.0 {_CFG} (line 731); unsupported methods: suffix, custom_class",
                 ("0.33.0 vllm/v1/worker/gpu/model_runner.py _dummy_sampler_run (line 993): a second pass with "
                 "SamplingParams.for_sampler_warmup()"))),
)


def model_runner_rule(version: str) -> ModelRunnerRule | None:
    """The Model Runner V2 row of a release (None before ``MODEL_RUNNER_V2_FIRST``: V1 always)."""
    rel = parse_release(version)
    rows = [r for r in MODEL_RUNNER_RULES if r.first <= rel]
    return rows[-1] if rows else None


# --- The V0 fallback of 0.8.0-0.10.1 ---------------------------------------------------------------------------
# vllm/engine/arg_utils.py ``EngineArgs.create_engine_config``: ``if try_v1 and self._is_v1_supported_oracle(...)``
# else V0.  With VLLM_USE_V1 unset, ``_is_v1_supported_oracle`` returns False (the V0 engine) on a feature the V1
# engine lacks (``_raise_or_fallback``; with VLLM_USE_V1=1 set it raises NotImplementedError instead) or has only as
# an experiment (``_warn_or_fallback``: V0 unless VLLM_USE_V1=1 is set).  The oracle is gone in 0.10.2, whose
# create_engine_config no longer falls back (``V0_FALLBACK_UNTIL``).  Only the causes a scenario can express are
# listed: the GPU's compute capability, serve.kv_cache_dtype, serve.cpu_offload_gb, an fp32 serve.dtype
# (``V1_SUPPORTED_DTYPES``: bf16 and fp16, to 0.9.x), bitsandbytes weights (``V1_UNSUPPORTED_QUANT``, 0.8.0), LoRA and
# pipeline parallelism.
V0FallbackCause = Literal["cc", "kv_fp8", "cpu_offload", "dtype", "bnb", "lora", "pp"]
V0_FALLBACK_UNTIL: Release = (0, 10, 2)
# VLLM_USE_V1=0 runs V0 up to 0.10.2 (whose vllm/worker/worker.py determine_available_kv_cache_memory keeps the
# memory_profiling rule); 0.11.0 ships no vllm/worker/worker.py
V0_ENGINE_UNTIL: Release = (0, 11, 0)
# The V0 engine 0.8.0-0.10.1 ship runs the rules of the 0.6.5 row (read at 0.7.3): vllm/worker/worker.py
# Worker.determine_num_available_blocks is the same text at 0.7.3, 0.8.0 and 0.10.1 (memory_profiling,
# profiled_increase); vllm/config.py VllmConfig._set_cudagraph_sizes' ``if not envs.VLLM_USE_V1`` branch captures
# [1, 2, 4] + 8i up to the first size >= max_num_seqs (0.8.0, as 0.7.3's _BATCH_SIZES_TO_CAPTURE); SchedulerConfig
# gives 2048 tokens under chunked prefill (0.8.0 config.py _DEFAULT_MAX_NUM_BATCHED_TOKENS, 0.10.1
# config/scheduler.py DEFAULT_MAX_NUM_BATCHED_TOKENS) and EngineArgs._set_default_args_v0 turns chunked prefill on
# above 32K tokens (0.8.0, 0.9.1, 0.10.1).
V0_ENGINE_STANDIN = "0.7.3"


@dataclass(frozen=True, kw_only=True)
class V0FallbackRule:
    """The causes of the V0 fallback from release ``first`` on (until the next row or ``V0_FALLBACK_UNTIL``).

    ``lines``: (cause, line of vllm/engine/arg_utils.py at ``read_at[0]``) where the oracle tests it;
    ``fp8_v1_cc``: the compute-capability majors (or "major.minor") on which an fp8 KV cache stays on V1."""

    first: Release
    read_at: tuple[Release, ...]
    lines: tuple[tuple[V0FallbackCause, int], ...]
    fp8_v1_cc: tuple[str, ...] = ()
    source: str


V0_FALLBACK_RULES: tuple[V0FallbackRule, ...] = (
    V0FallbackRule(
        first=(0, 8, 0), read_at=((0, 8, 0),),
        lines=(("cc", 1475), ("kv_fp8", 1481), ("cpu_offload", 1493), ("dtype", 1500), ("bnb", 1508), ("lora", 1586),
               ("pp", 1590)),
        source=("0.8.0 _is_v1_supported_oracle: 'Compute Capability < 8.0'; 'No Fp8 KV cache so far' (any "
                "kv_cache_dtype but auto); 'No CPU offloading yet'; V1_SUPPORTED_DTYPES bf16, fp16; "
                "V1_UNSUPPORTED_QUANT bitsandbytes, gguf; LoRA and PP through _warn_or_fallback")),
    V0FallbackRule(
        first=(0, 8, 5), read_at=((0, 8, 5),), lines=(("cc", 1354), ("kv_fp8", 1371), ("dtype", 1384)),
        fp8_v1_cc=("9",),
        source=("0.8.5 _is_v1_supported_oracle: 'Compute Capability < 8.0'; an fp8 KV cache stays on V1 only where "
                "FlashAttention supports it (vllm/attention/utils/fa_utils.py flash_attn_supports_fp8: FA 3 and "
                "compute capability 9.x); V1_SUPPORTED_DTYPES bf16, fp16; V1_UNSUPPORTED_QUANT gguf only")),
    V0FallbackRule(
        first=(0, 9, 1), read_at=((0, 9, 1),), lines=(("cc", 1305), ("kv_fp8", 1324), ("dtype", 1343)),
        fp8_v1_cc=("9",),
        source="0.9.1 _is_v1_supported_oracle: as 0.8.5 (fa_utils.py flash_attn_supports_fp8: FA 3 and 9.x)"),
    V0FallbackRule(
        first=(0, 10, 0), read_at=((0, 10, 0),), lines=(("cc", 1350), ("kv_fp8", 1359)), fp8_v1_cc=("9", "10.0"),
        source=("0.10.0 _is_v1_supported_oracle: 'Compute Capability < 8.0'; kv_cache_dtype through "
                "vllm/platforms/cuda.py is_kv_cache_dtype_supported: compute capability 10.0, or fp8 with "
                "FlashAttention 3 on 9.x; no dtype check)")),
    V0FallbackRule(
        first=(0, 10, 1), read_at=((0, 10, 1),), lines=(("cc", 1403), ("kv_fp8", 1412)), fp8_v1_cc=("9", "10.0"),
        source="0.10.1 _is_v1_supported_oracle: as 0.10.0"),
)


def v0_fallback_rule(release: Release) -> V0FallbackRule | None:
    """The row of ``V0_FALLBACK_RULES`` for a release (None outside 0.8.0-0.10.1)."""
    if release >= V0_FALLBACK_UNTIL or release < V0_FALLBACK_RULES[0].first:
        return None
    return [row for row in V0_FALLBACK_RULES if row.first <= release][-1]
