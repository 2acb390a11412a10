"""How SGLang decides its KV-cache pool at start-up, term by term, by release.

SGLang sizes its token pool from a fraction of the memory that was free when it started,
not from the device's total (``python/sglang/srt/model_executor/model_runner.py``,
``init_torch_distributed``, ``profile_max_num_token`` and ``init_memory_pool``, unchanged in
this respect from 0.4.0 to 0.5.x):

1. After torch.distributed (and, with tp > 1, NCCL and the custom all-reduce) is set up,
   ``total_gpu_memory`` = the free memory in GiB (``get_available_gpu_memory``:
   ``torch.cuda.mem_get_info()`` after ``empty_cache``; the minimum over the ranks).
   The log prints it as "Load weight begin. avail mem=... GB".
2. The weights are loaded ("Load weight end. ... avail mem=... GB").
3. ``rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static)``
   and ``max_total_num_tokens = int(rest_memory * 2**30 // cell_size)``, where
   ``cell_size`` is what one token costs over all layers of one rank:
   ``kv_heads_per_rank x head_dim x layers x 2 (K, V) x element size`` for MHA/GQA and
   ``(kv_lora_rank + qk_rope_head_dim) x layers x element size`` for MLA (one latent, no
   separate V).  So the pool is ``mem_fraction_static x free - weights``: the fraction
   covers weights and KV; the rest (``1 - mem_fraction_static``) is left for activations,
   CUDA graphs and the request-to-token table.
4. ``max_total_num_tokens`` is rounded down to a multiple of ``page_size``; if it is <= 0
   start-up fails with ``RuntimeError("Not enough memory. Please try to increase
   --mem-fraction-static.")``.
5. ``max_num_reqs = min(max(int(tokens / context_len * 512), 2048), 4096)`` sizes the
   ``ReqToTokenPool`` (``(max_num_reqs + 1) x (context_len + 4)`` int32 before 0.4.7, allocated from the
   reserve), and the scheduler runs at most ``min(tokens // 2, rows)`` requests
   (``tp_worker.py``); 0.5.10's ``_resolve_max_num_reqs`` caps the table itself by ``tokens // 2``
   (``serve/sglang_requests.py`` ``REQ_RULES``, by release).  A request may hold up to ``min(context_len, tokens) - 1`` input
   tokens (``scheduler.py``, ``max_req_input_len``): SGLang starts even when one request of
   ``context_len`` does not fit.
6. The radix (prefix) cache keeps evicted sequences' pages in the same pool: it has no memory
   of its own.

What differs between releases is how ``mem_fraction_static``, ``chunked_prefill_size`` and
``cuda_graph_max_bs`` are defaulted (``python/sglang/srt/server_args.py``); see
``SGLANG_BEHAVIOURS``.  Worked example (docs.sglang.ai "Quick Start: Sending Requests",
2025-01-23, SGLang 0.4.1, Llama-3.1-8B on an H100, default fraction 0.88 at tp 1):
free 78.81 GiB, after weights 63.72 GiB: 63.72 - 78.81 x 0.12 = 54.26 GiB;
cell 8 x 128 x 32 x 2 x 2 B = 131,072 B: 54.26 x 2**30 / 131,072 = 444,5xx tokens; the log
prints max_total_num_tokens=444500.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Literal

from vramplan.analytic.overhead import cuda_context_bytes, nccl_bytes
from vramplan.catalog.models import load_model, model_config
from vramplan.errors import Problem, ScenarioError, VramplanError
from vramplan.serve.sglang_options import (
    SGLANG_ALGORITHM,
    DpRule,
    DraftShape,
    DraftSizing,
    SpecRule,
    dp_attention_problems,
    dp_rule_for,
    draft_shape,
    headroom_tokens,
    model_draft,
    mtp_draft,
    nextn_dp_rule_for,
    spec_rule_for,
)
from vramplan.serve.sglang_requests import RequestPool, captured_graph_bs, req_rule_for, request_pool
from vramplan.serve.vllm import multimodal_architecture, serve_weights_bytes
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.units import GiB, MiB, dtype_bits

__all__ = [
    "DEFAULT_SGLANG_VERSION",
    "NOT_ENOUGH_MEMORY",
    "SGLANG_BEHAVIOURS",
    "SglangBehaviour",
    "SglangDecision",
    "behaviour_for",
    "cell_size_bytes",
    "decide_sglang",
    "default_settings",
    "piecewise_graph_tokens",
    "rotary_cache_bytes_sglang",
    "vlm_fraction_factor",
]

# model_runner.py init_memory_pool, verbatim (0.4.0 to 0.5.x)
NOT_ENOUGH_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."

FractionRule = Literal["tp_table", "tp_table_large_gpu", "reserved_by_gpu", "reserved_by_settings"]


# model_config.py piecewise_cuda_graph_disabled_model_archs, by release (read in each wheel)
_PW_OFF_0510 = ("DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeV2_5ForCausalLM",
                "LLaDAModelLM")
_PW_OFF_0512 = (*_PW_OFF_0510, "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN")
_PW_OFF_0513 = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "Qwen3NextForCausalLM",
                "BailingMoeV2_5ForCausalLM", "LLaDAModelLM")
_PW_OFF_0514 = (*_PW_OFF_0513, "MiniMaxM3SparseForCausalLM")
_PW_OFF_0516 = (*_PW_OFF_0513, "DeepseekV4ForCausalLMDSpark")


@dataclass(frozen=True)
class SglangBehaviour:
    """How one range of SGLang releases defaults its start-up settings, with the source it was read from.

    ``small_gpu_graph_bs``: ``cuda_graph_max_bs`` below 35 GiB at tp < 4 (``reserved_by_settings`` only), and
    ``small_gpu_graph_bs_tp4`` at tp >= 4, ``small_gpu_chunk`` the chunked prefill size there;
    ``piecewise_graphs``: the reserve counts the piecewise (prefill) CUDA graphs, on by default, except for
    ``piecewise_off_archs``; ``vlm_fraction``: a defaulted fraction is scaled down for a multimodal model
    (``adjust_mem_fraction_for_vlm``); ``mm_reserve_mib``: MiB of the KV budget kept for multimodal allocations
    made after the pool is sized (``mm_runtime_reservation_gb``); ``graphs_off_prefill`` / ``graphs_off_decode``:
    ``--disable-cuda-graph`` drops the prefill / decode graphs' share of the reserve; ``prefill_graph_clamp``: the
    prefill graph token sizes stop at a given context length; ``graph_bs_capped``: a defaulted
    ``cuda_graph_max_bs`` is capped at a given ``max_running_requests``; ``weights_error``: start-up raises
    "Loaded weights leave no GPU memory ..." when the weights exceed the static budget."""

    release: str  # the first release with this behaviour
    fraction_rule: FractionRule
    sources: tuple[str, ...]
    small_gpu_graph_bs: int = 24
    piecewise_graphs: bool = False
    small_gpu_graph_bs_tp4: int = 80
    small_gpu_chunk: int = 2048
    piecewise_off_archs: tuple[str, ...] = _PW_OFF_0510
    vlm_fraction: bool = False
    mm_reserve_mib: int = 0
    graphs_off_prefill: bool = False
    graphs_off_decode: bool = False
    prefill_graph_clamp: bool = False
    graph_bs_capped: bool = False
    weights_error: bool = False


SGLANG_BEHAVIOURS: tuple[SglangBehaviour, ...] = (
    SglangBehaviour(
        release="0.4.0", fraction_rule="tp_table",
        sources=(
            ("python/sglang/srt/server_args.py ServerArgs.__post_init__ (0.4.x): 'Set mem fraction static, which "
             "depends on the tensor parallelism size': 0.79 at tp >= 16, 0.81 at tp >= 8, 0.85 at tp >= 4, 0.87 at "
             "tp >= 2, else 0.88; chunked_prefill_size 2048 below 25,000 MiB, else 8192; cuda_graph_max_bs 8 "
             "(tp < 4) or 80 below 25,000 MiB, else 160"),
            ("checked against docs.sglang.ai logs of January-May 2025 (mem_fraction_static=0.88 at tp 1; 0.85 "
             "at tp 4 with chunked_prefill_size=2048 and cuda_graph_max_bs=80 on 24 GB L4s)"),
        ),
    ),
    SglangBehaviour(
        release="0.4.7", fraction_rule="tp_table_large_gpu",
        sources=(
            ("0.4.7 and 0.4.7.post1 wheels, python/sglang/srt/server_args.py ServerArgs.__post_init__: the tp table "
             "only up to 81,920 MiB (else 0.88); above 180,000 MiB 0.79; above 96 GiB min(fraction + 48 GiB x (1 - "
             "fraction) / gpu_mem, (gpu_mem - 18 GiB) / gpu_mem) (20 GiB with speculative decoding); "
             "chunked_prefill_size 16384 above 180,000 MiB"),
            ("0.4.6.post2-post5 have the 96 GiB rule without the 180,000 MiB one; release strings are compared "
             "without their .postN, so 0.4.6.postN takes the 0.4.0 row (the two differ only above 81,920 MiB)"),
        ),
    ),
    SglangBehaviour(
        release="0.4.8", fraction_rule="reserved_by_gpu",
        sources=(
            ("sgl-project/sglang PR #7054 'Simplify the heuristics for setting --mem-fraction-static' (merged "
             "2025-06-10), server_args.py __post_init__: reserved = (2.8 + tp*pp/10) GiB below 35 GiB, "
             "(9.5 + tp*pp/2) GiB below 90 GiB, (12 + tp*pp/2) GiB below 160 GiB, else 32 GiB; +2 GiB with "
             "speculative decoding, +4 GiB with DP attention; fraction = round((gpu_mem - reserved) / gpu_mem, 3); "
             "chunked_prefill_size 2048 below 35 GiB, 8192 below 160 GiB, else 16384"),
            ("read in the 0.4.8, 0.4.9, 0.4.10, 0.5.1 and 0.5.2 wheels (0.4.7 still has the tp table); checked "
             "against the docs.sglang.ai log of 2025-06-16 (mem_fraction_static=0.874 on an 80 GB H100 at tp 1 = "
             "(81559 - 10240) / 81559)"),
        ),
    ),
    SglangBehaviour(
        release="0.4.10", fraction_rule="reserved_by_gpu", vlm_fraction=True,
        sources=(
            ("0.4.10 wheel, server_args.py __post_init__: after the 0.4.8 rule, a multimodal model's defaulted "
             "fraction is multiplied by adjust_mem_fraction_for_vlm's 0.95 x clamp(1 - 0.1 x (layers x hidden^2 / "
             "(24 x 1024^2) - 1), 0.8, 1.05), layers and hidden read from hf_config.vision_config with getattr "
             "defaults 24 and 1024 (0.4.9 does not adjust); the same function, unchanged, through 0.5.23"),
        ),
    ),
    SglangBehaviour(
        release="0.5.3", fraction_rule="reserved_by_settings", small_gpu_graph_bs=16, vlm_fraction=True,
        sources=(
            ("sgl-project/sglang PR #10975 'Use more general heuristics to set the default value of "
             "--mem-fraction-static' (merged 2025-09-27) and #11076 (2025-09-30), server_args.py "
             "_handle_gpu_memory_settings: chunked_prefill_size and cuda_graph_max_bs by GPU memory (2048/8 below "
             "20 GiB; 2048/16 or 80 below 35 GiB; 4096/32 or 160 below 60 GiB; 8192/256 or 512 below 160 GiB; "
             "16384/512 above; the second figure at tp >= 4), then reserved = 512 MiB + max(chunked_prefill_size, "
             "2048) x 1.5 MiB + cuda_graph_max_bs x 2 MiB + tp*pp/8 GiB, at least 10 GiB above 60 GiB, +2 GiB with "
             "EAGLE-style speculative decoding; fraction = round((gpu_mem - reserved) / gpu_mem, 3)"),
            "read in the 0.5.3 and 0.5.4 wheels (0.5.2 still reserves by GPU memory)",
        ),
    ),
    SglangBehaviour(
        release="0.5.5", fraction_rule="reserved_by_settings", small_gpu_graph_bs=24, vlm_fraction=True,
        sources=(
            ("0.5.5 wheel, server_args.py _handle_gpu_memory_settings: cuda_graph_max_bs 24 (was 16) below 35 GiB "
             "at tp < 4; the rest as 0.5.3. Read in 0.5.5 to 0.5.9 (their piecewise CUDA-graph reserve applies "
             "only with --enable-piecewise-cuda-graph, off by default)"),
        ),
    ),
    SglangBehaviour(
        release="0.5.10", fraction_rule="reserved_by_settings", small_gpu_graph_bs=24, piecewise_graphs=True,
        vlm_fraction=True,
        sources=(
            ("0.5.10 wheel, server_args.py _handle_gpu_memory_settings: piecewise CUDA graphs on by default "
             "(disable_piecewise_cuda_graph False), reserving len(piecewise_cuda_graph_tokens) x 8 MiB (1.5 GiB for "
             "MLA) before the 10 GiB floor; the token sizes are 4-32 by 4, 48-256 by 16, 288-512 by 32, 576-1024 by "
             "64, 1280-4096 by 256, 4608 up by 512, up to chunked_prefill_size (2048 for MLA) "
             "(_generate_piecewise_cuda_graph_tokens); _handle_piecewise_cuda_graph turns them off for multimodal "
             "models, speculative decoding, LoRA, pp > 1, DP attention and some architectures "
             "(model_config.py piecewise_cuda_graph_disabled_model_archs); --disable-cuda-graph leaves both "
             "reserves in place. 0.5.11 is the same (its architecture list too)"),
        ),
    ),
    SglangBehaviour(
        release="0.5.12", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0512,
        sources=(("0.5.12 wheel: as 0.5.10; configs/model_config.py adds DeepseekV4ForCausalLM(NextN) to the "
                 "architectures without piecewise graphs"),),
    ),
    SglangBehaviour(
        release="0.5.13", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0513, prefill_graph_clamp=True,
        sources=(("0.5.13 wheel, server_args.py _handle_gpu_memory_settings: piecewise_cuda_graph_max_tokens = "
                 "min(..., context_length) when --context-length is given (#21112); DeepseekV32 and GlmMoeDsa "
                 "leave the architecture list"),),
    ),
    SglangBehaviour(
        release="0.5.14", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0514, prefill_graph_clamp=True, graphs_off_prefill=True, weights_error=True,
        sources=(
            ("0.5.14 wheel, server_args.py: CUDA graphs configured per phase (cuda_graph_config decode/prefill "
             "backends; --disable-cuda-graph sets both to disabled, and the prefill graphs' reserve is counted only "
             "when the prefill backend is not disabled; the decode reserve max_bs x 2 MiB still always); the "
             "speculative-decoding reserve (+4/+6 GiB) leaves _handle_gpu_memory_settings; MiniMaxM3Sparse joins the "
             "architecture list"),
            ("0.5.14 wheel, model_runner_kv_cache_mixin.py: rest_memory <= 0 raises ValueError('Loaded weights "
             "leave no GPU memory for the KV cache under --mem-fraction-static=F. Raise --mem-fraction-static "
             "above ceil((1 - available/pre) x 1000) / 1000 ...')"),
        ),
    ),
    SglangBehaviour(
        release="0.5.15", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0514, prefill_graph_clamp=True, graphs_off_prefill=True, graphs_off_decode=True,
        weights_error=True,
        sources=(("0.5.15 wheel, server_args.py _handle_gpu_memory_settings: the decode graphs' reserve (max_bs x 2 "
                 "MiB) is counted only when the decode backend is not disabled"),),
    ),
    SglangBehaviour(
        release="0.5.16", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0516, prefill_graph_clamp=True, graphs_off_prefill=True, graphs_off_decode=True,
        weights_error=True,
        sources=(("0.5.16 wheel: MiniMaxM3Sparse leaves and DeepseekV4ForCausalLMDSpark joins the architecture list; "
                 "the reserve is otherwise as 0.5.15 (a post-capture KV sizing path exists behind "
                 "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, off by default)"),),
    ),
    SglangBehaviour(
        release="0.5.17", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0516, graphs_off_prefill=True, graphs_off_decode=True, weights_error=True,
        sources=(("0.5.17 wheel, server_args.py _handle_gpu_memory_settings: the context-length clamp of the "
                 "prefill graph sizes is removed"),),
    ),
    SglangBehaviour(
        release="0.5.18", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0516, graphs_off_prefill=True, graphs_off_decode=True, weights_error=True,
        mm_reserve_mib=100,
        sources=(("0.5.18 wheel, mem_cache/kv_cache_configurator.py _profile_available_bytes: rest_memory = available "
                 "- pre_model_load x (1 - fraction) - mm_runtime_reservation_gb, the latter SGLANG_VLM_CACHE_SIZE_MB "
                 "(100) for a multimodal model with the default cpu feature transport on one node (environ.py)"),),
    ),
    SglangBehaviour(
        release="0.5.20", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0516, graphs_off_prefill=True, graphs_off_decode=True, weights_error=True,
        mm_reserve_mib=100, small_gpu_chunk=4096, small_gpu_graph_bs=48, small_gpu_graph_bs_tp4=160,
        sources=(("0.5.20 wheel, arg_groups/memory_hook.py handle_gpu_memory_settings (moved out of server_args.py "
                 "in 0.5.19 without a numeric change): below 35 GiB chunked_prefill_size 4096 (was 2048) and "
                 "decode max_bs 48 at tp < 4, 160 at tp >= 4 (were 24 and 80); 0.5.21 is the same"),),
    ),
    SglangBehaviour(
        release="0.5.22", fraction_rule="reserved_by_settings", piecewise_graphs=True, vlm_fraction=True,
        piecewise_off_archs=_PW_OFF_0516, graphs_off_prefill=True, graphs_off_decode=True, weights_error=True,
        mm_reserve_mib=100, small_gpu_chunk=4096, small_gpu_graph_bs=48, small_gpu_graph_bs_tp4=160,
        graph_bs_capped=True,
        sources=(
            ("0.5.22 wheel, arg_groups/memory_hook.py: a defaulted decode max_bs larger than a given "
             "--max-running-requests is lowered to it (before the reserve is computed)"),
            ("0.5.23 wheel: the same rules (MLA prefill graph sizes up to min(8192, chunked_prefill_size), whose "
             "reserve stays the flat 1.5 GiB); releases after 0.5.23 were not read: they are assumed to follow it "
             "(the report says so)"),
        ),
    ),
)
# scenarios without serve.sglang_version keep the release they had before the table grew
DEFAULT_SGLANG_VERSION = "0.5.3"
# the newest minor series whose server_args.py was read; later series are refused rather than guessed
_NEWEST_SERIES = (0, 5)
# the newest release read: later ones are answered with its rules and say so
_NEWEST_READ = "0.5.23"
_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.\-+]?(?:post|rc|dev)\d*)*$")


def _parse(release: str) -> tuple[int, int, int] | None:
    m = _RELEASE.match(release.strip())
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def behaviour_for(release: str) -> tuple[SglangBehaviour, str]:
    """The modelled behaviour of ``release`` (the nearest earlier modelled one) and a sentence saying which.

    Refuses a string that is not a release, a release before the first modelled one and a minor series
    after the newest one read."""
    first, newest = SGLANG_BEHAVIOURS[0].release, f"{_NEWEST_SERIES[0]}.{_NEWEST_SERIES[1]}.x"
    modelled = f"modelled: SGLang {first} to {newest}"
    v = _parse(release)
    if v is None:
        raise ScenarioError([Problem("serve.sglang_version", f"{release!r} is not an SGLang release",
                                     f"give a release such as {DEFAULT_SGLANG_VERSION} ({modelled})")])
    if v < (_parse(first) or (0, 0, 0)) or v[:2] > _NEWEST_SERIES:
        raise ScenarioError([Problem("serve.sglang_version", f"SGLang {release} is outside the modelled range",
                                     f"{modelled}; choose a release in that range")])
    chosen = [b for b in SGLANG_BEHAVIOURS if (_parse(b.release) or (0, 0, 0)) <= v][-1]
    if (_parse(chosen.release) or (0, 0, 0)) == v:
        return chosen, f"SGLang {release}: behaviour of {chosen.release}"
    if v > (_parse(_NEWEST_READ) or (0, 0, 0)):
        return chosen, (f"SGLang {release}: behaviour of {chosen.release}, the nearest earlier modelled release; "
                        f"releases after {_NEWEST_READ} were not read and are assumed to follow it")
    return chosen, f"SGLang {release}: behaviour of {chosen.release}, the nearest earlier modelled release"


@dataclass(frozen=True)
class Settings:
    """SGLang's memory settings after its defaults are applied (``server_args.py``)."""

    mem_fraction_static: float
    fraction_given: bool
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    reserved_mib: float | None  # the heuristic's reserve, when the fraction was defaulted by one


