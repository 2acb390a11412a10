"""The short launch README written next to the exported files."""

from __future__ import annotations

from vramplan.export.hf import casts_after_load, held_dtype, loads_onto_gpu
from vramplan.export.hub import LaunchModel
from vramplan.export.lifecycle import ResolvedLifecycle, lifecycle_of, resolve_lifecycle
from vramplan.facts.quantization import quant_format
from vramplan.plan.result import RankedSetup
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.units import GiB

__all__ = ["launch_readme"]

def _train_snippet(model: LaunchModel, s: TrainSetup, lc: ResolvedLifecycle) -> str:
    lines = ["```python", "import json", "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments"]
    if s.quantization != "none":
        lines.append("from transformers import BitsAndBytesConfig")
    if s.peft is not None:
        lines.append("from peft import LoraConfig, get_peft_model"
                     + (", prepare_model_for_kbit_training" if s.quantization != "none" else ""))
    on_gpu = loads_onto_gpu(s, lc) and s.num_gpus > 1
    if on_gpu or casts_after_load(s, lc):
        lines.append("import torch" + ("\nfrom accelerate import PartialState" if on_gpu else ""))
    lines += ["", "args = TrainingArguments(**json.load(open(\"training_args.json\")))",
              "model_kwargs = json.load(open(\"model_kwargs.json\"))"]
    if on_gpu:
        # each process loads onto its own GPU (lifecycle.device_map: auto); "auto" would split the model over all
        lines.append("model_kwargs[\"device_map\"] = {\"\": PartialState().local_process_index}")
    if s.quantization != "none":
        lines.append("model_kwargs[\"quantization_config\"] = BitsAndBytesConfig(**json.load(open(\"bnb_config.json\")))")
    rev = "" if model.revision is None else f", revision={model.revision!r}"
    lines.append(f"model = AutoModelForCausalLM.from_pretrained({model.name!r}{rev}, **model_kwargs)")
    if casts_after_load(s, lc):
        lines.append(f"model = model.to(\"cuda\").to(torch.{held_dtype(s)})  # lifecycle.load_dtype fp32: "
                     "loaded in fp32, cast on the GPU")
    if s.peft is not None:
        if s.quantization != "none":
            lines.append("model = prepare_model_for_kbit_training(model)")
        lines.append("model = get_peft_model(model, LoraConfig(**json.load(open(\"lora_config.json\"))))")
    ev = ", eval_dataset=..." if lc.evaluation else ""
    lines += [f"trainer = Trainer(model=model, args=args, train_dataset=...{ev})  # sequences of {s.seq_len} tokens",
              "trainer.train()", "```"]
    return "\n".join(lines)


def _lifecycle_lines(s: TrainSetup, lc: ResolvedLifecycle) -> list[str]:
    """Each lifecycle setting the estimate took: the option that sets it, or the assumption the files cannot
    carry (docs/lifecycle.md)."""
    trainer = s.framework != "torchtitan"
    out = ["## Lifecycle the estimate assumed", ""]
    if not lc.evaluation:
        out.append("- evaluation: none" + (" (`eval_strategy: \"no\"`)" if trainer else " (`[validation] enabled`)"))
    else:
        out.append(f"- evaluation: {lc.eval_batch_size} sequences per GPU per batch, {lc.eval_batches} batch(es) "
                   "per evaluation" + (" (`eval_strategy`, `per_device_eval_batch_size`; the number of batches is "
                                       "your eval dataset's size: no option sets it)" if trainer else
                                       " (`[validation]` enabled, local_batch_size, steps)"))
        if lc.eval_seq_len is not None:
            out.append(f"- evaluation sequences of {lc.eval_seq_len:,} tokens (the longest validation sample after your "
                       "tokenizer's truncation: no option sets it)")
        if lc.eval_keeps_logits:
            acc = (f", moved to the CPU every {lc.eval_accumulation_steps} batches (`eval_accumulation_steps`)"
                   if lc.eval_accumulation_steps else ", all kept on the GPU until the loop ends")
            out.append("- evaluation keeps every batch's logits (`prediction_loss_only: false`): pass a "
                       f"`compute_metrics` to the Trainer{acc}")
        elif trainer:
            out.append("- evaluation keeps no logits (`prediction_loss_only: true`)")
        if lc.eval_generate_tokens:
            out.append(f"- {lc.eval_generate_tokens} tokens generated after each evaluation: no Trainer option does "
                       "this; the estimate counts it, so add it to your script (a callback) or expect less memory")
    if not lc.checkpoint_save:
        out.append("- checkpoint save: none" + (" (`save_strategy: \"no\"`)" if trainer else
                                                " (`[checkpoint] enable_checkpoint`)"))
    else:
        what = "model and optimizer" if lc.save_optimizer else _model_only(s, lc)
        out.append(f"- checkpoint save: {what}" + (f"; state dict `{lc.state_dict_type}`{_state_dict_where(s, lc)}"
                                                   if lc.sharded else " (the model is not sharded: nothing is "
                                                   "gathered on the GPU)"))
    if casts_after_load(s, lc):
        out.append(f"- load: fp32 onto the GPU, then cast to {held_dtype(s)} (`lifecycle.load_dtype: fp32`; "
                   "`model_kwargs.json` `dtype: float32` and the cast in the snippet)")
    if s.framework == "accelerate":
        # analytic/lifecycle/load.py host_load_bytes counts the whole model on every rank's host, as with
        # fsdp_cpu_ram_efficient_loading off (its default); the export turns it on (rank 0 reads, the others
        # start on the meta device), which needs less
        out.append("- load, host RAM: the estimate counts the whole model on every process's host; "
                   "`fsdp_cpu_ram_efficient_loading: true` loads it on the first process only, which needs less")
    if lc.device_map == "none" and s.quantization != "none":
        out.append("- load: `device_map: none` cannot be honoured with bitsandbytes: transformers loads a quantized "
                   "model onto the GPU (`Bnb4BitHfQuantizer.update_device_map`)")
    return out + [""]


