"""Hand-computed oracles of the optimizer rows added for issue 17 (Muon, GaLore, APOLLO, Adam-mini, torchao's
low-bit AdamW, schedule-free AdamW, CAME), their trace layouts and their exports.

Llama-3.2-1B (tied embeddings) under the Trainer, bf16-mixed: the optimizer updates fp32 parameters (4 B).
    N  = 1,235,814,400 parameters
    E  = 128,256 x 2,048 = 262,668,288 (the embedding, also the head)
    norms = (16 layers x 2 + 1) x 2,048 = 67,584
    a layer's matrices [out, in]: q 2,048 x 2,048; k, v 512 x 2,048; o 2,048 x 2,048; gate, up 8,192 x 2,048;
    down 2,048 x 8,192: 2 x 4,194,304 + 2 x 1,048,576 + 3 x 16,777,216 = 60,817,408 values
    H  = 16 x 60,817,408 = 973,078,528 (the hidden matrices); N = H + E + norms
"""

from __future__ import annotations

import pytest

from vramplan import estimate
from vramplan.analytic.layout import rank_params
from vramplan.analytic.optimizer import OptimizerCost, optimizer_assumptions, optimizer_cost_for
from vramplan.catalog.models import load_model
from vramplan.errors import ScenarioError
from vramplan.export.hf import training_arguments_kwargs
from vramplan.facts.optimizers import optimizer_facts
from vramplan.plan.setup import TrainSetup

MODEL = "meta-llama/Llama-3.2-1B"
N, E, NORMS, H = 1_235_814_400, 262_668_288, 67_584, 973_078_528


def _cost(optimizer: str, param_bytes: int = 4) -> OptimizerCost:
    m = load_model(MODEL)
    rp = rank_params(m, 1, 1, 1, 0, None, None)
    return optimizer_cost_for(m, rp, peft=None, optimizer=optimizer, framework="hf-trainer", shards=1, tp=1,
                              trainable=rp.total, decay=rp.decay, param_bytes=param_bytes)


def test_the_census_adds_up() -> None:
    rp = rank_params(load_model(MODEL), 1, 1, 1, 0, None, None)
    assert (rp.total, rp.linear) == (N, H)
    assert H + E + NORMS == N