def _bucket_defaults(beh: SglangBehaviour, gpu_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) of the release's rule, by GPU memory (MiB) and tp."""
    rule, small_tp = beh.fraction_rule, tp < 4
    if rule in ("tp_table", "tp_table_large_gpu"):
        if gpu_mib < 25_000:
            return 2048, 8 if small_tp else 80
        return (16384 if rule == "tp_table_large_gpu" and gpu_mib > 180_000 else 8192), 160
    if rule == "reserved_by_gpu":
        chunk = 2048 if gpu_mib < 35 * 1024 else 8192 if gpu_mib < 160 * 1024 else 16384
        return chunk, (8 if small_tp else 80) if gpu_mib < 35 * 1024 else 160
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return beh.small_gpu_chunk, beh.small_gpu_graph_bs if small_tp else beh.small_gpu_graph_bs_tp4
    if gpu_mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def _tp_table_fraction(tp: int) -> float:
    for at_least, fraction in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)):
        if tp >= at_least:
            return fraction
    return 0.88


def _tp_table_large_gpu_fraction(gpu_mib: float, parallel: int, keep_gib: int = 18) -> float:
    """0.4.7's fraction: the tp table up to 81,920 MiB, then its large-GPU adjustments (``SGLANG_BEHAVIOURS``;
    ``keep_gib`` 20 with speculative decoding).  An H200 (143,771 MiB), tp 1: min(0.88 + 49,152 x 0.12 / 143,771,
    (143,771 - 18,432) / 143,771) = min(0.92103, 0.87180) = 0.87180."""
    fraction = _tp_table_fraction(parallel) if gpu_mib <= 81920 else 0.88
    if gpu_mib > 180 * 1000:
        return 0.79
    if gpu_mib > 96 * 1024:
        return min(fraction + 48 * 1024 * (1 - fraction) / gpu_mib, (gpu_mib - keep_gib * 1024) / gpu_mib)
    return fraction


