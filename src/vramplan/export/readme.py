"""The short launch README written next to the exported files."""

from __future__ import annotations

from vramplan.facts.quantization import quant_format
from vramplan.plan.result import RankedSetup
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.units import GiB

__all__ = ["launch_readme"]

def _train_snippet(model: str, s: TrainSetup) -> str:
    lines = ["```python", "import json", "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments"]
    if s.quantization != "none":
        lines.append("from transformers import BitsAndBytesConfig")
    if s.peft is not None:
        lines.append("from peft import LoraConfig, get_peft_model"
                     + (", prepare_model_for_kbit_training" if s.quantization != "none" else ""))
    lines += ["", "args = TrainingArguments(**json.load(open(\"training_args.json\")))",
              "model_kwargs = json.load(open(\"model_kwargs.json\"))"]
    if s.quantization != "none":
        lines.append("model_kwargs[\"quantization_config\"] = BitsAndBytesConfig(**json.load(open(\"bnb_config.json\")))")
    lines.append(f"model = AutoModelForCausalLM.from_pretrained({model!r}, **model_kwargs)")
    if s.peft is not None:
        if s.quantization != "none":
            lines.append("model = prepare_model_for_kbit_training(model)")
        lines.append("model = get_peft_model(model, LoraConfig(**json.load(open(\"lora_config.json\"))))")
    lines += [f"trainer = Trainer(model=model, args=args, train_dataset=...)  # sequences of {s.seq_len} tokens",
              "trainer.train()", "```"]
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GiB:,.1f} GiB"


def launch_readme(ranked: RankedSetup, s: TrainSetup | ServeSetup, model: str, files: list[str]) -> str:
    pg = ranked.report.per_gpu
    lines = [
        "# Launch", "",
        (f"Planned by vramplan: **{ranked.label}** on {s.num_gpus} x {ranked.report.gpu.get('name')} "
        f"for `{model}`."), "",
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
    lines += ["", "Reproduce the memory estimate: `vramplan estimate scenario.yaml`.", "",
              ("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (less fragmentation, which the "
              "safety margin otherwise has to absorb)."), "", "## Files", ""]
    lines += [f"- `{f}`" for f in files]
    lines += ["", "## Run", ""]
    if isinstance(s, ServeSetup):
        lines += ["```bash", "./serve.sh", "```", "",
                  "`vllm_engine_args.json` holds the same settings as `vllm.EngineArgs` keyword arguments."]
        if s.quantization != "none" and quant_format(s.quantization).prequantized_checkpoint:
            # GPTQ/AWQ are quantized after release; gpt-oss (MXFP4) and DeepSeek-V3 (fp8-block) ship so
            if quant_format(s.quantization).library in ("gptq", "awq"):
                lines += ["", (f"`{s.quantization}` needs a checkpoint quantized that way: replace `{model}` with "
                               "an AWQ/GPTQ version of the model.")]
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
    lines += ["In `train.py`:", "", _train_snippet(model, s), "",
              "Then" + (f" on each of the {nodes} nodes (set `machine_rank` and `main_process_ip`)" if nodes > 1
                        else "") + ":", "", "```bash",
              "accelerate launch --config_file accelerate_config.yaml train.py", "```"]
    if s.framework == "deepspeed":
        lines += ["", ("`training_args.json` points the Trainer at `ds_config.json`; its `\"auto\"` optimizer "
                  "values are filled from the Trainer's arguments.")]
    return "\n".join(lines) + "\n"
