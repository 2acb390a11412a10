"""Every exported file is accepted by its own library, and the values come back unchanged.

DeepSpeed's ``DeepSpeedConfig``, accelerate's config loader and launcher (down to the FSDP and
DeepSpeed plugins it builds), transformers' ``TrainingArguments`` (and its DeepSpeed config
processing) and ``BitsAndBytesConfig``, and peft's ``LoraConfig`` run here on CPU.  Two checks that
need a GPU are stood in for, and only those: DeepSpeed asks torch.distributed for the rank and world
size (an ``mpu`` object gives the planned data-parallel size), and transformers refuses ``bf16=True``
when no bf16-capable GPU is present (the planned GPU is one).  vLLM and torchtitan do not install
here: their files are checked against the field names of ``EngineArgs`` and ``JobConfig`` (cited in
``vramplan/export/vllm.py`` and ``torchtitan.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from vramplan.export import (
    accelerate_config,
    bnb_config_kwargs,
    deepspeed_config,
    lora_config_kwargs,
    model_init_kwargs,
    to_toml,
    torchtitan_config,
    training_arguments_kwargs,
    vllm_command,
    vllm_engine_args,
    write_export,
)
from vramplan.export.torchtitan import JOB_CONFIG_KEYS
from vramplan.export.vllm import DTYPE_CHOICES, ENGINE_ARGS_FIELDS, KV_CACHE_DTYPE_CHOICES
from vramplan.plan import ServeJob, ServeSetup, TrainJob, TrainSetup, plan


def _ts(**kw: Any) -> TrainSetup:
    base: dict[str, Any] = {"num_gpus": 8, "micro_batch_size": 2, "grad_accum_steps": 4, "seq_len": 2048}
    base.update(kw)
    return TrainSetup(**base)


DS_SETUPS = [
    _ts(framework="deepspeed", zero_stage=1, optimizer="adamw"),
    _ts(framework="deepspeed", zero_stage=2, offload="optimizer", optimizer="adamw", checkpointing="full"),
    _ts(framework="deepspeed", zero_stage=3, offload="optimizer+params", optimizer="adamw", num_gpus=16),
    _ts(framework="deepspeed", zero_stage=3, precision="fp16-mixed", optimizer="adamw"),
]
FSDP_SETUPS = [
    _ts(framework="accelerate", fsdp="full_shard"),
    _ts(framework="accelerate", fsdp="shard_grad_op", checkpointing="full", grad_accum_steps=1),
    _ts(framework="accelerate", fsdp="full_shard", offload="optimizer+params", checkpointing="full", num_gpus=16),
]
HF_SETUPS = [
    _ts(framework="hf-trainer", optimizer="adamw-8bit", checkpointing="full"),
    _ts(framework="hf-trainer", num_gpus=1, optimizer="paged-adamw-8bit", peft="qlora", quantization="nf4-dq"),
    _ts(framework="hf-trainer", num_gpus=1, optimizer="adamw-fused", peft="lora", precision="bf16-mixed"),
    _ts(framework="hf-trainer", num_gpus=2, precision="fp32", optimizer="paged-adamw"),
]


@pytest.fixture
def ds_world(monkeypatch: pytest.MonkeyPatch) -> Any:
    """DeepSpeedConfig with the planned data-parallel world size, without a process group."""
    import deepspeed.runtime.config as dsc

    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)

    def make(cfg: dict[str, Any], dp: int) -> Any:
        class Mpu:
            def get_data_parallel_world_size(self) -> int:
                return dp

            def get_sequence_parallel_world_size(self) -> int:
                return 1

        return dsc.DeepSpeedConfig(cfg, mpu=Mpu())

    return make


@pytest.mark.parametrize("s", DS_SETUPS, ids=lambda s: s.label())
def test_deepspeed_config_is_accepted(s: TrainSetup, ds_world: Any) -> None:
    c = ds_world(deepspeed_config(s), s.dp)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (
        s.global_batch, s.micro_batch_size, s.grad_accum_steps)
    assert c.zero_optimization_stage == s.zero_stage
    opt_dev = c.zero_config.offload_optimizer.device if c.zero_config.offload_optimizer else "none"
    par_dev = c.zero_config.offload_param.device if c.zero_config.offload_param else "none"
    assert opt_dev == ("cpu" if s.offload != "none" else "none")
    assert par_dev == ("cpu" if s.offload == "optimizer+params" else "none")
    assert c.bfloat16_config.enabled == s.precision.startswith("bf16")
    assert c.float16_config.enabled == s.precision.startswith("fp16")
    assert c.gradient_clipping == 1.0


def test_deepspeed_rejects_an_inconsistent_batch(ds_world: Any) -> None:
    cfg = deepspeed_config(DS_SETUPS[0])
    cfg["train_batch_size"] += 1  # the check our batch arithmetic must pass
    with pytest.raises(AssertionError):
        ds_world(cfg, 8)


def _launch_args(path: Path) -> tuple[argparse.Namespace, Any, bool]:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    result: tuple[argparse.Namespace, Any, bool] = _validate_launch_command(args)
    return result


@pytest.mark.parametrize("s", FSDP_SETUPS, ids=lambda s: s.label())
def test_accelerate_fsdp_config_is_accepted(s: TrainSetup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    path = tmp_path / "accelerate_config.yaml"
    path.write_text(yaml.safe_dump(accelerate_config(s)))
    cfg = load_config_from_file(str(path))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type.value == "FSDP" and cfg.num_processes == s.num_gpus
    assert cfg.num_machines == -(-s.num_gpus // 8) and cfg.mixed_precision == "bf16"
    # what `accelerate launch` does with it: environment for the FSDP plugin, then the plugin itself
    args, _, _ = _launch_args(path)
    env = prepare_multi_gpu_env(args)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward == (s.fsdp == "full_shard")
    assert (plugin.cpu_offload is not None and type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") == (
        s.offload != "none")
    assert plugin.activation_checkpointing == (s.checkpointing == "full")


@pytest.mark.parametrize("s", DS_SETUPS[:3], ids=lambda s: s.label())
def test_accelerate_deepspeed_config_is_accepted(s: TrainSetup, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    ds_path = tmp_path / "ds_config.json"
    ds_path.write_text(json.dumps(deepspeed_config(s)))
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(yaml.safe_dump(accelerate_config(s, deepspeed_file=str(ds_path))))
    args, defaults, mp_from_config = _launch_args(path)
    # as accelerate.commands.launch.launch_command does before the DeepSpeed launcher
    args.deepspeed_fields_from_accelerate_config = ",".join(
        list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else []))
    _, env = prepare_deepspeed_cmd_env(args)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = DeepSpeedPlugin()  # raises if the YAML sets what the JSON decides
    assert plugin.zero_stage == s.zero_stage
    assert plugin.gradient_accumulation_steps == s.grad_accum_steps
    got = plugin.hf_ds_config.config
    assert {k: got[k] for k in deepspeed_config(s)} == deepspeed_config(s)  # accelerate only adds steps_per_print
    assert args.num_processes == s.num_gpus


def test_accelerate_ddp_config_is_accepted(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    for n, kind in ((8, "MULTI_GPU"), (1, "NO")):
        path = tmp_path / f"acc{n}.yaml"
        path.write_text(yaml.safe_dump(accelerate_config(_ts(framework="hf-trainer", num_gpus=n))))
        cfg = load_config_from_file(str(path))
        assert cfg.distributed_type.value == kind and cfg.num_processes == n


@pytest.fixture
def bf16_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planned GPU supports bf16; this CPU-only machine does not."""
    import transformers.training_args as ta

    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)


