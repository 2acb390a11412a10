"""`vramplan plan` and `vramplan solve`: rendering, JSON, export, and bad input (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from vramplan.cli.main import app
from vramplan.plan import TrainJob, plan
from vramplan.plan.setup import FLAT, TrainSetup
from vramplan.spec.scenario import Parallel, Peft, Train

ROOT = Path(__file__).resolve().parents[1]
SNAP = Path(__file__).parent / "snapshots"
ENV = {"COLUMNS": "140", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()
QLORA = ["plan", "--model", "meta-llama/Llama-2-7b-hf", "--gpu", "RTX-4090", "--seq-len", "1024",
         "--global-batch", "16", "--peft", "qlora"]


def run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, res.stderr


def test_plan_snapshot() -> None:
    code, out, _ = run(*QLORA, "--top", "3")
    assert code == 0
    # the search's own timing changes run to run
    text = re.sub(r"searched .* pruned \(slower than the answer\)", "searched ...", out, flags=re.DOTALL)
    snap = SNAP / "plan_qlora_7b_4090.txt"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snap.write_text(text)
    assert text == snap.read_text()


def test_plan_text_has_the_parts() -> None:
    code, out, _ = run("plan", "--model", "meta-llama/Meta-Llama-3-70B", "--gpu", "A100-80GB", "--num-gpus", "8",
                       "--seq-len", "2048", "--global-batch", "32")
    assert code == 0
    for part in ("FITS", "Ranked setups", "Chosen: memory per GPU", "predicted time per step",
                 "Decision tree", "ZeRO-3", "host memory", "Assumptions"):
        assert part in out, part


def test_plan_json_is_the_python_result() -> None:
    code, out, _ = run(*QLORA, "--json")
    assert code == 0
    doc = json.loads(out)
    api = plan("meta-llama/Llama-2-7b-hf", "RTX-4090", 1, TrainJob(seq_len=1024, global_batch=16, peft="qlora"))
    ref = api.to_json_dict()
    for key in ("task", "model", "gpu", "num_gpus", "margin", "usable_bytes", "fits", "ladder", "suggestions",
                "explanation", "assumptions", "by_gpu_count"):
        assert doc[key] == ref[key], key
    assert doc["chosen"]["label"] == ref["chosen"]["label"]
    assert doc["chosen"]["report"]["per_gpu"] == ref["chosen"]["report"]["per_gpu"]
    assert set(doc["stats"]) >= {"candidates", "estimated", "bound_rejected", "pruned", "seconds", "candidates_per_s"}


def test_plan_from_a_scenario_file_and_export(tmp_path: Path) -> None:
    code, out, _ = run("plan", str(ROOT / "examples" / "llama3-70b-naive-8xa100.yaml"), "--export",
                       str(tmp_path / "cfg"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == "meta-llama/Meta-Llama-3-70B" and doc["num_gpus"] == [8]
    assert doc["job"]["seq_len"] == 4096 and doc["job"]["global_batch_sequences"] == 8
    names = {Path(p).name for p in doc["exported"]}
    assert "README.md" in names and (tmp_path / "cfg" / "README.md").exists()
    # the file's optimizer: adamw is carried (torch's foreach AdamW), which torchtitan does not run: the Accelerate
    # FSDP setup is exported without torchtitan's job config (the export raised ValueError here before)
    assert doc["chosen"]["report"]["scenario"]["train"]["optimizer"] == "adamw"
    assert "accelerate_config.yaml" in names and "torchtitan.toml" not in names


@pytest.mark.parametrize(("field", "value"), [("loss", "chunked"), ("liger_kernels", True), ("packing", True),
                                              ("activation_offload", "cpu"), ("optimizer_in_backward", True),
                                              ("torchao_cpu_offload", "optimizer")])
def test_plan_refuses_techniques_it_does_not_search(tmp_path: Path, field: str, value: object) -> None:
    """A scenario that asks for a loss kernel, Liger kernels, packing or activation offload is refused by plan
    (it would plan the job without them) and names the field; without it the same file plans."""
    doc = {"model": "meta-llama/Llama-3.2-1B", "task": "train", "hardware": {"gpu": "H100", "num_gpus": 1},
           "train": {"seq_len": 1024, field: value}}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    code, out, err = run("plan", str(path))
    assert code == 2 and f"train.{field}" in out + err and "does not search" in out + err
    del doc["train"][field]
    path.write_text(json.dumps(doc))
    assert run("plan", str(path), "--json")[0] == 0


@pytest.mark.parametrize(("path", "value"), [("lifecycle.evaluation", True), ("lifecycle.checkpoint_save", False),
                                             ("hardware.capacity_gib", 40), ("train.torch_compile", True)])
def test_plan_refuses_a_job_setting_it_does_not_carry(tmp_path: Path, path: str, value: object) -> None:
    """A lifecycle phase, a capacity override or torch.compile define another job than the one plan searches:
    before, plan dropped them without a word (cli/plan_cmd.py read six fields of the file).  Refused, naming the
    field; without it the same file plans."""
    block, key = path.split(".")
    doc: dict[str, object] = {"model": "meta-llama/Llama-3.2-1B", "task": "train",
                              "hardware": {"gpu": "H100", "num_gpus": 1}, "train": {"seq_len": 1024}}
    doc.setdefault(block, {})[key] = value  # type: ignore[index]
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    code, out, err = run("plan", str(f))
    assert code == 2 and path in out + err and "does not search or carry it" in out + err
    del doc[block][key]  # type: ignore[attr-defined]
    f.write_text(json.dumps(doc))
    assert run("plan", str(f), "--json")[0] == 0


def test_plan_says_which_file_settings_it_replaces_and_keeps_the_optimizer(tmp_path: Path) -> None:
    """The knobs plan chooses itself are named in its notes; the optimizer row is carried (the chosen setup uses
    it); a block of another task is said to be unused."""
    doc = {"model": "meta-llama/Llama-3.2-1B", "task": "train", "hardware": {"gpu": "H100", "num_gpus": 1},
           "framework": "deepspeed", "train": {"seq_len": 1024, "precision": "fp32", "optimizer": "adamw-8bit"},
           "parallel": {"zero_stage": 2}, "serve": {"max_model_len": 4096}}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    code, out, _ = run("plan", str(f), "--json")
    assert code == 0
    res = json.loads(out)
    notes = res["notes"]
    for path in ("framework", "train.precision", "parallel.zero_stage"):
        assert any(f"scenario's {path} = " in n and "is not kept" in n for n in notes), path
    assert "the scenario's serve block is not used by a train plan" in notes
    assert not any("train.optimizer" in n for n in notes)
    assert res["chosen"]["report"]["scenario"]["train"]["optimizer"] == "adamw-8bit"


@pytest.mark.parametrize("peft", [{}, {"method": "lora"}, {"rank": 8}])
def test_plan_carries_a_peft_block_set_with_defaults(tmp_path: Path, peft: dict[str, object]) -> None:
    """``peft: {}`` is LoRA with the schema's rank and alpha: planned as LoRA, not refused as an unknown field and
    not planned as full fine-tuning."""
    doc = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "hardware": {"gpu": "A10G"},
           "train": {"seq_len": 512, "peft": peft}}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    code, out, _ = run("plan", str(f), "--json")
    assert code == 0
    res = json.loads(out)
    assert res["chosen"]["report"]["scenario"]["train"]["peft"]["method"] == "lora"
    # the file's block carries the schema's rank (8), not the planner's own default for --peft (16)
    assert res["chosen"]["report"]["scenario"]["train"]["peft"]["rank"] == peft.get("rank", 8)


def test_plan_refuses_an_adapter_method_it_does_not_search(tmp_path: Path) -> None:
    """DoRA was planned as LoRA without a word (about 10% less than DoRA's estimate on SmolLM2-135M)."""
    doc = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "hardware": {"gpu": "A10G"},
           "train": {"seq_len": 512, "peft": {"method": "dora"}}}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    code, out, err = run("plan", str(f))
    assert code == 2 and "train.peft.method" in out + err and "plan searches LoRA and QLoRA" in out + err


