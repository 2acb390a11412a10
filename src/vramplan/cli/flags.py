"""Command-line options generated from the scenario models, so the schema is written once.

The idea of vLLM's ``engine/arg_utils.py`` ``get_kwargs``: walk ``Scenario.model_fields``
recursively; each leaf field becomes one option.  Its name is the leaf's (``--micro-batch-size``),
except for the few names in ``RENAMED`` (collisions such as ``train.peft`` vs ``software.peft``, and
the names the command line had before it was generated); its dotted path comes from the nesting;
its choices from the field's ``Literal`` (or a ``vramplan.facts.Choices`` marker); its help from the
field's docstring (``spec/scenario.py``).

A leaf name that several task sections share (``attention`` in train and inference; ``dtype``,
``kv_cache_dtype`` and ``quantization`` in inference and serve, ``quantization`` in train too) is
one option that sets the field of the scenario's task section (``--task``, else the file's), and
the first section's when the task has none (``--attention`` with ``--task serve`` sets
``train.attention``, as before).

The options list choices but do not enforce them: the scenario validator checks every value and
reports all the problems at once, each with a close-name suggestion (``vramplan.errors``), which a
click ``Choice`` would cut short at the first.

``scenario_options(flags)`` adds the options to a typer command: it builds the command's signature
(``inspect.Signature`` with ``typer.Option`` defaults, set as ``__signature__``) and hands the
command one ``Given`` with the values the user gave.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.markup import escape

from vramplan.cli.common import set_path
from vramplan.facts import Choices
from vramplan.spec.scenario import Scenario

__all__ = [
    "RENAMED", "TASK_SECTIONS", "Flag", "Given", "describe", "scenario_flags", "scenario_options",
]

# Flag names that are not the leaf's: collisions (the adapter settings and the peft release share the
# leaf ``peft``) and the names the command line used before the options were generated.
RENAMED: dict[str, str] = {
    "train.peft.method": "peft",
    "train.peft.rank": "lora_rank",
    "train.peft.alpha": "lora_alpha",
    "train.peft.dropout": "lora_dropout",
    "software.peft": "peft_version",
    "software.transformers": "transformers_version",
    "software.torch": "torch_version",
    "software.trl": "trl_version",
    "serve.speculative.method": "speculative_method",
    "serve.speculative.model": "speculative_model",
    # `estimate --engine` picks analytic or trace; the serving engine is --serve-engine there and --engine
    # in `vramplan serve` (SERVE_FLAGS renames it back)
    "serve.engine": "serve_engine",
    "serve.gguf.file": "gguf_file",
    "serve.gguf.quant": "gguf_quant",
    # the rollout engine's settings share their leaves with serve's (and estimate's --engine)
    "rl.rollout.engine": "rollout_engine",
    "rl.rollout.gpu_memory_utilization": "rollout_gpu_memory_utilization",
    "rl.rollout.vllm_version": "rollout_vllm_version",
    # AutoAWQ's fused inference (inference.autoawq) and its release
    "inference.autoawq.loop": "autoawq_loop",
    "inference.autoawq.max_seq_len": "awq_max_seq_len",
    "software.autoawq": "autoawq_version",
    "software.torchtune": "torchtune_version",
    # torchao float8 training's recipe (train.float8): "--recipe-name" alone would not say which recipe
    "train.float8.recipe_name": "float8_recipe",
    # torchao MXFP8 training (train.mx): its leaves are float8's too
    "train.mx.recipe_name": "mx_recipe",
    "train.mx.convert_lm_head": "mx_convert_lm_head",
    # torchtitan's own names are too long for an 80-120 column help table (rich cuts them): shorter, same prefix
    "train.float8.precompute_float8_dynamic_scale_for_fsdp": "float8_precompute_scale",
    "train.float8.force_recompute_fp8_weight_in_bwd": "float8_force_recompute",
    # DeepSpeed's key is 34 characters: shorter, DeepSpeed's words kept
    "parallel.deepspeed.stage3_param_persistence_threshold": "stage3_persistence_threshold",
    # "--torchtitan" alone would read as the framework
    "software.torchtitan": "torchtitan_version",
    # "--accelerate" alone would read as the framework too
    "software.accelerate": "accelerate_version",
    "software.deepspeed": "deepspeed_version",
    "software.unsloth": "unsloth_version",
    # verl's hybrid-engine keys (rl.verl) keep verl's names behind one prefix: some share serve's leaves
    "rl.verl.release": "verl_release",
    "rl.verl.param_offload": "verl_param_offload",
    "rl.verl.optimizer_offload": "verl_optimizer_offload",
    "rl.verl.gpu_memory_utilization": "verl_gpu_memory_utilization",
    "rl.verl.tensor_model_parallel_size": "verl_tensor_model_parallel_size",
    "rl.verl.free_cache_engine": "verl_free_cache_engine",
    "rl.verl.enforce_eager": "verl_enforce_eager",
    "rl.verl.log_prob_micro_batch_size_per_gpu": "verl_logprob_mbs_per_gpu",
    "rl.verl.ref_log_prob_micro_batch_size_per_gpu": "verl_ref_logprob_mbs_per_gpu",
    "rl.verl.use_dynamic_bsz": "verl_use_dynamic_bsz",
    "rl.verl.use_remove_padding": "verl_use_remove_padding",
    "rl.verl.entropy_coeff": "verl_entropy_coeff",
    "rl.verl.strategy": "verl_strategy",
    "rl.verl.rollout_name": "verl_rollout_name",
    # OpenRLHF's options (rl.openrlhf) behind one prefix; the long ones shortened
    "rl.openrlhf.release": "openrlhf_release",
    "rl.openrlhf.advantage_estimator": "openrlhf_advantage_estimator",
    "rl.openrlhf.zero_stage": "openrlhf_zero_stage",
    "rl.openrlhf.bf16": "openrlhf_bf16",
    "rl.openrlhf.adam_offload": "openrlhf_adam_offload",
    "rl.openrlhf.colocate_all_models": "openrlhf_colocate_all_models",
    "rl.openrlhf.colocate_actor_ref": "openrlhf_colocate_actor_ref",
    "rl.openrlhf.colocate_critic_reward": "openrlhf_critic_reward",
    "rl.openrlhf.ref_reward_offload": "openrlhf_ref_reward_offload",
    "rl.openrlhf.deepspeed_enable_sleep": "openrlhf_deepspeed_sleep",
    "rl.openrlhf.vllm_num_engines": "openrlhf_vllm_num_engines",
    "rl.openrlhf.vllm_tensor_parallel_size": "openrlhf_vllm_tp",
    "rl.openrlhf.vllm_gpu_memory_utilization": "openrlhf_vllm_gpu_mem_util",
    "rl.openrlhf.vllm_enable_sleep": "openrlhf_vllm_enable_sleep",
    "rl.openrlhf.enforce_eager": "openrlhf_enforce_eager",
    "rl.openrlhf.micro_train_batch_size": "openrlhf_micro_train_bs",
    "rl.openrlhf.micro_rollout_batch_size": "openrlhf_micro_rollout_bs",
    "rl.openrlhf.prompt_max_len": "openrlhf_prompt_max_len",
    "rl.openrlhf.generate_max_len": "openrlhf_generate_max_len",
    "rl.openrlhf.packing_samples": "openrlhf_packing_samples",
}

# Sections that belong to one task: a leaf name they share is one option (see the module docstring).
TASK_SECTIONS: tuple[str, ...] = ("train", "inference", "serve")

_R = TypeVar("_R")


@dataclass(frozen=True)
class Flag:
    """One generated option: ``--name`` sets ``paths[i]`` for the task's section (one path: always it)."""

    name: str
    paths: tuple[str, ...]
    kind: type
    choices: tuple[str, ...]
    help: str
    is_list: bool = False

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def path_for(self, task: object) -> str:
        """The dotted path this option sets for a scenario of ``task`` (the first path if its section is absent)."""
        for p in self.paths:
            if p.split(".", 1)[0] == task:
                return p
        return self.paths[0]

    def convert(self, value: Any) -> Any:
        """The scenario value of the option's text: a list option splits on commas unless it names a choice."""
        if self.is_list and isinstance(value, str) and value not in self.choices:
            return [x.strip() for x in value.split(",")]
        return value

    def parameter(self) -> inspect.Parameter:
        """The typer parameter: ``NAME: Optional[kind] = typer.Option(None, help=...)``.

        ``None`` means "not given", so a flag never overrides the file with a default; a boolean
        becomes ``--name/--no-name``.
        """
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=typer.Option(None, help=self.help),
                                 annotation=typing.Optional[self.kind])  # noqa: UP045 (a runtime type object)