@pytest.mark.parametrize("s", HF_SETUPS + FSDP_SETUPS + DS_SETUPS, ids=lambda s: s.label())
def test_training_arguments_are_accepted(s: TrainSetup, bf16_gpu: None, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import TrainingArguments

    ds_file = tmp_path / "ds_config.json"
    ds_file.write_text(json.dumps(deepspeed_config(s)) if s.framework == "deepspeed" else "{}")
    kw = training_arguments_kwargs(s, output_dir=str(tmp_path / "out"), deepspeed_file=str(ds_file))
    kw = json.loads(json.dumps(kw))  # as read back from training_args.json
    args = TrainingArguments(**kw)
    assert args.per_device_train_batch_size == s.micro_batch_size
    assert args.gradient_accumulation_steps == s.grad_accum_steps
    assert args.bf16 == s.precision.startswith("bf16") and args.fp16 == s.precision.startswith("fp16")
    if s.framework == "deepspeed":
        # the Trainer's own consistency check of the DeepSpeed file against its arguments, for the planned world
        monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: s.dp))
        hf_ds = args.hf_deepspeed_config
        hf_ds.trainer_config_process(args)
        assert hf_ds.config["zero_optimization"]["stage"] == s.zero_stage
        assert hf_ds.config["train_batch_size"] == s.global_batch
    elif s.framework == "accelerate":
        pa = args.fsdp_plugin_args
        assert pa["fsdp_version"] == 2 and pa["reshard_after_forward"] == (s.fsdp == "full_shard")
        assert pa.get("cpu_offload", False) == (s.offload != "none")
        assert pa.get("activation_checkpointing", False) == (s.checkpointing == "full")
        assert not args.activation_checkpointing  # FSDP checkpoints itself
    else:
        assert str(args.optim.value) == {"adamw-fused": "adamw_torch_fused", "adamw-8bit": "adamw_bnb_8bit",
                                         "paged-adamw-8bit": "paged_adamw_8bit",
                                         "paged-adamw": "paged_adamw_32bit"}[s.optimizer]
        assert args.activation_checkpointing == (s.checkpointing == "full")
        assert args.gradient_checkpointing == args.activation_checkpointing  # the older name mirrors it


