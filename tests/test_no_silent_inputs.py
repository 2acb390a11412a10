"""No silent inputs (issue 15 item 5; docs/conventions.md, No silent inputs).

Every scenario field is set, on sixteen base scenarios (full fine-tuning, LoRA, QLoRA, QLoRA under Lightning,
ZeRO-3, FSDP, torchtitan, DPO, GRPO, Hugging Face generate with and without 4-bit weights, and serving with vLLM
(plain, tp 2 with LoRA adapters, a draft model), SGLang and llama.cpp), to a valid value other than its
default, and the analytic estimate must show it: a byte figure, a report key, the phase list or the verdict changes; or an
assumption the base did not carry names the field (its dotted path, or the block holding it); or the scenario
is refused with a ``ScenarioError`` naming it.  A field that changes nothing for a stated reason is listed in
``ALLOWED`` with that reason; an entry that no longer matches anything is an error too, so the list stays
true.  Candidate values come from the field's type: every other member of a ``Literal`` or of a table's names
(``facts.Choices``), the other boolean, a number in range, and for free strings the values in ``VALUES``.
"""

from __future__ import annotations

import copy
import json
import types
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from vramplan import engine
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError, VramplanError
from vramplan.facts import Choices
from vramplan.spec.scenario import Scenario

MODEL = "meta-llama/Llama-2-7b-hf"
HW = {"gpu": "H100-SXM"}
BASES: dict[str, dict[str, Any]] = {
    "full": {"model": MODEL, "task": "train", "hardware": HW},
    "lora": {"model": MODEL, "task": "train", "hardware": HW, "train": {"peft": {"method": "lora"}}},
    "qlora": {"model": MODEL, "task": "train", "hardware": HW,
              "train": {"peft": {"method": "qlora"}, "quantization": "nf4"}},
    "grpo": {"model": MODEL, "task": "train", "hardware": HW,
             "train": {"peft": {"method": "lora"}, "objective": "grpo", "micro_batch_size": 8}},
    # Lit-GPT refuses a bitsandbytes base with a mixed precision (spec/checks.py litgpt_problems): bf16-true
    "lightning": {"model": MODEL, "task": "train", "hardware": HW, "framework": "lightning",
                  "train": {"peft": {"method": "qlora"}, "quantization": "nf4", "precision": "bf16-true"}},
    "torchtune": {"model": MODEL, "task": "train", "hardware": HW, "framework": "torchtune",
                  # torchtune's LoRA builders require lora_attn_modules: null targets are refused there
                  "train": {"peft": {"method": "qlora", "target_modules": ["q_proj", "v_proj"]},
                            "quantization": "nf4-dq", "precision": "bf16-true"}},
    "zero3": {"model": MODEL, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 2}, "parallel": {"zero_stage": 3}},
    "torchtitan": {"model": MODEL, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 2},
                   "framework": "torchtitan", "parallel": {"fsdp": "full_shard"}},
    # Megatron-LM: its optimizer is Transformer Engine's FusedAdam (adamw-fused); two GPUs so that the distributed
    # optimizer shards
    "megatron": {"model": MODEL, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 2},
                 "framework": "megatron", "train": {"optimizer": "adamw-fused"}},
    "dpo": {"model": MODEL, "task": "train", "hardware": HW, "train": {"peft": {"method": "lora"}, "objective": "dpo"}},
    "ppo": {"model": MODEL, "task": "train", "hardware": HW,
            "train": {"objective": "ppo", "precision": "bf16-true", "grad_accum_steps": 2}},
    "fsdp": {"model": MODEL, "task": "train", "hardware": {"gpu": "H100-SXM", "num_gpus": 2},
             "parallel": {"fsdp": "full_shard"}},
    "inference": {"model": MODEL, "task": "inference", "hardware": HW, "inference": {"prompt_len": 128, "new_tokens": 16}},
    "inference-nf4": {"model": MODEL, "task": "inference", "hardware": HW,
                      "inference": {"prompt_len": 128, "new_tokens": 16, "quantization": "nf4", "dtype": "fp16"}},
    "vllm": {"model": MODEL, "task": "serve", "hardware": HW},
    "vllm-tp2-lora": {"model": MODEL, "task": "serve", "hardware": {"gpu": "H100-SXM", "num_gpus": 2},
                      "parallel": {"tp": 2}, "serve": {"max_loras": 2}},
    "vllm-draft": {"model": MODEL, "task": "serve", "hardware": HW,
                   "serve": {"speculative": {"method": "draft", "model": "meta-llama/Llama-3.2-1B"}}},
    "sglang": {"model": MODEL, "task": "serve", "hardware": HW, "serve": {"engine": "sglang"}},
    "llamacpp": {"model": MODEL, "task": "serve", "hardware": HW, "serve": {"engine": "llamacpp"}},
}
# Fields not audited: the model itself (every base names one; another model changes everything) and how it
# is found (``offline``: no network, excluded from the report), and a GGUF file path (tests/test_serve_llamacpp.py
# reads hand-written files).
NOT_AUDITED = {"model": "the model under estimate: every other figure is its", "offline": "how the model is found, "
               "not what is estimated (excluded from the report's scenario)",
               "serve.gguf.file": "a local file (tests/test_serve_llamacpp.py writes and reads them)"}
