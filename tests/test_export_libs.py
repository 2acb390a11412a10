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
import importlib.util
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
    launch_model,
    lora_config_kwargs,
    model_init_kwargs,
    resolve_lifecycle,
    to_toml,
    torchtitan_config,
    training_arguments_kwargs,
    trl_sft_config,
    vllm_command,
    vllm_engine_args,
    write_export,
)
from vramplan.export.torchtitan import JOB_CONFIG_KEYS, job_config_tables
from vramplan.export.trl_sft import MODEL_CONFIG_FIELDS, SFT_CONFIG_FIELDS
from vramplan.export.vllm import DTYPE_CHOICES, ENGINE_ARGS_FIELDS, KV_CACHE_DTYPE_CHOICES
from vramplan.plan import ServeJob, ServeSetup, TrainJob, TrainSetup, plan
from vramplan.spec.scenario import Lifecycle


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
    for section, table in job_config_tables(back):
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
def test_write_export_files_parse(case: str, tmp_path: Path, bf16_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
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
    expected = {"deepspeed": {"ds_config.json", "accelerate_config.yaml", "training_args.json", "trl_sft.yaml"},
                "qlora": {"lora_config.json", "bnb_config.json", "training_args.json", "trl_sft.yaml"},
                "torchtitan": {"torchtitan.toml"}, "serve": {"vllm_engine_args.json", "serve.sh"}}[case]
    assert expected <= names, names
    if "trl_sft.yaml" in names and importlib.util.find_spec("trl") is not None:
        import trl

        monkeypatch.chdir(tmp_path / "out")  # the YAML names ds_config.json beside it
        parser = trl.TrlParser((trl.ScriptArguments, trl.SFTConfig, trl.ModelConfig))
        _, sft, mc = parser.parse_args_and_config(["--config", "trl_sft.yaml", "--dataset_name", "d"])
        ta = json.loads((tmp_path / "out" / "training_args.json").read_text())
        assert (sft.per_device_train_batch_size, sft.gradient_accumulation_steps) == (
            ta["per_device_train_batch_size"], ta["gradient_accumulation_steps"])
        assert res.chosen is not None and mc.model_name_or_path == res.chosen.scenario["model"]  # given as Hub ids
    if case == "serve":
        assert os.access(tmp_path / "out" / "serve.sh", os.X_OK)
        assert "vllm serve" in (tmp_path / "out" / "serve.sh").read_text()
    # the scenario reproduces the plan's memory figure
    from vramplan.engine import estimate

    assert res.chosen is not None
    assert estimate(tmp_path / "out" / "scenario.yaml").per_gpu.device_used_bytes == res.chosen.device_used_bytes


# --- lifecycle settings: each one written to the option that sets it, and accepted by that library ---------------

# (lifecycle fields, the TrainingArguments values they must come back as)
LIFECYCLE_CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"eval_strategy": "no", "save_strategy": "steps", "save_only_model": False}),
    ({"evaluation": True}, {"eval_strategy": "steps", "prediction_loss_only": True, "eval_accumulation_steps": None}),
    ({"evaluation": True, "eval_batch_size": 3}, {"per_device_eval_batch_size": 3}),
    ({"evaluation": True, "eval_keeps_logits": True, "eval_accumulation_steps": 8},
     {"prediction_loss_only": False, "eval_accumulation_steps": 8}),
    ({"checkpoint_save": False}, {"save_strategy": "no"}),
    ({"save_optimizer": False}, {"save_strategy": "steps", "save_only_model": True}),
]


