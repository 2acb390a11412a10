"""torchtitan job-config layouts (facts/torchtitan_releases.py) and the export's target release
(``software.torchtitan``): one test per release row, the fp8-torchao and mxfp8-torchao TOML at the oldest and
newest release, and (where a torchtitan git directory is given) the rows and the TOML against torchtitan's own
source at each tag."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from vramplan.errors import ScenarioError
from vramplan.export.lifecycle import resolve_lifecycle
from vramplan.export.torchtitan import job_config_tables, to_toml, torchtitan_config
from vramplan.facts.torchtitan_releases import (
    DEFAULT_RELEASE,
    TORCHTITAN_RELEASES,
    TorchtitanRelease,
    torchtitan_release,
)
from vramplan.plan.setup import TrainSetup
from vramplan.spec.scenario import Float8Training, Lifecycle, MXTraining, Train

# what each tag's source says, written out by hand (release -> float8 section, float8 converter, MX section, MX
# converter, MX keys, checkpoint switch, validation switch); the module docstring gives the file:line
EXPECTED = {
    "0.1.0": ("float8", "float8", "mx", "mx", {"filter_fqns", "recipe_name", "use_fp8_dim1_cast_triton_kernel"},
              "enable_checkpoint", None),
    "0.2.0": ("quantize.linear.float8", "quantize.linear.float8", "quantize.linear.mx", "quantize.linear.mx",
              {"filter_fqns", "recipe_name", "mxfp8_dim1_cast_kernel_choice"}, "enable", "enable"),
    "0.2.1": ("quantize.linear.float8", "quantize.linear.float8", "quantize.linear.mx", "quantize.linear.mx",
              {"filter_fqns", "recipe_name", "mxfp8_dim1_cast_kernel_choice"}, "enable", "enable"),
    "0.2.2": ("quantize.linear.float8", "quantize.linear.float8", "quantize.linear.mx", "quantize.linear.mx",
              {"filter_fqns", "recipe_name", "mxfp8_dim1_cast_kernel_choice"}, "enable", "enable"),
}
OLDEST, NEWEST = TORCHTITAN_RELEASES[0].release, TORCHTITAN_RELEASES[-1].release


@pytest.mark.parametrize("row", TORCHTITAN_RELEASES, ids=lambda r: r.release)
def test_release_row(row: TorchtitanRelease) -> None:
    f8, f8_conv, mx, mx_conv, mx_keys, ckpt, val = EXPECTED[row.release]
    assert (row.float8_section, row.float8_converter, row.mx_section, row.mx_converter) == (f8, f8_conv, mx, mx_conv)
    assert row.sections[row.mx_section] == mx_keys
    assert (row.checkpoint_enable, row.validation_enable) == (ckpt, val)
    assert ckpt in row.sections["checkpoint"]
    assert ("validation" in row.sections) == (val is not None)
    if val is not None:
        assert val in row.sections["validation"]
    # force_recompute_fp8_weight_in_bwd is v0.1.0's only (v0.2.0 Float8Linear dropped it)
    assert ("force_recompute_fp8_weight_in_bwd" in row.sections[f8]) == (row.release == "0.1.0")
    assert (row.mx_kernel_key is None) == (row.release == "0.1.0")
    assert (row.mx_recipe_values == {"mxfp8_cublas": "mxfp8"}) == (row.release == "0.1.0")
    # the tag's commit, and the source cites the file JobConfig is in
    assert len(row.commit) == 40 and row.config_file.endswith(row.source.split(":")[0])


def test_release_lookup() -> None:
    assert DEFAULT_RELEASE == "0.2.2" == torchtitan_release(None).release
    assert torchtitan_release("0.2").release == "0.2.0"  # a release named by fewer parts is its .0
    assert torchtitan_release("0.1.0").release == "0.1.0"
    with pytest.raises(ValueError, match=r"torchtitan 0\.3\.0 .*0\.1\.0, 0\.2\.0, 0\.2\.1, 0\.2\.2"):
        torchtitan_release("0.3.0")
    with pytest.raises(ValueError, match=r"did you mean 0\.2\.2"):
        torchtitan_release("0.2.3")


def _setup(precision: str, **kw: Any) -> TrainSetup:
    return TrainSetup(framework="torchtitan", num_gpus=8, fsdp="full_shard", train=Train(precision=precision, **kw))


FP8 = _setup("fp8-torchao", float8=Float8Training(enable_fsdp_float8_all_gather=True,
                                                   precompute_float8_dynamic_scale_for_fsdp=True))
MXFP8 = _setup("mxfp8-torchao", mx=MXTraining())


def _exported(s: TrainSetup, release: str | None) -> dict[str, Any]:
    cfg = torchtitan_config(s, "llama", 32, 4096, release=release)
    back = tomllib.loads(to_toml(cfg, header="fragment"))
    assert back == cfg
    row = torchtitan_release(release)
    for section, table in job_config_tables(back):
        assert section in row.sections and set(table) <= row.sections[section], section
    return back


def test_fp8_oldest_and_newest() -> None:
    old, new = _exported(FP8, OLDEST), _exported(FP8, NEWEST)
    assert old["model"]["converters"] == ["float8"] and "quantize" not in old and "validation" not in old
    assert old["float8"] == {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
                             "precompute_float8_dynamic_scale_for_fsdp": True,
                             "force_recompute_fp8_weight_in_bwd": False}
    assert old["checkpoint"] == {"enable_checkpoint": True}
    assert new["model"]["converters"] == ["quantize.linear.float8"] and "float8" not in new
    assert new["quantize"] == {"linear": {"float8": {"filter_fqns": ["output"], "enable_fsdp_float8_all_gather": True,
                                                     "precompute_float8_dynamic_scale_for_fsdp": True}}}
    assert new["checkpoint"] == {"enable": True} and new["validation"] == {"enable": False}
    assert _exported(FP8, None) == new  # unset: the newest
    rowwise = _exported(_setup("fp8-torchao", float8=Float8Training(recipe_name="rowwise")), NEWEST)
    assert rowwise["quantize"]["linear"]["float8"] == {"filter_fqns": ["output"], "recipe_name": "rowwise"}


def test_fp8_force_recompute_has_no_v02_key() -> None:
    s = _setup("fp8-torchao", float8=Float8Training(force_recompute_fp8_weight_in_bwd=True))
    assert _exported(s, OLDEST)["float8"]["force_recompute_fp8_weight_in_bwd"] is True
    with pytest.raises(ScenarioError, match="has no force_recompute_fp8_weight_in_bwd"):
        torchtitan_config(s, "llama", 32, 4096, release=NEWEST)


def test_mxfp8_oldest_and_newest() -> None:
    old, new = _exported(MXFP8, OLDEST), _exported(MXFP8, NEWEST)
    # v0.1.0 MX: recipe_name "mxfp8" is torchao's mxfp8_cublas (NAME_MAP); no key names the CUDA kernel
    assert old["model"]["converters"] == ["mx"] and old["mx"] == {"recipe_name": "mxfp8", "filter_fqns": ["output"]}
    assert new["model"]["converters"] == ["quantize.linear.mx"] and "mx" not in new
    assert new["quantize"]["linear"]["mx"] == {"recipe_name": "mxfp8_cublas", "mxfp8_dim1_cast_kernel_choice": "cuda",
                                               "filter_fqns": ["output"]}
    rceil = _setup("mxfp8-torchao", mx=MXTraining(recipe_name="mxfp8_cublas_rceil"))
    assert _exported(rceil, NEWEST)["quantize"]["linear"]["mx"]["recipe_name"] == "mxfp8_cublas_rceil"
    emulated = _setup("mxfp8-torchao", mx=MXTraining(recipe_name="mxfp8_emulated", convert_lm_head=True))
    assert _exported(emulated, NEWEST)["quantize"]["linear"]["mx"] == {
        "recipe_name": "mxfp8_emulated", "mxfp8_dim1_cast_kernel_choice": "torch", "filter_fqns": []}
    with pytest.raises(ScenarioError, match=r"offers mxfp8 \(torchao mxfp8_cublas\) only, not mxfp8_cublas_rceil"):
        torchtitan_config(rceil, "llama", 32, 4096, release=OLDEST)


def test_v010_has_no_validation_section() -> None:
    s = TrainSetup(framework="torchtitan", num_gpus=8, fsdp="full_shard")
    lc = resolve_lifecycle(s, Lifecycle(evaluation=True, eval_batches=20))
    with pytest.raises(ScenarioError, match=r"no \[validation\] section"):
        torchtitan_config(s, "llama", 32, 4096, lc, release=OLDEST)
    new = tomllib.loads(to_toml(torchtitan_config(s, "llama", 32, 4096, lc, release=NEWEST)))
    # the evaluation batch is the micro-batch, 1 (analytic eval_batch_size); 20 batches per evaluation
    assert new["validation"] == {"enable": True, "local_batch_size": 1, "seq_len": 2048, "steps": 20}


def test_unknown_release_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"software\.torchtitan.*0\.1\.0, 0\.2\.0, 0\.2\.1, 0\.2\.2"):
        torchtitan_config(FP8, "llama", 32, 4096, release="0.4.0")


# --- against torchtitan's source at each tag: set TORCHTITAN_GIT_DIR to a torchtitan git directory (a clone's
# .git, or a bare mirror) to run these

def _git_dir() -> Path:
    d = os.environ.get("TORCHTITAN_GIT_DIR")
    if not d or not Path(d).is_dir():
        pytest.skip("TORCHTITAN_GIT_DIR (a pytorch/torchtitan git directory with the release tags) is not set")
    return Path(d)


def _show(commit: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={_git_dir()}", "show", f"{commit}:{path}"], capture_output=True,
                          text=True, check=True).stdout


def _job_config_classes(row: TorchtitanRelease) -> dict[str, Any]:
    """The release's ``@dataclass`` classes, executed from its source (no torch or tyro needed: only the dataclass
    definitions and their ``dataclasses`` / ``typing`` imports are run)."""
    tree = ast.parse(_show(row.commit, row.config_file))
    keep = [n for n in tree.body if (isinstance(n, ast.ImportFrom) and n.module in ("dataclasses", "typing"))
            or (isinstance(n, ast.ClassDef) and any(ast.unparse(d).startswith("dataclass") for d in n.decorator_list))]
    ns: dict[str, Any] = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), row.config_file, "exec", dont_inherit=True), ns)  # noqa: S102
    return ns


def _config_manager_parse(row: TorchtitanRelease, doc: dict[str, Any]) -> Any:
    """``ConfigManager._dict_to_dataclass(JobConfig, doc)`` with the release's own method (its source), which is
    what ``ConfigManager.parse_args`` does with a ``--job.config_file`` TOML."""
    manager = "torchtitan/config_manager.py" if row.release == "0.1.0" else "torchtitan/config/manager.py"
    fn = next(n for c in ast.parse(_show(row.commit, manager)).body if isinstance(c, ast.ClassDef)
              and c.name == "ConfigManager" for n in c.body
              if isinstance(n, ast.FunctionDef) and n.name == "_dict_to_dataclass")
    ns: dict[str, Any] = {"is_dataclass": dataclasses.is_dataclass, "fields": dataclasses.fields, "Any": typing.Any}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), manager, "exec", dont_inherit=True), ns)  # noqa: S102
    holder = types.SimpleNamespace()
    holder._dict_to_dataclass = types.MethodType(ns["_dict_to_dataclass"], holder)
    return holder._dict_to_dataclass(_job_config_classes(row)["JobConfig"], doc)


@pytest.mark.parametrize("row", TORCHTITAN_RELEASES, ids=lambda r: r.release)
def test_row_matches_the_tag(row: TorchtitanRelease) -> None:
    classes = _job_config_classes(row)
    for section, keys in row.sections.items():
        cls = classes["JobConfig"]
        for part in section.split("."):
            cls = next(f.type for f in dataclasses.fields(cls) if f.name == part)
        assert {f.name for f in dataclasses.fields(cls)} == keys, section
    for kind, converter in (("float8", row.float8_converter), ("mx", row.mx_converter)):
        assert f'"{converter}")' in _show(row.commit, f"torchtitan/components/quantization/{kind}.py")


@pytest.mark.parametrize("release", [OLDEST, NEWEST])
@pytest.mark.parametrize("s", [FP8, MXFP8], ids=["fp8", "mxfp8"])
def test_torchtitan_parses_the_export(release: str, s: TrainSetup) -> None:
    row = torchtitan_release(release)
    doc = tomllib.loads(to_toml(torchtitan_config(s, "llama", 32, 4096, release=release)))
    job = _config_manager_parse(row, doc)
    for section, table in job_config_tables(doc):
        node = job
        for part in section.split("."):
            node = getattr(node, part)
        for key, value in table.items():
            assert getattr(node, key) == value, (section, key)
    converter = row.float8_converter if s.precision == "fp8-torchao" else row.mx_converter
    assert job.model.converters == [converter]


# --- the release through the planner: `plan --torchtitan-version` (or a scenario file's software.torchtitan)

def test_plan_document_carries_the_release() -> None:
    from vramplan.plan.context import make_context
    from vramplan.plan.steptime import DEFAULT_ASSUMPTIONS

    setup = TrainSetup(framework="torchtitan", num_gpus=8, fsdp="full_shard")
    ctx = make_context("gpt2", "A100-80GB", 0.1, DEFAULT_ASSUMPTIONS, "train",
                       {"train": {"seq_len": 1024}, "software": {"torchtitan": "0.1.0"}})
    # the export reads it from the setup's scenario mapping, and the estimate from the same scenario
    assert ctx.document(setup)["software"] == {"torchtitan": "0.1.0"}
    assert ctx.scenario(setup).software.torchtitan == "0.1.0"
    plain = make_context("gpt2", "A100-80GB", 0.1, DEFAULT_ASSUMPTIONS, "train", {"train": {"seq_len": 1024}})
    assert "software" not in plain.document(setup)


def test_plan_refuses_an_unknown_release_before_searching(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vramplan.cli.main import app

    res = CliRunner().invoke(app, ["plan", "--model", "gpt2", "--gpu", "A100-80GB", "--num-gpus", "1", "--seq-len",
                                   "1024", "--global-batch", "8", "--torchtitan-version", "0.3",
                                   "--export", str(tmp_path / "out")])
    assert res.exit_code != 0
    assert "--torchtitan-version" in res.output and "0.1.0, 0.2.0, 0.2.1, 0.2.2" in res.output
    assert not (tmp_path / "out").exists()