# (optimizer, state bytes, step temporary bytes), each derived in the comment above it
ORACLES = [
    # Muon: one fp32 momentum per hidden-matrix value, AdamW's two fp32 moments elsewhere:
    # 4 x 973,078,528 + 8 x (262,668,288 + 67,584) = 3,892,314,112 + 2,101,886,976 = 5,994,201,088.
    # Newton-Schulz of the largest matrix (8,192 x 2,048: k = 2,048, K = 8,192), analytic/optimizer.py
    # muon_step_bytes: 4 kK (the Nesterov update, fp32) + 4 kK + 4 k^2 (bf16 X, X', gram, gram update)
    # = 67,108,864 + 67,108,864 + 16,777,216 = 150,994,944
    ("muon", 5_994_201_088, 150_994_944),
    # GaLore, rank 128: moments on r x max(out, in) and a r x min(out, in) projection per matrix.
    # Per layer, r x max: q, k, v, o 4 x 128 x 2,048 = 1,048,576; gate, up, down 3 x 128 x 8,192 = 3,145,728
    # -> 4,194,304; x 16 = 67,108,864; two fp32 moments: 536,870,912 B.
    # r x min: q, o 2 x 128 x 2,048; k, v 2 x 128 x 512; gate, up, down 3 x 128 x 2,048 = 1,441,792;
    # x 16 x 4 B = 92,274,688 B.  The rest (E + norms) AdamW: 2,101,886,976 B.  Sum 2,731,032,576.
    # Step: the embedding's denom and norm_grad (2 x 4 x 262,668,288 = 2,101,346,304) outweigh any matrix
    # (up after gate: 16,777,216 x 4 + 3 x 128 x 8,192 x 4 + 2 x 16,777,216 x 4 = 213,909,504)
    ("galore-adamw", 2_731_032_576, 2_101_346_304),
    # APOLLO-Mini, rank 1: r x max per layer 4 x 2,048 + 3 x 8,192 = 32,768; x 16 x 2 moments x 4 B
    # = 4,194,304; r x min per layer 2 x 2,048 + 2 x 512 + 3 x 2,048 = 11,264; x 16 x 4 B = 720,896;
    # the rest 2,101,886,976.  Sum 2,106,802,176.  Step as GaLore's (the embedding's AdamW update).
    ("apollo", 2_106_802_176, 2_101_346_304),
    # Adam-mini: fp32 m for every parameter (4 N = 4,943,257,600) and fp32 v for the embedding (4 E =
    # 1,050,673,152): 5,993,930,752.  Step: one fp32 tensor of the embedding's size (h = v.sqrt(); the
    # gradient is already fp32, no copy): 4 x 262,668,288 = 1,050,673,152
    ("adam-mini", 5_993_930_752, 1_050_673_152),
    # torchao AdamW8bit: the norms (67,584 values in tensors < 4,096) keep fp32 moments: 2 x 4 x 67,584 =
    # 540,672; the rest (1,235,746,816 values) 2 x 1 B + 2 x 4 B / 256: 2,471,493,632 + 38,617,088.
    # Sum 2,510,651,392.  The compiled update's temporaries are not counted (an assumption line).
    ("adamw-8bit-torchao", 2_510_651_392, 0),
    # torchao AdamW4bit: 2 x 1,235,746,816 / 2 (packed codes) = 1,235,746,816, scales 2 x 4 x 1,235,746,816 / 128
    # = 77,234,176, the norms 540,672: 1,313,521,664
    ("adamw-4bit", 1_313_521_664, 0),
    # torchao AdamWFp8: one e4m3 byte per value and one fp32 scale per 256, as 8-bit: 2,510,651,392
    ("adamw-fp8", 2_510_651_392, 0),
    # schedule-free AdamW: z and exp_avg_sq, fp32: 8 N = 9,886,515,200; foreach sqrt over the decay group
    # (all but the norms): 4 x 1,235,746,816 = 4,942,987,264
    ("schedule-free-adamw", 9_886_515_200, 4_942_987_264),
    # CAME: fp32 exp_avg 4 N = 4,943,257,600; the second-moment pair: rows + columns of each matrix (per layer
    # q 4,096, k 2,560, v 2,560, o 4,096, gate, up, down 3 x 10,240 = 44,032; x 16 = 704,512), of the
    # embedding (128,256 + 2,048 = 130,304), the norms whole (67,584): 902,400 x 4 = 3,609,600; the
    # confidence pair on the matrices only: (704,512 + 130,304) x 4 = 3,339,264.  Sum 4,950,206,464.
    # Step (came_step_bytes): the embedding first, fp32 gradient (no copy): 4 x 3 E = 3,152,019,456
    ("came", 4_950_206_464, 3_152_019_456),
]


@pytest.mark.parametrize(("optimizer", "states", "step"), ORACLES)
def test_state_and_step_oracles(optimizer: str, states: int, step: int) -> None:
    assert _cost(optimizer) == OptimizerCost(states, 0, step)
    rep = estimate({"model": MODEL, "hardware": {"gpu": "A100-80GB"},
                    "train": {"micro_batch_size": 1, "seq_len": 512, "optimizer": optimizer}})
    assert rep.per_gpu.breakdown["optimizer_states"] == states


def test_muon_in_bf16_true_casts_no_copy_and_keeps_bf16_momentum() -> None:
    # bf16 parameters, no masters: momentum 2 B per hidden value, AdamW 2 x 2 B elsewhere:
    # 2 x 973,078,528 + 4 x 262,735,872 = 1,946,157,056 + 1,050,943,488 = 2,997,100,544.
    # Newton-Schulz: the bf16 update 2 kK + 4 kK + 4 k^2 = 33,554,432 + 67,108,864 + 16,777,216 = 117,440,512
    assert _cost("muon", 2) == OptimizerCost(2_997_100_544, 0, 117_440_512)


