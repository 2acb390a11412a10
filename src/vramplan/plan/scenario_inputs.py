"""The planning inputs a scenario file gives `vramplan plan`, and nothing taken silently.

A scenario names one setup; the planner searches setups.  Every field the file sets (every value other than the
schema's default, ``model_dump(exclude_defaults=True)``) is one of:

* **carried** into the search: the model, the GPUs, the job's size (sequence length, global batch, the LoRA or
  QLoRA method, rank and alpha; another adapter method is refused), the optimizer row, the torchtitan release,
  ``offline``; or for serving the context length and concurrency;
* **replaced** by the search, and said so in the plan's notes: the knobs the planner chooses itself (framework,
  precision, checkpointing, attention, sharding and offload, parallel degrees, the pipeline schedule, LoRA target
  modules and the 4-bit format; for serving the tensor-parallel degree, dtypes and vLLM's engine settings), and the
  library releases (the plan estimates the releases its defaults name);
* a block of another task (``serve`` in a training scenario), not used, said in the notes as ``estimate`` says it
  in its assumptions;
* **refused**: anything else (a lifecycle phase, a post-training objective, a loss kernel, a capacity override,
  memory held by other processes, images per sample...).  Planning without it would answer for another job, so
  the file is refused with the field named and the way out (remove it, or check the setup with `vramplan
  estimate`), the rule of docs/conventions.md, No silent inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.scenario import Scenario

__all__ = ["PlanInputs", "plan_inputs"]

_COMMON_CARRIED = ("model", "task", "hardware.gpu", "hardware.num_gpus", "hardware.gpus_per_node")
TRAIN_CARRIED = frozenset({*_COMMON_CARRIED, "train.seq_len", "train.micro_batch_size", "train.grad_accum_steps",
                           "train.peft.method", "train.peft.rank", "train.peft.alpha", "train.optimizer",
                           "software.torchtitan"})
# knobs the training search chooses (docs/planning.md, What is searched), a prefix standing for its block
TRAIN_SEARCHED = ("framework", "train.precision", "train.gradient_checkpointing", "train.checkpoint_every_n_layers",
                  "train.deepspeed_checkpointing", "train.attention", "train.quantization", "train.peft.target_modules",
                  "train.peft.dropout", "parallel.", "software.")
# the adapter methods the search builds (plan/space.py); DoRA and the others would be planned as LoRA
PLANNED_PEFT = ("lora", "qlora")
SERVE_CARRIED = frozenset({*_COMMON_CARRIED, "serve.max_model_len", "serve.max_num_seqs"})
# the serving search chooses tp, the weights' and the cache's dtype, and plans vLLM's defaults for the rest
SERVE_SEARCHED = ("framework", "parallel.tp", "serve.dtype", "serve.quantization", "serve.kv_cache_dtype",
                  "serve.max_num_batched_tokens", "serve.block_size", "serve.gpu_memory_utilization",
                  "serve.cuda_graphs", "serve.cudagraph_capture_sizes", "serve.max_cudagraph_capture_size",
                  "serve.cudagraph_mode", "serve.vllm_version", "serve.vllm_sampler", "software.")
# the blocks of each task's job; a block of another task is not used (estimate says the same in its assumptions);
# ``offline``, excluded from the dump (spec/scenario.py), is carried as a value below
TASK_BLOCKS = {"train": ("hardware", "framework", "train", "parallel", "software", "lifecycle", "rl"),
               "serve": ("hardware", "framework", "serve", "parallel", "software")}


@dataclass(frozen=True)
class PlanInputs:
    """What `plan` takes from a scenario file: ``values`` (the option names of ``vramplan plan``) and ``notes``
    (each field the search replaced, or a block it does not use)."""

    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _leaves(doc: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted paths of the values in a nested mapping (a list or scalar is one leaf)."""
    if isinstance(doc, dict) and doc:
        return [leaf for k, v in doc.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), doc)]


def _matches(path: str, names: tuple[str, ...]) -> bool:
    return any(path == n or (n.endswith(".") and path.startswith(n)) for n in names)


def set_fields(sc: Scenario) -> list[tuple[str, Any]]:
    """Every leaf the scenario sets to a value other than the schema's default."""
    return _leaves(sc.model_dump(mode="json", exclude_defaults=True))


