"""vLLM engine arguments and the ``vllm serve`` command line for a serving setup.

Field names are ``vllm.engine.arg_utils.EngineArgs`` dataclass fields, and each CLI flag is the
field name with dashes (``EngineArgs.add_cli_args``), as in vllm-project/vllm
``vllm/engine/arg_utils.py`` (commit 001999d2f360c2c5da23a916510c273b1a73d06c; the same names in
the V1 engine releases the estimator models).  vLLM does not install without a GPU, so the tests
check the exported names against ``ENGINE_ARGS_FIELDS`` below, copied from that dataclass.
"""

from __future__ import annotations

import shlex
from typing import Any

from vramplan.facts.quantization import quant_format
from vramplan.plan.setup import ServeSetup

__all__ = ["ENGINE_ARGS_FIELDS", "vllm_command", "vllm_engine_args"]

# EngineArgs fields used here (vllm/engine/arg_utils.py, class EngineArgs)
ENGINE_ARGS_FIELDS = frozenset({
    "model", "dtype", "kv_cache_dtype", "max_model_len", "pipeline_parallel_size", "tensor_parallel_size",
    "block_size", "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "quantization",
    "enforce_eager", "enable_prefix_caching", "swap_space", "seed", "revision",
})
# choices of --dtype and --kv-cache-dtype in the same file
DTYPE_CHOICES = frozenset({"auto", "half", "float16", "bfloat16", "float", "float32"})
KV_CACHE_DTYPE_CHOICES = frozenset({"auto", "fp8", "fp8_e5m2", "fp8_e4m3"})

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def vllm_engine_args(s: ServeSetup, model: str, revision: str | None = None) -> dict[str, Any]:
    """``EngineArgs(**args)`` for one replica; ``model``: a Hub id or a local folder (``export/hub.py``),
    ``revision``: its branch, tag or commit (``EngineArgs.revision``, ``--revision``), None for the default."""
    args: dict[str, Any] = {
        "model": model, "tensor_parallel_size": s.tp, "pipeline_parallel_size": s.pp, "dtype": _DTYPE[s.dtype],
        "max_model_len": s.max_model_len, "gpu_memory_utilization": s.gpu_memory_utilization,
        "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
        "block_size": s.block_size, "kv_cache_dtype": "fp8" if s.kv_cache_dtype == "fp8" else "auto",
    }
    if s.quantization != "none":
        flag = quant_format(s.quantization).vllm_quantization
        if not flag:  # HQQ: vLLM has no method for it (spec/load.py _serve_format_problems)
            raise ValueError(f"vLLM has no --quantization value for {s.quantization}")
        args["quantization"] = flag
    if revision is not None:
        args["revision"] = revision
    return args


def vllm_command(args: dict[str, Any]) -> str:
    """``vllm serve MODEL --flag value ...`` (flags = field names with dashes)."""
    parts = ["vllm", "serve", str(args["model"])]
    for key, value in args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                parts.append(flag)
            continue
        parts.extend([flag, str(value)])
    return shlex.join(parts)
