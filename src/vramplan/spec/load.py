"""Reading a scenario from a file, text or mapping, and checking it against its model.

All problems are collected and raised together as one ``ScenarioError``.  Looking the model and
GPU names up needs the catalog, a layer above ``spec``: ``vramplan.catalog.resolve.resolve`` does
that and returns the ``Resolved`` record defined here.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import ValidationError

from vramplan.errors import Problem, ScenarioError, suggest
from vramplan.facts.accelerate import (
    FSDP2_NO_UPCAST,
    FSDP2_WHOLE_MODEL,
    FSDP_UPCAST_RELEASE,
    FSDP_UPCAST_SOURCE,
    TRAINER_ACCELERATE_FSDP_SINCE,
)
from vramplan.facts.mx_training import BLOCK_SIZE as MX_BLOCK
from vramplan.facts.mx_training import NVFP4_REFUSAL
from vramplan.facts.peft_targets import (
    LITGPT_LORA_DEFAULT,
    LITGPT_LORA_SOURCE,
    PEFT_RELEASE,
    TORCHTUNE_LORA_RECIPE,
    TORCHTUNE_LORA_SOURCE,
    UNMAPPED_FALLBACK,
)
from vramplan.facts.pipeline_schedules import interleaved_rounds, pipeline_schedule
from vramplan.facts.quantization import bnb_formats, quant_format
from vramplan.facts.torchtune import (
    FROZEN_NF4_SINCE,
    NF4_BLOCK,
    NF4_SCALER_BLOCK,
    TORCHTUNE_PRECISIONS,
    TORCHTUNE_QUANTIZATION,
)
from vramplan.facts.transformers import OWN_MODEL_FRAMEWORKS
from vramplan.facts.unsloth import (
    UNSLOTH_FAMILIES,
    UNSLOTH_OFFLOADED_CKPT_FIRST,
    UNSLOTH_ROWS,
    forward_of,
    release3,
    unsloth_row,
)
from vramplan.facts.vllm_releases import mxfp4_triton_installed
from vramplan.spec.autoawq import autoawq_problems
from vramplan.spec.checks import held_module_notes
from vramplan.spec.defaults import UNREAD_SERVE_DTYPE, checkpointing, torch_fsdp2
from vramplan.spec.families.base import PREQUANTIZED_SUPPORTED
from vramplan.spec.fields import changed_fields
from vramplan.spec.gpu import GpuSpec, cuda_capability
from vramplan.spec.lora_match import (
    experts_are_parameters,
    module_paths,
    stock_bnb_quantizes_experts,
    target_matches,
    unmatched_lora_targets,
)
from vramplan.spec.megatron import megatron_problems, megatron_schedule_problems, megatron_unmodelled
from vramplan.spec.model import CheckpointQuant, ModelSpec
from vramplan.spec.scenario import (
    Float8Training,
    MXTraining,
    Peft,
    Scenario,
    TrainQuant,
    engine_option_problems,
)
from vramplan.spec.vision import image_problems, vision_notes
from vramplan.spec.vision_quant import tower_quant_problems

__all__ = [
    "HOPPER_SWIZZLE_NOTE",
    "IN_BACKWARD_STEPS",
    "MAX_DOCUMENT_BYTES",
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "MAX_PATH_CHARS",
    "MAX_VALUES",
    "Resolved",
    "checkpoint_quantization_for",
    "cross_check",
    "fsdp_upcast_for",
    "in_backward_problems",
    "lora_targets_for",
    "parse_scenario",
    "parse_text",
    "quant_format_assumptions",
    "read_bounded_text",
    "read_document",
    "release_attention_for",
    "torchao_offload_problems",
    "unmatched_lora_targets",
    "unmodelled_inputs",
    "unsloth_attention_for",
]


@dataclass(frozen=True)
class Resolved:
    """A scenario with its model and GPU looked up and cross-checked."""

    scenario: Scenario
    model: ModelSpec
    gpu: GpuSpec
    # what resolving decided for the user and the report states (a pre-quantized checkpoint's format)
    assumptions: tuple[str, ...] = ()


# Input limits, checked before a parser sees the text (issue 19: a deeply nested document overflowed
# the JSON and YAML parsers' recursion, /dev/zero was read without end).  A scenario or config.json is a
# few kilobytes (the largest bundled config.json, with its quantization tables, is under 40 KB), so
# these bounds refuse only what no real input is.
MAX_DOCUMENT_BYTES = 1 << 20
"""Largest scenario or config.json read (1 MiB)."""
MAX_NESTING = 32
"""Deepest nesting of mappings and lists in a document (a scenario needs 4, a config.json about 5)."""
MAX_PATH_CHARS = 4096
"""Longest file name accepted (Linux's PATH_MAX)."""
MAX_INT_DIGITS = 19
"""Most digits of an integer in a document: every count the schema takes fits in 64 bits."""
MAX_VALUES = 100_000
"""Most values (mappings, lists and scalars, YAML aliases counted each time they are used) in a document."""


def _problem(where: str, message: str, hint: str = "") -> ScenarioError:
    return ScenarioError([Problem(where, message, hint)])


def _shown(p: Path) -> str:
    text = str(p)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text):,} characters)"


def read_bounded_text(path: str | Path, where: str = "scenario", max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """The UTF-8 text of a regular file (or a pipe) of at most ``max_bytes``, else a ``ScenarioError``.

    Devices (``/dev/zero``), directories and other special files are refused before reading; a pipe
    (``/dev/stdin``) is read up to ``max_bytes`` + 1 bytes, so an endless stream cannot exhaust memory.
    """
    import stat

    p = Path(path)
    if len(str(p)) > MAX_PATH_CHARS:
        raise _problem(where, f"file name of {len(str(p)):,} characters is too long",
                       f"at most {MAX_PATH_CHARS:,} characters")
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise _problem(where, f"no such file: {_shown(p)}",
                       "give the path of a .yaml, .json or .toml file") from None
    except OSError as exc:
        raise _problem(where, f"cannot read {_shown(p)}: {exc.strerror or exc}", "") from None
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        kind = "a directory" if stat.S_ISDIR(mode) else "a device or special file"
        raise _problem(where, f"{_shown(p)} is {kind}, not a regular file", "give the path of a file")
    try:
        with p.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise _problem(where, f"cannot read {_shown(p)}: {exc.strerror or exc}", "") from None
    if len(raw) > max_bytes:
        raise _problem(where, f"{_shown(p)} is larger than {max_bytes:,} bytes",
                       "a scenario or config.json is a few kilobytes; check the path")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _problem(where, f"{_shown(p)} is not UTF-8 text ({exc.reason} at byte {exc.start})", "") from None


def _bracket_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside quoted strings: a linear scan, no recursion."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _value_problems(data: Any, where: str) -> list[Problem]:
    """Nesting deeper than ``MAX_NESTING``, more than ``MAX_VALUES`` values (a YAML alias bomb), integers
    beyond 64 bits, NaN or infinite floats: an iterative walk, so it cannot overflow the stack."""
    import math

    out: list[Problem] = []
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    seen = 0
    while stack and len(out) < 10:
        value, key, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            out.append(Problem(where, f"more than {MAX_VALUES:,} values", "a scenario holds a few dozen"))
            break
        at = key or where
        if depth > MAX_NESTING:
            out.append(Problem(where, f"nested deeper than {MAX_NESTING} levels", "a scenario nests 4 levels"))
            break
        if isinstance(value, dict):
            stack.extend((v, f"{key}.{k}" if key else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{key}[{i}]", depth + 1) for i, v in enumerate(value))
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int) and not -(2**63) <= value < 2**63:
            out.append(Problem(at, "integer beyond 64 bits", "give a realistic value"))
        elif isinstance(value, float) and not math.isfinite(value):
            out.append(Problem(at, f"{value} is not a finite number", "give a number"))
    return out


def parse_text(text: str, suffix: str, where: str = "scenario", name: str = "") -> Any:
    """Parse JSON, YAML or TOML text (by ``suffix``; YAML also reads JSON) within the limits above.

    ``where`` is the option the problems are reported under; ``name`` the file named in them.
    """
    kind = {".toml": "TOML", ".json": "JSON"}.get(suffix.lower(), "YAML")
    name = name or "the document"
    if _bracket_depth(text) > MAX_NESTING:
        raise _problem(where, f"{name} is nested deeper than {MAX_NESTING} levels", "a scenario nests 4 levels")
    try:
        if kind == "TOML":
            data: Any = tomllib.loads(text)
        elif kind == "JSON":
            data = json.loads(text, parse_int=_bounded_int)
        else:
            data = yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError, tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, RecursionError):
            first = f"nested deeper than {MAX_NESTING} levels"
        raise _problem(where, f"{name} is not valid {kind}: {first}", "fix the syntax") from None
    problems = _value_problems(data, where)
    if problems:
        raise ScenarioError(problems)
    return data


def read_document(path: str | Path) -> dict[str, Any]:
    """Parse a JSON, YAML or TOML file (chosen by suffix; YAML also reads JSON), within the input limits.

    A relative model path in the document that names a file next to the document (``model:
    sub/config.json``) is read against the document's folder, as a path in a config file is; a name
    found only against the working directory still works (the catalog and the working directory are
    tried as before).
    """
    p = Path(path)
    text = read_bounded_text(p, "scenario")
    data = parse_text(text, p.suffix, "scenario", _shown(p))
    if not isinstance(data, dict):
        raise ScenarioError([Problem("scenario", f"{_shown(p)} must hold a mapping of keys (model, task, ...)",
                                     "see examples/ for the format")])
    model = data.get("model")
    if isinstance(model, str) and model.strip() and not Path(model).expanduser().is_absolute():
        beside = p.parent / model
        try:
            if p.parent != Path(".") and beside.exists():
                data["model"] = str(beside)
        except OSError:
            pass
    return data


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(x) for x in loc)


def parse_scenario(data: dict[str, Any] | Scenario) -> Scenario:
    if isinstance(data, Scenario):
        return data
    if not isinstance(data, dict):
        raise ScenarioError([Problem("scenario", f"a scenario is a mapping of keys, not {type(data).__name__}",
                                     "see examples/ for the format")])
    limits = _value_problems(data, "scenario")  # the Python API's dicts meet the same bounds as files
    if limits:
        raise ScenarioError(limits)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems: list[Problem] = []
        for err in exc.errors():
            where = _loc(err["loc"])
            if err["type"] == "extra_forbidden":
                parent = err["loc"][:-1]
                key = str(err["loc"][-1])
                model_cls: Any = Scenario
                for part in parent:
                    field = model_cls.model_fields.get(str(part))
                    ann = getattr(field, "annotation", None)
                    model_cls = _model_in(ann)
                    if model_cls is None:
                        break
                names = list(model_cls.model_fields) if model_cls is not None else []
                close = suggest(key, names)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(names)}"
                problems.append(Problem(where, "unknown key", hint))
            elif err["type"] == "literal_error" and where == "train.precision" and "nvfp4" in str(err.get("input")).lower():
                problems.append(Problem(where, f"{err.get('input')!r} is not modelled: {NVFP4_REFUSAL}",
                                        "set train.precision: mxfp8-torchao (MXFP8 training, compute capability 10.0 "
                                        "and up) or fp8-torchao"))
            elif err["type"] == "literal_error":
                allowed = err.get("ctx", {}).get("expected", "")
                close = suggest(str(err.get("input")), [a.strip(" '") for a in str(allowed).replace(" or ", ",").split(",")])
                hint = f"did you mean {close[0]!r}?" if close else f"choose {allowed}"
                problems.append(Problem(where, f"{err.get('input')!r} is not allowed", hint))
            elif err["type"] == "string_pattern_mismatch" and where.startswith("software."):
                problems.append(Problem(where, f"{err.get('input')!r} is not a version number",
                                        "write the installed version, e.g. 0.41.1 (pip show <package>)"))
            else:
                problems.append(Problem(where, err["msg"].replace("Input should be", "must be"), ""))
        raise ScenarioError(problems) from None