# Values of free-form fields (strings, lists) and numbers where the generic choice says nothing: a release that
# gates a modelled behaviour, a catalog name, a llama.cpp batch below the micro-batch.
VALUES: dict[str, list[Any]] = {
    "hardware.gpu": ["A100-80GB"], "parallel.moe_expert_capacity_factor": [1.25],
    "train.peft.target_modules": ["all-linear", ["q_proj", "k_proj", "v_proj", "o_proj"]],
    "serve.cudagraph_capture_sizes": [[1, 2, 4, 8]],
    "serve.vllm_version": ["0.19"], "rl.rollout.vllm_version": ["0.19"], "serve.sglang_version": ["0.4.6"],
    "serve.gguf.quant": ["Q8_0"], "serve.gguf.cache_type_k": ["q8_0"], "serve.gguf.cache_type_v": ["q8_0"],
    "serve.gguf.llamacpp_build": ["b3410"], "serve.gguf.n_batch": [256], "lifecycle.eval_seq_len": [8192],
    "software.bitsandbytes": ["0.41.1"], "software.peft": ["0.10.0"], "software.transformers": ["4.40.0"],
    "software.torch": ["2.14"], "software.trl": ["1.16.0"], "serve.speculative.model": ["meta-llama/Llama-3.2-1B"],
    "software.autoawq": ["0.2.0"], "software.accelerate": ["0.29.0"], "software.torchtune": ["0.2.1"], "software.torchtitan": ["0.2.0"],
    "software.deepspeed": ["0.10.3"], "software.unsloth": ["2024.5"],
    "rl.reward_model": ["meta-llama/Llama-3.2-1B"],
    "rl.value_model": ["meta-llama/Llama-3.2-1B"],
    # null means the trainer's default (spec/defaults.py): a value on each side of GRPOConfig's
    "rl.beta": [1.0], "rl.rollout.num_generations": [16], "rl.rollout.max_completion_len": [512],
}
# Settings a field needs to be valid at all, laid on the base and on the variant alike.
COMPANIONS: dict[str, dict[str, Any]] = {f"parallel.{k}": {"hardware.num_gpus": 2} for k in ("tp", "pp", "cp", "ep")}
# An optional block (train.peft, serve.speculative) absent from a base is added with these keys before one of
# its fields is set, so the variant differs from its reference by that field alone.
BLOCKS: dict[str, dict[str, Any]] = {"train.peft": {}, "serve.speculative": {"method": "ngram"}}