def test_zero_shards_every_state_evenly() -> None:
    m = load_model(MODEL)
    rp = rank_params(m, 1, 1, 1, 0, None, None)
    sharded = optimizer_cost_for(m, rp, peft=None, optimizer="galore-adamw", framework="hf-trainer", shards=8,
                                 tp=1, trainable=rp.total, decay=rp.decay, param_bytes=4)
    # each part is divided by 8 (rounded up per part): 2,101,886,976 / 8 + 536,870,912 / 8 + 92,274,688 / 8
    assert sharded.state_bytes == 262_735_872 + 67_108_864 + 11_534_336


def test_hidden_matrix_rows_refuse_adapters() -> None:
    doc = {"model": MODEL, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 1, "seq_len": 512, "optimizer": "muon", "peft": {"method": "lora"}}}
    with pytest.raises(ScenarioError, match="muon updates the model's hidden matrices"):
        estimate(doc)


def test_assumption_lines_name_what_is_not_counted() -> None:
    assert any("Newton-Schulz" in a for a in optimizer_assumptions("muon", "hf-trainer"))
    assert any("torch.compile" in a for a in optimizer_assumptions("adamw-4bit", "hf-trainer"))
    assert any("per-block second moments" in a for a in optimizer_assumptions("adam-mini", "hf-trainer"))


# ------------------------------------------------------------------------------------------- exports
def _setup(optimizer: str) -> TrainSetup:
    return TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=128,
                      optimizer=optimizer)


@pytest.mark.parametrize(("optimizer", "optim"), [
    ("galore-adamw", "galore_adamw"), ("apollo", "apollo_adamw"), ("adamw-8bit-torchao", "adamw_torch_8bit"),
    ("adamw-4bit", "adamw_torch_4bit"), ("schedule-free-adamw", "schedule_free_adamw")])
def test_trainer_names_and_arguments(optimizer: str, optim: str) -> None:
    kw = training_arguments_kwargs(_setup(optimizer))
    assert kw["optim"] == optim
    f = optimizer_facts(optimizer)
    assert kw.get("optim_args") == f.hf_optim_args
    assert kw.get("optim_target_modules") == (list(f.hf_optim_target_modules) or None)


@pytest.mark.parametrize("optimizer", ["muon", "adam-mini", "adamw-fp8", "came"])
def test_rows_the_trainer_does_not_name_are_refused(optimizer: str) -> None:
    with pytest.raises(ValueError, match="no Hugging Face Trainer optim"):
        training_arguments_kwargs(_setup(optimizer))


def test_transformers_accepts_the_exported_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    transformers = pytest.importorskip("transformers")
    import transformers.training_args as ta
    from transformers.training_args import OptimizerNames

    # the planned GPU supports bf16; this CPU-only machine does not (as test_export_libs.py)
    monkeypatch.setattr(ta, "is_torch_bf16_gpu_available", lambda: True)

    names = {o.value for o in OptimizerNames}
    for optimizer in ("galore-adamw", "apollo", "adamw-8bit-torchao", "adamw-4bit", "schedule-free-adamw"):
        kw = training_arguments_kwargs(_setup(optimizer))
        assert kw["optim"] in names
        args = transformers.TrainingArguments(**{**kw, "output_dir": str(tmp_path)})
        assert args.optim == kw["optim"]
        assert args.optim_args == kw.get("optim_args")


