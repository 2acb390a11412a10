"""Each package's public face: ``__all__`` lists exactly what its ``__init__`` offers, and is frozen here.

After httpx's ``tests/test_exported_members.py``.  For ``vramplan`` and each subpackage:

* every name in ``__all__`` resolves (the lazily loaded ones too: ``vramplan.record``, the planner);
* every public name the ``__init__`` binds (a class, a function, a constant, or a name imported from a
  ``vramplan`` module, the ``TYPE_CHECKING`` imports of a lazy face included) is in ``__all__``;
* ``__all__`` equals the list frozen below, so that widening or narrowing a face is a deliberate change
  made in two places.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

# dunder names a face may export on purpose (httpx exports __version__ the same way)
EXPORTED_DUNDERS = frozenset({"__version__"})

FACES: dict[str, list[str]] = {
    "vramplan": [
        "ModelSpec", "Problem", "Report", "Resolved", "Scenario", "ScenarioError", "VramplanError",
        "__version__", "estimate", "list_gpus", "list_models", "load_model", "read_snapshot", "record",
        "resolve", "resolve_gpu",
    ],
    "vramplan.analytic": ["K", "KEYS", "Key", "Moment", "PHASES", "Phase"],
    "vramplan.spec": [
        "GpuSpec", "Hardware", "Inference", "LayerSpec", "MLASpec", "MoESpec", "ModelSpec", "Parallel",
        "ParamGroup", "Peft", "Scenario", "Serve", "Train", "Traits",
    ],
    "vramplan.catalog": [
        "CatalogModel", "gpu_names", "list_gpus", "list_models", "load_model", "model_ids", "resolve_gpu",
    ],
    "vramplan.alloc": [
        "AllocEvent", "AllocatorSettings", "BlockView", "CachingAllocator", "OomInfo", "Repeat", "ReplayResult",
        "SegmentView", "allocation_size", "expand", "parse_alloc_conf", "replay",
        "replay_compact", "replay_parts", "round_size", "should_split",
    ],
    "vramplan.plan": [
        "DEFAULT_MARGIN", "PlanResult", "RankedSetup", "Rung", "ServeJob", "ServeSetup", "SolveResult",
        "Suggestion", "TrainJob", "TrainSetup", "fits_with_margin", "plan", "solve", "solve_max_batch",
        "solve_max_seq", "solve_min_gpus",
    ],
    "vramplan.serve": ["SGLANG_BEHAVIOURS", "VLLM_BEHAVIOURS", "LlamaCppDecision", "ServeResult", "SglangDecision",
                       "VllmDecision", "decide", "decide_sglang", "read_gguf", "serve"],
    "vramplan.trace": ["estimate", "require_torch"],
    "vramplan.measure": [
        "BatchPlan", "HFMemoryCallback", "LeakDiagnosis", "LightningMemoryHooks", "MeasureResult",
        "MemoryMonitor", "MemoryStats", "PartRow", "SafeStep", "StepRecord", "cuda_stats",
        "largest_fitting_micro_batch", "lightning_callback", "measure", "micro_batches", "read_snapshot",
        "rss_stats", "shrink", "tracker_stats",
    ],
    "vramplan.export": [
        "accelerate_config", "bnb_config_kwargs", "deepspeed_config", "export_files", "lora_config_kwargs",
        "model_init_kwargs", "setup_of", "to_toml", "torchtitan_config", "training_arguments_kwargs",
        "vllm_command", "vllm_engine_args", "write_export",
        "LaunchModel", "ResolvedLifecycle", "launch_model", "resolve_lifecycle", "trl_sft_config", "megatron_arguments",
    ],
    "vramplan.validate": [
        "COMPARED_FIELD", "Dataset", "EngineFn", "Entry", "EntryResult", "Measured", "Prediction",
        "PredictorSummary", "RULES", "Rule", "Summary", "ValidationResult", "default_engines", "fits_verdict",
        "load_dataset", "parse_dataset", "percentile", "predicted_quantity", "relative_error",
        "run_validation", "summarize", "to_markdown", "validate", "workload",
    ],
    "vramplan.facts": ["Choices", "OneOf", "row_named"],
    "vramplan.web": ["WebSettings", "create_app"],
}


def _init_file(package: str) -> Path:
    module = importlib.import_module(package)
    assert module.__file__ is not None and module.__file__.endswith("__init__.py")
    return Path(module.__file__)


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def _offered_names(body: list[ast.stmt]) -> set[str]:
    """Names a module body offers its readers: its public definitions, and what it imports only to pass on.

    A name imported from a vramplan module and used nowhere else in the ``__init__`` (its ``__getattr__``
    aside) can only be there to be offered; one the ``__init__`` itself uses (``export`` annotates with
    ``PlanResult``) is a tool of the ``__init__``, which ``__all__`` may list or not.
    """
    used = {n.id for node in body if not (isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
            for n in ast.walk(node) if isinstance(n, ast.Name)}
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vramplan"):
            names.update(n for a in node.names if (n := a.asname or a.name) not in used)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            names |= _offered_names(node.body) - used
    return names


def public_names(package: str) -> set[str]:
    """The public names ``package``'s ``__init__`` offers (submodules imported as modules left out)."""
    module = importlib.import_module(package)
    tree = ast.parse(_init_file(package).read_text(encoding="utf-8"))
    out = set()
    for name in _offered_names(tree.body) - {"__all__"}:
        if name.startswith("_") and name not in EXPORTED_DUNDERS:
            continue
        if isinstance(vars(module).get(name), types.ModuleType):
            continue  # ``from vramplan.alloc import native``: a submodule, reached by its own path
        out.add(name)
    return out


@pytest.mark.parametrize("package", sorted(FACES))
def test_every_name_in_all_resolves(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


@pytest.mark.parametrize("package", sorted(FACES))
def test_all_lists_every_public_name_of_the_init(package: str) -> None:
    module = importlib.import_module(package)
    assert public_names(package) - set(module.__all__) == set()


@pytest.mark.parametrize("package", sorted(FACES))
def test_faces_are_frozen(package: str) -> None:
    """Change a face here and in its ``__init__`` together."""
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(FACES[package])
    assert len(module.__all__) == len(set(module.__all__)), "a name listed twice"


# subpackages without a checked face, and why
UNCHECKED = {
    "vramplan.cli": "the command line: its face is the `vramplan` command, not a Python name",
    "vramplan.report": "one schema module (Report and its parts), imported by its own names",
}


def test_every_subpackage_has_a_checked_face() -> None:
    """A new subpackage of vramplan gets a face here too (``plan.steptime`` is reached through ``plan``)."""
    root = _init_file("vramplan").parent
    packages = {f"vramplan.{p.parent.name}" for p in root.glob("*/__init__.py")}
    assert packages - set(FACES) == set(UNCHECKED)


def test_public_names_sees_the_lazy_and_defined_names() -> None:
    """The scanner itself: ``vramplan`` offers ``record`` lazily (a TYPE_CHECKING import) and ``estimate``."""
    names = public_names("vramplan")
    assert {"record", "read_snapshot", "estimate", "__version__"} <= names
    assert "TYPE_CHECKING" not in names and "Any" not in names