# python/sglang/srt/server_args.py _generate_piecewise_cuda_graph_tokens (0.5.10)
_PIECEWISE_STEPS = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256))


def piecewise_graph_tokens(max_tokens: int) -> list[int]:
    """The token counts SGLang 0.5.10 captures piecewise CUDA graphs for, up to ``max_tokens``.
    8192: 8 + 14 + 8 + 8 + 12 sizes up to 4096, then 4608-8192 by 512 (8): 58 sizes."""
    sizes = [n for lo, hi, step in _PIECEWISE_STEPS for n in range(lo, hi + 1, step)]
    sizes += list(range(4608, max_tokens + 1, 512))
    return [n for n in sizes if n <= max_tokens]


def _reserved_mib(rule: FractionRule, gpu_mib: float, parallel: int, chunk: int, graph_bs: int,
                  piecewise_mib: float = 0.0, decode_graphs: bool = True, spec_mib: int = 0, dp: int = 1) -> float:
    """The reserve (MiB) the release's heuristic keeps out of ``mem_fraction_static`` (module table);
    ``piecewise_mib``: the piecewise CUDA graphs' share (0.5.10 on), added before the 10 GiB floor;
    ``decode_graphs``: whether the decode graphs' ``graph_bs x 2`` MiB is counted (0.5.15 on: not with
    --disable-cuda-graph); ``spec_mib``: speculative decoding's share (``sglang_options.SPEC_RULES``), after the
    floor; ``dp``: DP attention's dp_size (``reserved_by_gpu``: 4 GiB more; ``reserved_by_settings``: graph_bs x
    dp x 3 MiB, and graph_bs x dp x 1.5 more above 300, before the floor; server_args.py 0.4.8 and 0.5.3)."""
    if rule == "reserved_by_gpu":
        extra = spec_mib + (4 * 1024 if dp > 1 else 0)
        if gpu_mib < 35 * 1024:
            return (2.8 + parallel / 10) * 1024 + extra
        if gpu_mib < 90 * 1024:
            return (9.5 + parallel / 2) * 1024 + extra
        if gpu_mib < 160 * 1024:
            return (12 + parallel / 2) * 1024 + extra
        return 32.0 * 1024 + extra
    graphs = graph_bs * 2 if decode_graphs else 0
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs + parallel / 8 * 1024 + piecewise_mib
    if dp > 1:
        reserved += graph_bs * dp * 3 + (graph_bs * dp * 1.5 if graph_bs > 300 else 0)
    return (max(reserved, 10.0 * 1024) if gpu_mib > 60 * 1024 else reserved) + spec_mib