def _model_only(s: TrainSetup, lc: ResolvedLifecycle) -> str:
    """Where a model-only save is set, or why it is not (a sharded save gathers nothing, optimizer or not)."""
    if s.framework == "torchtitan":
        return "model only (torchtitan's periodic checkpoints hold the optimizer: no option leaves it out)"
    if s.framework == "accelerate" and lc.state_dict_type == "sharded":
        return "model only (not written: the Trainer refuses `save_only_model` with `SHARDED_STATE_DICT`)"
    return "model only (`save_only_model: true`)"


def _state_dict_where(s: TrainSetup, lc: ResolvedLifecycle) -> str:
    if s.framework == "deepspeed":
        note = "" if lc.state_dict_type != "full" else (
            "; DeepSpeed has no save that gathers the whole model on every GPU, so the save peaks lower than "
            "estimated")
        return f" (`stage3_gather_16bit_weights_on_model_save: {str(lc.state_dict_type != 'sharded').lower()}`{note})"
    if s.framework == "torchtitan":
        return " (torchtitan saves with torch DCP, each rank its shard: `[checkpoint] enable_checkpoint`)"
    note = "" if lc.state_dict_type != "full" else (
        "; accelerate's FULL_STATE_DICT always offloads to the CPU on rank 0 (`set_state_dict_type`: "
        "`FullStateDictConfig(offload_to_cpu=True, rank0_only=True)`), so the save peaks lower than estimated")
    return f" (`fsdp_state_dict_type` / `fsdp_config.state_dict_type`{note})"


def _trl_loss_note(ranked: RankedSetup) -> str:
    loss = (ranked.scenario.get("train") or {}).get("loss", "standard")
    base = ("TRL's SFTTrainer (1.16) computes the loss with its own fused LM head (`add_fused_lm_head`: no "
            "`(batch, seq, vocab)` logits)")
    if loss == "liger-fused-linear-ce":
        return (base + " and refuses Liger's fused linear cross-entropy, so `trl_sft.yaml` leaves it off; the "
                "estimate counted Liger's, which also keeps no full logits.")
    return base + ": the estimate counted the standard loss's logits, so the TRL run's loss needs no more memory."


def _gib(n: int) -> str:
    return f"{n / GiB:,.1f} GiB"


