"""Configuration files for the engines people already use, from a planned setup.

``export_files(result)`` returns ``{file name: text}`` for the chosen setup of a plan (or any
ranked setup): a DeepSpeed JSON, Accelerate YAML (FSDP or DeepSpeed or DDP), Hugging Face
``TrainingArguments`` / ``from_pretrained`` / ``LoraConfig`` / ``BitsAndBytesConfig`` keyword
arguments as JSON, TRL's ``trl sft`` YAML, a torchtitan TOML, Megatron-LM's command-line arguments for a framework
megatron scenario (``megatron_arguments``, not a planned setup: the planner does not search framework megatron), or vLLM engine arguments and a ``vllm serve``
script -- each where the setup can run on that engine -- plus the scenario (``vramplan estimate`` reproduces
the memory figures from it) and a short launch README.  Launch files name the model by its Hub id
(``hub.py``) and carry the scenario's lifecycle settings (``lifecycle.py``).  ``write_export(result, directory)`` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from vramplan.errors import Problem, ScenarioError
from vramplan.export.accelerate import accelerate_config
from vramplan.export.deepspeed import deepspeed_config
from vramplan.export.hf import (
    bnb_config_kwargs,
    lora_config_kwargs,
    model_init_kwargs,
    training_arguments_kwargs,
)
from vramplan.export.hub import LaunchModel, launch_model
from vramplan.export.lifecycle import ResolvedLifecycle, lifecycle_of, resolve_lifecycle
from vramplan.export.megatron import megatron_arguments
from vramplan.export.readme import launch_readme
from vramplan.export.torchtitan import release_of as _titan_release
from vramplan.export.torchtitan import to_toml, torchtitan_config
from vramplan.export.trl_sft import trl_sft_config
from vramplan.export.vllm import vllm_command, vllm_engine_args
from vramplan.facts.optimizers import optimizer_facts
from vramplan.plan.result import PlanResult, RankedSetup
from vramplan.plan.setup import ServeSetup, TrainSetup

__all__ = [
    "LaunchModel",
    "ResolvedLifecycle",
    "accelerate_config",
    "bnb_config_kwargs",
    "deepspeed_config",
    "export_files",
    "launch_model",
    "lora_config_kwargs",
    "megatron_arguments",
    "model_init_kwargs",
    "resolve_lifecycle",
    "setup_of",
    "to_toml",
    "torchtitan_config",
    "training_arguments_kwargs",
    "trl_sft_config",
    "vllm_command",
    "vllm_engine_args",
    "write_export",
]


def setup_of(ranked: RankedSetup) -> TrainSetup | ServeSetup:
    """The setup record back from a ranked setup (its ``setup`` mapping)."""
    return TrainSetup(**ranked.setup) if ranked.kind == "train" else ServeSetup(**ranked.setup)


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def export_files(source: PlanResult | RankedSetup) -> dict[str, str]:
    """Every file for one setup (the chosen one of a plan), as ``{name: text}``."""
    ranked = source.chosen if isinstance(source, PlanResult) else source
    if ranked is None:
        raise ScenarioError([Problem("--export", "nothing fits, so there is no setup to export",
                                     "follow one of the suggestions, then plan again")])
    s = setup_of(ranked)
    model = launch_model(ranked.scenario.get("model", "MODEL"), str(ranked.report.model.get("name", "MODEL")))
    files: dict[str, str] = {"scenario.yaml": yaml.safe_dump(ranked.scenario, sort_keys=False)}
    if isinstance(s, ServeSetup):
        args = vllm_engine_args(s, model.name, model.revision)
        files["vllm_engine_args.json"] = _json(args)
        files["serve.sh"] = _serve_script(s, args)
    else:
        _train_files(ranked, s, model, files)
    files["README.md"] = launch_readme(ranked, s, model, sorted(files))
    return files


def _train_files(ranked: RankedSetup, s: TrainSetup, model: LaunchModel, files: dict[str, str]) -> None:
    train = ranked.scenario.get("train") or {}
    loss, packing = str(train.get("loss", "standard")), bool(train.get("packing", False))
    liger, offload = bool(train.get("liger_kernels", False)), train.get("activation_offload", "none") != "none"
    lc = resolve_lifecycle(s, lifecycle_of(ranked.scenario))
    if s.framework == "deepspeed":
        files["ds_config.json"] = _json(deepspeed_config(s, lc))
    if s.framework != "torchtitan":
        if loss not in ("standard", "liger-fused-linear-ce"):
            _refuse_loss(loss)
        files["accelerate_config.yaml"] = yaml.safe_dump(accelerate_config(s, lifecycle=lc), sort_keys=False)
        if not (packing or offload):
            # packing and activation offloading have no TrainingArguments key: TRL's SFTConfig below sets them
            files["training_args.json"] = _json({**training_arguments_kwargs(s, lifecycle=lc),
                                                 **_loss_arguments(loss, packing, liger, offload)})
        files["model_kwargs.json"] = _json(model_init_kwargs(s, lc))
        files["trl_sft.yaml"] = yaml.safe_dump(
            trl_sft_config(s, model, loss, packing, liger, offload, lc), sort_keys=False)
    if s.peft is not None:
        files["lora_config.json"] = _json(lora_config_kwargs(s))
    bnb = bnb_config_kwargs(s)
    if bnb is not None:
        files["bnb_config.json"] = _json(bnb)
    titan_unset = packing or offload or loss != "standard"
    if s.framework == "torchtitan" and titan_unset:
        _refuse_titan(loss, packing, offload)
    # an Accelerate FSDP setup gets torchtitan's job config beside its own only where torchtitan runs the same
    # optimizer (a row with a torchtitan [optimizer] name: torch's foreach AdamW, for one, has none)
    titan_optim = optimizer_facts(s.optimizer).torchtitan is not None
    if s.framework == "torchtitan" or (s.framework == "accelerate" and s.peft is None and s.fsdp == "full_shard"
                                       and not titan_unset and titan_optim):
        # the layout of the release software.torchtitan names (unset: the newest read)
        release = _titan_release((ranked.scenario.get("software") or {}).get("torchtitan")).release
        cfg = torchtitan_config(s, *_family_layers_hidden(ranked), lifecycle=lc, release=release)
        files["torchtitan.toml"] = to_toml(cfg, header="vramplan plan: merge into your torchtitan job config "
                                                       f"(torchtitan {release} layout)")


def _loss_arguments(loss: str, packing: bool, liger_kernels: bool = False, offload: bool = False) -> dict[str, Any]:
    """The TrainingArguments keys for ``train.loss`` and ``train.liger_kernels``; the losses, packing and
    activation offloading no Trainer argument sets are refused (``trl_sft.yaml`` sets packing and offloading).

    transformers' ``use_liger_kernel`` with ``liger_kernel_config`` (4.52 and later) passes the config to
    Liger's ``_apply_liger_kernel_to_instance``: exactly the kernels the scenario models are switched on (the
    fused linear cross-entropy for ``loss``, RMSNorm, SwiGLU and RoPE for ``liger_kernels``)."""
    for on, what, sft in ((packing, "packing", "padding_free=True"), (offload, "activation offloading",
                                                                       "activation_offloading=True")):
        if on:
            raise ScenarioError([Problem("--export", f"{what} has no TrainingArguments key (TRL's SFTConfig "
                                         f"{sft} sets it), and the export writes TrainingArguments",
                                         f"export without it, then set SFTConfig({sft})")])
    if loss not in ("standard", "liger-fused-linear-ce"):
        _refuse_loss(loss)
    if loss == "standard" and not liger_kernels:
        return {}
    return {"use_liger_kernel": True, "liger_kernel_config": {
        "fused_linear_cross_entropy": loss == "liger-fused-linear-ce", "cross_entropy": False,
        "rms_norm": liger_kernels, "swiglu": liger_kernels, "rope": liger_kernels}}


def _refuse_loss(loss: str) -> None:
    """A loss set up in code, which the export does not write."""
    how = ("ml-cross-entropy's cce_patch(model)" if loss == "cut-cross-entropy" else
           "torchtune's CEWithChunkedOutputLoss with its model's chunked output")
    raise ScenarioError([Problem("--export", f"loss {loss} has no Trainer argument: it is set up in code ({how}), "
                                 "which the export does not write", "export with loss: standard, or add it to your "
                                 "training script")])


def _refuse_titan(loss: str, packing: bool, offload: bool) -> None:
    """torchtitan's job config has no key for these (its ``JOB_CONFIG_KEYS``)."""
    what = ", ".join(w for w, on in (("loss " + loss, loss != "standard"), ("packing", packing),
                                     ("activation offloading", offload)) if on)
    raise ScenarioError([Problem("--export", f"{what}: no torchtitan job-config key sets it",
                                 "export without it, or plan with a Trainer framework (TRL's SFTConfig sets them)")])


def _family_layers_hidden(ranked: RankedSetup) -> tuple[str, int, int]:
    from vramplan.catalog.models import load_model

    spec = load_model(ranked.scenario["model"])
    return spec.family, spec.num_layers, spec.hidden_size


def _serve_script(s: ServeSetup, args: dict[str, Any]) -> str:
    lines = ["#!/usr/bin/env bash", "# vLLM replicas planned by vramplan; each runs on its own GPUs and port.",
             "set -euo pipefail", "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    per = s.tp * s.pp
    for r in range(s.replicas):
        gpus = ",".join(str(g) for g in range(r * per, (r + 1) * per))
        lines.append(f"CUDA_VISIBLE_DEVICES={gpus} {vllm_command(args)} --port {8000 + r} &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def write_export(source: PlanResult | RankedSetup, directory: str | Path) -> list[Path]:
    """Write ``export_files`` into ``directory`` (created if needed); returns the paths written."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScenarioError([Problem("--export", f"cannot create {out}: {exc}", "give a writable directory")]) from None
    paths = []
    for name, text in export_files(source).items():
        p = out / name
        p.write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            p.chmod(0o755)
        paths.append(p)
    return paths