def _model_in(annotation: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def cross_check(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Checks that need both the scenario and the model (parallel degrees, lengths), in this order."""
    return [*_parallel_problems(s, m), *_schedule_problems(s, m), *_train_problems(s, m), *_expert_format_problems(s, m),
            *_block_fp8_problems(s, m), *_engine_problems(s), *image_problems(s, m), *_serve_format_problems(s),
            *_generate_format_problems(s),
            *autoawq_problems(s, m), *tower_quant_problems(s, m), *megatron_problems(s, m)]


def _serve_format_problems(s: Scenario) -> list[Problem]:
    """A format without a vLLM path here (the row's ``vllm_quantization`` is empty): HQQ, whose ``hqq`` method
    (``HQQMarlinConfig``) is absent from vLLM's ``quantization/__init__.py`` ``QUANTIZATION_METHODS`` (commit
    05d9095); torchao, whose vLLM method is not modelled."""
    if s.task != "serve" or s.serve.quantization == "none" or quant_format(s.serve.quantization).vllm_quantization:
        return []
    q = s.serve.quantization
    why = {"hqq": "its QUANTIZATION_METHODS has no 'hqq' (quantization/__init__.py)",
           "torchao": "how its torchao method (quantization/torchao.py TorchAOConfig) holds them is not modelled"}
    return [Problem("serve.quantization", f"vLLM cannot serve {q} weights here: {why[quant_format(q).library]}",
                    "serve a GPTQ, AWQ, fp8 or compressed-tensors checkpoint, or estimate task: inference")]


def _generate_format_problems(s: Scenario) -> list[Problem]:
    """A format transformers cannot load for generate: Model Optimizer's export (``AutoHfQuantizer`` knows no
    ``modelopt`` method)."""
    q = s.inference.quantization if s.task == "inference" else "none"
    if q == "none" or quant_format(q).library != "modelopt":
        return []
    return [Problem("inference.quantization", f"transformers cannot load {q} weights: its AutoHfQuantizer has no "
                    "Model Optimizer method (quant_method modelopt)",
                    f"serve the checkpoint with vLLM (task: serve, --quantization {quant_format(q).vllm_quantization})")]


def _engine_problems(s: Scenario) -> list[Problem]:
    """A serve option of one engine set for another (``spec.scenario.engine_option_problems``)."""
    if s.task != "serve":
        return []
    return [*(Problem(where, what, hint) for where, what, hint in engine_option_problems(s.serve)),
            *_llamacpp_option_problems(s)]


# serve keys of vLLM and SGLang that llama.cpp has under another name (or not at all), and the key it reads
# instead: its weights' types come from the GGUF file (``serve.gguf.quant``), its cache types from
# -ctk/-ctv (``llama_context_params.type_k/type_v``), and no start-up option of it captures CUDA graphs
# (ggml-cuda captures them per graph unless GGML_CUDA_DISABLE_GRAPHS is set, inside the compute buffer).
_LLAMACPP_INSTEAD = {"dtype": "serve.gguf.quant (the file type)",
                     "kv_cache_dtype": "serve.gguf.cache_type_k and serve.gguf.cache_type_v",
                     "cuda_graphs": ""}


def _llamacpp_option_problems(s: Scenario) -> list[Problem]:
    """A vLLM/SGLang serve key that llama.cpp does not read, given with a value other than its default
    (so that a scenario dumped with every field checks again), refused rather than ignored."""
    sv = s.serve
    if sv.engine != "llamacpp":
        return []
    # the resolved default: dtype auto reads UNREAD_SERVE_DTYPE under llama.cpp (spec/defaults.py with_served_dtype)
    given = set(changed_fields(sv, _LLAMACPP_INSTEAD, defaults={"dtype": UNREAD_SERVE_DTYPE}))
    if sv.dtype == "auto":  # not yet resolved (a scenario checked before catalog.resolve resolves it)
        given.discard("dtype")
    out = []
    for key, instead in _LLAMACPP_INSTEAD.items():
        if key in given:
            hint = f"remove it; llama.cpp reads {instead}" if instead else "remove it; llama.cpp has no such option"
            out.append(Problem(f"serve.{key}", "is an option of vLLM and SGLang, not of engine llamacpp", hint))
    return out


def _block_fp8_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """vLLM refuses block-wise fp8 whose tensor-parallel slices are not whole 128-wide tiles
    (``Fp8LinearMethod.create_weights`` / ``Fp8MoEMethod.create_weights``: "... is not divisible by weight
    quantization block_n / block_k")."""
    tp = s.parallel.tp
    if s.task != "serve" or s.serve.quantization != "fp8-block" or tp == 1:
        return []
    bad = []
    for p in m.params:
        if p.role not in ("linear", "expert") or not p.in_features:
            continue
        expert_row = p.tp == "expert" and s.parallel.ep == 1
        split = p.out_features if p.tp == "column" or (expert_row and p.module != "down_proj") else (
            p.in_features if p.tp == "row" or expert_row else 0)
        if split and (split % tp or (split // tp) % 128):
            bad.append(f"{p.name} ({split} / tp {tp})")
    if not bad:
        return []
    return [Problem("parallel.tp", f"vLLM needs each tensor-parallel slice of a block-wise fp8 weight to be a "
                    f"multiple of 128 (Fp8LinearMethod.create_weights); not so for {', '.join(bad[:3])}",
                    "use a smaller tp, or expert parallelism")]


def _expert_format_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """A format that quantizes only routed experts (MXFP4) on a model without any: neither engine would
    quantize anything (vLLM ``Mxfp4Config.get_quant_method`` gives linears ``UnquantizedLinearMethod``;
    transformers ``replace_with_mxfp4_linear`` replaces only the experts module)."""
    if s.task not in ("inference", "serve"):
        return []
    q: str = getattr(s, s.task).quantization
    if s.task == "inference" and q in _BNB_NAMES and m.moe is not None and not stock_bnb_quantizes_experts(
            m, q, s.software.fused_moe_experts):
        # stock bitsandbytes converts nn.Linear only: experts that are parameters stay 16-bit (train:
        # _moe_expert_quant_problems)
        return [Problem("inference.quantization", f"stock bitsandbytes leaves {m.name}'s routed experts unquantized "
                        "(they are parameters, not nn.Linear modules: transformers >= 5's fused experts, bitsandbytes "
                        "issue #1849), so they stay in the load dtype; experts in 16-bit beside 4-bit linears are not "
                        "modelled", "set software.transformers to the 4.x release the run used (per-expert Linear4bit), "
                        "or use a pre-quantized checkpoint (GPTQ, AWQ, fp8, MXFP4) or inference.quantization: none")]
    if q != "mxfp4" or m.moe is not None:
        return []
    return [Problem(f"{s.task}.quantization", f"mxfp4 stores only routed MoE experts; {m.name} has none",
                    "use a format for dense linears (fp8, gptq-4bit, awq-4bit, nf4, int8) or none")]


# vLLM's Triton MXFP4 backend on Hopper keeps the loaded scales and adds the swizzled copy that triton_kernels'
# HopperMXScaleLayout makes (rows padded to 256), from 0.12.0, the first release whose plain install takes that path
# (facts/vllm_releases.py MXFP4_HOPPER_SWIZZLE_FROM, MXFP4_HOPPER_SOURCES): counted in the weights by serve/vllm.py
# hopper_swizzle_bytes, 3.46 GiB for gpt-oss-120b on one H100 (vLLM 0.14.1 printed "Model loading took 64.38 GiB",
# 64.32 GiB here: vllm-project/vllm#33155).
HOPPER_SWIZZLE_NOTE = (
    "mxfp4 on Hopper, vLLM >= 0.12.0: the Triton backend swizzles the experts for its vendored triton_kernels "
    "(quantization/utils/mxfp4_utils.py _swizzle_mxfp4) and keeps the loaded scales beside the swizzled copy, whose "
    "rows HopperMXScaleLayout pads to 256 (3.46 GiB for gpt-oss-120b on one GPU), counted in the weights; before "
    "0.12.0 a plain install runs Marlin or, with triton_kernels installed apart, keeps the unswizzled layout below "
    "torch 2.8.1 (0.10.x pins torch 2.7.1, 0.11.x torch 2.8.0): no copy. A triton_kernels installed in site-packages "
    "takes precedence over the vendored one (vllm/utils/import_utils.py import_triton_kernels); newer ones pad the "
    "packed weights further (hopper_value.py _padded_shape: rows to 64, columns to 256), which is not modelled")


def _hopper_swizzle_note(cap: tuple[int, int] | None) -> list[str]:
    """The Hopper-only copy of vLLM's swizzled MXFP4 scales (``HOPPER_SWIZZLE_NOTE``); Blackwell's default backend
    is FlashInfer's, not covered by it."""
    return [HOPPER_SWIZZLE_NOTE] if cap == (9, 0) else []


def vllm_mxfp4_triton(s: Scenario) -> bool:
    """Whether vLLM's Triton MXFP4 backend is there for this scenario: any engine but vLLM's start-up (transformers,
    a rollout under TRL) is taken as today's; a vLLM release's plain install has triton_kernels from 0.12.0 on
    (facts/vllm_releases.py ``mxfp4_triton_installed``)."""
    return s.effective_framework != "vllm" or mxfp4_triton_installed(s.serve.vllm_version)


def _mxfp4_assumptions(task: str, cap: tuple[int, int] | None, triton: bool = True) -> list[str]:
    """What transformers (inference) or vLLM (serve) does with MXFP4 experts on a GPU of capability ``cap``;
    ``triton``: the vLLM release's plain install has triton_kernels (facts/vllm_releases.py ``mxfp4_triton_installed``)."""
    if task == "inference":
        out = [("mxfp4: transformers keeps the experts as stored (Mxfp4GptOssExperts: uint8 blocks and E8M0 "
               "scales, expert biases in fp32), which needs triton >= 3.4, the kernels package and compute "
               "capability >= 7.5; without them Mxfp4HfQuantizer.validate_environment dequantizes to bf16 "
               "(transformers 5.24 quantizers/quantizer_mxfp4.py), which this estimate does not cover")]
        if cap is not None and cap < (7, 5):
            out.append("not modelled: below compute capability 7.5 transformers dequantizes MXFP4 to bf16")
        return out
    if cap is not None and cap < (8, 0):
        return ["not modelled: vLLM refuses MXFP4 below compute capability 8.0 (Mxfp4Config.get_min_capability)"]
    if triton and (cap is None or (9, 0) <= cap < (11, 0)):
        return ([("mxfp4: vLLM's Triton MoE backend (quantization/mxfp4.py get_mxfp4_backend on compute capability "
                 "9.x and 10.x with triton_kernels and no FlashInfer MXFP4 variable) keeps the experts as stored, "
                 "each expert's intermediate slice padded to a multiple of 64 and the expert biases converted to "
                 "fp32; off Hopper the triton_kernels swizzle is assumed to keep the byte count")]
                + _hopper_swizzle_note(cap))
    return [("mxfp4: vLLM's Marlin MoE backend (quantization/mxfp4.py get_mxfp4_backend on this GPU, or on any GPU "
             "before 0.12.0, whose plain install has no triton_kernels) pads the "
             "hidden size to a multiple of 256 and each expert's intermediate slice to 128, repacks the payload "
             "(prepare_moe_fp4_layer_for_marlin), keeps one byte per scale and casts the biases to the model dtype")]


_PER_TENSOR_FP8 = ("modelopt-fp8", "fp8-tensor", "fp8-tensor-static", "ct-fp8-tensor", "ct-fp8-tensor-static")


def _per_tensor_fp8_assumptions(task: str, q: str, cap: tuple[int, int] | None) -> list[str]:
    """Per-tensor fp8 weights: vLLM (Fp8LinearMethod, CompressedTensorsW8A8Fp8, ModelOptFp8LinearMethod) keeps one
    scale per fused layer (``requantize_with_max_scale`` rewrites a fused layer's shards in place to their largest
    scale, quantization/utils/w8a8_utils.py) and needs fp8 tensor cores; below compute capability 8.9 its fp8 weights
    take Marlin's weight-only path.  (compressed-tensors under transformers: the CompressedLinear note.)
    transformers' FP8Linear holds a scalar ``weight_scale_inv`` (and ``activation_scale``) and dequantizes below 8.9
    (``FineGrainedFP8HfQuantizer.validate_environment``)."""
    if task == "serve":
        return [] if cap is None or cap >= (8, 9) else [
            "not modelled: below compute capability 8.9 vLLM runs fp8 weights through Marlin (weight-only)"]
    out = [(f"{q}: e4m3 weights with one fp32 scale per matrix kept as stored by transformers' FineGrainedFP8 "
            "FP8Linear with weight_block_size null (integrations/finegrained_fp8.py), which needs compute capability "
            ">= 8.9")]
    if cap is not None and cap < (8, 9):
        out.append("not modelled: below compute capability 8.9 FineGrainedFP8HfQuantizer.validate_environment "
                   "dequantizes the weights")
    return out


def quant_format_assumptions(s: Scenario, m: ModelSpec, compute_capability: str = "") -> list[str]:
    """How each engine holds MXFP4, block-wise fp8 and compressed-tensors weights, as assumptions the report states;
    ``compute_capability``: the GPU's, where the engines change path with it."""
    if s.task not in ("inference", "serve"):
        return []
    q: str = getattr(s, s.task).quantization
    cap = cuda_capability(compute_capability)
    if q == "mxfp4":
        return _mxfp4_assumptions(s.task, cap, vllm_mxfp4_triton(s))
    if s.task == "inference" and q != "none" and (note := quant_format(q).inference_note):
        return [note.format(name=q)]
    if q in ("ct-nvfp4", "ct-nvfp4a16", "modelopt-nvfp4") and s.task == "serve":
        # vLLM's compressed-tensors NVFP4 schemes were not read at a release: the checkpoint's tensors are counted
        return [(f"{q}: vLLM assumed to hold the checkpoint's tensors as stored (uint8 e2m1 pairs, e4m3 scales per "
                 "16 inputs, fp32 global scales); its re-layout of the scales after loading for its FP4 kernels "
                 "(compute capability 10.0 and later; Marlin's weight-only path below) was not read")]
    if q.startswith("ct-") and s.task == "inference":
        # compressed-tensors linear/compressed_linear.py CompressedLinear.forward: a COMPRESSED layer decompresses
        # its weight at its first forward and registers it as a dense parameter beside the compressed tensors
        return [(f"not modelled: {q} under transformers: compressed-tensors' CompressedLinear decompresses each "
                 "weight at its first forward and keeps the dense copy (compressed_linear.py); the weights are "
                 "estimated as the checkpoint stores them")]
    if q in _PER_TENSOR_FP8:
        return _per_tensor_fp8_assumptions(s.task, q, cap)
    if q != "fp8-block":
        return []
    engine = ("vLLM Fp8LinearMethod / Fp8MoEMethod with block_quant (quantization/fp8.py)" if s.task == "serve"
              else "transformers FineGrainedFP8 FP8Linear (integrations/finegrained_fp8.py)")
    out = [(f"fp8-block: e4m3 weights with one fp32 weight_scale_inv per 128 x 128 tile kept as stored by {engine}, "
           "which needs compute capability >= 8.9")]
    if cap is not None and cap < (8, 9):
        out.append("not modelled: below compute capability 8.9 " + (
            "vLLM runs fp8 weights through Marlin (prepare_fp8_layer_for_marlin)" if s.task == "serve"
            else "FineGrainedFP8HfQuantizer.validate_environment dequantizes the weights"))
    return out


def _parallel_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Parallel degrees against the GPU count, the heads, layers and experts; sharding and offload."""
    out: list[Problem] = []
    par, n = s.parallel, s.hardware.num_gpus
    mp = par.tp * par.pp * par.cp
    if n % mp:
        out.append(Problem("parallel", f"tp*pp*cp = {par.tp}*{par.pp}*{par.cp} = {mp} does not divide num_gpus = {n}",
                           f"use num_gpus a multiple of {mp}, or lower tp/pp/cp"))
    # an attention-free Mamba-1 or RWKV-4 model (mamba, falcon_mamba, rwkv) has no heads to split: its adapter's one
    # "head" is a placeholder, and spec/checks.py refuses tp > 1 for it with the mixer's own reason
    mamba1_only = (m.mamba is not None and m.mamba.kind in ("mamba1", "rwkv4")
                   and len(m.mamba.layers) == m.num_layers)
    if m.num_attention_heads % par.tp and not mamba1_only:
        ok = [d for d in range(1, m.num_attention_heads + 1) if m.num_attention_heads % d == 0 and d <= max(n, 1)]
        out.append(Problem("parallel.tp", f"tp={par.tp} does not divide the {m.num_attention_heads} attention heads",
                           f"use tp in {ok[-4:]}"))
    elif m.mla is None and m.num_kv_heads % par.tp and par.tp % m.num_kv_heads:
        out.append(Problem("parallel.tp", f"tp={par.tp} and the {m.num_kv_heads} KV heads cannot be split evenly",
                           "use a tp that divides the KV heads or a multiple of them"))
    if par.pp > m.num_layers:
        out.append(Problem("parallel.pp", f"pp={par.pp} exceeds the {m.num_layers} layers", f"use pp <= {m.num_layers}"))
    if s.framework == "vllm" and s.task != "serve":
        out.append(Problem("framework", f"framework vllm serves models; it has no {s.task} path here",
                           "use task: serve, or a training / generate framework (hf-trainer, plain, lightning)"))
    if par.zero_stage and par.fsdp != "none":
        out.append(Problem("parallel", "zero_stage and fsdp both set", "choose DeepSpeed ZeRO or FSDP, not both"))
    if par.offload != "none" and not (par.zero_stage or par.fsdp not in ("none", "no_shard")):
        out.append(Problem("parallel.offload", "offload needs ZeRO (zero_stage >= 1) or FSDP",
                           "set parallel.zero_stage: 3 (or 1/2 for optimizer offload) or parallel.fsdp: full_shard"))
    if par.offload == "optimizer+params" and par.zero_stage not in (0, 3):
        out.append(Problem("parallel.offload", "parameter offload needs ZeRO stage 3",
                           "set parallel.zero_stage: 3 or offload: optimizer"))
    if par.cp > 1 and s.task == "train" and s.train.seq_len % par.cp:
        out.append(Problem("train.seq_len", f"seq_len={s.train.seq_len} is not divisible by cp={par.cp}",
                           f"use a seq_len multiple of {par.cp}"))
    # vLLM's expert map gives the first num_experts % ep ranks one more expert (fused_moe/layer.py
    # determine_expert_map, 0.11.0), modelled by the largest rank (serve/vllm.py moe_split); SGLang asserts
    # num_experts % moe_ep_size == 0 (0.5.3 fused_moe_triton/layer.py FusedMoE.__init__), training splits evenly
    uneven_ok = s.task == "serve" and s.effective_framework == "vllm" and s.serve.engine == "vllm"
    if m.moe is not None and par.ep > 1 and m.moe.num_experts % par.ep and not uneven_ok:
        fits = [d for d in range(2, par.ep + 1) if m.moe.num_experts % d == 0]
        out.append(Problem("parallel.ep", f"ep={par.ep} does not divide {m.moe.num_experts} experts",
                           f"choose an ep dividing {m.moe.num_experts}" + (f", e.g. {fits[-1]}" if fits else "")))
    out.extend(_capacity_problems(s, m))
    return out


def _capacity_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """``parallel.moe_expert_capacity_factor`` and ``moe_pad_to_capacity``: modelled for full fine-tuning of an
    MoE model through transformers >= 5's grouped experts, without tensor parallelism (analytic/moe_capacity.py)."""
    par, key = s.parallel, "parallel.moe_expert_capacity_factor"
    if par.moe_pad_to_capacity and par.moe_expert_capacity_factor is None:
        return [Problem("parallel.moe_pad_to_capacity", "padding to capacity needs a capacity (Megatron-LM: "
                        "moe_pad_expert_input_to_capacity is effective only after moe_expert_capacity_factor is set)",
                        "set parallel.moe_expert_capacity_factor, or moe_pad_to_capacity: false")]
    if par.moe_expert_capacity_factor is None:
        return []
    why = ""
    if m.moe is None:
        why = f"{m.family} has no routed experts"
    elif s.task != "train":
        why = "the capacity sizes the training step's routed rows only"
    elif s.train.peft is not None or not s.software.fused_moe_experts:
        why = ("the routed rows are modelled through transformers >= 5's grouped experts under full fine-tuning "
               "(not per-expert linears or adapters)")
    elif par.tp > 1:
        why = f"with tp={par.tp} the tokens each router sees are not modelled"
    elif checkpointing(s) not in ("none", "full"):
        why = (f"under gradient_checkpointing {checkpointing(s)} which of the extra rows' tensors stay saved is not "
               "modelled (none and full are)")
    return [Problem(key, f"moe_expert_capacity_factor: {why}", "leave parallel.moe_expert_capacity_factor unset "
                    "(dropless, balanced routing)")] if why else []


def _schedule_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """``parallel.pp_schedule`` and ``pp_virtual_stages`` against the schedule's row (facts/pipeline_schedules.py),
    pp, the layers and the micro-batches: what torch's schedule classes accept and what the engine models."""
    par = s.parallel
    row, v = pipeline_schedule(par.pp_schedule), par.pp_virtual_stages
    if row.name == "1f1b" and v == 1:
        return []
    out: list[Problem] = []
    if par.pp == 1 or s.task != "train":
        out.append(Problem("parallel.pp_schedule", "a pipeline schedule applies to training with pp > 1",
                           "set parallel.pp > 1 and task: train, or leave pp_schedule: 1f1b"))
    if not row.min_virtual <= v <= (row.max_virtual or v):
        want = str(row.min_virtual) if row.max_virtual == row.min_virtual else f">= {row.min_virtual}"
        out.append(Problem("parallel.pp_virtual_stages", f"{row.name} runs {want} model chunks per rank, not {v}",
                           f"set pp_virtual_stages: {row.min_virtual}"))
    if par.pp * v > m.num_layers:
        out.append(Problem("parallel.pp_virtual_stages", f"pp x pp_virtual_stages = {par.pp * v} chunks exceed the "
                           f"{m.num_layers} layers", "lower pp_virtual_stages"))
    g = s.train.grad_accum_steps
    if row.name == "dualpipev" and par.pp > 1 and g < 2 * par.pp:
        out.append(Problem("train.grad_accum_steps", f"{row.torch_class} needs at least as many micro-batches as "
                           f"stages (ScheduleDualPipeV.__init__): {g} < {2 * par.pp}",
                           f"use grad_accum_steps >= {2 * par.pp}, or pp_schedule: zbv-zero-bubble"))
    if row.style == "loop" and row.in_flight in ("interleaved", "split") and g % interleaved_rounds(par.pp, g)[0]:
        rounds = interleaved_rounds(par.pp, g)[0]
        out.append(Problem("train.grad_accum_steps", f"{row.torch_class} needs the {g} micro-batches to be a multiple "
                           f"of its {rounds} rounds (max(1, m // pp))", f"use grad_accum_steps a multiple of {par.pp}"))
    if s.effective_framework == "megatron":
        out += megatron_schedule_problems(s)
    elif s.effective_framework not in ("torchtitan", "plain"):
        out.append(Problem("parallel.pp_schedule", f"pp_schedule picks a torch.distributed.pipelining schedule, which "
                           f"torchtitan (or a plain script) runs; {s.effective_framework} is modelled with 1f1b only",
                           "use framework: torchtitan, or pp_schedule: 1f1b"))
    if m.vision is not None:
        out.append(Problem("parallel.pp_schedule", "a vision tower's activations are modelled under 1f1b only",
                           "use pp_schedule: 1f1b"))
    if row.in_flight == "split":
        out.extend(_split_backward_problems(s, m, row.name))
    return out


def _split_backward_problems(s: Scenario, m: ModelSpec, name: str) -> list[Problem]:
    """A zero-bubble schedule holds, from each input-gradient pass to its weight-gradient pass, the gradient into
    every parameter-consuming op (analytic/zero_bubble.py): modelled for full fine-tuning of dense decoders
    without tensor parallelism or activation checkpointing."""
    out: list[Problem] = []
    fix = "use pp_schedule: interleaved-1f1b"
    if s.train.peft is not None:
        out.append(Problem("parallel.pp_schedule", f"{name} with PEFT: the adapters' ops and the frozen base's "
                           "graph are not in the held-gradient model (full fine-tuning only)", fix))
    if s.parallel.tp > 1:
        out.append(Problem("parallel.pp_schedule", f"{name} with tp={s.parallel.tp}: the held gradients are "
                           "modelled without tensor parallelism", f"set parallel.tp: 1, or {fix}"))
    if checkpointing(s) != "none":
        out.append(Problem("parallel.pp_schedule", f"{name} with gradient_checkpointing "
                           f"{checkpointing(s)}: what the recomputation keeps between the I pass "
                           "(retain_graph=True) and the W pass is not modelled",
                           f"set train.gradient_checkpointing: none, or {fix}"))
    if s.train.activation_offload != "none":
        out.append(Problem("parallel.pp_schedule", f"{name} with activation_offload {s.train.activation_offload}: "
                           "what the offload hooks hold between the I pass (retain_graph=True) and the W pass is not "
                           "modelled", f"set train.activation_offload: none, or {fix}"))
    if s.train.loss != "standard" or s.train.liger_kernels:
        out.append(Problem("parallel.pp_schedule", f"{name} with a fused loss or Liger's kernels: their autograd "
                           "functions replace the linear and norm ops whose output gradients are held from I to W",
                           f"set train.loss: standard and liger_kernels: false, or {fix}"))
    odd = split_backward_unmodelled_params(m)
    if odd:
        out.append(Problem("parallel.pp_schedule", f"{name}: the output sizes of the ops consuming {odd[0]}"
                           f"{f' and {len(odd) - 1} more' if len(odd) > 1 else ''} (routed experts, routers, "
                           "per-head norms, other tensors) are not modelled", fix))
    return out


def split_backward_unmodelled_params(m: ModelSpec) -> list[str]:
    """Parameters whose consuming ops' held output gradients a zero-bubble schedule's model lacks: routed experts
    and routers (their tokens depend on the routing), norms narrower than the hidden size (per-head q/k norms),
    other tensors (convolutions, state-space parameters)."""
    return [p.name for p in m.params
            if p.role in ("expert", "router", "other") or (p.role == "norm" and p.numel != m.hidden_size)]


def lora_targets_for(s: Scenario, m: ModelSpec) -> tuple[Scenario, list[str], list[Problem]]:
    """``train.peft.target_modules: null`` completed as PEFT completes ``LoraConfig(target_modules=None)``: the
    model type's row of ``facts/peft_targets.py`` (peft ``_prepare_adapter_config``).  A model type PEFT has no
    row for makes PEFT raise ("Please specify `target_modules` in `peft_config`"): q_proj, v_proj are assumed
    where the model has both, stated; otherwise refused.  Under Lit-GPT (``framework: lightning``) its own default
    (``_litgpt_targets``); torchtune has none (its builders require ``lora_attn_modules``): refused.  Returns the
    scenario, the assumptions, the problems."""
    peft = s.train.peft if s.task == "train" else None
    if peft is None or peft.target_modules is not None:
        return s, [], []
    fw = s.effective_framework
    if fw == "torchtune":
        return s, [], [Problem("train.peft.target_modules", f"is null under torchtune, which has no default: "
                               f"{TORCHTUNE_LORA_SOURCE}", "name them, e.g. target_modules: "
                               f"[{', '.join(_present(TORCHTUNE_LORA_RECIPE, m) or ('q_proj', 'v_proj'))}] "
                               "(the recipe configs' choice, in transformers' module names)")]
    if fw == "lightning":
        return _litgpt_targets(s, m, peft)
    mapped = m.peft_default_targets
    notes: list[str] = []
    if mapped is None:
        # the language model's modules: a tower's q_proj/v_proj (Phi-4-multimodal's SigLIP and audio encoder beside a
        # fused qkv_proj) are never adapted here (spec/model.py VisionSpec), so they cannot stand for the fallback
        tower = m.vision.param_prefixes if m.vision is not None else ()
        paths = frozenset(p.name.rsplit(".", 1)[0] for p in m.params
                          if "." in p.name and not (tower and p.name.startswith(tower)))
        if not all(target_matches(t, paths) for t in UNMAPPED_FALLBACK):
            leaves = sorted({p.module for p in m.params if p.role in ("linear", "expert", "router")})
            return s, [], [Problem("train.peft.target_modules",
                                   f"PEFT {PEFT_RELEASE} has no default LoRA targets for model type {m.model_type!r} "
                                   "(it raises 'Please specify `target_modules` in `peft_config`'); its linear "
                                   f"modules: {', '.join(leaves)}", "name target_modules, or use all-linear")]
        mapped = UNMAPPED_FALLBACK
        notes.append(f"LoRA targets assumed {', '.join(mapped)}: PEFT {PEFT_RELEASE} has no default for model type "
                     f"{m.model_type!r} and raises without target_modules, so the script named some; set "
                     "train.peft.target_modules")
    elif mapped != UNMAPPED_FALLBACK:
        notes.append(f"LoRA targets: PEFT's default for model type {m.model_type!r}, {', '.join(mapped)} "
                     f"(peft {PEFT_RELEASE} TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)")
    peft = peft.model_copy(update={"target_modules": list(mapped)})
    return s.model_copy(update={"train": s.train.model_copy(update={"peft": peft})}), notes, []


# transformers' is_torch_sdpa_available (utils/import_utils.py 4.36.2-4.46.3) on CUDA: torch >= 2.1.1
SDPA_TORCH = (2, 1, 1)


def release_attention_for(s: Scenario, m: ModelSpec) -> tuple[Scenario, list[str]]:
    """The attention a job runs when the scenario leaves it at its default (``sdpa``) and names a transformers
    release whose default was eager: before ``Traits.sdpa_since`` (4.36 for most families, when
    ``_check_and_enable_sdpa`` made SDPA the default where the class supports it), or with torch below 2.1.1
    (``is_torch_sdpa_available``).  An explicit ``attention`` is kept (optimum's BetterTransformer ran SDPA on
    older releases).  Returns the scenario estimated and its assumption."""
    section = s.train if s.task == "train" else s.inference if s.task == "inference" else None
    tv, torch = s.software.transformers_version, s.software.torch_version
    if (section is None or section.attention != "sdpa" or "attention" in section.model_fields_set
            or s.effective_framework in OWN_MODEL_FRAMEWORKS or tv is None):
        return s, []
    since = m.traits.sdpa_since
    if since is not None and tv < since:
        why = (f"{m.family}'s class has no SDPA path before transformers {'.'.join(map(str, since))} "
               "(modeling_utils._check_and_enable_sdpa, _supports_sdpa)")
    elif (since is not None or tv >= (4, 36)) and torch is not None and torch < SDPA_TORCH:
        why = "transformers enables SDPA only with torch >= 2.1.1 (is_torch_sdpa_available)"
    else:
        return s, []
    part = "train" if s.task == "train" else "inference"
    s = s.model_copy(update={part: section.model_copy(update={"attention": "eager"})})
    with_torch = f" with torch {s.software.torch}" if "torch" in why else ""
    return s, [(f"{part}.attention: eager, the default of transformers {s.software.transformers}{with_torch}: {why}; "
                f"set {part}.attention to say otherwise")]


def fsdp_upcast_for(s: Scenario) -> tuple[Scenario, list[str]]:
    """A half-precision full fine-tune (bf16-true, fp16-true) under the HF Trainer or accelerate with FSDP and the
    Trainer's ``--bf16``/``--fp16`` (``train.trainer_mixed_precision``, null: on) runs with fp32 trainable parameters:
    accelerate from 0.30 upcasts them (facts/accelerate.py), so its gradients and AdamW moments are fp32 too and the
    step is bf16-mixed's (fp16-mixed's) under FSDP.  Not before transformers 4.30 (the Trainer wrapped FSDP itself),
    nor under framework accelerate (FSDP2, as ``vramplan export`` writes it) on accelerate 1.13.x, which casts nothing.
    A PEFT run under framework accelerate on accelerate 1.6-1.12, whose FSDP2 casts the frozen base to fp32 as well,
    is stated as not modelled (the band widens).  Returns the scenario estimated and its assumptions."""
    fw = s.effective_framework
    if s.task != "train" or fw not in ("hf-trainer", "accelerate") or s.parallel.fsdp == "none":
        return s, []
    t, av, tv = s.train, s.software.accelerate_version, s.software.transformers_version
    if t.trainer_mixed_precision is False or (av is not None and av < FSDP_UPCAST_RELEASE):
        return s, []
    if fw == "hf-trainer" and tv is not None and tv < TRAINER_ACCELERATE_FSDP_SINCE:
        return s, []
    fsdp2 = torch_fsdp2(s)  # accelerate as export/accelerate.py writes it (fsdp_version 2); the HF Trainer's FSDP1
    if t.peft is not None:
        if fsdp2 and av is not None and FSDP2_WHOLE_MODEL[0] <= av < FSDP2_WHOLE_MODEL[1]:
            return s, [(f"not modelled: accelerate {s.software.accelerate}'s FSDP2 (fsdp2_prepare_model, "
                        "1.6.0-1.12.0) casts the whole model to fp32 under mixed precision, the frozen base included; "
                        "the estimate holds the frozen base in its loaded dtype (accelerate 1.14 casts the trainable "
                        "parameters only)")]
        return s, []
    if t.precision not in ("bf16-true", "fp16-true"):
        return s, []
    if fsdp2 and av is not None and FSDP2_NO_UPCAST[0] <= av < FSDP2_NO_UPCAST[1]:
        return s, []
    half = t.precision.removesuffix("-true")
    mixed = f"{half}-mixed"
    said = "accelerate " + (s.software.accelerate or "from 0.30 (software.accelerate not given)")
    note = (f"train.precision {t.precision} under FSDP with mixed precision {half} (the Trainer's --{half}, "
            f"train.trainer_mixed_precision): {said} upcasts the trainable parameters to fp32 ({FSDP_UPCAST_SOURCE}), "
            f"so the run is estimated as {mixed}: fp32 sharded parameters, gradients and AdamW moments, {half} "
            f"all-gathered copies; the load phase is costed as {mixed}'s too, although from_pretrained loads "
            f"{half} and the cast comes after sharding (its host RAM is over-stated by up to 2 B per parameter); set "
            "train.trainer_mixed_precision: false for a run without the flag (mixed_precision no)")
    return s.model_copy(update={"train": t.model_copy(update={"precision": mixed})}), [note]


def _present(names: tuple[str, ...], m: ModelSpec) -> tuple[str, ...]:
    """Those of ``names`` that are modules of ``m``."""
    paths = module_paths(m)
    return tuple(n for n in names if target_matches(n, paths))


def _litgpt_targets(s: Scenario, m: ModelSpec, peft: Peft) -> tuple[Scenario, list[str], list[Problem]]:
    """``target_modules: null`` under Lit-GPT: its own defaults, the query and the value (facts/peft_targets.py
    ``LITGPT_LORA_DEFAULT``), named q_proj and v_proj where the model has them.  A model whose transformers layout fuses
    them with the key (Falcon's query_key_value, GPT-2's c_attn) cannot be given the query and value parts alone
    here: refused, naming the fused module (which also adapts the key, Lit-GPT's lora_key)."""
    if len(_present(LITGPT_LORA_DEFAULT, m)) < len(LITGPT_LORA_DEFAULT):
        fused = ", ".join(m.traits.qkv_modules)
        return s, [], [Problem("train.peft.target_modules", f"is null under Lit-GPT, whose default adapts the query "
                               f"and value parts of its fused qkv ({LITGPT_LORA_SOURCE}); {m.name} has no q_proj and "
                               f"v_proj to name them by, its attention input projection is {fused}",
                               f"name target_modules: [{fused}] (the key too, as lora_key: true would)")]
    peft = peft.model_copy(update={"target_modules": list(LITGPT_LORA_DEFAULT)})
    note = f"LoRA targets: Lit-GPT's default, {', '.join(LITGPT_LORA_DEFAULT)} ({LITGPT_LORA_SOURCE})"
    return s.model_copy(update={"train": s.train.model_copy(update={"peft": peft})}), [note], []


def _lora_target_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """PEFT raises when no target matches (``NoMatchingPeftModuleError``, peft 0.21 tuners_utils.py
    ``inject_adapter``: "Target modules ... not found in the base model"), so no adapter would exist and
    the job would not start: refused here, with the model's module names and the close ones.  So are the
    targets peft refuses or cannot run (``_moe_target_problems``)."""
    peft = s.train.peft
    if peft is None or peft.target_modules is None:  # null: lora_targets_for completes or refuses it
        return []
    linears = {p.module for p in m.params if p.role == "linear"}
    asked = linears if peft.target_modules == "all-linear" else {t.rsplit(".", 1)[-1] for t in peft.target_modules}
    refused = sorted(asked & set(m.traits.peft_refused_targets))
    if refused:
        reach = " and all-linear reaches them" if peft.target_modules == "all-linear" else ""
        return [Problem("train.peft.target_modules",
                        f"peft refuses {', '.join(repr(t) for t in refused)} as LoRA targets of {m.model_type} ('Module "
                        f"... is incompatible with Mamba-based models'){reach}",
                        "name the targets: the attention and MLP linears and the mixers' in_proj take adapters")]
    if peft.target_modules != "all-linear":
        unadaptable = dict(m.traits.unadaptable_modules)
        named = [t for t in peft.target_modules if t.rsplit(".", 1)[-1] in unadaptable]
        if named:
            return [Problem("train.peft.target_modules",
                            f"{', '.join(repr(t) for t in named)} name{'s' if len(named) == 1 else ''} "
                            f"{', '.join(unadaptable[t.rsplit('.', 1)[-1]] for t in named)} of {m.name}, not a layer "
                            "peft can adapt (peft raises 'Target module ... is not supported')",
                            "drop them; the attention, MLP and shared-expert linears take adapters")]
    expert_params = experts_are_parameters(m, s.software.fused_moe_experts, s.train.quantization)
    if moe := _moe_target_problems(peft, m, expert_params):
        return moe
    missing = unmatched_lora_targets(peft, m, expert_params)
    if peft.target_modules == "all-linear" or len(missing) < len(peft.target_modules):
        return []
    leaves = sorted({p.module for p in m.params if p.role == "linear" or (
        p.role in ("expert", "router") and not expert_params)})
    close = sorted({c for t in missing for c in suggest(t.rsplit(".", 1)[-1], leaves)})
    first = f"did you mean {', '.join(repr(c) for c in close)}? Or" if close else "name some of them, or"
    fused = (" (on transformers >= 5 the routed experts are parameters of one module, which no target name reaches"
             f"{'' if m.peft_moe_pattern is None else ' but the names peft converts'})") if expert_params else ""
    return [Problem("train.peft.target_modules",
                    f"none of {missing} is a module of {m.name} (PEFT raises 'Target modules ... not found in the "
                    f"base model'); its linear modules: {', '.join(leaves)}{fused}",
                    f"{first} use target_modules: all-linear")]


_TARGET = "train.peft.target_modules"


def _moe_target_problems(peft: Peft, m: ModelSpec, expert_params: bool) -> list[Problem]:
    """A MoE model's targets that peft 0.21.2 refuses or cannot run (facts/peft_targets.py, checked against peft on
    transformers 5.24): the experts' module, a router that is not an ``nn.Linear``, a router whose forward returns a
    tuple (all-linear reaches it), one half of a fused gate/up pair peft converts."""
    if m.moe is None:
        return []
    named = [] if peft.target_modules == "all-linear" else list(peft.target_modules or [])
    leaves = {t.rsplit(".", 1)[-1]: t for t in named}
    if "experts" in leaves and "experts" not in dict(m.traits.unadaptable_modules):
        return [Problem(_TARGET, f"{leaves['experts']!r} names the routed experts' container of {m.name}, which peft "
                        "cannot adapt (it raises 'Target module ... is not supported': only nn.Linear, nn.Embedding, "
                        "nn.Conv and Conv1D layers are)", "name the expert projections (gate_proj, up_proj, "
                        "down_proj), which peft converts where it can, or the attention's linears")]
    held = m.router_module()
    if held is not None and expert_params:
        name, cls, kind = held
        pattern = m.peft_moe_pattern
        if kind == "tuple" and (peft.target_modules == "all-linear" or name in leaves):
            how = "all-linear reaches" if peft.target_modules == "all-linear" else f"{leaves[name]!r} names"
            return [Problem(_TARGET, f"{how} {m.name}'s router {cls}, an nn.Linear whose forward returns a tuple: peft "
                            "0.21 wraps it in lora.Linear, whose forward fails on the tuple (AttributeError: 'tuple' "
                            "object has no attribute 'dtype')", "name the targets without the router, e.g. "
                            "[q_proj, k_proj, v_proj, o_proj]")]
        if kind == "module" and name in leaves and (pattern is None or pattern.router != name):
            return [Problem(_TARGET, f"{leaves[name]!r} names {m.name}'s router {cls}, which is not an nn.Linear on "
                            "transformers >= 5: peft raises 'Target module ... is not supported'",
                            f"drop {leaves[name]!r}")]
    pattern = m.peft_moe_pattern if expert_params else None
    if pattern is not None:
        aliases = dict(m.traits.expert_module_aliases)
        pair = {aliases.get(leaf, leaf) for leaf in leaves} & {"gate_proj", "up_proj"}
        if len(pair) == 1:
            have = pair.pop()
            other = "up_proj" if have == "gate_proj" else "gate_proj"
            return [Problem(_TARGET, f"peft converts the expert targets of {m.model_type} to transformers 5's fused "
                            f"parameters and raises 'Cannot convert PEFT target(s) {have} without also targeting "
                            f"{other} because they are fused into gate_up_proj'",
                            f"add {other} (its 4.x name for this model) or drop {have}")]
    return []


# frameworks whose training loop is the user's or torchtitan's, where torch's checkpoint APIs are applied per
# layer as torchtitan does; transformers' gradient_checkpointing_enable checkpoints every layer, whole
_OWN_CHECKPOINTING = ("torchtitan", "plain")


def _checkpointing_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """Policies a framework cannot run, and op-level SAC where its saved outputs are not modelled."""
    t, fw, g = s.train, s.effective_framework, checkpointing(s)
    out: list[Problem] = []
    if fw == "megatron":
        return out  # spec/megatron.py: Megatron-LM's own recompute options
    if t.checkpoint_every_n_layers > 1 and (g != "full" or fw not in _OWN_CHECKPOINTING):
        out.append(Problem("train.checkpoint_every_n_layers",
                           f"checkpointing every {t.checkpoint_every_n_layers}-th layer needs gradient_checkpointing: "
                           f"full under {' or '.join(_OWN_CHECKPOINTING)} (torchtitan selective_ac_option); {fw} "
                           "with transformers' gradient_checkpointing_enable checkpoints every layer",
                           "set checkpoint_every_n_layers: 1, or framework: torchtitan"))
    if t.deepspeed_checkpointing != "none" and (fw != "deepspeed" or g != "full"):
        out.append(Problem("train.deepspeed_checkpointing", f"DeepSpeed's {t.deepspeed_checkpointing} checkpointing "
                           f"needs framework deepspeed and gradient_checkpointing: full (here {fw}, "
                           f"{g})", "set framework: deepspeed and gradient_checkpointing: full, "
                           "or deepspeed_checkpointing: none"))
    op_sac = g == "op-sac" or (g == "selective" and fw == "torchtitan")
    if g == "op-sac" and fw not in _OWN_CHECKPOINTING:
        out.append(Problem("train.gradient_checkpointing", f"op-sac is torchtitan's op-level selective checkpointing; "
                           f"{fw} has no such policy", "use framework: torchtitan, or full / attention-core"))
    elif op_sac and any(ls.moe for ls in m.layers):
        out.append(Problem("train.gradient_checkpointing", "op-level selective checkpointing of MoE layers is not "
                           "modelled (grouped expert matmuls, the router's forced recompute)",
                           "use gradient_checkpointing: full"))
    return out


_TUNE_PROJECTIONS = frozenset(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))


def _torchtune_partial_quant(s: Scenario) -> list[str]:
    """torchtune before v0.3.0 quantizes only the LoRALinear bases (no FrozenNF4Linear yet, facts/torchtune.py);
    the engine counts every decoder linear quantized, exact where the adapters cover every projection."""
    v, peft = s.software.torchtune_version, s.train.peft
    targets = (peft.target_modules or "all-linear") if peft is not None else "all-linear"
    if v is None or v >= FROZEN_NF4_SINCE or targets == "all-linear" or _TUNE_PROJECTIONS <= set(targets):
        return []
    return [(f"not modelled: torchtune {s.software.torchtune} quantizes only the linears with adapters (its QLoRA "
             "builders had no FrozenNF4Linear before v0.3.0); the others are counted in NF4, not bf16")]


def _torchtune_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """What torchtune's recipes cannot run (facts/torchtune.py): a dtype other than bf16 or fp32 (``training.get_dtype``;
    no autocast, the model is built in that dtype), a 4-bit format other than its torchao NF4 (``to_nf4`` always
    double-quantizes the scalers: nf4-dq), and a checkpointing policy other than every layer whole
    (``training.set_activation_checkpointing`` wraps each ``TransformerSelfAttentionLayer``; ``ac_mode: selective``
    exists only in a dev recipe at v0.6.1)."""
    t, out = s.train, []
    if t.objective != "sft":
        # post-training objectives follow TRL's trainers (facts/trl.py); torchtune's own DPO/PPO recipes are not read
        out.append(Problem("framework", f"objective {t.objective} under torchtune is not modelled: the post-training "
                           "estimates follow TRL's trainers", "use framework: hf-trainer (TRL), or objective: sft"))
    block = NF4_BLOCK * NF4_SCALER_BLOCK
    odd = sorted({p.module for p in m.params if p.role == "linear" and p.numel % block})
    if t.quantization != "none" and t.peft is not None and odd:
        # NF4Tensor.from_tensor asserts numel % block_size == 0 and double_quantize_scalers that the scalers fill
        # whole blocks of 256: a weight of a multiple of 16,384 elements (torchao 0.7.0 dtypes/nf4tensor.py)
        out.append(Problem("train.quantization", f"torchao's to_nf4 needs each weight to be a multiple of {block:,} "
                           f"elements (blocks of {NF4_BLOCK} and scaler blocks of {NF4_SCALER_BLOCK}); "
                           f"{', '.join(odd)} of {m.name} are not", "use quantization: none (LoRA)"))
    if t.precision not in TORCHTUNE_PRECISIONS:
        out.append(Problem("train.precision", f"torchtune's recipes run dtype bf16 or fp32 with no autocast "
                           f"({t.precision} is not one of them; fp16 is refused by training.get_dtype)",
                           "use precision: bf16-true (dtype: bf16) or fp32"))
    if t.quantization not in TORCHTUNE_QUANTIZATION:
        out.append(Problem("train.quantization", f"torchtune's QLoRA stores its base in torchao's NF4Tensor, whose "
                           f"scalers are always double-quantized; {t.quantization} is not a torchtune format",
                           "use quantization: nf4-dq (torchao NF4) or none"))
    if s.parallel.zero_stage:
        # the distributed recipes wrap the model in FSDP (FSDP1 before v0.3.0, fully_shard after)
        out.append(Problem("parallel.zero_stage", "torchtune shards with FSDP in its distributed recipes, not "
                           "DeepSpeed's ZeRO", "use parallel.fsdp: full_shard and zero_stage: 0"))
    g = checkpointing(s)
    if g not in ("none", "full"):
        out.append(Problem("train.gradient_checkpointing", f"torchtune's recipes checkpoint every layer whole "
                           f"(enable_activation_checkpointing) or not at all; {g} is not one of their policies",
                           "use gradient_checkpointing: full or none"))
    return out


# the frameworks that run a transformers model whose loss Liger's or CCE's patch replaces (torchtitan and
# Lit-GPT run their own model and loss)
_FUSED_LOSS_FRAMEWORKS = ("hf-trainer", "accelerate", "plain", "deepspeed")
# torchtune's chunked loss needs the model to return its logits in chunks: a training loop of one's own
_CHUNKED_LOSS_FRAMEWORKS = ("accelerate", "plain", "torchtune")


def _loss_and_offload_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """train.loss, train.packing, train.activation_offload and train.liger_kernels where the library cannot run them as modelled."""
    t, fw, tp = s.train, s.effective_framework, s.parallel.tp
    out: list[Problem] = []
    if t.loss != "standard":
        allowed = _CHUNKED_LOSS_FRAMEWORKS if t.loss == "chunked" else _FUSED_LOSS_FRAMEWORKS
        if fw not in allowed:
            out.append(Problem("train.loss", f"loss {t.loss} is not available under framework {fw} (it runs "
                               f"where {', '.join(allowed)} run the model)", "use loss: standard, or framework: "
                               f"{allowed[0]}"))
        if tp > 1:
            out.append(Problem("train.loss", f"loss {t.loss} with a vocabulary-parallel LM head (tp {tp}) is not "
                               "modelled: the kernels read the whole head on the rank", "use loss: standard with tp > 1"))
        if m.encoder_only:
            out.append(Problem("train.loss", f"loss {t.loss} is a causal-LM loss; {m.name} is an encoder",
                               "use loss: standard"))
    if t.packing and t.attention != "flash":
        out.append(Problem("train.packing", f"packing without padding is modelled with flash-attention's varlen "
                           f"kernel only; with {t.attention} transformers builds a 4-D block-diagonal mask from the "
                           "position_ids (masking_utils find_packed_sequence_indices)", "set attention: flash"))
    if t.activation_offload != "none":
        out += _offload_problems(s)
    if t.liger_kernels and (m.family not in _LIGER_FAMILIES or m.norm != "rms" or not m.mlp_gated
                            or m.hidden_act not in ("silu", "swish") or any(ls.moe for ls in m.layers)):
        out.append(Problem("train.liger_kernels", f"Liger's kernels on {m.name} ({m.family}) are not modelled: "
                           f"modelled for the dense RMSNorm + SwiGLU families {', '.join(_LIGER_FAMILIES)}",
                           "set liger_kernels: false"))
    if t.liger_kernels and fw not in _FUSED_LOSS_FRAMEWORKS:
        out.append(Problem("train.liger_kernels", f"Liger's kernels patch transformers' models; {fw} runs its own",
                           "set liger_kernels: false"))
    return out


def _unsloth_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """``software.unsloth`` where Unsloth's patched step is not what is modelled (facts/unsloth.py)."""
    t, sw = s.train, s.software
    v = sw.unsloth_version
    assert v is not None
    out: list[Problem] = []
    first = UNSLOTH_FAMILIES.get(m.family)
    if first is None:
        out.append(Problem("software.unsloth", f"Unsloth's patched forward is read for "
                           f"{', '.join(sorted(UNSLOTH_FAMILIES))}; {m.name} is {m.family}",
                           "unset software.unsloth (the model then runs transformers' code)"))
    elif release3(v) < first:
        out.append(Problem("software.unsloth", f"Unsloth {sw.unsloth} does not patch {m.family} (its loader dispatches "
                           f"it from {'.'.join(map(str, first))})", f"set software.unsloth to {'.'.join(map(str, first))} "
                           "or later, or unset it"))
    elif unsloth_row(v, m.family).loss == "unmodelled":
        last = UNSLOTH_ROWS[forward_of(m.family)][-1].first
        out.append(Problem("software.unsloth", f"Unsloth {sw.unsloth}'s loss from {'.'.join(map(str, last))} is not "
                           "modelled (llama.py's unsloth_fused_ce_loss sizes its chunks from the GPU memory free at run "
                           "time)", "set software.unsloth: 2025.8.4 (the last release modelled)"))
    if t.peft is None:
        out.append(Problem("software.unsloth", "Unsloth is modelled for LoRA and QLoRA (FastLanguageModel."
                           "get_peft_model); its full fine-tuning is not", "add train.peft, or unset software.unsloth"))
    if t.quantization not in ("none", "nf4", "nf4-dq"):
        out.append(Problem("train.quantization", f"Unsloth's FastLanguageModel loads a bitsandbytes 4-bit NF4 base "
                           f"(load_in_4bit) or a 16-bit one; {t.quantization} is not modelled with it",
                           "set quantization: nf4-dq (load_in_4bit) or none"))
    if s.effective_framework != "hf-trainer" or t.objective != "sft":
        out.append(Problem("software.unsloth", f"Unsloth is modelled under the HF Trainer's (TRL SFTTrainer's) "
                           f"supervised step; this is framework {s.effective_framework}, objective {t.objective}",
                           "set framework: hf-trainer and train.objective: sft, or unset software.unsloth"))
    if s.hardware.num_gpus > 1 or s.parallel.fsdp != "none" or s.parallel.zero_stage:
        out.append(Problem("software.unsloth", "Unsloth is modelled on one GPU", "set hardware.num_gpus: 1 with no "
                           "sharding, or unset software.unsloth"))
    if t.loss != "standard" or t.liger_kernels:
        out.append(Problem("software.unsloth", "Unsloth computes its own loss and kernels; train.loss and "
                           "train.liger_kernels describe other libraries'", "set loss: standard and liger_kernels: false"))
    if checkpointing(s) not in ("none", "full") or t.checkpoint_every_n_layers > 1 or t.deepspeed_checkpointing != "none":
        out.append(Problem("train.gradient_checkpointing", "Unsloth's use_gradient_checkpointing is True (full), "
                           "\"unsloth\" (full with activation_offload: cpu) or False (none)",
                           "set gradient_checkpointing: full or none"))
    if t.activation_offload == "cpu" and release3(v) < UNSLOTH_OFFLOADED_CKPT_FIRST:
        out.append(Problem("train.activation_offload", f"use_gradient_checkpointing=\"unsloth\" first shipped in "
                           f"Unsloth 2024.4; this is {sw.unsloth}", "set activation_offload: none "
                           "(use_gradient_checkpointing=True)"))
    return out


def unsloth_attention_for(s: Scenario, m: ModelSpec) -> tuple[Scenario, list[str]]:
    """The attention Unsloth's patched layers run in training, whatever ``train.attention`` says (no mask in
    training): Llama-family attention (``LlamaAttention_fast_forward``, 2024.5-2024.8) is flash-attention's kernel
    when flash-attn is installed, else xformers' memory-efficient one (K/V expanded to the query heads when gradients
    are needed), never eager; Gemma 2's (``Gemma2Attention_fast_forward``) is flash-attention's softcapping kernel with
    flash-attn >= 2.6.3, else ``slow_attention_softcapping``, which makes the whole score matrix (eager's tensors).
    ``attention: flash`` says flash-attn is installed; anything else is estimated as the fallback, said so."""
    if s.task != "train" or s.software.unsloth is None:
        return s, []
    given = s.train.attention
    if m.family == "gemma2":
        runs = "flash" if given == "flash" else "eager"
        why = ("flash-attn >= 2.6.3 (its softcapping kernel)" if runs == "flash" else
               "slow_attention_softcapping, the whole softcapped score matrix, without flash-attn >= 2.6.3")
    else:
        runs = "flash" if given == "flash" else "sdpa"
        why = ("flash-attn's kernel" if runs == "flash" else "xformers' memory-efficient kernel without flash-attn "
               "(estimated as SDPA's memory-efficient one)")
    if runs == given:
        return s, [f"train.attention: Unsloth runs {why} ({m.family})"]
    s = s.model_copy(update={"train": s.train.model_copy(update={"attention": runs})})
    return s, [(f"train.attention: {runs}, not {given}: Unsloth's patched {m.family} attention runs {why}; "
               "set attention: flash where flash-attn is installed")]


# Liger-Kernel v0.8.2 monkey_patch.py: apply_liger_kernel_to_llama / _mistral / _qwen2 / _qwen3 swap
# LlamaRMSNorm-style norms for LigerRMSNorm and the MLP for LigerSwiGLUMLP
_LIGER_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


# OffloadActivations wraps a training loop's forward: TRL's SFTTrainer (SFTConfig activation_offloading), a loop of
# one's own (torchtune's recipes)
_OFFLOAD_FRAMEWORKS = ("hf-trainer", "accelerate", "plain", "torchtune")


def _offload_problems(s: Scenario) -> list[Problem]:
    """Activation offloading as modelled: full checkpointing of every layer, one pipeline stage."""
    t, fw = s.train, s.effective_framework
    out: list[Problem] = []
    if checkpointing(s) != "full" or t.checkpoint_every_n_layers > 1:
        out.append(Problem("train.activation_offload", "activation offloading is modelled with full checkpointing "
                           "of every layer, as torchtune's recipes require (enable_activation_offloading needs "
                           "enable_activation_checkpointing)", "set gradient_checkpointing: full"))
    if fw not in _OFFLOAD_FRAMEWORKS:
        out.append(Problem("train.activation_offload", f"{fw} has no activation offloading of this kind "
                           "(torchtune's OffloadActivations, TRL's activation_offloading)",
                           f"use framework: {' or '.join(_OFFLOAD_FRAMEWORKS)}"))
    if s.parallel.pp > 1:
        out.append(Problem("train.activation_offload", "activation offloading with pipeline parallelism is not "
                           "modelled", "use pp: 1"))
    return out


# the optimizer rows whose step temporaries are those of one parameter updated alone (analytic/optimizer.py
# ``STEP_TEMPORARIES``): what a per-parameter optimizer in the backward makes; the step-wise strategies over
# several tensors' shapes (Adafactor, CAME) and the subset rows (Muon, GaLore, APOLLO) are not modelled there
IN_BACKWARD_STEPS = ("none", "foreach_sqrt_decay_group", "per_tensor_sign_update", "adam_mini_stepwise")

# the frameworks that clip every gradient after the backward by default, which needs them all at once:
# transformers' Trainer (TrainingArguments.max_grad_norm = 1.0), torchtitan (training.max_norm = 1.0), Accelerate as
# modelled here (trace/step.py: clip_grad_norm_(params, 1.0)); DeepSpeed's and Lightning's engines own the step
_CLIPPING = {"hf-trainer": "transformers' Trainer clips gradients (max_grad_norm=1.0)",
             "accelerate": "Accelerate's loop is modelled with clip_grad_norm_(params, 1.0)",
             "torchtitan": "torchtitan clips gradients (training.max_norm=1.0)"}


def in_backward_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """train.optimizer_in_backward where torchtune (recipes/full_finetune_single_device.py, v0.3.0 and later)
    or PyTorch refuse it, or where it is not modelled.

    torchtune raises "Gradient accumulation is not supported with optimizer in bwd" (v0.3.0) and, from v0.4.0,
    "Gradient clipping is not supported with optimizer in bwd": a gradient is freed by its parameter's
    hook before the next micro-batch could add to it or a norm over all of them could be taken."""
    from vramplan.facts.optimizers import optimizer_facts, runs_as

    t, fw, par = s.train, s.effective_framework, s.parallel
    name = "train.optimizer_in_backward"
    off = "or set optimizer_in_backward: false"
    out: list[Problem] = []
    if t.grad_accum_steps > 1:
        out.append(Problem(name, f"optimizer_in_backward with train.grad_accum_steps = {t.grad_accum_steps}: each "
                           "gradient is freed by its parameter's step as soon as it is made, so nothing accumulates "
                           "(torchtune: 'Gradient accumulation is not supported with optimizer in bwd')",
                           f"set grad_accum_steps: 1, {off}"))
    if fw in _CLIPPING:
        out.append(Problem(name, f"optimizer_in_backward with framework {fw}: {_CLIPPING[fw]}, which needs every "
                           "gradient after the backward (torchtune: 'Gradient clipping is not supported with "
                           "optimizer in bwd')", f"use framework: plain (no clipping), {off}"))
    elif fw not in ("plain", "torchtune"):
        out.append(Problem(name, f"optimizer_in_backward with framework {fw}: its engine runs the optimizer step "
                           "itself; modelled for a loop of one's own (framework: plain, torchtune's recipes)",
                           f"use framework: plain or torchtune, {off}"))
    if s.data_parallel_degree > 1 or par.tp > 1 or par.pp > 1 or par.cp > 1 or par.ep > 1 or \
            par.zero_stage or par.fsdp != "none" or par.offload != "none":
        out.append(Problem(name, "optimizer_in_backward is modelled on one GPU without sharding or offload "
                           "(torchtune's full_finetune_single_device)", f"use one GPU, {off}"))
    if m.moe is not None and t.peft is None and s.software.fused_moe_experts:
        out.append(Problem(name, f"optimizer_in_backward with {m.name}'s experts under transformers >= 5, which "
                           "holds each layer's experts as one fused tensor: its size per parameter is not modelled",
                           f"set software.transformers below 5 (one nn.Linear per expert), {off}"))
    f = optimizer_facts(runs_as(t.optimizer, fw))
    if f.step_temporary not in IN_BACKWARD_STEPS or f.subset is not None:
        out.append(Problem(name, f"optimizer_in_backward with optimizer {t.optimizer}: its step over several "
                           "tensors is not modelled one parameter at a time",
                           f"use adamw, adamw-fused, a bitsandbytes or torchao AdamW, {off}"))
    return out


def torchao_offload_problems(s: Scenario) -> list[Problem]:
    """train.torchao_cpu_offload where torchao (v0.18.0 torchao/optim/cpu_offload.py) refuses it or it is not
    modelled.  Its docstring: "Offload optimizer to CPU for single-GPU training"; ``offload_gradients``: "Not
    compatible with gradient accumulation" (and a clipping norm after the backward finds no GPU gradient)."""
    t, fw, par = s.train, s.effective_framework, s.parallel
    name = "train.torchao_cpu_offload"
    off = "or set torchao_cpu_offload: none"
    out: list[Problem] = []
    if s.data_parallel_degree > 1 or par.tp > 1 or par.pp > 1 or par.cp > 1 or par.ep > 1 or \
            par.zero_stage or par.fsdp != "none" or par.offload != "none":
        out.append(Problem(name, "torchao's CPUOffloadOptimizer is for single-GPU training, without sharding or "
                           "another offload", f"use one GPU, {off}"))
    if t.optimizer not in ("adamw", "adamw-fused") or t.peft is not None or t.optimizer_in_backward:
        out.append(Problem(name, "torchao_cpu_offload is modelled for full fine-tuning with torch's AdamW (fused on "
                           "the CPU), without train.peft or train.optimizer_in_backward",
                           f"use optimizer: adamw, no peft, no optimizer_in_backward, {off}"))
    if t.torchao_cpu_offload == "optimizer+gradients":
        if t.grad_accum_steps > 1:
            out.append(Problem(name, f"optimizer+gradients with train.grad_accum_steps = {t.grad_accum_steps}: "
                               "offload_gradients frees each GPU gradient once copied ('Not compatible with "
                               "gradient accumulation')", f"set grad_accum_steps: 1, use optimizer, {off}"))
        if fw in _CLIPPING:
            out.append(Problem(name, f"optimizer+gradients with framework {fw}: {_CLIPPING[fw]}, but the GPU "
                               "gradients are freed in the backward", f"use framework: plain, or optimizer, {off}"))
    return out


_BNB_NAMES = frozenset(bnb_formats())  # the formats replace_with_bnb_linear stores


def _moe_expert_quant_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """``train.quantize_moe_experts``: QLoRA on a MoE model whose experts stock bitsandbytes leaves unquantized is
    refused unless the experts are said to be quantized (the field's docstring); the key is refused where it does
    not apply."""
    t = s.train
    where = "train.quantize_moe_experts"
    applies = m.moe is not None and t.peft is not None and t.quantization in _BNB_NAMES
    if not applies:
        if t.quantize_moe_experts is not None:
            return [Problem(where, "applies to bitsandbytes QLoRA on a mixture-of-experts model only "
                            f"({m.name}, quantization {t.quantization})", "drop train.quantize_moe_experts")]
        return []
    stock = stock_bnb_quantizes_experts(m, t.quantization, s.software.fused_moe_experts)
    held = t.quantize_moe_experts if t.quantize_moe_experts is not None else stock
    if held:
        return []
    experts = sum(p.total for p in m.params if p.role == "expert")
    extra = experts * 4 - quant_format(t.quantization).linear_bytes(experts, 1)
    size = f"{extra / 2**30:,.1f} GiB" if extra >= 2**30 else f"{extra / 2**20:,.1f} MiB"
    why = ("train.quantize_moe_experts is false" if t.quantize_moe_experts is False else
           f"stock bitsandbytes leaves {m.name}'s experts unquantized under "
           f"{'transformers ' + s.software.transformers if s.software.transformers else 'transformers >= 5'}: they "
           "are parameters, not nn.Linear modules (bitsandbytes issue #1849)")
    return [Problem(where, f"{why}; peft's prepare_model_for_kbit_training then casts them to fp32, about "
                    f"{size} more than 4-bit over the whole model (before any sharding); experts in "
                    "16/32-bit under QLoRA are not modelled",
                    "set train.quantize_moe_experts: true if the framework quantizes them (axolotl's "
                    "quantize_moe_experts, Unsloth), or software.transformers to the 4.x release the run used "
                    "(per-expert Linear4bit), or train.quantization: none with peft.method lora")]


def _train_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """A training scenario's quantization, attention and adapter targets against its adapter and model."""
    out: list[Problem] = []
    if s.task == "train":
        t = s.train
        out += _lora_target_problems(s, m)
        if t.peft is not None and t.peft.method == "qlora" and t.quantization == "none":
            out.append(Problem("train.quantization", "peft.method qlora needs 4-bit base weights",
                               "set train.quantization: nf4 (or nf4-dq)"))
        if t.quantization != "none" and t.peft is None:
            out.append(Problem("train.quantization", "quantized base weights cannot be trained without an adapter",
                               "add train.peft (lora/qlora) or set quantization: none"))
        out += _checkpointing_problems(s, m)
        out += _loss_and_offload_problems(s, m)
        out += _moe_expert_quant_problems(s, m)
        if s.software.unsloth is not None:
            out += _unsloth_problems(s, m)
        if s.effective_framework == "torchtune":
            out += _torchtune_problems(s, m)
        if s.effective_framework == "torchtitan" and s.parallel.zero_stage:
            # torchtitan shards with FSDP2 (parallelize_llama.py apply_fsdp); it has no DeepSpeed engine
            out.append(Problem("parallel.zero_stage", "torchtitan shards with FSDP2 (fully_shard), not DeepSpeed's "
                               "ZeRO", "use parallel.fsdp: full_shard and zero_stage: 0"))
        if t.optimizer_in_backward:
            out += in_backward_problems(s, m)
        if t.torchao_cpu_offload != "none":
            out += torchao_offload_problems(s)
        out += _float8_problems(s)
        out += _mx_problems(s, m)
        if m.encoder_only and t.attention == "flash":
            out.append(Problem("train.attention", "flash-attention 2 is not available for encoder models here",
                               "use sdpa"))
    return out


def _converter_section_problems(s: Scenario, precision: str, section: str, section_set: bool,
                                converter: str) -> list[Problem]:
    """What torchao's converter precisions (``fp8-torchao``, ``mxfp8-torchao``) share: their ``train.<section>`` is
    read only with the precision; with it, only torchtitan's converter and full fine-tuning are modelled."""
    if s.train.precision != precision:
        return ([Problem(f"train.{section}", f"train.{section} is read only with train.precision: {precision}",
                         f"set train.precision: {precision}, or remove train.{section}")] if section_set else [])
    out: list[Problem] = []
    if s.effective_framework != "torchtitan":
        out.append(Problem("train.precision", f"{precision} is modelled as torchtitan's {converter} converter, not "
                           f"under framework {s.effective_framework}", "set framework: torchtitan (or use bf16-mixed)"))
    if s.train.peft is not None or s.train.objective != "sft":
        out.append(Problem("train.precision", f"{precision} is modelled for full fine-tuning (objective sft) only",
                           "remove train.peft / set objective: sft, or use bf16-mixed"))
    return out


def _mx_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """torchao MXFP8 training (``precision: mxfp8-torchao``, ``train.mx``): what torchtitan's ``mx`` converter and
    torchao's MX casts refuse, and what is not modelled (docs/conventions.md, torchao MXFP8).  The GPU's compute
    capability is checked with the GPU (spec/checks.py ``capability_problems``)."""
    t = s.train
    if t.precision != "mxfp8-torchao":
        return _converter_section_problems(s, "mxfp8-torchao", "mx", t.mx != MXTraining(), "mx")
    out = _converter_section_problems(s, "mxfp8-torchao", "mx", False, "mx")
    tokens = t.micro_batch_size * t.seq_len // s.parallel.cp
    if tokens % MX_BLOCK:
        # mx_mm.backward casts grad_output and the input along dim1, in blocks of 32 tokens: mxfp8_quantize_cuda
        # asserts "rows must be a multiple of 32", to_mx "must be divisible by block_size"
        out.append(Problem("train.seq_len", f"MXFP8 casts the gradients in blocks of {MX_BLOCK} tokens: "
                           f"micro_batch_size x seq_len{' / cp' if s.parallel.cp > 1 else ''} = {tokens} is not a "
                           f"multiple of {MX_BLOCK} (torchao to_mx, mxfp8_quantize_cuda)",
                           f"set seq_len to a multiple of {MX_BLOCK}"))
    odd = _mx_odd_linears(s, m)
    if odd:
        # torchtitan converts any nn.Linear with dimensions multiples of 16; torchao's MX casts need 32
        out.append(Problem("train.precision", f"mxfp8-torchao: torchtitan converts {', '.join(odd)}, whose dimensions "
                           f"on a rank are multiples of 16 but not of {MX_BLOCK}, which torchao's MX casts need "
                           "(to_mx: 'must be divisible by block_size')", "use fp8-torchao or bf16-mixed"))
    return out


def _mx_odd_linears(s: Scenario, m: ModelSpec) -> list[str]:
    """The linears torchtitan's filter converts (both dimensions multiples of 16) whose local dimensions are not
    multiples of the MX block (32): the decoder's, and the head when ``train.mx.convert_lm_head`` is true."""
    tp = s.parallel.tp
    out = []
    for p in m.params:
        convert = p.role == "linear" or (p.role == "lm_head" and s.train.mx.convert_lm_head)
        if not (convert and p.in_features and p.in_features % 16 == 0 and p.out_features % 16 == 0):
            continue
        fan_in = p.in_features // tp if p.tp == "row" else p.in_features
        fan_out = p.out_features // tp if p.tp == "column" or p.role == "lm_head" else p.out_features
        if fan_in % MX_BLOCK or fan_out % MX_BLOCK:
            out.append(p.name)
    return out


def _float8_problems(s: Scenario) -> list[Problem]:
    """torchao float8 training (``precision: fp8-torchao``, ``train.float8``): what torchtitan's converter and torchao's
    ``Float8LinearConfig`` refuse, and what is not modelled (docs/conventions.md, torchao float8)."""
    t, f8 = s.train, s.train.float8
    if t.precision != "fp8-torchao":
        return _converter_section_problems(s, "fp8-torchao", "float8", f8 != Float8Training(), "float8")
    out = _converter_section_problems(s, "fp8-torchao", "float8", False, "float8")
    if f8.enable_fsdp_float8_all_gather and f8.recipe_name != "tensorwise":
        # torchao config.py Float8LinearConfig.__post_init__: "enable_fsdp_float8_all_gather only supports
        # tensorwise scaling granularity"; torchtitan asserts it is not combined with recipe_name
        out.append(Problem("train.float8.enable_fsdp_float8_all_gather", "float8 all-gather needs recipe_name "
                           f"tensorwise, not {f8.recipe_name} (torchao Float8LinearConfig)",
                           "set train.float8.recipe_name: tensorwise, or turn the all-gather off"))
    sharded = s.parallel.fsdp in ("full_shard", "hybrid_shard") and s.shard_degree > 1
    if f8.enable_fsdp_float8_all_gather and not sharded:
        # torchtitan Float8Converter: enable_fsdp_float8_all_gather = parallel_dims.dp_shard_enabled and ...
        out.append(Problem("train.float8.enable_fsdp_float8_all_gather", "float8 all-gather acts only on FSDP "
                           "parameter sharding over more than one GPU (torchtitan turns it off otherwise)",
                           "set parallel.fsdp: full_shard with several data-parallel GPUs, or turn it off"))
    if f8.precompute_float8_dynamic_scale_for_fsdp and not f8.enable_fsdp_float8_all_gather:
        out.append(Problem("train.float8.precompute_float8_dynamic_scale_for_fsdp", "precomputed scales need "
                           "enable_fsdp_float8_all_gather (torchtitan ignores them otherwise)",
                           "set train.float8.enable_fsdp_float8_all_gather: true, or turn it off"))
    if f8.force_recompute_fp8_weight_in_bwd and f8.recipe_name != "tensorwise":
        out.append(Problem("train.float8.force_recompute_fp8_weight_in_bwd", "torchtitan refuses "
                           "force_recompute_fp8_weight_in_bwd with a recipe_name", "set recipe_name: tensorwise"))
    return out


def _skipped_linears(cq: CheckpointQuant, m: ModelSpec) -> list[str]:
    """Skipped modules (``llm_int8_skip_modules``/``modules_to_not_convert``) that name a linear layer
    vramplan quantizes: the LM head, embeddings and routers are never quantized here anyway."""
    leaves = {p.module for p in m.params if p.role in ("linear", "expert")}
    # compressed-tensors ``ignore`` entries "re:<pattern>" are matched against module names
    # (``utils/match.py`` ``is_match``: ``re.match``); here against one layer's names, ``model.layers.0.<...>``
    names = ["model." + p.name.removesuffix(".weight").replace("layers.", "layers.0.", 1)
             for p in m.params if p.role in ("linear", "expert")]
    # entries naming a vision tower's or projector's modules (``visual.blocks.31.mlp.down_proj``) are read by
    # spec/vision_quant.py against the tower's own names
    tower = tuple(p.removesuffix(".") for p in m.vision.param_prefixes) if m.vision is not None else ()
    return [x for x in cq.skip_modules
            if not (tower and x.removeprefix("re:").removeprefix("model.").startswith(tower))
            and ((x.startswith("re:") and any(_regex_match(x[3:], n) for n in names))
                 or (not x.startswith("re:") and x.rsplit(".", 1)[-1].replace("*", "") in leaves))]


def _regex_match(pattern: str, name: str) -> bool:
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False


def checkpoint_quantization_for(s: Scenario, m: ModelSpec) -> tuple[Scenario, list[str], list[Problem]]:
    """A pre-quantized checkpoint (the model's ``quantization_config``) against the scenario's quantization.

    transformers loads a checkpoint in the format it was saved in: a ``quantization_config`` passed to
    ``from_pretrained`` for an already-quantized model is replaced by the checkpoint's own
    (``AutoHfQuantizer.merge_quantization_configs``: "The quantization_config from the model will be
    used").  So the checkpoint decides: the task's quantization left at none takes the checkpoint's format
    (the scenario returned says so, and an assumption); a different one is refused naming both; a format
    with no row in ``facts/quantization.py`` is refused naming what is supported, except in training,
    where formats transformers cannot train as stored (MXFP4, block-wise fp8) are loaded dequantized.
    Returns the scenario to estimate, the assumptions, the problems.
    """
    cq = m.checkpoint_quant
    if cq is None:
        return s, [], []
    if s.task == "serve" and s.serve.engine == "llamacpp":
        # llama.cpp never reads the Hub checkpoint: it loads a GGUF file, whose tensor types (serve.gguf.quant, or
        # the file's header with serve.gguf.file) decide the weights (serve/llamacpp.py _tensors), so the Hub
        # config's quantization_config does not apply; a scenario's own serve.quantization stays refused there
        note = (f"{m.name}'s config.json declares {cq.description} (quantization_config): not used by llama.cpp, "
                "which reads the GGUF file's tensor types")
        return s, [note], []
    section = s.task
    current: str = getattr(s, section).quantization
    said = f"{m.name}'s config.json declares {cq.description} (quantization_config)"
    problem = _checkpoint_problem(s, m, cq, said)
    if problem is not None:
        return s, [], [problem]
    if s.task == "train" and cq.trained_dequantized:
        then = "" if current == "none" else f", then quantized to {current} as train.quantization says"
        loader = {"mxfp4": "Mxfp4Config", "fp8": "FineGrainedFP8Config"}.get(cq.method, "the quantizer's config")
        note = (f"{said}: transformers cannot train it as stored, so the weights are assumed loaded dequantized "
                f"to {m.checkpoint_dtype} ({loader}(dequantize=True)){then}")
        return s, [note], []
    assert cq.format is not None
    if current == "none":
        s = s.model_copy(update={section: getattr(s, section).model_copy(update={"quantization": cq.format})})
    if s.task == "inference" and cq.compute_dtype and s.inference.bnb_compute_dtype is None:
        # the checkpoint's BitsAndBytesConfig carries its compute dtype, which from_pretrained uses
        s = s.model_copy(update={"inference": s.inference.model_copy(update={"bnb_compute_dtype": cq.compute_dtype})})
    note = f"{said}: its linear weights are estimated as stored ({section}.quantization {cq.format}, from the checkpoint)"
    return s, [note], []


def unmodelled_inputs(s: Scenario, m: ModelSpec) -> list[str]:
    """Inputs accepted but not modelled, each as an assumption starting ``not modelled: `` (the calibrated
    band widens for a report carrying one)."""
    fw, out = s.effective_framework, []
    if s.task == "serve" and fw != "vllm":
        out.append(f"not modelled: framework {fw} for task serve (a vLLM engine's start-up is what is estimated)")
    if s.task == "inference" and fw in ("torchtitan", "deepspeed", "torchtune", "verl", "openrlhf"):
        out.append(f"not modelled: framework {fw} for task inference (Hugging Face generate is what is estimated)")
    out += megatron_unmodelled(s, m)
    if s.task == "train" and s.train.precision == "fp8-mixed" and s.train.peft is not None:
        # precision.py's fp8 row (an fp8 copy of each linear weight, fp8 saved inputs) is applied to the trained
        # linears of a full fine-tuning only; a frozen base under adapters is counted as bf16-mixed
        out.append("not modelled: train.precision fp8-mixed with train.peft (Transformer Engine's fp8 weight copies "
                   "and fp8 saved inputs of frozen linears with adapters): they are counted as under bf16-mixed")
    if s.task == "train" and s.train.objective != "sft" and s.software.transformers is not None:
        # TRL's trainers were read at releases that require a recent transformers (facts/trl.py); what an older
        # one does to the logits TRL reads (e.g. the causal-LM forward's fp32 upcast of every position's logits
        # before 4.45) is not followed
        out.append(f"not modelled: software.transformers {s.software.transformers} for a {s.train.objective} step "
                   "(TRL's log-probabilities are read at the transformers its releases require; only the MoE expert "
                   "layout follows this release)")
    if s.task == "train" and s.train.torch_compile:
        out.append("not modelled: train.torch_compile (the eager step's saved tensors are counted; inductor's "
                   "fusions and min-cut partitioner usually save fewer and recompute the rest, so the activations "
                   "are likely overestimated)")
    if s.task == "train" and fw == "torchtune" and s.train.peft is not None and s.train.quantization != "none":
        out += _torchtune_partial_quant(s)
    if s.task == "inference" and m.traits.fp32_router_weight:
        # HunYuan-MoE's generate: the traced engine (transformers' own module on the meta device) holds more at the
        # prefill than the analytic terms (tests/test_families_hunyuan.py test_hunyuan_prefill_matches_trace, xfail)
        out.append("not modelled: generate's prefill of a model whose router weight is fp32 (HunYuan-MoE's gate.wg): "
                   "the fp32 gate weight and what the MoE block keeps through the routed experts (the shared MLP's "
                   "output, the gate's fp32 input copy); the traced engine is up to 16% higher in the non-weight bytes")
    if s.task == "inference" and s.parallel.pp > 1:
        out.append(f"not modelled: parallel.pp {s.parallel.pp} for task inference (generate's layers split over GPUs, "
                   "as device_map='auto' does): every GPU is counted with the whole model")
    # parallel.ep on a dense model is a contradiction, refused before this (spec/checks.py contradictions)
    return out + vision_notes(s, m) + held_module_notes(s, m)


def _checkpoint_problem(s: Scenario, m: ModelSpec, cq: CheckpointQuant, said: str) -> Problem | None:
    """Why the checkpoint's format cannot be estimated for this scenario (None: it can)."""
    where = f"{s.task}.quantization"
    current: str = getattr(s, s.task).quantization
    if skipped := _skipped_linears(cq, m):
        return Problem("model", f"{said} with skipped linear modules {skipped}: not modelled (vramplan quantizes "
                       "every linear layer but the LM head)",
                       "remove them from llm_int8_skip_modules / modules_to_not_convert, or the quantization_config")
    if s.task == "train" and cq.trained_dequantized:
        return None
    trainable: tuple[str, ...] = get_args(TrainQuant)
    if cq.format is None or (s.task == "train" and cq.format not in trainable):
        why = cq.why_not or f"training over {cq.format} weights is not modelled (trainable: {', '.join(trainable[1:])})"
        return Problem("model", f"{said}: not modelled ({why})",
                       f"estimable pre-quantized checkpoints: {'; '.join(PREQUANTIZED_SUPPORTED)}; or remove "
                       "quantization_config to estimate the unquantized model")
    if current not in ("none", cq.format):
        return Problem(where, f"{where} is {current} but {said}, stored as {cq.format}; transformers keeps the "
                       "checkpoint's format (merge_quantization_configs)",
                       f"set {where}: {cq.format} (or none), or use an unquantized checkpoint")
    return None
