"""Every optimizer row is known to every consumer, and a new row is one entry of the table.

GPT-2 (124,439,808 parameters, tied head) on one A100-80GB, bf16-mixed under the Trainer: parameters
and the optimizer's states are fp32 (``param_bytes`` 4), so AdamW's two moments are 8 B per parameter.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from vramplan import estimate
from vramplan.analytic.layout import rank_params
from vramplan.analytic.optimizer import (
    OptimizerCost,
    optimizer_assumptions,
    optimizer_cost,
    optimizer_cost_for,
    state_bytes_per_param,
    state_tensors_per_param,
)
from vramplan.catalog.models import load_model
from vramplan.errors import ScenarioError
from vramplan.export.hf import optim_name, training_arguments_kwargs
from vramplan.facts import optimizers as facts
from vramplan.facts.optimizers import OptimizerFacts, StateTensor, optimizer_facts, optimizer_names
from vramplan.plan.context import make_context
from vramplan.plan.setup import TrainSetup
from vramplan.plan.space import TrainJob, train_candidates
from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS
from vramplan.plan.steptime.memory_bound import optimizer_bytes_per_param
from vramplan.spec.load import parse_scenario
from vramplan.spec.scenario import Train

GPT2 = 124_439_808  # openai-community/gpt2 parameters (wte 38,597,376 + wpe 786,432 + 12 layers + ln_f)


def _doc(optimizer: str) -> dict[str, object]:
    return {"model": "gpt2", "hardware": {"gpu": "A100-80GB"},
            "train": {"micro_batch_size": 1, "seq_len": 128, "optimizer": optimizer}}


def _setup(optimizer: str) -> TrainSetup:
    return TrainSetup(framework="hf-trainer", num_gpus=1, micro_batch_size=1, grad_accum_steps=1, seq_len=128,
                      optimizer=optimizer)


def test_table_names_are_unique_and_the_schema_lists_them() -> None:
    names = optimizer_names()
    assert len(names) == len(set(names)) == 19
    assert Train.model_json_schema()["properties"]["optimizer"]["enum"] == list(names)


def test_unknown_optimizer_names_the_choices_and_a_close_name() -> None:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(_doc("adamw8bit"))
    assert "train.optimizer: 'adamw8bit' is not allowed (did you mean 'adamw-8bit'?)" in str(exc.value)
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(_doc("rmsprop"))
    # no close name: every valid choice is listed
    assert "(choose 'adamw', 'adamw-fused', 'adamw-8bit', 'paged-adamw', 'paged-adamw-8bit', 'adafactor', " \
           "'sgd', 'sgd-momentum', 'lion', 'muon', 'galore-adamw', 'apollo', 'adam-mini', 'adamw-8bit-torchao', " \
           "'adamw-4bit', 'adamw-fp8', 'schedule-free-adamw', 'came' or 'none')" in str(exc.value)


@pytest.mark.parametrize("name", optimizer_names())
def test_every_consumer_knows_every_optimizer(name: str) -> None:
    f = optimizer_facts(name)
    # engine: the estimate runs; states sit in torch's allocator or in managed memory as the row says
    rep = estimate(_doc(name))
    states = rep.per_gpu.breakdown["optimizer_states"]
    managed = rep.per_gpu.outside_allocator.get("managed", 0)
    assert (states > 0) == (bool(f.states) and not f.managed_memory)
    assert (managed > 0) == (bool(f.states) and f.managed_memory)
    # the allocator event stream's count, and the report's assumption lines
    assert state_tensors_per_param(name) == len(f.states)
    assert isinstance(optimizer_assumptions(name, "hf-trainer"), list)
    # planner: the lower bound runs and stays below the estimate
    ctx = make_context("gpt2", "A100-80GB", 0.1, DEFAULT_ASSUMPTIONS, "train")
    assert ctx.lower_bound(_setup(name)) <= ctx.estimate(_setup(name)).per_gpu.device_used_bytes
    # step time: the update's HBM traffic (0 only without an optimizer)
    assert (optimizer_bytes_per_param(name, 4, 4, 0) == 0) == (f.construct is None)
    # Hugging Face exporter: the Trainer's name, or an explicit refusal
    if f.hf_trainer_optim is None:
        with pytest.raises(ValueError, match="no Hugging Face Trainer optim"):
            optim_name(name)
    else:
        assert training_arguments_kwargs(_setup(name))["optim"] == f.hf_trainer_optim
    # measure: a class to build, or nothing for "none"
    assert (f.construct is None) == (name == "none")


@pytest.mark.parametrize("name", optimizer_names())
def test_trace_and_measure_build_every_optimizer(name: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.measure.build import make_optimizer as measure_optimizer
    from vramplan.trace.optim import init_states, make_optimizer

    f = optimizer_facts(name)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128))
    setup = make_optimizer(name, model)
    init_states(setup, list(model.parameters()))
    assert setup.managed == f.managed_memory
    tensors = dict(setup.state_tensors())
    # the 64 x 128 weight (8,192 values) holds one tensor per state of the row
    weight_states = [k for k in tensors if k.startswith("0.weight.") and tensors[k].dim() > 0]
    expected = len(f.states)
    if f.subset is not None and f.subset.params == "hidden_matrices":
        # the subset's states, and a low-rank subset's projection matrix
        expected = len(f.subset.states) + (1 if f.subset.rank else 0)
    assert len([k for k in weight_states if "absmax" not in k and not k.endswith(".scale")]) == expected
    if f.construct is not None and (f.construct.needs_cuda or not _importable(f.construct.package)
                                    or f.subset is not None):
        return  # measure refuses it (test_measure_refuses_what_it_cannot_build)
    cpu_model = torch.nn.Linear(8, 8)
    opt, _note = measure_optimizer(name, cpu_model, "cpu")
    assert (opt is None) == (f.construct is None)


def test_bnb_8bit_trace_layout_follows_the_row() -> None:
    torch = pytest.importorskip("torch")
    from vramplan.trace.optim import init_states, make_optimizer

    model = torch.nn.Linear(64, 128)  # weight 8,192 values >= 4,096; bias 128 < 4,096
    setup = make_optimizer("adamw-8bit", model)
    init_states(setup, list(model.parameters()))
    t = dict(setup.state_tensors())
    assert t["weight.state1"].dtype == torch.uint8 and t["weight.state1"].numel() == 8192
    assert t["weight.absmax1"].numel() == 32  # 8,192 / 256 blocks, one fp32 absmax each
    assert t["bias.state1"].dtype == torch.float32 and "bias.absmax1" not in t  # small tensor: fp32, no scale


def _importable(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def test_measure_refuses_what_it_cannot_build() -> None:
    from vramplan.catalog.resolve import resolve
    from vramplan.measure.build import unsupported

    for name in optimizer_names():
        f = optimizer_facts(name)
        construct = f.construct
        problems = [p for p in unsupported(resolve(_doc(name)), "cpu") if p.where == "train.optimizer"]
        # CUDA-only kernels off CUDA, a library that is not installed, or a split over parameter subsets
        # (one class over every parameter is what measure builds)
        refused = bool(construct and (construct.needs_cuda or not _importable(construct.package)
                                      or f.subset is not None))
        assert bool(problems) == refused, name


def test_engine_sizes_from_the_row() -> None:
    # 8-bit AdamW, 2**20 values in one large tensor: 2 states x (2**20 uint8 + 4 B x 2**20 / 256 absmax)
    # = 2 x (1,048,576 + 16,384) = 2,129,920 B; with 1,000 values in small tensors: + 1,000 x 2 x 4 fp32
    assert optimizer_cost("adamw-8bit", 2**20, 2**20, 4).state_bytes == 2_129_920
    assert optimizer_cost("adamw-8bit", 2**20 + 1000, 0, 4, small_tensor_params=1000).state_bytes == 2_137_920
    assert state_bytes_per_param("adamw-8bit", 4) == 2 + 2 * 4 / 256
    # foreach AdamW: one second-moment-sized temporary per decay-group parameter, 900 x 4 B
    assert optimizer_cost("adamw", 1000, 900, 4).step_temporary_bytes == 3600
    # Lion: the clone and the sign update of the largest parameter, 2 x 100 x 2 B
    assert optimizer_cost("lion", 1000, 900, 2, largest_param=100).step_temporary_bytes == 400
    # paged: AdamW's 2 x 4 B x 1,000 states in managed memory, no temporary
    assert optimizer_cost("paged-adamw", 1000, 900, 4) == OptimizerCost(0, 8000, 0)
    # bf16 parameters: still two fp32 states (bitsandbytes Optimizer2State.init_state, optim_bits=32): 8 x 1000
    assert optimizer_cost("paged-adamw", 1000, 900, 2) == OptimizerCost(0, 8000, 0)


def test_optimizer_cost_for_reads_the_row() -> None:
    m = load_model("gpt2")
    rp = rank_params(m, 1, 1, 1, 0, None, None)
    # DeepSpeed runs FusedAdam for "adamw": no foreach temporary; the Trainer runs foreach
    ds = optimizer_cost_for(m, rp, peft=None, optimizer="adamw", framework="deepspeed", shards=1, tp=1,
                            trainable=rp.total, decay=rp.decay, param_bytes=4)
    hf = optimizer_cost_for(m, rp, peft=None, optimizer="adamw", framework="hf-trainer", shards=1, tp=1,
                            trainable=rp.total, decay=rp.decay, param_bytes=4)
    assert ds.state_bytes == hf.state_bytes == 8 * GPT2  # 995,518,464 B
    assert ds.step_temporary_bytes == 0 and hf.step_temporary_bytes == 4 * rp.decay
    assert optimizer_assumptions("adamw", "deepspeed") == []
    assert len(optimizer_assumptions("adamw", "hf-trainer")) == 1


def test_step_traffic_from_the_row() -> None:
    assert optimizer_bytes_per_param("adamw-fused", 4, 4, 0) == 28  # read p g m v, write p m v (fp32)
    assert optimizer_bytes_per_param("adamw", 2, 2, 4) == 36  # + bf16 grad upcast 2 + 4, + bf16 param write 2
    assert optimizer_bytes_per_param("adamw-8bit", 4, 4, 0) == 16 + 16 / 256
    assert optimizer_bytes_per_param("lion", 4, 4, 0) == 20  # read p g m, write p m: 2 x 4 + 4 + 2 x 4


# ---------------------------------------------------------------- a fictitious optimizer, one row
BF16_ADAMW = OptimizerFacts(
    name="adamw-bf16-states", summary="AdamW with bf16 moments (fictitious)",
    states=(StateTensor(name="exp_avg", dtype="bf16"), StateTensor(name="exp_avg_sq", dtype="bf16")),
    hf_trainer_optim="adamw_torch_bf16_states", planner=("full",),
    construct=facts.Construct(path="torch.optim.AdamW", kwargs=(("fused", True),)),
)


@pytest.fixture
def with_bf16_adamw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts, "OPTIMIZERS", (*facts.OPTIMIZERS, BF16_ADAMW))


@pytest.mark.usefixtures("with_bf16_adamw")
def test_a_fictitious_optimizer_is_one_row() -> None:
    # the scenario accepts it and the schema lists it
    assert parse_scenario(_doc("adamw-bf16-states")).train.optimizer == "adamw-bf16-states"
    assert "adamw-bf16-states" in Train.model_json_schema()["properties"]["optimizer"]["enum"]
    # engine: two bf16 moments are 2 x 2 = 4 B per parameter instead of fused AdamW's 2 x 4 = 8 B,
    # so the states shrink by 4 x 124,439,808 = 497,759,232 B (995,518,464 -> 497,759,232)
    new = estimate(_doc("adamw-bf16-states")).per_gpu.breakdown["optimizer_states"]
    old = estimate(_doc("adamw-fused")).per_gpu.breakdown["optimizer_states"]
    assert old == 995_518_464
    assert old - new == 497_759_232
    # planner: its lower bound drops by the same 4 B per parameter, and the search offers it
    ctx = make_context("gpt2", "A100-80GB", 0.1, DEFAULT_ASSUMPTIONS, "train")
    assert ctx.lower_bound(_setup("adamw-fused")) - ctx.lower_bound(_setup("adamw-bf16-states")) == 497_759_232
    cands = list(train_candidates(ctx.model, ctx.gpu, 1, TrainJob(seq_len=128, global_batch=1)))
    assert any(s.optimizer == "adamw-bf16-states" for s in cands)
    # step time: read p (4) g (4) m v (2 + 2), write p (4) m v (2 + 2) = 20 B per parameter
    assert optimizer_bytes_per_param("adamw-bf16-states", 4, 4, 0) == 20
    # exporters: the Trainer's optim string
    assert training_arguments_kwargs(_setup("adamw-bf16-states"))["optim"] == "adamw_torch_bf16_states"
    # the CLI accepts it and reports the same states
    from vramplan.cli.main import app

    res = CliRunner().invoke(app, ["estimate", "--model", "gpt2", "--gpu", "A100-80GB", "--seq-len", "128",
                                   "--optimizer", "adamw-bf16-states", "--json"])
    assert res.exit_code == 0, res.stdout
    assert json.loads(res.stdout)["per_gpu"]["breakdown"]["optimizer_states"] == new


def test_rows_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        optimizer_facts("adamw").name = "x"  # type: ignore[misc]


def test_a_fictitious_optimizer_row_reaches_the_cli_help() -> None:
    # The CLI's options are generated from the scenario schema when vramplan.cli.main is imported, and an
    # optimizer's choices from the table (facts.Choices): a row added before that import is listed by
    # ``estimate --help`` with no other change.  A fresh interpreter, so the generated options are built anew.
    code = (
        "import dataclasses, vramplan.facts.optimizers as f\n"
        "f.OPTIMIZERS = (*f.OPTIMIZERS, dataclasses.replace(f.optimizer_facts('adamw-fused'), name='adamw-bf16-x'))\n"
        "from typer.testing import CliRunner\n"
        "from vramplan.cli.main import app\n"
        "print(CliRunner().invoke(app, ['estimate', '--help'], env={'COLUMNS': '400'}).stdout)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # the option's help, wrapped over several lines: from "--optimizer" to the next option
    start = out.index("--optimizer")
    block = out[start:out.find(" --", start + len("--optimizer"))]
    assert "adamw-bf16-x" in block and "adamw-8bit" in block
