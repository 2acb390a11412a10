"""The generated command-line options (cli/flags.py): frozen per command, documented, and the old names kept.

A change to a scenario field changes the generated options; ``tests/data/cli_flags.json`` makes that
change visible and deliberate (torchtitan's ``tests/unit_tests/test_no_new_cli_options.py`` does the same).
Regenerate it with ``UPDATE_CLI_FLAGS=1 python -m pytest tests/test_cli_flags.py`` after such a change.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from pydantic import BaseModel
from typer.testing import CliRunner

from vramplan.cli import flags as flags_mod
from vramplan.cli.compare_cmd import COMPARE_FLAGS
from vramplan.cli.flags import Flag, Given, describe, scenario_flags
from vramplan.cli.main import ESTIMATE_FLAGS, app
from vramplan.cli.measure_cmd import MEASURE_FLAGS
from vramplan.cli.plan_cmd import PLAN_FLAGS, SOLVE_FLAGS
from vramplan.cli.serve_cmd import GENERATE_FLAGS, SERVE_FLAGS
from vramplan.cli.trace_cmd import TRACE_FLAGS
from vramplan.facts import Choices
from vramplan.spec.scenario import Scenario

FROZEN = Path(__file__).parent / "data" / "cli_flags.json"
COMMANDS: dict[str, tuple[Flag, ...]] = {"estimate": ESTIMATE_FLAGS, "trace": TRACE_FLAGS, "plan": PLAN_FLAGS,
                                         "serve": SERVE_FLAGS, "generate": GENERATE_FLAGS,
                                         # solve and compare take a whole scenario as options (issue 19)
                                         "solve": SOLVE_FLAGS, "compare": COMPARE_FLAGS, "measure": MEASURE_FLAGS}
runner = CliRunner()
ENV = {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}

# The option names each command had before its options were generated (they stay the same).
BEFORE: dict[str, set[str]] = {
    "estimate": {
        "model", "task", "gpu", "num-gpus", "capacity-gib", "gpus-per-node", "cuda-module-loading", "framework",
        "micro-batch-size", "seq-len", "grad-accum-steps", "precision", "optimizer", "gradient-checkpointing",
        "attention", "peft", "lora-rank", "lora-alpha", "lora-dropout", "target-modules", "quantization",
        "batch-size", "prompt-len", "new-tokens", "dtype", "kv-cache-dtype", "bnb-compute-dtype", "max-model-len",
        "gpu-memory-utilization", "block-size", "max-num-seqs", "max-num-batched-tokens", "vllm-version",
        "cuda-graphs", "no-cuda-graphs", "bitsandbytes", "peft-version", "transformers-version", "zero-stage", "fsdp",
        "tp", "pp", "cp", "ep", "sequence-parallel", "no-sequence-parallel", "offload", "offload-device", "engine",
        "json"},
    "trace": {
        "model", "task", "gpu", "num-gpus", "framework", "micro-batch-size", "seq-len", "grad-accum-steps",
        "precision", "optimizer", "gradient-checkpointing", "attention", "peft", "lora-rank", "target-modules",
        "quantization", "batch-size", "prompt-len", "new-tokens", "dtype", "zero-stage", "fsdp", "timeline", "top",
        "json"},
    "plan": {
        "model", "gpu", "num-gpus", "task", "seq-len", "global-batch", "global-batch-tokens", "peft", "lora-rank",
        "lora-alpha", "allow-pure-bf16", "no-allow-pure-bf16", "max-micro-batch", "max-model-len", "concurrency",
        "allow-quantization", "no-allow-quantization", "margin", "top", "mfu", "inter-node-gbps",
        "host-memory-gib", "gpus-per-node", "export", "json"},
    "serve": {
        "model", "gpu", "capacity-gib", "tp", "max-model-len", "gpu-memory-utilization", "block-size", "max-num-seqs",
        "max-num-batched-tokens", "kv-cache-dtype", "dtype", "quantization", "enforce-eager", "vllm-version",
        "subtract-cudagraphs", "json"},
    "generate": {
        "model", "gpu", "capacity-gib", "tp", "batch-size", "prompt-len", "new-tokens", "dtype", "quantization",
        "kv-cache-dtype", "attention", "json"},
    "solve": {"margin", "json"},
    "compare": set(),
    "measure": {"device", "layers", "seq-len", "micro-batch-size", "batch-size", "prompt-len", "new-tokens",
                "max-cpu-bytes", "warmup", "no-warmup", "json"},
}


def _options(command: str) -> set[str]:
    """Every option name the command accepts (without the dashes)."""
    click_cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    names: set[str] = set()
    for p in click_cmd.params:
        names.update(o.removeprefix("--") for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return names


def _generated() -> dict[str, Any]:
    return {cmd: describe(fl) for cmd, fl in COMMANDS.items()}


def _dump(table: dict[str, Any]) -> str:
    """One line per option, so a diff of the file shows exactly the options that changed."""
    cmds = []
    for cmd, opts in table.items():
        lines = ",\n".join(f"  {json.dumps(o)}: {json.dumps(v)}" for o, v in opts.items())
        cmds.append(f" {json.dumps(cmd)}: {{\n{lines}\n }}")
    return "{\n" + ",\n".join(cmds) + "\n}\n"


def test_generated_flag_set_is_frozen() -> None:
    now = _generated()
    if os.environ.get("UPDATE_CLI_FLAGS"):
        FROZEN.write_text(_dump(now))
    frozen = json.loads(FROZEN.read_text())
    assert now == frozen, ("the generated options changed; if that is deliberate, regenerate "
                           "tests/data/cli_flags.json with UPDATE_CLI_FLAGS=1 and say why in the commit")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_old_names_kept_and_generated_options_reach_the_command(command: str) -> None:
    have = _options(command)
    assert BEFORE[command] <= have, sorted(BEFORE[command] - have)
    assert {f.option.removeprefix("--") for f in COMMANDS[command]} <= have


def test_estimate_offers_every_scenario_field_once() -> None:
    paths = [p for f in ESTIMATE_FLAGS for p in f.paths]
    assert len(paths) == len(set(paths))
    # every leaf of the schema, found by walking it independently of cli/flags.py
    leaves: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = [a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                   if isinstance(a, type) and issubclass(a, BaseModel)]
            if sub:
                walk(sub[0], f"{prefix}{name}.")
            else:
                leaves.append(prefix + name)

    walk(Scenario, "")
    assert sorted(paths) == sorted(leaves)


def test_every_scenario_field_has_a_description() -> None:
    schema = Scenario.model_json_schema()
    missing = [f"Scenario.{k}" for k, v in schema["properties"].items() if not v.get("description")]
    for model, d in schema["$defs"].items():
        missing += [f"{model}.{k}" for k, v in d["properties"].items() if not v.get("description")]
    assert not missing
    # a description is the field's attribute docstring, and the first paragraph is the short help
    assert Scenario.model_fields["task"].description == "What runs: a training step, Hugging Face generate, or a vLLM engine."


def _help(*args: str) -> str:
    res = runner.invoke(app, [*args, "--help"], env=ENV)
    assert res.exit_code == 0
    # rich draws the options in a box; drop its borders, then fold the wrapping (any terminal width)
    return " ".join(re.sub("[\u2500-\u257f]", " ", res.stdout).split())


def test_help_shows_the_description_and_choices() -> None:
    text = _help("estimate")
    assert ("train: Activation recomputation policy: none; full (each checkpointed layer keeps only its input); "
            "attention-core") in text
    assert "Choices: none | full | selective | attention-core | op-sac." in text
    # a field shared by the task sections lists each section's text and the union of the choices
    assert ("Choices: none | int8 | nf4 | nf4-dq | fp4 | gptq-4bit | awq-4bit | fp8 | mxfp4 | fp8-block | gptq-3bit | "
            "gptq-8bit | ct-w4a16 | ct-w8a8-int8 | ct-fp8 | ct-nvfp4 | ct-nvfp4a16 | modelopt-nvfp4 | modelopt-fp8 | "
            "fp8-tensor | fp8-tensor-static | ct-fp8-tensor | ct-fp8-tensor-static | hqq-4bit | hqq-8bit | ao-int4 | ao-fp8 | ao-int8.") in text
    assert "train: Base-weight quantization under training" in text and "inference/serve: Weight quantization" in text
    assert "Choices: 0 | 1 | 2 | 3." in text  # zero_stage: a Literal of ints
    trace = _help("trace")
    assert ("Choices: fp32 | fp16-mixed | bf16-mixed | bf16-true | fp16-true | fp8-mixed | fp8-torchao | "
            "mxfp8-torchao.") in trace
    assert "--bitsandbytes" not in trace  # the trace runs the installed libraries
    plan = _help("plan")
    assert "train: Adapter rank r" in plan and "The planner's default: 16." in plan


def test_shared_leaf_sets_the_task_section() -> None:
    quant = next(f for f in ESTIMATE_FLAGS if f.name == "quantization")
    assert quant.paths == ("train.quantization", "inference.quantization", "serve.quantization")
    g = Given(ESTIMATE_FLAGS, {"quantization": "nf4", "dtype": "fp16", "attention": "eager"})
    assert g.document("inference") == {"inference": {"quantization": "nf4", "dtype": "fp16", "attention": "eager"}}
    # no section of its own: the first one, as the hand-written options did (dtype of a training
    # scenario went to inference, attention of a serving one to train)
    assert g.document("train") == {"train": {"quantization": "nf4", "attention": "eager"},
                                   "inference": {"dtype": "fp16"}}
    assert g.document("serve") == {"serve": {"quantization": "nf4", "dtype": "fp16"}, "train": {"attention": "eager"}}


def test_serve_flags_reach_the_serve_section() -> None:
    # --enforce-eager (vllm serve's name) and the generated --no-cuda-graphs set the same field
    graphs = {}
    for flag in ("--cuda-graphs", "--enforce-eager", "--no-cuda-graphs"):
        res = runner.invoke(app, ["serve", "--model", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096",
                                  "--dtype", "fp16", flag, "--json"], env=ENV)
        assert res.exit_code == 0, res.stderr
        graphs[flag] = json.loads(res.stdout)["vllm"]["cudagraph_bytes"]
    assert graphs["--cuda-graphs"] > 0 and graphs["--enforce-eager"] == graphs["--no-cuda-graphs"] == 0


def test_list_option_and_not_given_values() -> None:
    g = Given(ESTIMATE_FLAGS, {"target_modules": "q_proj, v_proj", "lora_rank": None, "cuda_graphs": False})
    assert g.document("train") == {"train": {"peft": {"target_modules": ["q_proj", "v_proj"]}},
                                   "serve": {"cuda_graphs": False}}
    assert Given(ESTIMATE_FLAGS, {"target_modules": "all-linear"}).document("train") == {
        "train": {"peft": {"target_modules": "all-linear"}}}


def test_cli_values_reach_the_scenario() -> None:
    res = runner.invoke(app, ["estimate", "--model", "gpt2", "--gpu", "T4", "--task", "inference", "--quantization",
                              "int8", "--kv-cache-dtype", "fp16", "--batch-size", "2", "--json"], env=ENV)
    assert res.exit_code == 0, res.stderr
    sc = json.loads(res.stdout)["scenario"]
    assert sc["inference"]["quantization"] == "int8" and sc["inference"]["kv_cache_dtype"] == "fp16"
    assert sc["inference"]["batch_size"] == 2 and sc["train"]["quantization"] == "none"


def _table_names() -> tuple[str, ...]:
    return ("alpha", "beta")


class _WithChoices(BaseModel):
    a: Annotated[str, Choices("thing", _table_names)] = "alpha"
    b: Annotated[str, Choices("thing", _table_names)] | None = None


def test_choices_marker_gives_the_choices() -> None:
    # a field whose allowed values are a data table's row names (vramplan.facts.Choices)
    M = _WithChoices

    assert flags_mod._kind_and_choices(M.model_fields["a"]) == (str, ("alpha", "beta"), False)
    assert flags_mod._kind_and_choices(M.model_fields["b"]) == (str, ("alpha", "beta"), False)


def test_colliding_leaf_needs_a_rename(monkeypatch: pytest.MonkeyPatch) -> None:
    # train.peft.method is --peft (its old name); software.peft would be --peft too without its rename,
    # and the generator refuses an option that sets two fields outside the task sections
    renamed = dict(flags_mod.RENAMED)
    del renamed["software.peft"]
    monkeypatch.setattr(flags_mod, "RENAMED", renamed)
    with pytest.raises(ValueError, match=r"--peft would set \('train.peft.method', 'software.peft'\)"):
        scenario_flags([""])