def test_plan_of_an_inline_model_says_nothing_about_its_block(tmp_path: Path) -> None:
    doc = {"model": {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
                     "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000},
           "hardware": {"gpu": "A10G"}, "train": {"seq_len": 512}}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(doc))
    code, out, _ = run("plan", str(f), "--json")
    assert code == 0 and not any("model" in n and "not used" in n for n in json.loads(out)["notes"])


def test_plan_serve() -> None:
    code, out, _ = run("plan", "--task", "serve", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM",
                       "--num-gpus", "2", "--max-model-len", "8192", "--concurrency", "64", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["chosen"]["max_concurrency"] >= doc["chosen"]["setup"]["max_num_seqs"]
    assert doc["chosen"]["tokens_per_s"] > 0


def test_nothing_fits_exits_1_with_suggestions() -> None:
    code, out, _ = run("plan", "--model", "meta-llama/Meta-Llama-3-70B", "--gpu", "RTX-4090", "--seq-len", "8192",
                       "--global-batch", "8")
    assert code == 1
    assert "NOTHING FITS" in out and "would fit:" in out


@pytest.mark.parametrize(("args", "needle"), [
    (["plan", "--model", "llama-3-8", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch", "8"], "did you mean"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H10", "--seq-len", "1024", "--global-batch", "8"],
     "unknown gpu"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--global-batch", "8"], "--seq-len"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024"], "global batch"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--peft", "qlra"], "did you mean 'qlora'"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1000",
      "--global-batch-tokens", "4096"], "whole number"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--num-gpus", "eight", "--seq-len",
      "1024", "--global-batch", "8"], "--num-gpus"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--task", "infer", "--seq-len", "8"],
     "--task"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--margin", "1.5"], "--margin"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--mfu", "0"], "--mfu"),
    (["plan", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "H100-SXM", "--seq-len", "1024", "--global-batch",
      "8", "--host-memory-gib", "-1"], "--host-memory-gib"),
    (["solve", "max-bach", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml")], "did you mean 'max-batch'"),
    (["solve", "max-batch", "nope.yaml"], "no such file"),
])
def test_bad_input_exits_2_without_traceback(args: list[str], needle: str) -> None:
    code, out, err = run(*args)
    assert code == 2, (out, err)
    assert needle in err
    assert "Traceback" not in err + out