@pytest.mark.parametrize(("fields", "expect"), LIFECYCLE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("s", [HF_SETUPS[0], FSDP_SETUPS[0], DS_SETUPS[2]], ids=lambda s: s.framework)
def test_lifecycle_training_arguments_are_accepted(s: TrainSetup, fields: dict[str, Any], expect: dict[str, Any],
                                                   bf16_gpu: None, tmp_path: Path) -> None:
    from transformers import TrainingArguments

    lc = resolve_lifecycle(s, Lifecycle(**fields))
    ds_file = tmp_path / "ds_config.json"
    ds_file.write_text(json.dumps(deepspeed_config(s, lc)) if s.framework == "deepspeed" else "{}")
    kw = json.loads(json.dumps(training_arguments_kwargs(s, str(tmp_path / "out"), str(ds_file), lc)))
    args = TrainingArguments(**kw)
    for key, value in expect.items():
        got = getattr(args, key)
        assert (got.value if hasattr(got, "value") else got) == value, key
    # the evaluation batch: the HF Trainer's default 8, the training micro-batch under the other frameworks
    # (analytic/lifecycle/evaluation.py eval_batch_size), unless the scenario names one
    default_batch = 8 if s.framework == "hf-trainer" else s.micro_batch_size
    assert args.per_device_eval_batch_size == fields.get("eval_batch_size", default_batch)


def test_lifecycle_defaults_are_the_estimates() -> None:
    """resolve_lifecycle repeats the engine's defaults: check them against the assumptions the estimate states."""
    from vramplan.engine import estimate

    for s, batch, sdt in ((_ts(framework="hf-trainer", num_gpus=2), 8, "full_offload"),
                          (_ts(framework="accelerate", fsdp="full_shard"), 2, "full_offload"),
                          (_ts(framework="deepspeed", zero_stage=3, optimizer="adamw"), 2, "sharded")):
        lc = resolve_lifecycle(s, Lifecycle(evaluation=True))
        assert (lc.eval_batch_size, lc.state_dict_type) == (batch, sdt)
        doc = s.to_document("meta-llama/Llama-2-7b-hf", "A100-80GB")
        doc["lifecycle"] = {"evaluation": True}
        said = "\n".join(estimate(doc).assumptions)
        assert f"no-grad forwards of {batch} sequences" in said and f"state dict {sdt}" in said


@pytest.mark.parametrize(("sdt", "fsdp_type", "offloaded"), [
    (None, "FULL_STATE_DICT", True), ("full_offload", "FULL_STATE_DICT", True), ("full", "FULL_STATE_DICT", True),
    ("sharded", "SHARDED_STATE_DICT", True)])
def test_lifecycle_fsdp_state_dict_type_is_accepted(sdt: str | None, fsdp_type: str, offloaded: bool, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    s = FSDP_SETUPS[0]
    lc = resolve_lifecycle(s, Lifecycle(state_dict_type=sdt))
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(yaml.safe_dump(accelerate_config(s, lifecycle=lc)))
    args, _, _ = _launch_args(path)
    for k, v in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(k, v)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.state_dict_type.name == fsdp_type
    # accelerate's FULL_STATE_DICT gathers to the CPU on rank 0 (the estimate's full_offload, set_state_dict_type)
    assert plugin.state_dict_config.offload_to_cpu is offloaded
    if fsdp_type == "FULL_STATE_DICT":
        assert plugin.state_dict_config.rank0_only
    # the Trainer's own FSDP config says the same, as TrainingArguments hands it to accelerate's plugin
    from transformers import TrainingArguments

    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    kw = json.loads(json.dumps(training_arguments_kwargs(s, str(tmp_path / "out"), lifecycle=lc)))
    assert TrainingArguments(**kw).fsdp_plugin_args["state_dict_type"] == fsdp_type


def test_lifecycle_fsdp_sharded_model_only_save_is_not_refused(bf16_gpu: None, tmp_path: Path) -> None:
    # Trainer refuses save_only_model with SHARDED_STATE_DICT; a sharded save gathers nothing either way
    s = FSDP_SETUPS[0]
    kw = training_arguments_kwargs(s, str(tmp_path), lifecycle=resolve_lifecycle(
        s, Lifecycle(state_dict_type="sharded", save_optimizer=False)))
    assert "save_only_model" not in kw and kw["fsdp_config"]["state_dict_type"] == "SHARDED_STATE_DICT"


@pytest.mark.parametrize(("sdt", "gathers"), [(None, False), ("sharded", False), ("full_offload", True),
                                              ("full", True)])
def test_lifecycle_deepspeed_16bit_save_is_accepted(sdt: str | None, gathers: bool, ds_world: Any) -> None:
    s = DS_SETUPS[2]  # ZeRO-3
    cfg = deepspeed_config(s, resolve_lifecycle(s, Lifecycle(state_dict_type=sdt)))
    c = ds_world(cfg, s.dp)
    assert c.zero_config.gather_16bit_weights_on_model_save is gathers
    # ZeRO-1/2 hold whole parameters: nothing to gather, no key
    assert "stage3_gather_16bit_weights_on_model_save" not in deepspeed_config(DS_SETUPS[0])["zero_optimization"]


def test_lifecycle_load_keys_reach_from_pretrained(tmp_path: Path) -> None:
    """``dtype`` and ``device_map`` as exported load a (tiny, local) checkpoint with from_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    tiny = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(tiny).save_pretrained(tmp_path / "ckpt")
    lora1 = _ts(framework="hf-trainer", num_gpus=1, peft="lora", precision="bf16-mixed")
    kw = model_init_kwargs(lora1, resolve_lifecycle(lora1, Lifecycle(load_dtype="fp32", device_map="auto")))
    # fp32 load then a cast (the estimate's fp32-cast load); one process: the whole model on its GPU
    assert kw == {"dtype": "float32", "attn_implementation": "sdpa", "device_map": {"": 0}}
    kw["device_map"] = {"": "cpu"}  # the same shape on this GPU-less machine
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), **kw)
    assert m.dtype == torch.float32
    assert model_init_kwargs(lora1)["dtype"] == "bfloat16"  # load_dtype auto: the dtype the step holds
    # several processes: the device map is set per process in the README's snippet, not in the JSON
    lora2 = _ts(framework="hf-trainer", num_gpus=2, peft="lora")
    assert "device_map" not in model_init_kwargs(lora2, resolve_lifecycle(lora2, Lifecycle(device_map="auto")))
    # sharded or quantized loads: the engine ignores load_dtype there, and bitsandbytes sets its own device map
    q = HF_SETUPS[1]
    assert model_init_kwargs(q, resolve_lifecycle(q, Lifecycle(load_dtype="fp32"))) == {
        "dtype": "bfloat16", "attn_implementation": "sdpa"}


# --- TRL: trl sft --config trl_sft.yaml ------------------------------------------------------------------------------

TRL_CASES: list[tuple[TrainSetup, dict[str, Any]]] = [
    (HF_SETUPS[1], {}),  # QLoRA, one GPU
    (HF_SETUPS[0], {"liger_kernels": True, "loss": "liger-fused-linear-ce"}),
    (FSDP_SETUPS[1], {"packing": True}),
    (DS_SETUPS[2], {"activation_offload": True}),
    (_ts(framework="hf-trainer", num_gpus=1, precision="fp32", optimizer="adamw"), {}),
]


def _trl_config(s: TrainSetup, extra: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    ds_file = tmp_path / "ds_config.json"
    ds_file.write_text(json.dumps(deepspeed_config(s)) if s.framework == "deepspeed" else "{}")
    cfg = trl_sft_config(s, launch_model("llama3-8b"), loss=extra.get("loss", "standard"),
                         packing=extra.get("packing", False), liger_kernels=extra.get("liger_kernels", False),
                         activation_offload=extra.get("activation_offload", False),
                         lifecycle=resolve_lifecycle(s, Lifecycle(evaluation=True, save_optimizer=False)),
                         output_dir=str(tmp_path / "out"), deepspeed_file=str(ds_file))
    loaded: dict[str, Any] = yaml.safe_load(yaml.safe_dump(cfg, sort_keys=False))
    return loaded


@pytest.mark.parametrize(("s", "extra"), TRL_CASES, ids=lambda v: v.label() if isinstance(v, TrainSetup) else str(v))
def test_trl_sft_keys_are_trl_fields(s: TrainSetup, extra: dict[str, Any], tmp_path: Path) -> None:
    """Without trl: every key is a TrainingArguments field or one of SFTConfig's / ModelConfig's own at trl 1.16.0
    (the field lists vendored in export/trl_sft.py)."""
    import dataclasses

    from transformers import TrainingArguments

    cfg = _trl_config(s, extra, tmp_path)
    known = {f.name for f in dataclasses.fields(TrainingArguments)} | SFT_CONFIG_FIELDS | MODEL_CONFIG_FIELDS
    assert set(cfg) <= known, set(cfg) - known
    assert cfg["model_name_or_path"] == "meta-llama/Meta-Llama-3-8B"  # the Hub id, not the alias
    # SFTConfig defaults gradient_checkpointing and bf16 to True: both are always written
    assert cfg["activation_checkpointing"] == (s.checkpointing == "full" and s.framework != "accelerate")
    assert cfg["bf16"] == s.precision.startswith("bf16")


def test_trl_vendored_fields_match_trl() -> None:
    trl = pytest.importorskip("trl")
    import dataclasses

    from transformers import TrainingArguments

    ta = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert {f.name for f in dataclasses.fields(trl.SFTConfig)} - ta == SFT_CONFIG_FIELDS
    assert {f.name for f in dataclasses.fields(trl.ModelConfig)} == MODEL_CONFIG_FIELDS


@pytest.mark.parametrize(("s", "extra"), TRL_CASES, ids=lambda v: v.label() if isinstance(v, TrainSetup) else str(v))
def test_trl_sft_config_is_accepted(s: TrainSetup, extra: dict[str, Any], tmp_path: Path, bf16_gpu: None) -> None:
    """``trl sft``'s own parser (TrlParser over ScriptArguments, SFTConfig, ModelConfig) reads the YAML back."""
    trl = pytest.importorskip("trl")
    from trl.trainer.utils import get_peft_config, get_quantization_config

    cfg = _trl_config(s, extra, tmp_path)
    path = tmp_path / "trl_sft.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    parser = trl.TrlParser((trl.ScriptArguments, trl.SFTConfig, trl.ModelConfig))
    _, sft, model = parser.parse_args_and_config(["--config", str(path), "--dataset_name", "d"])
    assert model.model_name_or_path == "meta-llama/Meta-Llama-3-8B"
    assert (sft.per_device_train_batch_size, sft.gradient_accumulation_steps, sft.max_length) == (
        s.micro_batch_size, s.grad_accum_steps, s.seq_len)
    assert sft.bf16 == s.precision.startswith("bf16") and sft.fp16 == s.precision.startswith("fp16")
    assert sft.gradient_checkpointing == (s.checkpointing == "full" and s.framework != "accelerate")
    assert sft.packing == extra.get("packing", False) and sft.activation_offloading == extra.get(
        "activation_offload", False)
    assert sft.use_liger_kernel == extra.get("liger_kernels", False)
    if s.framework != "deepspeed":
        assert str(sft.optim.value) == training_arguments_kwargs(s)["optim"]
    # the lifecycle keys
    assert (str(sft.eval_strategy.value), sft.prediction_loss_only, sft.save_only_model) == ("steps", True, True)
    assert sft.per_device_eval_batch_size == (8 if s.framework == "hf-trainer" else s.micro_batch_size)
    # adapters and quantization as TRL builds them, equal to the LoraConfig / BitsAndBytesConfig exports
    peft = get_peft_config(model)
    assert (peft is None) == (s.peft is None)
    if peft is not None:
        assert (peft.r, peft.lora_alpha, peft.lora_dropout, peft.target_modules) == (
            s.lora_rank, s.lora_alpha, s.lora_dropout, s.target_modules)
    bnb, want = get_quantization_config(model), bnb_config_kwargs(s)
    assert (bnb is None) == (want is None)
    if bnb is not None and want is not None:
        assert (bnb.bnb_4bit_quant_type, bnb.bnb_4bit_use_double_quant) == (
            want["bnb_4bit_quant_type"], want["bnb_4bit_use_double_quant"])
        assert str(bnb.bnb_4bit_compute_dtype).endswith(want["bnb_4bit_compute_dtype"])


# --- Hub ids in every launch file --------------------------------------------------------------------------------

def test_launch_model_names_hub_ids(tmp_path: Path) -> None:
    assert launch_model("llama3-8b").name == "meta-llama/Meta-Llama-3-8B"
    assert launch_model("Meta-Llama-3-8B").name == "meta-llama/Meta-Llama-3-8B"  # the id's short name
    m = launch_model("someorg/some-model@v1.0")
    assert (m.name, m.revision, m.is_hub) == ("someorg/some-model", "v1.0", True)
    assert launch_model("someorg/some-model").revision is None
    (tmp_path / "config.json").write_text("{}")
    local = launch_model(str(tmp_path / "config.json"))
    assert (local.name, local.is_hub) == (str(tmp_path), False)  # from_pretrained takes the folder
    assert not launch_model({"model_type": "llama"}, "inline").is_hub


@pytest.mark.parametrize("case", ["train", "serve"])
def test_exports_name_the_hub_id_not_the_alias(case: str, tmp_path: Path) -> None:
    if case == "train":
        res = plan("llama3-8b", "RTX-4090", 1, TrainJob(seq_len=1024, global_batch=16, peft="qlora"), top=1)
    else:
        res = plan("llama3-8b", "H100-SXM", 2, ServeJob(max_model_len=4096, concurrency=16), top=1)
    assert res.chosen is not None and res.chosen.scenario["model"] == "llama3-8b"
    files = {p.name: p.read_text() for p in write_export(res, tmp_path)}
    hub = "meta-llama/Meta-Llama-3-8B"
    for name, text in files.items():
        if name != "scenario.yaml":  # the scenario keeps what the user typed; vramplan reads it
            assert "llama3-8b" not in text, name
    if case == "train":
        assert f"from_pretrained({hub!r}" in files["README.md"]
        assert yaml.safe_load(files["trl_sft.yaml"])["model_name_or_path"] == hub
    else:
        assert json.loads(files["vllm_engine_args.json"])["model"] == hub
        assert f"vllm serve {hub} " in files["serve.sh"]
    # a pinned revision reaches vLLM's --revision and from_pretrained(revision=...)
    args = vllm_engine_args(ServeSetup(num_gpus=1, tp=1, max_model_len=2048, max_num_seqs=8), "o/m", "abc123")
    assert args["revision"] == "abc123" and set(args) <= ENGINE_ARGS_FIELDS
    assert "--revision abc123" in vllm_command(args)


def test_export_carries_the_scenarios_lifecycle_and_packing(tmp_path: Path) -> None:
    """A scenario with lifecycle settings and packing: the exported files carry them; packing has no
    TrainingArguments key, so the run goes through trl_sft.yaml."""
    res = plan("meta-llama/Llama-2-7b-hf", "A100-80GB", 2, TrainJob(seq_len=2048, global_batch=16), top=5)
    assert res.chosen is not None
    chosen = next(r for r in (res.chosen, *res.runners_up) if r.setup["framework"] != "torchtitan")
    sc = dict(chosen.scenario)
    sc["lifecycle"] = {"evaluation": True, "eval_batch_size": 2, "eval_accumulation_steps": 4,
                       "eval_keeps_logits": True, "eval_batches": 50, "eval_generate_tokens": 64}
    ranked = chosen.model_copy(update={"scenario": sc})
    files = {p.name: p.read_text() for p in write_export(ranked, tmp_path / "a")}
    ta = json.loads(files["training_args.json"])
    assert (ta["eval_strategy"], ta["per_device_eval_batch_size"], ta["eval_accumulation_steps"],
            ta["prediction_loss_only"]) == ("steps", 2, 4, False)
    readme = files["README.md"]
    # no option sets these: stated as assumptions
    assert "50 batch(es) per evaluation" in readme and "64 tokens generated after each evaluation" in readme
    assert "compute_metrics" in readme
    sc["train"] = {**sc["train"], "packing": True, "attention": "flash"}
    files = {p.name: p.read_text() for p in write_export(chosen.model_copy(update={"scenario": sc}),
                                                          tmp_path / "b")}
    assert "training_args.json" not in files
    trl_cfg = yaml.safe_load(files["trl_sft.yaml"])
    assert trl_cfg["packing"] is True and trl_cfg["eval_accumulation_steps"] == 4
    assert "trl sft --accelerate_config accelerate_config.yaml --config trl_sft.yaml" in files["README.md"]


@pytest.mark.parametrize(("fields", "checkpoint", "validation"), [
    ({}, {"enable": True}, {"enable": False}),
    ({"checkpoint_save": False, "evaluation": True, "eval_batches": 20},
     {"enable": False}, {"enable": True, "local_batch_size": 1, "seq_len": 2048, "steps": 20}),
])
def test_lifecycle_torchtitan_sections(fields: dict[str, Any], checkpoint: dict[str, Any],
                                       validation: dict[str, Any]) -> None:
    # the torchtitan setup's micro-batch is 1: its evaluation batch by default (analytic eval_batch_size)
    s = _ts(framework="torchtitan", tp=2, fsdp="full_shard", micro_batch_size=1, grad_accum_steps=16)
    back = tomllib.loads(to_toml(torchtitan_config(s, "llama", 32, 4096, resolve_lifecycle(s, Lifecycle(**fields)))))
    assert back["checkpoint"] == checkpoint and back["validation"] == validation
    for section in ("checkpoint", "validation"):
        assert set(back[section]) <= JOB_CONFIG_KEYS[section]