# Fields, or (field, value) pairs, whose setting changes nothing, and why.  Each must be silent somewhere
# (test_every_allowance_is_used).
ALLOWED: dict[str | tuple[str, str] | tuple[str, str, str], str] = {
    # Llama-2-7B's attention runs on the cache's own K/V (as many K/V heads as query heads, nothing repeated)
    "train.use_cache": "with Llama-2-7B the training forward's cache holds the attention's own K/V: it adds nothing "
                       "whichever way it is set (analytic/terms/saved.py training_cache_bytes)",
    # the value a null resolves to, so nothing is set that the base did not have
    ("framework", "'hf-trainer'"): "null resolves to hf-trainer for a training job without ZeRO",
    ("framework", "'vllm'"): "null resolves to vllm for task serve, whatever serve.engine (spec/scenario.py)",
    ("lifecycle.evaluation", "False"): "null resolves to false outside Lightning (HF Trainer eval_strategy='no')",
    ("lifecycle.quantize_at_init", "False"): "null resolves to false outside Lightning (analytic/lifecycle/load.py)",
    ("lifecycle.device_map", "'none'"): "null resolves to none without bitsandbytes (the load note names it)",
    ("lifecycle.device_map", "'auto'"): "null resolves to auto with bitsandbytes (Bnb4BitHfQuantizer.update_device_map)",
    ("lifecycle.state_dict_type", "'full_offload'"): "null resolves to full_offload outside torchtitan and "
    "DeepSpeed (accelerate's and Lightning's FULL_STATE_DICT config)",
    ("framework", "'deepspeed'"): "null resolves to deepspeed with a ZeRO stage (spec/scenario.py)",
    ("lifecycle.state_dict_type", "'sharded'"): "null resolves to sharded under torchtitan and DeepSpeed",
    ("rl.reference_model", "'shared'"): "null resolves to shared under PEFT with a reference (TRL DPOTrainer)",
    ("inference.bnb_compute_dtype", "'fp16'"): "null means inference.dtype, fp16 in that base",
    ("lifecycle.evaluation", "True"): "null resolves to true under Lightning (Lit-GPT's finetune scripts validate)",
    ("lifecycle.quantize_at_init", "True"): "null resolves to true under Lightning with a bitsandbytes 4-bit base",
    ("zero3", "lifecycle.zero_init", "True"): "null resolves to true: a model built under zero.Init "
    "(spec/scenario.py Lifecycle.zero_init)",
    ("lightning", "framework", "'litgpt'"): "litgpt names Lit-GPT's conventions, which lightning has always meant "
    "(spec/scenario.py effective_framework)",
    ("parallel.deepspeed.contiguous_gradients", "True"): "null resolves to true (DeepSpeed's default, "
    "runtime/zero/config.py): the value equals it",
    ("zero3", "train.grad_accum_steps", "2"): "DeepSpeed ZeRO-3's gradient partition is one flat buffer made at the "
    "optimizer's __init__ (stage3.py grad_partitions_flat_buffer): resident from the forward whatever the accumulation",
    ("megatron", "parallel.megatron.use_distributed_optimizer", "False"): "null resolves to false, Megatron-LM's "
    "default (--use-distributed-optimizer is a store_true flag; spec/defaults.py megatron_distributed_optimizer)",
    ("megatron", "train.grad_accum_steps", "2"): "Megatron-Core's grad buffer is resident from the forward whatever "
    "the accumulation: every micro-batch adds into the same main_grad views (param_and_grad_buffer.py)",
    ("lifecycle.eval_generate_tokens", "4"): "Lit-GPT's generate_example sizes its KV cache by max_seq_length, "
    "not by the tokens generated (analytic/lifecycle/evaluation.py _generation_bytes)",
    ("vllm-draft", "serve.speculative.method", "'eagle'"): "vLLM loads a draft model and an EAGLE head alike, as the "
    "named checkpoint's weights and KV layers (the proposer note names the method)",
    ("vllm-draft", "serve.speculative.method", "'eagle3'"): "as eagle: the named checkpoint's weights and KV layers",
    ("inference.quantization", "'fp4'"): "bitsandbytes fp4 and nf4 store the same 4-bit codes and one absmax per 64",
    ("serve.gguf.flash_attn", "True"): "the newest modelled build's default is auto, on for a CUDA GPU (b6327 on)",
    ("rl.reference_model", "'none'"): "null resolves to none when beta is 0 (TRL GRPOTrainer.__init__)",
    ("train.gradient_checkpointing", "'full'"): "left out under a TRL objective it is TRL's default, "
    "gradient_checkpointing=True (spec/defaults.py; the note says so)",
    ("train.gradient_checkpointing", "'none'"): "null resolves to none outside a TRL objective (the HF Trainer's "
    "gradient_checkpointing=False, spec/defaults.py)",
    ("software.expandable_segments", "False"): "null resolves to false outside a torchtitan training job (PyTorch's "
    "default; spec/defaults.py expandable_segments): the value equals it",
    ("serve.vllm_engine", "'v1'"): "VLLM_USE_V1=1 is what auto runs at the bases' vLLM 0.11 (V1 from 0.8.0, no V0 "
    "fallback after 0.10.1: facts/vllm_releases.py V0_FALLBACK_UNTIL); tests/test_vllm_v0_fallback.py",
    ("serve.dtype", "'bf16'"): "auto resolves to bf16 from compute capability 8.0 (vLLM's --dtype auto), and is "
    "bf16 where no engine reads it (llama.cpp: the GGUF file's types; spec/defaults.py)",
    ("rl.beta", "1.0"): "under PEFT the reference is the policy with its adapters disabled, no second copy, and its "
    "no-grad forward is the scoring phase's (the reference note says so)",
    ("torchtitan", "software.expandable_segments", "True"): "null resolves to true under torchtitan (its "
    "run_train.sh; spec/defaults.py expandable_segments): the value equals it",
    ("ppo", "rl.reference_model", "'separate'"): "null resolves to separate without PEFT (TRL v1.12.0 "
    "PPOTrainer.__init__ create_reference_model; the reference note says so)",
    ("rl.rollout.engine", "'vllm'"): "null resolves to vllm outside ppo (spec/defaults.py rollout_engine): the value "
    "equals it",
    ("ppo", "rl.rollout.engine", "'hf-generate'"): "null resolves to hf-generate under ppo, PPOTrainer's only rollout "
    "(analytic/ppo.py with_defaults; the rollout note says so)",
    ("ppo", "train.precision", "'fp16-true'"): "fp16 and bf16 weights, states and logits are 2 bytes each",
    # modelled, and the same bytes
    ("train.precision", "'fp16-mixed'"): "fp16 and bf16 autocast hold the same 2-byte copies and 4-byte masters",
    ("inference.dtype", "'fp16'"): "fp16 and bf16 weights are 2 bytes each (the assumptions name the dtype)",
    ("serve.dtype", "'fp16'"): "fp16 and bf16 weights are 2 bytes each",
    ("inference.kv_cache_dtype", "'fp16'"): "2 bytes per element like the model's bf16 (the KV note names it)",
    ("inference.kv_cache_dtype", "'bf16'"): "the model's own dtype, what auto means",
    ("serve.kv_cache_dtype", "'fp16'"): "2 bytes per element like the model's bf16",
    ("serve.kv_cache_dtype", "'bf16'"): "the model's own dtype, what auto means",
    ("train.quantization", "'fp4'"): "bitsandbytes fp4 and nf4 store the same 4-bit codes and one absmax per 64",
    ("train.attention", "'flash'"): "flash, like sdpa, saves no s x s scores: the same saved tensors",
    ("inference.attention", "'flash'"): "flash, like sdpa, keeps no scores at generate (the note names the kernel)",
    ("train.gradient_checkpointing", "'attention-core'"): "drops only the s x s attention tensors, which sdpa never "
    "saves (arXiv 2205.05198 sec. 5); the checkpointing note says which policy ran",
    ("train.gradient_checkpointing", "'selective'"): "attention-core outside torchtitan (the note says so)",
    ("software.peft", "'0.10.0'"): "a 4-bit base weight is not a float, so peft < 0.12 leaves the adapters fp32 too "
    "(the PEFT note names the release)",
    ("software.torch", "'2.14'"): "gates SDPA's memory-efficient kernel for grouped K/V where flash cannot run "
    "(spec/scenario.py Software.torch); Llama 2 7B has no grouped K/V and flash runs on an H100",
    ("serve.speculative.num_speculative_tokens", "2"): "changes no start-up memory (the proposer note says so)",
    ("parallel.fsdp", "'hybrid_shard'"): "shards within a node: with every GPU in one node it is full_shard",
    "train.trainer_mixed_precision": "read only for half-precision weights (bf16-true, fp16-true) of a full fine-tune "
    "under FSDP with hf-trainer or accelerate, which no base is (spec/load.py fsdp_upcast_for; "
    "tests/test_accelerate_fsdp_upcast.py)",
    "software.accelerate": "gates accelerate's FSDP upcast of half-precision weights (0.30.0 on), which no base "
    "trains (tests/test_accelerate_fsdp_upcast.py)",
    "software.deepspeed": "gates ZeRO's overflow-check copies (fp16, ZeRO-Offload, or every dtype before 0.11.2), "
    "smaller than the step's flat and fp32 gradient copies in the one ZeRO base (tests/test_deepspeed_zero.py)",
    "train.peft.alpha": "scales the adapter update; no tensor depends on it (peft LoraLayer.scaling)",
    "hardware.gpus_per_node": "read by hybrid_shard (shards within a node) and the planner's inter-node links; no base "
    "shards hybrid across nodes",
    # another engine: every framework but lightning, torchtitan and deepspeed runs the same generate call
    ("framework", "'accelerate'"): "generate is the same call under accelerate (task inference)",
    ("framework", "'plain'"): "generate is the same call in a plain script (task inference)",
}
Outcome = Literal["changed", "assumption", "refused", "refused-other", "silent", "invalid"]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def leaves(cls: type[BaseModel] = Scenario, prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every scalar field of the schema as (dotted path, field), nested blocks walked."""
    for name, f in cls.model_fields.items():
        sub = _model_of(f.annotation)
        if sub is not None:
            yield from leaves(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", f


def _literals(annotation: Any) -> list[Any] | None:
    """The members of a Literal, or of a union of Literals and None; None when the type is not one."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType):
        out: list[Any] = []
        for arg in get_args(annotation):
            sub = [None] if arg is type(None) else _literals(arg)
            if sub is None:
                return None
            out += sub
        return out
    return None


def _number(kind: type, f: FieldInfo) -> Any:
    lo: Any = None
    hi: Any = None
    for m in f.metadata:
        lo = m.ge if isinstance(m, at.Ge) else m.gt if isinstance(m, at.Gt) else lo
        hi = m.le if isinstance(m, at.Le) else m.lt if isinstance(m, at.Lt) else hi
    d = f.default
    if kind is int:
        if d is None or d == 0:
            return 4 if lo is None or lo <= 4 else lo
        return 8 if d == -1 else d * 2 if hi is None or d * 2 <= hi else d // 2
    if d is None or (d == 0 and hi is not None and hi <= 1):
        return 0.5
    return 1.0 if d == 0 else d / 2 if hi is not None and d * 2 > hi else d * 2


def candidates(path: str, f: FieldInfo) -> list[Any]:
    """Valid values other than the default, from the field's type (``VALUES`` for free-form ones)."""
    if path in VALUES:
        return VALUES[path]
    for m in f.metadata:
        if isinstance(m, Choices):
            return [v for v in m.names() if v != f.default]
    lits = _literals(f.annotation)
    if lits is not None:
        return [v for v in lits if v != f.default]
    kinds = [a for a in (get_args(f.annotation) or (f.annotation,)) if a is not type(None)]
    if kinds[0] is bool:
        return [v for v in (True, False) if v != f.default]
    if kinds[0] in (int, float):
        return [_number(kinds[0], f)]
    raise AssertionError(f"{path}: no candidate value for {f.annotation}; add it to VALUES")


def _get(doc: dict[str, Any], path: str) -> Any:
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return NotImplemented
        cur = cur[part]
    return cur


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    cur = doc
    for i, part in enumerate(parents):
        if cur.get(part) is None:
            cur[part] = copy.deepcopy(BLOCKS.get(".".join(parents[:i + 1]), {}))
        cur = cur[part]
    cur[last] = value
    return doc


def _reference(base: dict[str, Any], path: str) -> dict[str, Any]:
    """The base with the field's optional blocks present and its companions set."""
    doc = copy.deepcopy(base)
    parts = path.split(".")
    for i in range(1, len(parts)):
        block = ".".join(parts[:i])
        if block in BLOCKS and _get(doc, block) in (None, NotImplemented):
            doc = _set(doc, block, copy.deepcopy(BLOCKS[block]))
    for other, value in COMPANIONS.get(path, {}).items():
        doc = _set(doc, other, value)
    return doc


def _run(doc: dict[str, Any]) -> dict[str, Any] | ScenarioError:
    try:
        out = estimate(doc).to_json_dict()
    except ScenarioError as exc:
        return exc
    out.pop("scenario")
    return out


def _names(text: str, path: str) -> bool:
    """The text names the field or a block holding it (``train.peft`` for ``train.peft.rank``)."""
    parts = path.split(".")
    if len(parts) == 1:
        return path in text
    return any(".".join(parts[:i]) in text for i in range(len(parts), 1, -1))


Runner = Callable[[dict[str, Any]], "dict[str, Any] | ScenarioError"]


def _cached(memo: dict[str, dict[str, Any] | ScenarioError]) -> Runner:
    """``_run`` remembering each document's result (the base and each reference recur across cases)."""
    def run(doc: dict[str, Any]) -> dict[str, Any] | ScenarioError:
        key = json.dumps(doc, sort_keys=True)
        if key not in memo:
            memo[key] = _run(doc)
        return memo[key]
    return run


def outcome(base: dict[str, Any], path: str, value: Any, run: Runner = _run) -> Outcome:
    """What setting ``path`` to ``value`` on ``base`` does to the analytic estimate."""
    ref_doc = _reference(base, path)
    try:  # a candidate the schema refuses tests nothing (test_every_candidate_is_valid)
        Scenario.model_validate(_set(ref_doc, path, value))
    except ValueError:
        return "invalid"
    ref, plain, got = run(ref_doc), run(base), run(_set(ref_doc, path, value))
    if isinstance(got, ScenarioError):
        named = any(_names(f"{p.where} {p.message} {p.hint}", path) for p in got.problems)
        return "refused" if named else "refused-other"
    assert isinstance(ref, dict), f"{path}: the reference scenario is refused: {ref}"
    if {k: v for k, v in ref.items() if k != "assumptions"} != {k: v for k, v in got.items() if k != "assumptions"}:
        return "changed"
    # new beside the base as written: an optional block added for the field (a serve.speculative on a training
    # job) is named by the assumption that says it is not used, in the reference and the variant alike
    assert isinstance(plain, dict), f"the base scenario is refused: {plain}"
    before = set(plain["assumptions"])
    if any(_names(a, path) for a in got["assumptions"] if a not in before):
        return "assumption"
    return "silent"


def _allowed(path: str, value: str, base: str = "") -> bool:
    """``value`` as ``repr`` writes it (the audit's keys); an entry may name the base it holds for."""
    return path in ALLOWED or (path, value) in ALLOWED or (base, path, value) in ALLOWED


def _cases(base: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for path, f in leaves():
        if path in NOT_AUDITED:
            continue
        ref = _reference(base, path)
        for value in candidates(path, f):
            if _get(ref, path) != value:
                yield path, value


@cache
def audit(name: str) -> dict[tuple[str, str], Outcome]:
    """Every case of one base: (path, repr(value)) -> outcome."""
    base, run = BASES[name], _cached({})
    return {(path, repr(value)): outcome(base, path, value, run) for path, value in _cases(base)}


def test_the_walk_covers_every_scenario_option() -> None:
    """Every scenario path the CLI exposes (tests/data/cli_flags.json) is a field the audit walks."""
    frozen = json.loads((Path(__file__).parent / "data" / "cli_flags.json").read_text(encoding="utf-8"))
    walked = {path for path, _ in leaves()}
    exposed = {p for flags in frozen.values() for flag in flags.values() for p in flag["paths"]}
    scenario_paths = {p for p in exposed if p.split(".")[0] in Scenario.model_fields}
    assert scenario_paths and scenario_paths <= walked | set(NOT_AUDITED), scenario_paths - walked


@pytest.mark.parametrize("name", list(BASES))
def test_no_field_is_silently_ignored(name: str) -> None:
    silent = sorted(f"{path}={value}" for (path, value), out in audit(name).items()
                    if out == "silent" and not _allowed(path, value, name))
    assert not silent, f"{name}: accepted, changed nothing and said nothing: {silent}"


def test_every_candidate_is_valid() -> None:
    """Each candidate value passes the schema, so a refusal is the engine's, not a bad test value's."""
    invalid = sorted(f"{name}: {path}={value}" for name in BASES for (path, value), out in audit(name).items()
                     if out == "invalid")
    assert not invalid


def test_every_field_is_exercised() -> None:
    """Each field shows its effect on some base (a refusal for another reason proves nothing about it)."""
    shown: set[str] = set()
    for name in BASES:
        shown |= {path for (path, value), out in audit(name).items() if out in ("changed", "assumption", "refused")
                  or (out == "silent" and _allowed(path, value, name))}
    walked = {path for path, _ in leaves()} - set(NOT_AUDITED)
    assert walked - shown == set()


def test_every_allowance_is_used() -> None:
    """An ALLOWED entry that matches no silent case is stale: the field now shows, or the entry is wrong."""
    silent = {(name, path, value) for name in BASES for (path, value), out in audit(name).items() if out == "silent"}
    used = {p for _, p, _ in silent} | {(p, v) for _, p, v in silent} | silent
    assert set(ALLOWED) - used == set()


def test_a_dropped_handling_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit can fail: with the unused-settings assumptions removed (as if nothing handled them), the
    fields they name become silent again."""
    base = BASES["vllm"]
    assert outcome(base, "software.transformers", "4.40.0") == "assumption"
    assert outcome(base, "lifecycle.eval_batches", 2) == "assumption"
    monkeypatch.setattr(engine, "unused_settings", lambda s: [])
    assert outcome(base, "software.transformers", "4.40.0") == "silent"
    assert outcome(base, "lifecycle.eval_batches", 2) == "silent"
    assert not _allowed("software.transformers", "'4.40.0'")


def test_a_deliberately_silent_field_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field the engine reads is silent once its reading is cut: the LoRA rank, pinned to the default."""
    base = BASES["lora"]
    assert outcome(base, "train.peft.rank", 16) == "changed"
    real = resolve

    def pinned(source: Any) -> Any:
        r = real(source)
        t = r.scenario.train
        assert t.peft is not None
        peft = t.peft.model_copy(update={"rank": 8})
        sc = r.scenario.model_copy(update={"train": t.model_copy(update={"peft": peft})})
        return type(r)(sc, r.model, r.gpu, r.assumptions)

    monkeypatch.setattr("vramplan.engine.resolve", pinned)
    assert outcome(base, "train.peft.rank", 16) == "silent"


def test_errors_other_than_scenario_errors_are_not_outcomes() -> None:
    """Only a ScenarioError counts as a refusal: another error in the estimate fails the audit loudly."""
    assert issubclass(ScenarioError, VramplanError)
    with pytest.raises(AssertionError, match="no candidate value"):
        candidates("x.free_text", FieldInfo(annotation=str, default=""))


# ------------------------------------------------------------------ evaluation settings while no evaluation runs

def _band_widened(assumptions: list[str]) -> bool:
    return any(a.startswith("band widened") for a in assumptions)


def test_eval_settings_left_to_a_framework_without_evaluation_widen_the_band() -> None:
    """The HF Trainer evaluates only when asked (eval_strategy='no'); an eval batch given with evaluation left
    to that default describes an evaluation the estimate leaves out: said, and the band widened."""
    base = _run(BASES["full"])
    got = _run(_set(BASES["full"], "lifecycle.eval_batch_size", 16))
    assert isinstance(base, dict) and isinstance(got, dict)
    new = [a for a in got["assumptions"] if a not in base["assumptions"]]
    assert new[0] == ("not modelled: lifecycle.eval_batch_size given, but hf-trainer's loop runs no evaluation by "
                      "default, so no evaluation phase is counted (set lifecycle.evaluation: true to count it)")
    assert _band_widened(got["assumptions"]) and not _band_widened(base["assumptions"])
    assert got["per_gpu"]["lifecycle"].keys() == base["per_gpu"]["lifecycle"].keys()  # no evaluation phase


def test_eval_settings_with_evaluation_set_false_are_unused_not_unmodelled() -> None:
    """Evaluation turned off by the user: the eval keys describe nothing this job does; stated, band unchanged."""
    off = _set(BASES["full"], "lifecycle.evaluation", False)
    base, got = _run(off), _run(_set(off, "lifecycle.eval_seq_len", 4096))
    assert isinstance(base, dict) and isinstance(got, dict)
    assert [a for a in got["assumptions"] if a not in base["assumptions"]] == [
        "lifecycle.eval_seq_len set but not used: lifecycle.evaluation is false"]
    assert got["band"] == base["band"] and got["per_gpu"] == base["per_gpu"]


# No check reads a key's presence (model_fields_set): a dumped DPO, GRPO or serving scenario is judged like the
# one written (spec/defaults.py resolves the trainer's defaults; tests/test_report_roundtrip.py the whole report).
@pytest.mark.parametrize("name", ["full", "lora", "qlora", "inference", "dpo", "grpo", "vllm", "llamacpp"])
def test_a_scenario_dumped_with_every_field_says_the_same(name: str) -> None:
    """The planner, the solvers and a report's ``scenario`` carry every field (``model_dump``); a field at its
    default is not a setting, so the estimate, its notes included, is the scenario's as written."""
    doc = _set(BASES[name], "lifecycle.eval_batch_size", 16) if BASES[name]["task"] == "train" else BASES[name]
    dumped = Scenario.model_validate(doc).model_dump(mode="json")
    assert estimate(dumped).assumptions == estimate(doc).assumptions


def test_a_solver_adds_no_note_of_its_own() -> None:
    """solve_max_batch re-estimates a dumped scenario at each probe: its answer carries the base's notes only."""
    from vramplan.plan.solvers import solve_max_batch

    res = solve_max_batch(BASES["lora"])
    assert res.value is not None and res.report is not None
    base = estimate(_set(BASES["lora"], "train.micro_batch_size", res.value))
    assert res.report.assumptions == base.assumptions
    assert not any(a.startswith("not modelled") or "set but not used" in a for a in res.report.assumptions)


def test_the_command_line_states_an_eval_batch_without_evaluation() -> None:
    """``vramplan estimate --eval-batch-size`` under the HF Trainer's default: the JSON report says so and widens."""
    from typer.testing import CliRunner

    from vramplan.cli.main import app

    args = ["estimate", "--model", "llama-2-7b", "--gpu", "H100", "--peft", "lora", "--json"]
    env = {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    plain = json.loads(CliRunner().invoke(app, args, env=env).stdout)["assumptions"]
    given = json.loads(CliRunner().invoke(app, [*args, "--eval-batch-size", "16"], env=env).stdout)["assumptions"]
    assert not any(a.startswith("not modelled") for a in plain)
    assert next(a for a in given if a not in plain).startswith("not modelled: lifecycle.eval_batch_size given")
    assert _band_widened(given) and not _band_widened(plain)


def test_the_traced_engine_states_lifecycle_keys_it_does_not_trace() -> None:
    """The traced engine runs the steady step only: lifecycle keys given to it are stated as not modelled (its
    band widens); a scenario that gives none gains nothing."""
    pytest.importorskip("torch")
    from vramplan.trace.engine import _lifecycle_not_traced

    given = Scenario.model_validate(_set(BASES["full"], "lifecycle.evaluation", True))
    assert _lifecycle_not_traced(given) == [
        ("not modelled: lifecycle.evaluation by the traced engine (it traces the steady step; `vramplan estimate` "
         "gives the job's load, evaluation and save phases)")]
    assert _lifecycle_not_traced(Scenario.model_validate(BASES["full"])) == []
    assert _lifecycle_not_traced(Scenario.model_validate(_set(BASES["vllm"], "lifecycle.evaluation", True))) == []