def launch_readme(ranked: RankedSetup, s: TrainSetup | ServeSetup, model: LaunchModel, files: list[str]) -> str:
    pg = ranked.report.per_gpu
    lines = [
        "# Launch", "",
        (f"Planned by vramplan: **{ranked.label}** on {s.num_gpus} x {ranked.report.gpu.get('name')} "
        f"for `{model.name}`" + (f" at revision `{model.revision}`" if model.revision else "") + "."), "",
        (f"- memory per GPU: {_gib(pg.device_used_bytes)} of {_gib(ranked.usable_bytes)} usable "
        f"({_gib(pg.capacity_bytes)} capacity), peak in the {pg.peak_phase} phase"),
    ]
    if isinstance(s, TrainSetup):
        lines.append(f"- predicted step: {ranked.step_time_s:,.2f} s, {ranked.tokens_per_s:,.0f} tokens/s "
                     f"(global batch {s.global_batch} x {s.seq_len} tokens)")
    else:
        lines.append(f"- predicted decode throughput: {ranked.tokens_per_s:,.0f} tokens/s over {s.replicas} "
                     f"replica(s); KV cache holds {ranked.max_concurrency} sequences of {s.max_model_len} "
                     "tokens per replica")
    if ranked.host_offloaded_bytes_per_gpu:
        per_node = ranked.host_offloaded_bytes_per_gpu * min(s.num_gpus, s.gpus_per_node)
        lines.append(f"- host memory for offload: {_gib(ranked.host_offloaded_bytes_per_gpu)} per GPU, "
                     f"{_gib(per_node)} per node (pinned)")
    if not model.is_hub:
        lines.append(f"- `{model.name}` is not a Hugging Face Hub id: replace it with the checkpoint's id or folder")
    lines += ["", "Reproduce the memory estimate: `vramplan estimate scenario.yaml`.", "",
              ("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (less fragmentation, which the "
              "safety margin otherwise has to absorb)."), "", "## Files", ""]
    lines += [f"- `{f}`" for f in files]
    if isinstance(s, TrainSetup):
        lc = resolve_lifecycle(s, lifecycle_of(ranked.scenario))
        lines += [""] + _lifecycle_lines(s, lc)[:-1]
    lines += ["", "## Run", ""]
    if isinstance(s, ServeSetup):
        lines += ["```bash", "./serve.sh", "```", "",
                  "`vllm_engine_args.json` holds the same settings as `vllm.EngineArgs` keyword arguments."]
        if s.quantization != "none" and quant_format(s.quantization).prequantized_checkpoint:
            # GPTQ/AWQ are quantized after release; gpt-oss (MXFP4) and DeepSeek-V3 (fp8-block) ship so
            if quant_format(s.quantization).library in ("gptq", "awq", "compressed-tensors"):
                lines += ["", (f"`{s.quantization}` needs a checkpoint quantized that way: replace `{model.name}` with "
                               "an AWQ/GPTQ/compressed-tensors (llm-compressor) version of the model.")]
            else:
                lines += ["", (f"`{s.quantization}` needs a checkpoint stored that way (its config.json's "
                               "quantization_config declares it, as gpt-oss's and DeepSeek-V3's do).")]
        return "\n".join(lines) + "\n"
    nodes = -(-s.num_gpus // s.gpus_per_node)
    if s.framework == "torchtitan":
        lines += [("Merge `torchtitan.toml` into a torchtitan job config for this model (tokenizer, dataset, "
                  "steps), then on each node:"), "", "```bash",
                  f"NGPU={min(s.num_gpus, s.gpus_per_node)} CONFIG_FILE=./torchtitan.toml ./run_train.sh", "```"]
        if nodes > 1:
            lines.append(f"\n{nodes} nodes: launch with torchrun `--nnodes {nodes}` and a rendezvous endpoint.")
        return "\n".join(lines) + "\n"
    each = f" on each of the {nodes} nodes (set `machine_rank` and `main_process_ip`)" if nodes > 1 else ""
    if "training_args.json" in files:
        lines += ["In `train.py`:", "", _train_snippet(model, s, lc), "", f"Then{each}:", "", "```bash",
                  "accelerate launch --config_file accelerate_config.yaml train.py", "```", "",
                  "Or with TRL's SFT script (`trl_sft.yaml`: the same settings as `SFTConfig` and `ModelConfig`):"]
    else:
        lines += [("Packing and activation offloading are set by TRL's `SFTConfig` (no `TrainingArguments` key "
                   f"does), so run TRL's SFT script with `trl_sft.yaml`{each}:")]
    lines += ["", "```bash", ("trl sft --accelerate_config accelerate_config.yaml --config trl_sft.yaml "
                              "--dataset_name YOUR_DATASET"), "```", "", _trl_loss_note(ranked)]
    if s.framework == "deepspeed":
        lines += ["", ("`training_args.json` points the Trainer at `ds_config.json`; its `\"auto\"` optimizer "
                  "values are filled from the Trainer's arguments.")]
    return "\n".join(lines) + "\n"