def default_settings(beh: SglangBehaviour, gpu_total_bytes: int, tp: int, pp: int = 1,
                     fraction: float | None = None, chunked_prefill_size: int | None = None,
                     cuda_graph_max_bs: int | None = None, piecewise: Literal["off", "mha", "mla"] = "off",
                     graphs: bool = True, max_running_requests: int | None = None,
                     context_length: int | None = None, speculative: bool = False, spec_mib: int = 0,
                     dp: int = 1) -> Settings:
    """``mem_fraction_static``, ``chunked_prefill_size`` and ``cuda_graph_max_bs`` as the release defaults them.

    ``gpu_mem`` is read by SGLang from nvidia-smi's memory.total in MiB; the GPU's total memory in MiB is
    used here (nvidia-smi's figure is a few hundred MiB higher on data-centre cards: the fraction moves by
    less than 0.001).  Given values win, as in SGLang.  ``piecewise``: whether the release's piecewise CUDA
    graphs are on for this model (``mha``/``mla``: their reserve; only where ``beh.piecewise_graphs``);
    ``graphs``: false is --disable-cuda-graph; ``max_running_requests`` and ``context_length``: as given (null:
    not given), read where the release reads them (``beh.graph_bs_capped``, ``beh.prefill_graph_clamp``);
    ``speculative``, ``spec_mib`` and ``dp``: speculative decoding on, its reserve (MiB) and DP attention's
    dp_size (``_reserved_mib``; 0.4.7's large-GPU rule keeps 20 GiB instead of 18 with speculative decoding)."""
    gpu_mib = gpu_total_bytes / MiB
    d_chunk, d_bs = _bucket_defaults(beh, gpu_mib, tp)
    if beh.graph_bs_capped and max_running_requests is not None:
        d_bs = min(d_bs, max_running_requests)
    chunk = chunked_prefill_size if chunked_prefill_size is not None else d_chunk
    graph_bs = cuda_graph_max_bs if cuda_graph_max_bs is not None else d_bs
    if fraction is not None:
        return Settings(fraction, True, chunk, graph_bs, None)
    if beh.fraction_rule == "tp_table":
        return Settings(_tp_table_fraction(tp), False, chunk, graph_bs, None)
    if beh.fraction_rule == "tp_table_large_gpu":
        return Settings(_tp_table_large_gpu_fraction(gpu_mib, tp * pp, 20 if speculative else 18), False, chunk,
                        graph_bs, None)
    pw = 0.0
    if beh.piecewise_graphs and piecewise != "off" and (graphs or not beh.graphs_off_prefill):
        if piecewise == "mla":
            pw = 1.5 * 1024
        else:
            max_tokens = chunk
            if beh.prefill_graph_clamp and context_length is not None:
                max_tokens = min(max_tokens, context_length)
            pw = len(piecewise_graph_tokens(max_tokens)) * 8
    reserved = _reserved_mib(beh.fraction_rule, gpu_mib, tp * pp, chunk, graph_bs, pw,
                             decode_graphs=graphs or not beh.graphs_off_decode, spec_mib=spec_mib, dp=dp)
    return Settings(round((gpu_mib - reserved) / gpu_mib, 3), False, chunk, graph_bs, reserved)


# adjust_mem_fraction_for_vlm (0.4.10 to 0.5.23): the baseline tower is ViT-L/14, 24 layers of width 1024
_VIT_BASELINE_LAYERS, _VIT_BASELINE_HIDDEN = 24, 1024
# vision config classes whose default num_hidden_layers / hidden_size apply when config.json omits them
# (transformers CLIPVisionConfig.__init__ and SiglipVisionConfig.__init__: 12 layers of width 768)
_VISION_CLASS_DEFAULTS: dict[str, tuple[int, int]] = {"clip_vision_model": (12, 768), "siglip_vision_model": (12, 768)}


# model types whose vision config class names its depth ``depth`` and maps no num_hidden_layers to it in the
# transformers releases SGLang pins (read in 4.55.2, 4.57.1, 5.3.0 and 5.19.0: attribute_map only
# {"num_attention_heads": "num_heads"}), so SGLang's getattr reads its default 24
_DEPTH_NAMED = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


def vlm_fraction_factor(vision: dict[str, object], model_type: str = "") -> tuple[float, int, int, str]:
    """SGLang's ``adjust_mem_fraction_for_vlm`` factor for a multimodal model's ``vision_config``, with the
    layers and width it read and a note on where they came from.

    ``getattr(vision_config, "num_hidden_layers", 24)`` and ``getattr(..., "hidden_size", 1024)`` on the config
    object of the transformers release SGLang pins (4.54 to 5.19): Qwen2-VL, Qwen2.5-VL and Qwen3-VL's vision
    configs name their depth ``depth`` and map no ``num_hidden_layers`` to it in those releases (the map appears
    in later transformers), so SGLang reads 24 for them.  Factor = 0.95 x clamp(1 - 0.1 x (ratio - 1), 0.8,
    1.05), ratio = layers x hidden^2 / (24 x 1024^2).  Qwen2.5-VL-7B (hidden 1280, no num_hidden_layers):
    ratio = 24 x 1280^2 / (24 x 1024^2) = 1.5625, factor 0.95 x (1 - 0.05625) = 0.8965625."""
    layers_default, hidden_default = _VISION_CLASS_DEFAULTS.get(str(vision.get("model_type", "")),
                                                                (_VIT_BASELINE_LAYERS, _VIT_BASELINE_HIDDEN))
    raw_layers, raw_hidden = vision.get("num_hidden_layers"), vision.get("hidden_size")
    layers = raw_layers if isinstance(raw_layers, int) else layers_default
    hidden = raw_hidden if isinstance(raw_hidden, int) else hidden_default
    ratio = layers * hidden**2 / (_VIT_BASELINE_LAYERS * _VIT_BASELINE_HIDDEN**2)
    factor = 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
    missing = [k for k, v in (("num_hidden_layers", raw_layers), ("hidden_size", raw_hidden)) if not isinstance(v, int)]
    if not missing:
        note = "vision_config's num_hidden_layers and hidden_size"
    elif vision.get("model_type") in _VISION_CLASS_DEFAULTS:
        note = f"vision_config has no {' or '.join(missing)}: the config class's default"
    elif model_type in _DEPTH_NAMED and missing == ["num_hidden_layers"]:
        note = (f"{model_type}'s vision config names its depth 'depth' and maps no num_hidden_layers to it in the "
                "transformers releases SGLang pins: SGLang reads its getattr default 24")
    else:
        note = (f"vision_config has no {' or '.join(missing)}: SGLang's getattr default, the config class of the "
                "transformers release it pins being assumed to have none")
    return factor, layers, hidden, note