def test_peft_and_bitsandbytes_configs_are_accepted() -> None:
    import torch
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig

    q = HF_SETUPS[1]
    lora = LoraConfig(**lora_config_kwargs(q))
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules) == (
        q.lora_rank, q.lora_alpha, q.lora_dropout, "all-linear")
    assert lora.task_type == "CAUSAL_LM"
    kw = bnb_config_kwargs(q)
    assert kw is not None
    bnb = BitsAndBytesConfig(**kw)
    assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4" and bnb.bnb_4bit_use_double_quant
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16
    assert bnb_config_kwargs(HF_SETUPS[2]) is None
    assert model_init_kwargs(q) == {"dtype": "bfloat16", "attn_implementation": "sdpa"}
    assert model_init_kwargs(HF_SETUPS[0])["dtype"] == "float32"  # autocast keeps fp32 master weights


@pytest.mark.parametrize("s", [
    ServeSetup(num_gpus=2, tp=2, max_model_len=8192, max_num_seqs=64),
    ServeSetup(num_gpus=8, tp=4, max_model_len=4096, max_num_seqs=32, quantization="fp8", kv_cache_dtype="fp8",
               gpu_memory_utilization=0.85),
    ServeSetup(num_gpus=1, tp=1, max_model_len=2048, max_num_seqs=8, quantization="awq-4bit", dtype="fp16"),
])
def test_vllm_arguments_match_engine_args(s: ServeSetup) -> None:
    args = vllm_engine_args(s, "meta-llama/Meta-Llama-3-8B")
    assert set(args) <= ENGINE_ARGS_FIELDS
    assert args["dtype"] in DTYPE_CHOICES and args["kv_cache_dtype"] in KV_CACHE_DTYPE_CHOICES
    assert args.get("quantization") in (None, "fp8", "awq")
    # the command line parses back to the same values (flags = field names with dashes)
    tokens = shlex.split(vllm_command(args))
    assert tokens[:3] == ["vllm", "serve", "meta-llama/Meta-Llama-3-8B"]
    p = argparse.ArgumentParser()
    for field, value in args.items():
        if field != "model":
            p.add_argument("--" + field.replace("_", "-"), type=type(value))
    back = vars(p.parse_args(tokens[3:]))
    assert back == {k: v for k, v in args.items() if k != "model"}
    assert (args["tensor_parallel_size"], args["max_model_len"], args["max_num_seqs"],
            args["gpu_memory_utilization"]) == (s.tp, s.max_model_len, s.max_num_seqs, s.gpu_memory_utilization)