# ------------------------------------------------------------------------------------------- trace
def test_trace_layouts_follow_the_rows() -> None:
    torch = pytest.importorskip("torch")
    from vramplan.trace.optim import init_states, make_optimizer

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(512, 64)  # 32,768 values
            self.proj = torch.nn.Linear(64, 256, bias=False)  # [256, 64]: 16,384 values
            self.norm = torch.nn.LayerNorm(64)  # 64 + 64 values

    def states(name: str) -> dict[str, torch.Tensor]:
        model = Tiny()
        setup = make_optimizer(name, model)
        init_states(setup, list(model.parameters()))
        return dict(setup.state_tensors())

    muon = states("muon")
    assert muon["proj.weight.momentum_buffer"].shape == (256, 64)  # torch.optim.Muon on the hidden matrix
    assert "embed.weight.exp_avg" in muon and "proj.weight.exp_avg" not in muon  # AdamW elsewhere
    galore = states("galore-adamw")
    # [256, 64], rows >= columns: grad @ P.T is 256 x r with r = min(128, 64) = 64; P is 64 x 64
    assert galore["proj.weight.exp_avg"].shape == (256, 64) and galore["proj.weight.ortho_matrix"].shape == (64, 64)
    apollo = states("apollo")
    assert apollo["proj.weight.exp_avg"].shape == (256, 1) and apollo["proj.weight.ortho_matrix"].shape == (1, 64)
    mini = states("adam-mini")
    assert {k for k in mini if k.startswith("proj.")} == {"proj.weight.m"}
    assert {"embed.weight.m", "embed.weight.v"} <= set(mini)
    four = states("adamw-4bit")
    # 16,384 values: 8,192 packed bytes and 16,384 / 128 = 128 fp32 scales per moment; the norm (64 < 4,096)
    # keeps zeros_like(p)
    assert four["proj.weight.exp_avg"].numel() == 8192 and four["proj.weight.exp_avg.scale"].numel() == 128
    assert four["norm.weight.exp_avg"].dtype == torch.float32 and "norm.weight.exp_avg.scale" not in four
    fp8 = states("adamw-fp8")
    assert fp8["proj.weight.exp_avg_sq"].dtype == torch.float8_e4m3fn
    came = states("came")
    assert came["proj.weight.exp_avg_res_row"].shape == (256,) and came["proj.weight.exp_avg_sq_col"].shape == (64,)
    assert "norm.weight.exp_avg_sq" in came and "norm.weight.exp_avg_res_row" not in came
    sf = states("schedule-free-adamw")
    assert {"proj.weight.z", "proj.weight.exp_avg_sq"} <= set(sf) and "proj.weight.exp_avg" not in sf


# ------------------------------------------------------------------------------------------- planner
def test_the_planner_searches_only_a_named_optimizer() -> None:
    from vramplan.catalog.gpus import resolve_gpu
    from vramplan.plan.space import TrainJob, train_candidates

    m, gpu = load_model(MODEL), resolve_gpu("A100-80GB")
    default = list(train_candidates(m, gpu, 2, TrainJob(seq_len=512, global_batch=4, peft="allow")))
    # the new rows are not searched by default (no row names the planner): see docs/checklists/optimizer.md
    assert {s.optimizer for s in default} == {"adamw", "adamw-fused", "adamw-8bit", "paged-adamw", "paged-adamw-8bit"}
    muon = list(train_candidates(m, gpu, 2, TrainJob(seq_len=512, global_batch=4, peft="allow", optimizer="muon")))
    # Muon: the Trainer's full fine-tuning only (no adapters; DeepSpeed, FSDP and torchtitan name no Muon)
    assert muon and {(s.optimizer, s.framework, s.peft) for s in muon} == {("muon", "hf-trainer", None)}
    four = list(train_candidates(m, gpu, 2, TrainJob(seq_len=512, global_batch=4, peft="allow",
                                                     optimizer="adamw-4bit")))
    # torchao 4-bit: the Trainer (full and PEFT) and FSDP through Accelerate (the Trainer's optim name)
    assert {s.framework for s in four} == {"hf-trainer", "accelerate"} and any(s.peft for s in four)
    assert {s.optimizer for s in four} == {"adamw-4bit"}


def test_plan_cli_takes_an_optimizer() -> None:
    import json

    from typer.testing import CliRunner

    from vramplan.cli.main import app

    res = CliRunner().invoke(app, ["plan", "--model", "gpt2", "--gpu", "A100-80GB", "--seq-len", "128",
                                   "--global-batch", "4", "--optimizer", "adamw-4bit", "--json"])
    assert res.exit_code == 0, res.stdout
    doc = json.loads(res.stdout)
    assert doc["job"]["optimizer"] == "adamw-4bit"
    assert "adamw-4bit" in json.dumps(doc["chosen"])