def cell_size_bytes(m: ModelSpec, tp: int, elem_bytes: int) -> int:
    """Bytes one token takes in the pool of one rank (``profile_max_num_token``'s ``cell_size``).

    MHA/GQA: ``max(1, kv_heads // tp) x head_dim x layers x 2 x elem`` (``get_num_kv_heads``
    replicates a head when tp exceeds the heads).  MLA: ``(kv_lora_rank + qk_rope_head_dim) x
    layers x elem``.  Llama-3.1-8B, bf16, tp 1: 8 x 128 x 32 x 2 x 2 = 131,072 B."""
    if m.mla is not None:
        return (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * m.num_layers * elem_bytes
    return max(1, m.num_kv_heads // tp) * m.head_dim * m.num_layers * 2 * elem_bytes


def rotary_cache_bytes_sglang(m: ModelSpec) -> int:
    """SGLang's rotary ``cos_sin_cache``: ``max_position x rotary_dim`` kept in fp32 on CUDA.

    ``python/sglang/srt/layers/rotary_embedding.py`` ``RotaryEmbedding.__init__`` casts the cache to the
    model dtype only off CUDA (the sgl-kernel rope reads fp32 cos/sin).  Llama-3.1-8B: 131,072 x 128 x 4 B
    = 64 MiB."""
    if m.position != "rope":
        return 0
    rot = m.mla.qk_rope_head_dim if m.mla is not None else m.head_dim
    return m.max_position_embeddings * rot * 4


@dataclass
class SglangDecision:
    """SGLang's start-up decision on one GPU (rank) of the job, and what it implies."""

    release: str
    behaviour: str
    model: str
    gpu: str
    tp: int
    total_memory_bytes: int
    cuda_context_bytes: int
    nccl_bytes: int
    free_at_start_bytes: int
    mem_fraction_static: float
    fraction_given: bool
    reserved_heuristic_bytes: int | None
    parameters_bytes: int
    rotary_cache_bytes: int
    weights_bytes: int
    static_budget_bytes: int  # mem_fraction_static x free at start: weights + KV pool
    cell_size_bytes: int
    page_size: int
    max_total_num_tokens: int
    kv_cache_bytes: int
    context_len: int
    max_num_reqs: int
    max_running_requests: int
    req_to_token_bytes: int
    reserve_bytes: int  # (1 - mem_fraction_static) x free at start: activations, CUDA graphs, tables
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    max_req_input_len: int
    max_concurrency: float
    starts: bool
    problem: str = ""
    fix: str = ""
    assumptions: list[str] = field(default_factory=list)
    in_use_by_others_bytes: int = 0  # hardware.memory_in_use_gib: other processes' share of total_memory_bytes
    speculative_algorithm: str = ""  # SGLang's --speculative-algorithm ("": off)
    speculative_headroom_tokens: int = 0  # tokens the shared pool adds past the profiled budget (0.4.5-0.5.6)
    draft_weights_bytes: int = 0  # the draft worker's weights once started
    draft_kv_tokens: int = 0  # the draft worker's own KV pool, tokens
    draft_kv_bytes: int = 0  # and bytes (0 where the draft's config could not be read)
    outside_fraction_bytes: int = 0  # the draft worker's (and the headroom's) bytes taken from the reserve
    dp_attention: int = 1  # --dp-size with --enable-dp-attention (1: off)
    req_to_token_rows: int = 0  # the request table's rows (serve/sglang_requests.py)
    req_to_token_width: int = 0  # and its columns: context_len + 4 (+ the draft tokens, 0.5.1 on)
    cuda_graph_captured_bs: int = 0  # the largest decode batch captured: cuda_graph_max_bs, or the table's rows

    @property
    def num_pages(self) -> int:
        return self.max_total_num_tokens // self.page_size

    @property
    def device_used_bytes(self) -> int:
        """What is held once started, activations and CUDA graphs apart: context, NCCL, weights, pool, table."""
        return (self.cuda_context_bytes + self.nccl_bytes + self.weights_bytes + self.kv_cache_bytes
                + self.req_to_token_bytes + self.draft_weights_bytes + self.draft_kv_bytes)

    def log_lines(self) -> list[str]:
        """The start-up lines SGLang would print, for comparison with a real log."""
        def g(n: int) -> str:
            return f"{n / GiB:.2f}"
        half = self.kv_cache_bytes // 2
        out = [
            f"Load weight begin. avail mem={g(self.free_at_start_bytes)} GB",
            (f"Load weight end. avail mem={g(self.free_at_start_bytes - self.weights_bytes)} GB, "
             f"mem usage={g(self.weights_bytes)} GB."),
        ]
        if self.starts:
            out.append(f"KV Cache is allocated. #tokens: {self.max_total_num_tokens}, K size: {g(half)} GB, "
                       f"V size: {g(half)} GB")
            out.append(f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size="
                       f"{self.chunked_prefill_size}, max_running_requests={self.max_running_requests}, "
                       f"context_len={self.context_len}")
        if self.problem:
            out.append(f"RuntimeError: {self.problem}")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "sglang_version": self.release, "sglang_behaviour_modelled": self.behaviour, "model": self.model,
            "gpu": self.gpu, "tp": self.tp, "total_memory_bytes": self.total_memory_bytes,
            **({"in_use_by_others_bytes": self.in_use_by_others_bytes} if self.in_use_by_others_bytes else {}),
            "cuda_context_bytes": self.cuda_context_bytes, "nccl_bytes": self.nccl_bytes,
            "free_at_start_bytes": self.free_at_start_bytes, "mem_fraction_static": self.mem_fraction_static,
            "mem_fraction_static_given": self.fraction_given,
            "reserved_heuristic_bytes": self.reserved_heuristic_bytes,
            "parameters_bytes": self.parameters_bytes, "rotary_cache_bytes": self.rotary_cache_bytes,
            "weights_bytes": self.weights_bytes, "static_budget_bytes": self.static_budget_bytes,
            "cell_size_bytes": self.cell_size_bytes, "page_size": self.page_size,
            "max_total_num_tokens": self.max_total_num_tokens, "num_pages": self.num_pages,
            "kv_cache_bytes": self.kv_cache_bytes, "context_len": self.context_len,
            "max_num_reqs": self.max_num_reqs, "max_running_requests": self.max_running_requests,
            "req_to_token_bytes": self.req_to_token_bytes, "reserve_bytes": self.reserve_bytes,
            "chunked_prefill_size": self.chunked_prefill_size, "cuda_graph_max_bs": self.cuda_graph_max_bs,
            "max_req_input_len": self.max_req_input_len, "max_concurrency": round(self.max_concurrency, 4),
            "starts": self.starts, "problem": self.problem, "fix": self.fix,
            "device_used_bytes": self.device_used_bytes, "assumptions": list(self.assumptions),
            **({"speculative_algorithm": self.speculative_algorithm,
                "speculative_headroom_tokens": self.speculative_headroom_tokens,
                "draft_weights_bytes": self.draft_weights_bytes, "draft_kv_tokens": self.draft_kv_tokens,
                "draft_kv_bytes": self.draft_kv_bytes, "outside_fraction_bytes": self.outside_fraction_bytes}
               if self.speculative_algorithm else {}),
            **({"dp_attention": self.dp_attention} if self.dp_attention > 1 else {}),
            **({"cuda_graph_captured_bs": self.cuda_graph_captured_bs}
               if self.cuda_graph_captured_bs < self.cuda_graph_max_bs else {}),
        }


def _refusals(r: Resolved) -> list[Problem]:
    """What this model of SGLang does not cover, refused rather than answered wrongly."""
    s = r.scenario
    problems: list[Problem] = []
    if s.parallel.pp > 1:
        problems.append(Problem("parallel.pp", "pipeline parallelism is not modelled for SGLang",
                                "use parallel.tp instead of parallel.pp"))
    if s.serve.max_model_len and s.serve.max_model_len > r.model.max_position_embeddings:
        # model_config.py: "User-specified context_length (...) is greater than the derived context_length (...)"
        # is a ValueError unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
        problems.append(Problem("serve.max_model_len", f"context length {s.serve.max_model_len} is greater than the "
                                f"model's {r.model.max_position_embeddings}",
                                f"use serve.max_model_len <= {r.model.max_position_embeddings} (SGLang refuses it "
                                "unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)"))
    if s.serve.kv_cache_dtype == "int8":
        problems.append(Problem("serve.kv_cache_dtype", "SGLang has no int8 KV cache",
                                "use auto, fp16, bf16 or fp8 (SGLang's fp8_e4m3 / fp8_e5m2)"))
    return problems


def _kv_elem_bytes(r: Resolved) -> int:
    kv, c = r.scenario.serve.kv_cache_dtype, dtype_bits(r.scenario.serve.dtype) // 8
    return {"auto": c, "fp16": 2, "bf16": 2, "fp8": 1}[kv]


def _fix(w: int, cell: int, page: int, free: int) -> str:
    """The change that makes SGLang start: the fraction that leaves one page of tokens, else more GPUs."""
    needed = (w + cell * page) / free if free > 0 else 2.0
    if needed < 0.99:
        return f"serve.mem_fraction_static >= {int(needed * 100 + 1) / 100:.2f}"
    return "raise parallel.tp (weights per GPU exceed the fraction of free memory) or quantize the weights"


def _problem(free: int, w: int, tokens: int, req_bytes: int, reserve: int, cell: int, page: int) -> tuple[str, str]:
    if w > free:
        return ((f"CUDA out of memory while loading the weights: {w / GiB:.2f} GiB on this GPU, "
                 f"{free / GiB:.2f} GiB free"), _fix(w, cell, page, free))
    if tokens <= 0:
        return NOT_ENOUGH_MEMORY, _fix(w, cell, page, free)
    if req_bytes > reserve:
        return ((f"CUDA out of memory allocating the request-to-token table ({req_bytes / GiB:.2f} GiB) in the "
                 f"{reserve / GiB:.2f} GiB left outside mem_fraction_static"),
                "lower serve.mem_fraction_static, serve.max_model_len (context length) or serve.max_running_requests")
    return "", ""


def _raw_config(r: Resolved) -> dict[str, object]:
    try:
        return model_config(r.scenario.model, offline=True)
    except (VramplanError, OSError):
        return {}


def _piecewise(r: Resolved, beh: SglangBehaviour, cfg: dict[str, object],
               multimodal: bool) -> Literal["off", "mha", "mla"]:
    """Whether SGLang's piecewise CUDA graphs are on for this scenario (server_args.py
    ``_handle_piecewise_cuda_graph``, 0.5.10 on): off for multimodal models and the release's architectures
    without them (``beh.piecewise_off_archs``), with speculative decoding and with DP attention; pp > 1 and LoRA
    are refused here before this is asked.  ``cfg``: the model's config.json; ``multimodal``: it is a multimodal
    architecture."""
    if multimodal or r.scenario.serve.speculative is not None or r.scenario.serve.dp_attention > 1:
        return "off"
    archs = cfg.get("architectures") or []
    if isinstance(archs, list) and any(a in beh.piecewise_off_archs for a in archs):
        return "off"
    return "mla" if r.model.mla is not None else "mha"


@dataclass(frozen=True)
class _Options:
    """Speculative decoding and DP attention as the release runs them (``sglang_options``)."""

    spec: SpecRule | None = None
    method: str = ""
    steps: int = 0
    draft: DraftSizing | None = None
    dp: int = 1
    dp_rule: DpRule | None = None
    shape: DraftShape | None = None  # --speculative-eagle-topk and --speculative-num-draft-tokens as run
    given_shape: bool = False  # serve.speculative gave eagle_topk or num_draft_tokens


def _draft_sizing(r: Resolved, method: str, cfg: dict[str, object], rule: SpecRule, dp_rule: DpRule | None = None,
                  dp: int = 1, release: tuple[int, int, int] = (0, 5, 3)) -> DraftSizing | None:
    """The draft worker of ``method`` (None: its config could not be read, where the release does not need it).
    Under DP attention (``dp_rule``) DeepSeek's NEXTN layer is placed as the target's (``_dp_model``), its embedding
    copy as the target's embedding and its head copy by ``NEXTN_DP_RULES``; its cell is the target's at tp / dp."""
    s, m = r.scenario, r.model
    tp, c, elem = s.parallel.tp, dtype_bits(s.serve.dtype) // 8, _kv_elem_bytes(r)
    spec = s.serve.speculative
    assert spec is not None
    if method == "mtp":
        nextn = cfg.get("num_nextn_predict_layers")
        if not isinstance(nextn, int) or nextn < 1:
            raise ScenarioError([Problem("serve.speculative.method", f"{m.name} has no MTP layers "
                                         "(num_nextn_predict_layers) for SGLang's NEXTN draft",
                                         "use method eagle, eagle3, draft or ngram")])
        if dp_rule is None:
            return mtp_draft(m, nextn, tp, s.parallel.ep, c, s.serve.quantization, cell_size_bytes(m, tp, elem)
                             // m.num_layers, tp)
        head = nextn_dp_rule_for(release)
        assert head is not None  # refused before 0.4.5 (dp_attention_problems)
        splits = {"replicated": 1, "attn_tp": tp // dp, "tp": tp}
        return mtp_draft(_dp_model(m, dp_rule, tp, dp), nextn, tp, s.parallel.ep, c, s.serve.quantization,
                         cell_size_bytes(m, tp // dp, elem) // m.num_layers, splits[dp_rule.embed], splits[head.head])
    if not spec.model:
        raise ScenarioError([Problem("serve.speculative.model", f"speculative method {method!r} needs a model",
                                     "give serve.speculative.model (SGLang's --speculative-draft-model-path)")])
    try:
        draft = load_model(spec.model, where="serve.speculative.model")
    except ScenarioError as e:
        if rule.pool == "cell_scaled" or method == "draft":
            # 0.5.14 on the pool is sized with the draft's layers; a STANDALONE draft's weights are large
            why = ("SGLang sizes the pool with its layers from 0.5.14" if rule.pool == "cell_scaled" else
                   "a STANDALONE draft's weights and pool come out of the reserve")
            raise ScenarioError([Problem("serve.speculative.model", f"the draft's config.json is needed ({why}): "
                                         f"{e}", "give a catalog model or a Hub id whose config.json is cached")])
        return None
    return model_draft(draft, tp, c, elem, method)


def _options(r: Resolved, beh: SglangBehaviour, cfg: dict[str, object]) -> _Options:
    sv, tp = r.scenario.serve, r.scenario.parallel.tp
    v = _parse(sv.sglang_version) or (0, 0, 0)
    spec = sv.speculative
    rule = spec_rule_for(v, spec.method) if spec is not None else None
    raw_archs = cfg.get("architectures")
    archs = [str(a) for a in raw_archs] if isinstance(raw_archs, list) else []
    dp_rule = dp_rule_for(v, archs) if sv.dp_attention > 1 else None
    problems = _data_expert_problems(r, v)
    if dp_rule is not None:
        problems += dp_attention_problems(r.model, archs, tp, sv.dp_attention, dp_rule,
                                          spec.method if spec else None, v)
    if problems:
        raise ScenarioError(problems)
    if spec is None or rule is None:
        return _Options(dp=sv.dp_attention, dp_rule=dp_rule)
    shape = draft_shape(v, spec.method, spec.num_speculative_tokens, spec.eagle_topk, spec.num_draft_tokens,
                        sv.page_size or 1)
    draft = None if spec.method == "ngram" else _draft_sizing(r, spec.method, cfg, rule, dp_rule, sv.dp_attention, v)
    return _Options(rule, spec.method, spec.num_speculative_tokens, draft, sv.dp_attention, dp_rule, shape,
                    spec.eagle_topk != 1 or spec.num_draft_tokens is not None)


# SGLang releases whose expert parallelism was read: 0.4.6 (--enable-ep-moe sets ep_size = tp_size, server_args.py
# __post_init__; EPMoE holds num_experts // tp_size whole experts, layers/moe/ep_moe/layer.py) and 0.5.3
# (--ep-size / --expert-parallel-size / --ep, any divisor of tp: distributed/parallel_state.py moe_tp_size =
# tensor_model_parallel_size // moe_ep_size, each expert split over the moe_tp ranks, fused_moe_triton/layer.py)
_EP_IS_TP_FROM, _EP_DIVIDES_TP_FROM = (0, 4, 6), (0, 5, 3)


def _data_expert_problems(r: Resolved, v: tuple[int, ...]) -> list[Problem]:
    """serve.dp and parallel.ep as SGLang has them (``_EP_IS_TP_FROM``, ``_EP_DIVIDES_TP_FROM``)."""
    sv, par = r.scenario.serve, r.scenario.parallel
    out: list[Problem] = []
    if sv.dp > 1 and sv.dp_attention > 1:
        out.append(Problem("serve.dp", "SGLang has one --dp-size: serve.dp_attention is --dp-size with "
                           "--enable-dp-attention (ranks inside the tp group), serve.dp is --dp-size without it "
                           "(replicas on their own GPUs)", "set one of serve.dp and serve.dp_attention, the other 1"))
    if par.ep > 1:
        given = sv.sglang_version
        if v < _EP_IS_TP_FROM:
            out.append(Problem("parallel.ep", f"SGLang {given}'s expert parallelism was not read (read: 0.4.6, "
                               "--enable-ep-moe, and 0.5.3, --ep-size)", "set serve.sglang_version 0.4.6 or later"))
        elif par.ep > par.tp or par.tp % par.ep:
            out.append(Problem("parallel.ep", f"SGLang's expert-parallel group lies inside the tensor-parallel group "
                               f"(moe_tp_size = tp // ep): ep {par.ep} must divide tp {par.tp}",
                               f"set parallel.ep {par.tp} or a divisor of it"))
        elif par.ep != par.tp and v < _EP_DIVIDES_TP_FROM:
            out.append(Problem("parallel.ep", f"SGLang 0.4.6's --enable-ep-moe sets ep_size = tp_size; an ep below tp "
                               f"was read at 0.5.3 only (SGLang {given} given)",
                               f"set parallel.ep {par.tp}, or serve.sglang_version 0.5.3 or later"))
    return out


def _data_expert_notes(r: Resolved) -> list[str]:
    """What serve.dp and parallel.ep change under SGLang, said in the report."""
    sv, par, m = r.scenario.serve, r.scenario.parallel, r.model
    out: list[str] = []
    attn_tp = par.tp // sv.dp if sv.dp_attention else par.tp
    if m.mla is None and m.mamba is None and 0 < m.num_kv_heads < attn_tp:
        # sglang/srt/layers/linear.py QKVParallelLinear: num_kv_head_replicas = attn_tp_size / total_num_kv_heads
        out.append(f"not modelled: attention tensor parallel {attn_tp} over {m.num_kv_heads} KV heads replicates them "
                   "(SGLang's QKVParallelLinear: one whole K and V head per rank); the weights count the K and V "
                   f"projections at 1/{attn_tp}")
    if sv.dp > 1:
        out.append(f"--dp-size {sv.dp} without DP attention: {sv.dp} replicas, each a tp {par.tp} x pp {par.pp} "
                   "group on its own GPUs (managers/data_parallel_controller.py: base_gpu_id += tp_size x pp_size); "
                   "each sizes its own pool exactly as with serve.dp 1, and max_running_requests is not divided "
                   f"(tp_worker.py: only with --enable-dp-attention): {sv.dp} x these tokens across the replicas")
    if par.ep > 1 and m.moe is not None:
        out.append(f"expert parallel --ep-size {par.ep}: {m.moe.num_experts // par.ep} whole experts per MoE layer on "
                   f"each GPU, each split over tp / ep = {par.tp // par.ep} rank(s) in its intermediate dimension "
                   "(moe_tp_size, distributed/parallel_state.py)"
                   + ("; the MoE expert and tensor groups' own NCCL communicators are not counted"
                      if par.ep < par.tp else ""))
    return out


def _over_group(p: ParamGroup, dp: int) -> ParamGroup:
    """``p`` as held when split over the attention group of tp / dp ranks instead of all tp: the same split over tp
    of a parameter ``dp`` times larger (a column-parallel matrix's outputs, a row-parallel one's inputs)."""
    if p.tp == "row":
        return replace(p, numel=p.numel * dp, in_features=p.in_features * dp)
    return replace(p, numel=p.numel * dp, out_features=p.out_features * dp)


def _dp_model(m: ModelSpec, rule: DpRule, tp: int, dp: int) -> ModelSpec:
    """The model as DeepSeek's and Qwen-MoE's code place it under DP attention: the attention projections split over the
    attention group of tp / dp ranks (whole on every rank at dp = tp), the embedding and LM head replicated or split
    as the release does (``DP_RULES``); the rest as without DP attention."""
    whole = {"embedding": rule.embed == "replicated", "lm_head": rule.lm_head == "replicated"}
    group = {"embedding": rule.embed == "attn_tp", "lm_head": rule.lm_head == "attn_tp"}
    params = []
    for p in m.params:
        attention = ".self_attn." in p.name and p.tp in ("column", "row")
        if whole.get(p.role, False) or ((attention or group.get(p.role, False)) and dp == tp):
            params.append(replace(p, tp="replicated"))
        elif attention or group.get(p.role, False):
            params.append(_over_group(p, dp))
        else:
            params.append(p)
    return replace(m, params=tuple(params))


def _spec_pools(o: _Options, tokens: int, max_num_reqs: int, cell: int, page: int) -> tuple[int, int, int, int]:
    """(target tokens, headroom tokens, draft pool tokens, draft pool bytes) of the release's pool rule."""
    if o.spec is None or o.method == "ngram":
        return tokens, 0, 0, 0
    shape = o.shape or DraftShape(1, o.steps + 1)
    head = headroom_tokens(o.spec, max_num_reqs, o.steps, shape.topk, shape.draft_tokens)
    target = tokens + head if o.spec.pool == "shared_headroom" else tokens
    draft_tokens = (tokens + head) // page * page if o.spec.pool == "draft_headroom" else target // page * page
    draft_cell = o.draft.cell_bytes if o.draft is not None else 0
    return target // page * page, head, draft_tokens, draft_tokens * draft_cell


def decide_sglang(r: Resolved) -> SglangDecision:
    """SGLang's start-up decision for a resolved ``task: serve`` scenario with ``serve.engine: sglang``."""
    problems = _refusals(r)
    if problems:
        raise ScenarioError(problems)
    s, m, gpu = r.scenario, r.model, r.gpu
    sv, tp = s.serve, s.parallel.tp
    beh, which = behaviour_for(sv.sglang_version)
    cfg, multimodal = _raw_config(r), bool(multimodal_architecture(r))  # read once: a Hub id's comes from disk
    o = _options(r, beh, cfg)
    # the default fraction reads the device's whole memory (get_device_memory_capacity); the pool is sized from
    # what is free at start, which other processes' memory (hardware.memory_in_use_gib) leaves out
    st = default_settings(beh, gpu.device_total_bytes, tp, s.parallel.pp, sv.mem_fraction_static,
                          sv.chunked_prefill_size, sv.cuda_graph_max_bs, _piecewise(r, beh, cfg, multimodal), graphs=sv.cuda_graphs,
                          max_running_requests=sv.max_running_requests, context_length=sv.max_model_len,
                          speculative=o.spec is not None, spec_mib=o.spec.reserve_for(o.method) if o.spec else 0,
                          dp=o.dp)
    if o.spec is not None and o.spec.prefill_unchunked:
        st = replace(st, chunked_prefill_size=-1)  # server_args.py (0.4.3): chunked prefill off with EAGLE
    if o.dp_rule is not None:
        # server_args.py: chunked_prefill_size // dp_size (// 2 at 0.4.1-0.4.4), after the fraction is set
        st = replace(st, chunked_prefill_size=st.chunked_prefill_size // (o.dp if o.dp_rule.chunk_by_dp else 2))
    vlm_note, mm_reserve, rule_st = "", 0, st
    if multimodal:
        vision = cfg.get("vision_config")
        if beh.vlm_fraction and not st.fraction_given and isinstance(vision, dict):
            factor, layers, hidden, where = vlm_fraction_factor(vision, str(cfg.get("model_type", "")))
            vlm_note = (f"multimodal model: the default fraction {st.mem_fraction_static} is scaled by "
                        f"adjust_mem_fraction_for_vlm's {factor:.4f} ({layers} tower layers of width {hidden}; "
                        f"{where}) to {st.mem_fraction_static * factor:.4f}")
            st = replace(st, mem_fraction_static=st.mem_fraction_static * factor)
        mm_reserve = beh.mm_reserve_mib * MiB
    # SGLang measures the memory free at start, before a workload's kernels are loaded
    ctx, comm = cuda_context_bytes(gpu, at_start=True), (nccl_bytes(1) if tp > 1 else 0)
    free = gpu.total_memory_bytes - ctx - comm
    params, _ = serve_weights_bytes(r if o.dp_rule is None else replace(r, model=_dp_model(m, o.dp_rule, tp, o.dp)))
    rotary = rotary_cache_bytes_sglang(m)
    w = params + rotary
    cell, page = cell_size_bytes(m, tp // o.dp, _kv_elem_bytes(r)), sv.page_size or 1
    scaled = o.spec is not None and o.spec.pool == "cell_scaled" and o.draft is not None and o.draft.layers > 0
    # 0.5.14 on the draft is loaded before the pool is sized, and its KV layers join the cell (pool_configurator.py)
    profile_cell = int(cell * (1 + o.draft.layers / m.num_layers)) if scaled and o.draft else cell
    loaded = w + (o.draft.load_bytes if scaled and o.draft else 0)
    # profile_max_num_token, in SGLang's own GiB floats: rest = avail - total * (1 - fraction)
    rest_gib = (free - loaded) / GiB - free / GiB * (1 - st.mem_fraction_static) - mm_reserve / GiB
    profiled = max(0, int(rest_gib * GiB // profile_cell)) if loaded <= free else 0
    tokens = profiled // page * page
    context_len = sv.max_model_len or m.max_position_embeddings
    default_reqs = o.spec.running_default if o.spec is not None else None
    given_reqs = sv.max_running_requests or default_reqs
    # the request table and the running limit (serve/sglang_requests.py REQ_RULES); before 0.5.10 its size is read
    # from the profiled tokens, before the speculative headroom (0.4.5-0.5.6) and the page rounding
    req_rule = req_rule_for(_parse(sv.sglang_version) or (0, 0, 0))
    shape = o.shape if o.spec is not None else None
    capacity = tokens  # the page-aligned capacity 0.5.10 on reads

    def pool_of(pool_tokens: int) -> RequestPool:
        return request_pool(req_rule, profiled, capacity, pool_tokens, context_len, given_reqs, o.dp,
                            shape.draft_tokens if shape else None)

    max_num_reqs = pool_of(tokens).max_num_reqs
    if o.spec is not None:
        # with speculative decoding the headroom is added before the page rounding
        tokens, headroom, draft_tokens, draft_kv = _spec_pools(o, profiled, max_num_reqs, cell, page)
    else:
        headroom, draft_tokens, draft_kv = 0, 0, 0
    if scaled and o.draft:
        draft_kv = draft_tokens * o.draft.cell_bytes
    reqs = pool_of(tokens)
    running, req_bytes = reqs.running, reqs.table_bytes
    graph_bs_captured = captured_graph_bs(st.cuda_graph_max_bs, reqs.rows)
    reserve = free - int(free * st.mem_fraction_static)
    # before 0.5.14 the draft worker loads its weights and pool after the target's pool, from the reserve, and the
    # shared pool's headroom (0.4.5-0.5.6) is allocated past the budget
    outside = 0
    if o.spec is not None and not scaled:
        target_extra = headroom * cell if o.spec.pool == "shared_headroom" else 0
        outside = target_extra + draft_kv + (o.draft.load_bytes if o.draft else 0)
    problem, fix = _problem(free, loaded, tokens, req_bytes, reserve, cell, page)
    if not problem and running <= 0:
        # managers/tp_worker.py (0.4.7 on): assert self.max_running_requests > 0
        problem = "max_running_request is zero (an assertion in tp_worker.py)"
        fix = (f"raise serve.max_running_requests to at least serve.dp_attention ({o.dp}): each DP rank gets "
               f"{given_reqs} // {o.dp} = 0 requests" if given_reqs and given_reqs < o.dp else
               "raise serve.mem_fraction_static (half the pool is under one token)")
    if not problem and outside and req_bytes + outside > reserve:
        problem = (f"CUDA out of memory loading the draft worker: it needs {outside / GiB:.2f} GiB (weights, KV pool"
                   f"{', headroom' if headroom else ''}) beside the {req_bytes / GiB:.2f} GiB request table in the "
                   f"{reserve / GiB:.2f} GiB left outside mem_fraction_static")
        fix = "lower serve.mem_fraction_static (SGLang loads the draft after sizing the target's pool)"
    if beh.weights_error and loaded <= free and rest_gib <= 0:
        # kv_cache_configurator.py / model_runner_kv_cache_mixin.py (0.5.14 on), in SGLang's GiB floats
        minimum = 1 - (free - loaded) / free
        problem = (f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
                   f"{st.mem_fraction_static}. Raise --mem-fraction-static above {math.ceil(minimum * 1000) / 1000:.3f}")
    dec = SglangDecision(
        release=sv.sglang_version, behaviour=which, model=m.name, gpu=gpu.name, tp=tp,
        total_memory_bytes=gpu.device_total_bytes, in_use_by_others_bytes=gpu.in_use_by_others_bytes,
        cuda_context_bytes=ctx, nccl_bytes=comm, free_at_start_bytes=free,
        mem_fraction_static=st.mem_fraction_static, fraction_given=st.fraction_given,
        reserved_heuristic_bytes=None if st.reserved_mib is None else int(st.reserved_mib * MiB),
        parameters_bytes=params, rotary_cache_bytes=rotary, weights_bytes=w,
        static_budget_bytes=int(free * st.mem_fraction_static), cell_size_bytes=cell, page_size=page,
        max_total_num_tokens=tokens, kv_cache_bytes=tokens * cell,
        context_len=context_len, max_num_reqs=max_num_reqs, max_running_requests=running,
        req_to_token_bytes=req_bytes, reserve_bytes=reserve, chunked_prefill_size=st.chunked_prefill_size,
        cuda_graph_max_bs=st.cuda_graph_max_bs, max_req_input_len=max(0, min(context_len, tokens) - 1),
        max_concurrency=tokens / context_len if context_len else 0.0, starts=not problem, problem=problem, fix=fix,
        req_to_token_rows=reqs.rows, req_to_token_width=reqs.width, cuda_graph_captured_bs=graph_bs_captured,
        speculative_algorithm=SGLANG_ALGORITHM[o.method] if o.spec else "", speculative_headroom_tokens=headroom,
        draft_weights_bytes=o.draft.resident_bytes if o.draft else 0, draft_kv_tokens=draft_tokens,
        draft_kv_bytes=draft_kv, outside_fraction_bytes=outside, dp_attention=o.dp,
    )
    dec.assumptions = _assumptions(r, dec, beh, rule_st) + _option_notes(o, dec, profile_cell, sv.cuda_graphs)
    if vlm_note:
        dec.assumptions.insert(2, vlm_note)
    if mm_reserve:
        dec.assumptions.append(f"{beh.mm_reserve_mib} MiB of the KV budget kept for multimodal allocations made "
                               "after the pool is sized (SGLANG_VLM_CACHE_SIZE_MB, cpu feature transport)")
    return dec


def _option_notes(o: _Options, d: SglangDecision, profile_cell: int, graphs: bool = True) -> list[str]:
    out: list[str] = []
    if o.spec is not None:
        pool = {"draft_headroom": "the target keeps the profiled tokens; the draft's pool adds max_num_reqs x steps "
                                  "+ 100",
                "shared_headroom": (f"target and draft pools share indices and add a headroom of max_num_reqs x "
                                    f"(steps x topk + draft tokens) + 100 = {d.speculative_headroom_tokens:,} tokens "
                                    "past the profiled budget"),
                "shared": "target and draft pools hold the same tokens",
                "cell_scaled": (f"the draft's KV layers join the cell ({d.cell_size_bytes:,} -> {profile_cell:,} B per "
                                "token) and its weights are loaded before the pool is sized")}[o.spec.pool]
        shape = o.shape or DraftShape(1, o.steps + 1)
        if o.given_shape:
            out.append(f"speculative decoding ({d.speculative_algorithm}, SGLang {o.spec.release} rule): {pool}; "
                       f"--speculative-num-steps {o.steps}, --speculative-eagle-topk {shape.topk}, "
                       f"--speculative-num-draft-tokens {shape.draft_tokens} (serve.speculative)")
        else:
            out.append(f"speculative decoding ({d.speculative_algorithm}, SGLang {o.spec.release} rule): {pool}; "
                       f"--speculative-num-steps {o.steps}, --speculative-eagle-topk 1, --speculative-num-draft-tokens "
                       f"{shape.draft_tokens} assumed (serve.speculative.num_speculative_tokens is the steps)")
        if shape.note:
            out.append(shape.note)
        if d.req_to_token_width > d.context_len + 4:
            out.append(f"request table rows {d.context_len:,} + 4 + {shape.draft_tokens} draft tokens wide (SGLang 0.5.1 "
                       "on: extra_max_context_len)")
        if o.method != "ngram" and graphs:
            reserve = (f"the default fraction keeps {o.spec.reserve_for(o.method)} MiB for 'draft models and cuda "
                       "graphs'" if o.spec.reserve_for(o.method) else "no reserve of its own in the default fraction")
            out.append(f"the draft worker's CUDA graphs (draft decode, batch sizes up to {d.cuda_graph_captured_bs} x "
                       f"topk {shape.topk}, and draft extend, {shape.draft_tokens} tokens a request) are captured after "
                       f"the pools, from the reserve; their memory is not modelled ({reserve})")
        if o.spec.prefill_unchunked:
            out.append("chunked prefill (chunked_prefill_size -1) and the radix cache are off with EAGLE at this "
                       "release")
        if o.method == "ngram":
            out.append("n-gram proposer: no draft weights or KV pool on the GPU (its cache is on the host)")
        elif o.draft is None:
            out.append("draft head's config.json not readable: its weights and KV pool (taken from the reserve "
                       "outside mem_fraction_static before 0.5.14) are not counted")
        else:
            out.append(o.draft.note)
    if o.dp_rule is not None:
        out.append(f"DP attention, dp {o.dp} of tp {d.tp} (SGLang {o.dp_rule.release} rule): attention weights split "
                   f"over groups of {d.tp // o.dp} rank(s), embedding {o.dp_rule.embed}, LM head {o.dp_rule.lm_head}, the "
                   "MoE and dense MLPs split as without it; each DP group has its own pool of max_total_num_tokens")
    return out


# An MoE or MLA model at tp > 1 served without serve.dp_attention says what DP attention would change
# (serve/sglang_options.py DP_RULES; PR #7054: 4 GiB more reserved at 0.4.8 to 0.5.2).
_DP_ATTENTION_NOT_MODELLED = (
    "DP attention (--enable-dp-attention) off: this is the pool without it (serve.dp_attention sets it; modelled for "
    "DeepSeek-V2/V3 and Qwen2/Qwen3-MoE). With it each rank runs attention at tp / dp, each DP rank keeps its own pool for its "
    "own requests, chunked prefill is divided and the default fraction reserves more")


def _assumptions(r: Resolved, d: SglangDecision, beh: SglangBehaviour, st: Settings) -> list[str]:
    sv, m = r.scenario.serve, r.model
    fraction = (f"mem_fraction_static {st.mem_fraction_static} as given" if st.fraction_given else
                f"mem_fraction_static {st.mem_fraction_static}: the default of {beh.release}'s rule "
                f"({beh.fraction_rule})")
    out = [
        d.behaviour,
        fraction,
        (f"free memory at start = total - CUDA context {d.cuda_context_bytes / GiB:.2f} GiB"
         + (f" - NCCL {d.nccl_bytes / GiB:.2f} GiB" if d.nccl_bytes else "")
         + "; SGLang takes mem_fraction_static of it for weights + KV pool"),
        (f"the reserve ({d.reserve_bytes / GiB:.2f} GiB) holds activations (chunked prefill "
         f"{d.chunked_prefill_size} tokens), CUDA graphs (batch sizes up to {d.cuda_graph_max_bs}) and the "
         "request-to-token table; activations and graphs are not modelled (SGLang does not profile them)"),
        f"page size {d.page_size} token(s)" + ("" if sv.page_size else " (SGLang's default; MLA backends "
                                                "such as flashmla use 64)"),
        "radix (prefix) cache: shares the pool, no memory of its own",
        "rotary cos/sin cache kept in fp32 (CUDA)",
    ]
    if any(la.sliding_window for la in m.layers):
        out.append("sliding-window layers counted as full attention (SGLang's hybrid SWA pool, "
                   "swa_full_tokens_ratio, is not modelled; SGLang disables it for Gemma-2/3 and gpt-oss)")
    if d.tp > 1 and (m.moe is not None or m.mla is not None) and d.dp_attention == 1:
        out.append(_DP_ATTENTION_NOT_MODELLED)
    out += _data_expert_notes(r)
    if d.cuda_graph_captured_bs < d.cuda_graph_max_bs and r.scenario.serve.cuda_graphs:
        out.append(f"decode CUDA graphs captured up to batch {d.cuda_graph_captured_bs}, the request table's rows "
                   f"(cuda_graph_max_bs {d.cuda_graph_max_bs}; cuda_graph_runner.py get_batch_sizes_to_capture)")
    if d.starts and d.max_req_input_len + 1 < d.context_len:
        out.append(f"one request of context_len {d.context_len:,} does not fit the pool: SGLang starts and caps "
                   f"input at {d.max_req_input_len:,} tokens")
    return out