@pytest.mark.parametrize("s", [
    _ts(framework="torchtitan", tp=2, fsdp="full_shard", micro_batch_size=1, grad_accum_steps=16),
    _ts(framework="torchtitan", tp=2, pp=2, fsdp="full_shard", micro_batch_size=1, grad_accum_steps=8,
        checkpointing="full"),
    _ts(framework="accelerate", fsdp="full_shard", offload="optimizer+params"),
])
def test_torchtitan_toml_matches_job_config(s: TrainSetup) -> None:
    cfg = torchtitan_config(s, "llama", 32, 4096)
    text = to_toml(cfg, header="fragment")
    back = tomllib.loads(text)
    assert back == cfg  # values round-trip
    for section, table in back.items():
        assert section in JOB_CONFIG_KEYS and set(table) <= JOB_CONFIG_KEYS[section], section
    t, par = back["training"], back["parallelism"]
    assert (back["model"]["name"], back["model"]["flavor"]) == ("llama3", "8B")
    assert par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * par["data_parallel_shard_degree"] == (
        s.num_gpus)
    # torchtitan accumulates global / (local x dp) micro-batches without PP; PP splits the local batch instead
    if s.pp > 1:
        assert t["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == s.grad_accum_steps
    else:
        assert t["global_batch_size"] // (t["local_batch_size"] * s.dp) == s.grad_accum_steps
    assert back["activation_checkpoint"]["mode"] == ("full" if s.checkpointing == "full" else "none")
    assert t["enable_cpu_offload"] == (s.offload != "none")


@pytest.mark.parametrize("case", ["deepspeed", "qlora", "torchtitan", "serve"])
def test_write_export_files_parse(case: str, tmp_path: Path) -> None:
    if case == "deepspeed":
        # FSDP is the fastest setup whose band fits (verdict FITS); the export of the fastest DeepSpeed one is checked
        res = plan("meta-llama/Meta-Llama-3-70B", "A100-80GB", 8, TrainJob(seq_len=2048, global_batch=32), top=3)
        ds = next(r for r in res.runners_up if r.label.startswith("DeepSpeed"))
        res = res.model_copy(update={"chosen": ds})
    elif case == "qlora":
        res = plan("meta-llama/Llama-2-7b-hf", "RTX-4090", 1, TrainJob(seq_len=1024, global_batch=16, peft="qlora"),
                   top=1)
    elif case == "torchtitan":
        res = plan("meta-llama/Meta-Llama-3-8B", "H100-SXM", 8, TrainJob(seq_len=8192, global_batch=64), top=1)
    else:
        res = plan("meta-llama/Meta-Llama-3-8B", "H100-SXM", 4, ServeJob(max_model_len=8192, concurrency=128), top=1)
    paths = write_export(res, tmp_path / "out")
    names = {p.name for p in paths}
    assert {"README.md", "scenario.yaml"} <= names
    for p in paths:
        text = p.read_text()
        if p.suffix == ".json":
            json.loads(text)
        elif p.suffix == ".yaml":
            yaml.safe_load(text)
        elif p.suffix == ".toml":
            tomllib.loads(text)
        if p.name != "README.md":
            assert p.name in (tmp_path / "out" / "README.md").read_text()
    expected = {"deepspeed": {"ds_config.json", "accelerate_config.yaml", "training_args.json"},
                "qlora": {"lora_config.json", "bnb_config.json", "training_args.json"},
                "torchtitan": {"torchtitan.toml"}, "serve": {"vllm_engine_args.json", "serve.sh"}}[case]
    assert expected <= names, names
    if case == "serve":
        assert os.access(tmp_path / "out" / "serve.sh", os.X_OK)
        assert "vllm serve" in (tmp_path / "out" / "serve.sh").read_text()
    # the scenario reproduces the plan's memory figure
    from vramplan.engine import estimate

    assert res.chosen is not None
    assert estimate(tmp_path / "out" / "scenario.yaml").per_gpu.device_used_bytes == res.chosen.device_used_bytes