def test_solve_cli() -> None:
    code, out, _ = run("solve", "max-batch", str(ROOT / "examples" / "qlora-7b-rtx4090.yaml"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "max-batch" and doc["value"] >= 1
    assert doc["report"]["per_gpu"]["device_used_bytes"] <= doc["usable_bytes"]
    code, out, _ = run("solve", "min-gpus", str(ROOT / "examples" / "llama2-7b-full-naive-a100.yaml"))
    assert code == 1 and "nothing fits" in out


# ---- the planner's setup is a partial update of the scenario models ---------------------------------

def _qlora_setup() -> TrainSetup:
    return TrainSetup(framework="hf-trainer", num_gpus=2, micro_batch_size=2, grad_accum_steps=4, seq_len=1024,
                      checkpointing="full", peft="qlora", quantization="nf4-dq", optimizer="paged-adamw-8bit")


def test_setup_holds_the_scenario_records() -> None:
    s = _qlora_setup()
    assert isinstance(s.train, Train) and isinstance(s.parallel, Parallel)
    # the delta: the fields the planner chooses, and no others (cp, ep, offload_device stay the base's)
    assert s.train.model_fields_set == {"micro_batch_size", "seq_len", "grad_accum_steps", "precision", "optimizer",
                                        "gradient_checkpointing", "attention", "quantization", "peft"}
    assert s.parallel.model_fields_set == {"zero_stage", "fsdp", "tp", "pp", "sequence_parallel", "offload"}
    assert s.train.peft == Peft(method="qlora", rank=16, alpha=32, dropout=0.05, target_modules="all-linear")
    # the flat names read the same fields, cached or not
    assert (s.checkpointing, s.lora_rank, s.peft) == (s.train.gradient_checkpointing, s.train.peft.rank, "qlora")
    for key in FLAT:
        if key in vars(TrainSetup):  # not the dataclass fields (framework, num_gpus, gpus_per_node)
            assert vars(TrainSetup)[key].__get__(s, TrainSetup) == getattr(s, key), key
    full = TrainSetup(framework="deepspeed", num_gpus=8, micro_batch_size=1, grad_accum_steps=1, seq_len=8, tp=2,
                      zero_stage=3)
    assert full.train.peft is None and full.peft is None and full.parallel.sequence_parallel is True


def test_setup_document_is_the_model_dump_in_the_published_layout() -> None:
    doc = _qlora_setup().to_document("llama-2-7b", "A100-80GB")
    assert doc == {
        "model": "llama-2-7b", "task": "train", "hardware": {"gpu": "A100-80GB", "num_gpus": 2, "gpus_per_node": 8},
        "framework": "hf-trainer",
        "train": {"micro_batch_size": 2, "seq_len": 1024, "grad_accum_steps": 4, "precision": "bf16-mixed",
                  "optimizer": "paged-adamw-8bit", "gradient_checkpointing": "full", "attention": "sdpa",
                  "quantization": "nf4-dq", "peft": {"method": "qlora", "rank": 16, "alpha": 32.0,
                                                      "target_modules": "all-linear", "dropout": 0.05}},
        "parallel": {"zero_stage": 0, "fsdp": "none", "tp": 1, "pp": 1, "sequence_parallel": False,
                     "offload": "none"}}
    # key order is part of the exported scenario.yaml: peft after quantization, as before
    assert list(doc["train"])[-2:] == ["quantization", "peft"]


def test_setup_applied_equals_its_validated_document() -> None:
    from vramplan.catalog.resolve import resolve
    from vramplan.plan.context import make_context
    from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS

    ctx = make_context("llama-2-7b", "A100-80GB", 0.1, DEFAULT_ASSUMPTIONS, "train")
    for s in (_qlora_setup(),
              TrainSetup(framework="torchtitan", num_gpus=8, micro_batch_size=1, grad_accum_steps=2, seq_len=2048,
                         tp=2, fsdp="full_shard", checkpointing="full"),
              TrainSetup(framework="deepspeed", num_gpus=4, micro_batch_size=4, grad_accum_steps=1, seq_len=512,
                         zero_stage=3, offload="optimizer+params", optimizer="adamw")):
        assert ctx.scenario(s) == resolve(ctx.document(s)).scenario


def test_setup_reads_back_and_replaces_by_flat_name() -> None:
    import dataclasses

    s = _qlora_setup()
    assert list(s.as_dict()) == [
        "framework", "num_gpus", "micro_batch_size", "grad_accum_steps", "seq_len", "precision", "optimizer",
        "checkpointing", "attention", "zero_stage", "fsdp", "offload", "tp", "pp", "peft", "lora_rank", "lora_alpha",
        "lora_dropout", "target_modules", "quantization", "gpus_per_node", "pp_schedule", "pp_virtual_stages"]
    assert TrainSetup(**s.as_dict()) == s and hash(TrainSetup(**s.as_dict())) == hash(s)
    r = dataclasses.replace(s, num_gpus=4, grad_accum_steps=2)
    assert r.as_dict() == {**s.as_dict(), "num_gpus": 4, "grad_accum_steps": 2} and r.train.peft == s.train.peft
    # 2 x 2 x (4 // 1) = 16 sequences per step before, 2 x 2 x 4 = 16 after (accumulation halved, GPUs doubled)
    assert s.global_batch == r.global_batch == 16
    with pytest.raises(TypeError, match="unexpected keyword argument 'lora_r'"):
        TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=8, lora_r=4)
    with pytest.raises(ValidationError, match="precision"):
        TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=8,
                   precision="bf16")