def _unwrap(annotation: Any) -> Iterator[Any]:
    """The alternatives of a union (``X | None``), ``Annotated`` metadata kept with its type."""
    if get_origin(annotation) in (typing.Union, types.UnionType):
        for a in get_args(annotation):
            yield from _unwrap(a)
    else:
        yield annotation


def _sub_model(annotation: Any) -> type[BaseModel] | None:
    for a in _unwrap(annotation):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _alternative(a: Any) -> tuple[list[type], list[str], bool]:
    """(value types, choices, is a list) of one alternative of a field's type (``None`` adds nothing)."""
    if a is type(None):
        return [], [], False
    if get_origin(a) is Literal:
        values = get_args(a)
        return [type(v) for v in values], [str(v) for v in values], False
    if get_origin(a) is list:
        return [str], [], True
    # a plain type; anything else (``dict[str, Any]``: an inline model config) is given as text
    return [a if isinstance(a, type) else str], [], False


def _kind_and_choices(field: FieldInfo) -> tuple[type, tuple[str, ...], bool]:
    """(option type, choices, is a list) of a leaf field: choices from its ``Literal`` alternatives and
    from a ``vramplan.facts.Choices`` marker (in the field's metadata, or inside an ``Optional``)."""
    kinds: list[type] = []
    choices: list[str] = []
    is_list = False
    marks = [m for m in field.metadata if isinstance(m, Choices)]
    for a in _unwrap(field.annotation):
        if get_origin(a) is Annotated:
            a, *meta = get_args(a)
            marks += [m for m in meta if isinstance(m, Choices)]
        ks, cs, lst = _alternative(a)
        kinds += ks
        choices += cs
        is_list = is_list or lst
    for m in marks:
        choices += m.names()
    unique = tuple(dict.fromkeys(choices))
    # a field of one type is typed on the command line (bool is an int: tested first); a mix is text
    kind = next((k for k in (bool, float, int) if kinds and all(x is k for x in kinds)), str)
    return kind, unique, is_list


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _leaves(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        sub = _sub_model(field.annotation)
        if sub is not None:
            yield from _leaves(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


@dataclass(frozen=True)
class _Leaf:
    path: str
    kind: type
    choices: tuple[str, ...]
    is_list: bool
    text: str  # the docstring's first paragraph


@functools.lru_cache(maxsize=1)
def _leaf_table() -> tuple[_Leaf, ...]:
    """Every leaf field of the scenario, read once per process (each command filters it)."""
    return tuple(_Leaf(path, *_kind_and_choices(field), _first_paragraph(field.description))
                 for path, field in _leaves(Scenario, ""))


def _help(leaves: Sequence[_Leaf], choices: Sequence[str], is_list: bool, note: str) -> str:
    """The option's help: each field's first docstring paragraph, after the task sections it applies to
    (sections with the same text share it), then the choices and the command's note."""
    texts: dict[str, list[str]] = {}
    for leaf in leaves:
        texts.setdefault(leaf.text, []).append(leaf.path.split(".", 1)[0])
    parts = []
    for text, sections in texts.items():
        where = "/".join(s for s in sections if s in TASK_SECTIONS)
        parts.append(f"{where}: {text}" if where else text)
    help_text = " ".join(parts).replace("``", "")
    if choices and not is_list:  # a list option's docstring names its one word (all-linear) itself
        help_text += f" Choices: {' | '.join(choices)}."
    if note:
        help_text += f" {note}"
    # typer renders help as rich markup: text in square brackets must stay text
    return escape(help_text) if "[" in help_text else help_text


def _one_flag(name: str, leaves: Sequence[_Leaf], notes: dict[str, str]) -> Flag:
    """The option ``--name`` for ``leaves`` (one field, or the same key of several task sections)."""
    paths = tuple(leaf.path for leaf in leaves)
    if len(paths) > 1 and not all(p.split(".", 1)[0] in TASK_SECTIONS for p in paths):
        raise ValueError(f"option --{name} would set {paths}: add one of them to RENAMED")
    kinds = {leaf.kind for leaf in leaves}
    choices = tuple(dict.fromkeys(c for leaf in leaves for c in leaf.choices))
    is_list = any(leaf.is_list for leaf in leaves)
    note = " ".join(notes[p] for p in paths if p in notes)
    return Flag(name, paths, kinds.pop() if len(kinds) == 1 else str, choices, _help(leaves, choices, is_list, note),
                is_list)


def scenario_flags(sections: Sequence[str], notes: dict[str, str] | None = None,
                   renamed: dict[str, str] | None = None) -> tuple[Flag, ...]:
    """The options for the scenario fields under ``sections`` (dotted prefixes such as ``"train"``,
    ``"hardware.gpu"`` or ``""`` for everything), in the schema's order.

    ``notes``: text appended to one option's help, by dotted path (a command's own default, say).
    ``renamed``: this command's names for some paths, over ``RENAMED``.
    """
    names = {**RENAMED, **(renamed or {})}
    by_name: dict[str, list[_Leaf]] = {}
    for leaf in _leaf_table():
        p = leaf.path
        if any(s == "" or p == s or p.startswith(s + ".") for s in sections):
            by_name.setdefault(names.get(p, p.rsplit(".", 1)[-1]), []).append(leaf)
    return tuple(_one_flag(name, leaves, notes or {}) for name, leaves in by_name.items())


def describe(flags: Sequence[Flag]) -> dict[str, dict[str, list[str]]]:
    """``{option: {"paths": [...], "choices": [...]}}``: what ``tests/data/cli_flags.json`` freezes."""
    return {f.option: {"paths": list(f.paths), "choices": list(f.choices)} for f in flags}


class Given:
    """The generated options' values as the user gave them (``None``: not given)."""

    def __init__(self, flags: Sequence[Flag], values: dict[str, Any]) -> None:
        self.flags = tuple(flags)
        self.values = values

    def __getitem__(self, name: str) -> Any:
        return self.values.get(name)

    def document(self, task: object) -> dict[str, Any]:
        """The given options as a nested scenario mapping, for a scenario of ``task``."""
        out: dict[str, Any] = {}
        for f in self.flags:
            value = self.values.get(f.name)
            if value is not None:
                set_path(out, f.path_for(task), f.convert(value))
        return out


def scenario_options(flags: Sequence[Flag]) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Add ``flags`` as options to a typer command whose last parameter is ``given: Given``.

    The command's own parameters keep their place; the generated options follow its arguments
    (``typer.Argument``) and precede its other options in ``--help``.
    """

    def wrap(fn: Callable[..., _R]) -> Callable[..., _R]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "given"]
        names = {p.name for p in own}
        clash = [f.name for f in flags if f.name in names]
        if clash:
            raise ValueError(f"{fn.__name__}: generated options {clash} clash with the command's own parameters")
        args = [p for p in own if _is_argument(p)]
        rest = [p for p in own if not _is_argument(p)]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in args]
        params += [f.parameter() for f in flags]
        params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in rest]
        flag_names = [f.name for f in flags]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> _R:
            values = {n: kwargs.pop(n, None) for n in flag_names}
            return fn(**kwargs, given=Given(flags, values))

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the signature above, not the function's own
        return command

    return wrap


def _is_argument(p: inspect.Parameter) -> bool:
    meta = get_args(p.annotation)[1:] if get_origin(p.annotation) is Annotated else ()
    return any(isinstance(m, typer.models.ArgumentInfo) for m in (*meta, p.default))
