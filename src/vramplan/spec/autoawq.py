"""What ``framework: autoawq`` (AutoAWQ's fused-module inference) accepts, and its cache window.

The estimate itself is ``analytic/autoawq.py``; this module refuses, with the reason read in AutoAWQ's source,
every scenario the estimate does not model, so that no setting is silently ignored.
"""

from __future__ import annotations

from vramplan.errors import Problem
from vramplan.facts.autoawq import AutoAwqRelease, autoawq_release
from vramplan.spec.fields import changed_fields
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = ["FUSED_MODEL_TYPES", "autoawq_problems", "autoawq_window"]

# model types whose AutoAWQ fuser builds ``LlamaLikeBlock``s with ``QuantAttentionFused`` (awq/models/llama.py and
# mistral.py ``LlamaFuser``/``MistralFuser``, v0.1.6-v0.2.3); the others' fused blocks (MPT, Falcon, Mixtral's MoE,
# Qwen2's biased q/k/v) are not modelled
FUSED_MODEL_TYPES = ("llama", "mistral")


def autoawq_window(s: Scenario, m: ModelSpec, row: AutoAwqRelease) -> int:
    """Positions of the fused cache window: ``inference.autoawq.max_seq_len``, else the release's default.

    0.2.x: ``from_quantized(max_seq_len=2048)``; 0.1.x: ``max_new_tokens=None`` takes the config's
    ``max_position_embeddings`` (``_load_config``), 32,768 for Mistral-7B-v0.1.
    """
    given = s.inference.autoawq.max_seq_len
    if given is not None:
        return given
    return row.default_window if row.default_window is not None else m.max_position_embeddings


def _set_without_framework(s: Scenario) -> list[Problem]:
    """AutoAWQ settings given to a scenario of another framework: they would be ignored."""
    out = []
    given = sorted(changed_fields(s.inference.autoawq))
    for key in given:
        out.append(Problem(f"inference.autoawq.{key}", "is a setting of AutoAWQ's fused inference, but the framework "
                           f"is {s.effective_framework}: it would be ignored", "set framework: autoawq, or drop it"))
    if s.software.autoawq is not None:
        out.append(Problem("software.autoawq", f"names an AutoAWQ release, but the framework is "
                           f"{s.effective_framework}: it would be ignored", "set framework: autoawq, or drop it"))
    return out


def _setting_problems(s: Scenario) -> list[Problem]:
    """The settings AutoAWQ's fused path fixes (fp16, one GPU, its own attention) given otherwise."""
    inf, out = s.inference, []
    # a value, not the key's presence: a saved scenario (model_dump, the solvers' documents) carries the default
    # bf16, which the report states as not read (analytic/autoawq.py); another value is refused
    if inf.dtype not in ("fp16", type(inf).model_fields["dtype"].default):
        out.append(Problem("inference.dtype", f"AutoAWQ's fused inference runs in fp16 (from_quantized "
                           f"torch_dtype=torch.float16, WindowedCache .half()), not {inf.dtype}",
                           "set inference.dtype: fp16, or leave it out"))
    if inf.kv_cache_dtype not in ("auto", "fp16"):
        out.append(Problem("inference.kv_cache_dtype", "AutoAWQ's WindowedCache is fp16",
                           "set inference.kv_cache_dtype: auto"))
    if s.hardware.num_gpus > 1 or s.parallel.tp > 1:
        out.append(Problem("hardware.num_gpus", "AutoAWQ's fused inference is modelled on one GPU (its multi-GPU "
                           "device_map splits layers, which is not modelled)", "set num_gpus: 1 and parallel.tp: 1"))
    # the other parallel settings (ZeRO, offload, pp, cp, ep, ...) are not read by the fused path: refused when given
    for key in sorted(k for k in changed_fields(s.parallel) if k != "tp"):
        out.append(Problem(f"parallel.{key}", "is not read by AutoAWQ's fused inference (one GPU, no sharding or "
                           "offload is modelled)", f"leave parallel.{key} at its default"))
    if inf.images_per_sample:
        out.append(Problem("inference.images_per_sample", "AutoAWQ's fused text model takes no images",
                           "set images_per_sample: 0"))
    # a value, not the key's presence: sdpa is the default (what a dumped scenario carries)
    if changed_fields(inf, ("attention",)):
        out.append(Problem("inference.attention", f"AutoAWQ's fused attention computes its own scores: "
                           f"attention {inf.attention} would be ignored", "leave inference.attention out"))
    if inf.bnb_compute_dtype is not None:
        out.append(Problem("inference.bnb_compute_dtype", "is a bitsandbytes setting: AutoAWQ would ignore it",
                           "leave it out"))
    if not inf.autoawq.fuse_layers:
        out.append(Problem("inference.autoawq.fuse_layers", "false keeps transformers' modules with AWQ linears, "
                           "which framework autoawq does not model", "drop framework: autoawq to estimate "
                           "transformers' generate with quantization awq-4bit"))
    return out


def autoawq_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Why a scenario cannot be estimated as AutoAWQ's fused inference ([] when it can, or when the framework is
    another and sets none of its keys)."""
    if s.framework != "autoawq":
        return _set_without_framework(s)
    if s.task != "inference":
        return [Problem("framework", f"autoawq is AutoAWQ's fused inference; task {s.task} is not estimated for it",
                        "set task: inference, or another framework")]
    try:
        row = autoawq_release(s.software.autoawq)
    except ValueError as exc:
        return [Problem("software.autoawq", str(exc), "name one of the releases read, or leave it out (0.2.3)")]
    out = _setting_problems(s)
    if s.inference.quantization != "awq-4bit":
        out.append(Problem("inference.quantization", f"AutoAWQ runs AWQ checkpoints, not {s.inference.quantization}",
                           "set inference.quantization: awq-4bit"))
    if m.model_type not in FUSED_MODEL_TYPES or m.moe is not None or m.hidden_size != m.num_attention_heads * m.head_dim:
        out.append(Problem("model", f"AutoAWQ's fused {m.model_type} blocks are not modelled (LlamaLikeBlock of "
                           f"{', '.join(FUSED_MODEL_TYPES)} with head_dim = hidden_size / heads only)",
                           "estimate transformers' generate (drop framework: autoawq)"))
    if s.inference.num_beams > 1:
        # the fused blocks' WindowedCache is allocated for from_quantized's batch_size and has no reorder_cache
        out.append(Problem("inference.num_beams", f"is {s.inference.num_beams}: beam search over AutoAWQ's fused "
                           "blocks is not modelled (their WindowedCache is made for from_quantized's batch_size and is "
                           "not reordered between beams)", "set inference.num_beams: 1, or drop framework: autoawq"))
    window = autoawq_window(s, m, row)
    if s.inference.prompt_len > window:
        out.append(Problem("inference.prompt_len", f"the prompt ({s.inference.prompt_len} tokens) is longer than "
                           f"AutoAWQ's cache window ({window} positions): WindowedCache.update_kv cannot write it",
                           f"raise inference.autoawq.max_seq_len (from_quantized {row.window_argument}=...) to at "
                           "least the prompt length"))
    return out