def _refusal(sc: Scenario, path: str, value: Any) -> Problem:
    if path == "train.objective":
        # the search builds supervised fine-tuning steps; a post-training job (its reference model and rollout
        # engine) is another job, refused rather than planned as SFT
        return Problem(path, f"is {value!r} in the scenario, but plan searches supervised fine-tuning (sft) setups "
                       "only (no reference model, no rollout engine)",
                       "check the setup with `vramplan estimate`, or remove train.objective to plan the SFT job")
    if path == "hardware.memory_in_use_gib":
        # the search reserves --margin of each GPU for what the estimate does not know; other processes' memory
        # is planned through it rather than dropped
        return Problem(path, f"is {value:g} GiB in the scenario, but plan reserves memory for other processes "
                       "through --margin", "remove it and raise --margin by its share of the GPU's capacity "
                       "(e.g. 1.5 GiB of 24 GiB: --margin 0.17)")
    job = "training" if sc.task == "train" else "serving"
    return Problem(path, f"is {value!r} in the scenario, but plan does not search or carry it (a {job} plan keeps "
                   "the model, the GPUs and the job's size, and chooses the setup itself; docs/planning.md)",
                   f"remove {path} to plan without it, or check the setup with `vramplan estimate`")


def plan_inputs(sc: Scenario) -> PlanInputs:
    """The planning inputs of scenario ``sc``; a field that is neither carried nor replaced is refused."""
    if sc.task == "inference":
        raise ScenarioError([Problem("task", "the scenario has task: inference, but plan searches training (train) "
                                     "and vLLM serving (serve) setups",
                                     "use `vramplan generate` for Hugging Face generate, or set task: train or serve")])
    carried, searched = (TRAIN_CARRIED, TRAIN_SEARCHED) if sc.task == "train" else (SERVE_CARRIED, SERVE_SEARCHED)
    problems: list[Problem] = []
    notes: list[str] = []
    unused: list[str] = []
    for path, value in set_fields(sc):
        block = path.split(".")[0]
        if path == "train.peft.method" and value not in PLANNED_PEFT:
            problems.append(Problem(path, f"is {value!r} in the scenario, but plan searches LoRA and QLoRA adapters "
                                    f"only ({', '.join(PLANNED_PEFT)})", "check the setup with `vramplan estimate`, or "
                                    "set train.peft.method: lora to plan the LoRA job"))
            continue
        # the model (a name or an inline config.json), and a block set with its defaults only (``peft: {}``: LoRA
        # with the schema's rank and alpha) are carried
        if path in carried or block == "model" or (value == {} and any(c.startswith(path + ".") for c in carried)):
            continue
        if block not in TASK_BLOCKS[sc.task]:
            if block not in unused:
                unused.append(block)
        elif _matches(path, searched):
            notes.append(f"the scenario's {path} = {value!r} is not kept: the plan searches it or estimates its own "
                         "default (docs/planning.md)")
        else:
            problems.append(_refusal(sc, path, value))
    if problems:
        raise ScenarioError(problems)
    notes += [f"the scenario's {b} block is not used by a {sc.task} plan" for b in unused]
    out: dict[str, Any] = {"model": sc.model, "gpu": sc.hardware.gpu, "num_gpus": str(sc.hardware.num_gpus),
                           "task": sc.task, "gpus_per_node": sc.hardware.gpus_per_node, "offline": sc.offline}
    if sc.task == "serve":
        out["max_model_len"] = sc.serve.max_model_len
        # a scenario that leaves max_num_seqs to vLLM plans 256 sequences at once (the schema's default before
        # null came to mean vLLM's own per-release default)
        out["concurrency"] = sc.serve.max_num_seqs or 256
        return PlanInputs(out, notes)
    t = sc.train
    out["seq_len"] = t.seq_len
    if sc.software.torchtitan is not None:
        out["torchtitan_version"] = sc.software.torchtitan
    if "optimizer" in t.model_fields_set:
        out["optimizer"] = t.optimizer
    out["global_batch"] = t.micro_batch_size * t.grad_accum_steps * sc.data_parallel_degree
    if t.peft is not None:
        out["peft"] = "qlora" if t.peft.method == "qlora" else "lora"
        out["lora_rank"] = t.peft.rank
        out["lora_alpha"] = t.peft.alpha
    return PlanInputs(out, notes)
