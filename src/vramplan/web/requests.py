"""What a request may ask for, checked before the library sees it (the server is safe to expose).

A scenario's ``model`` is a catalog id or alias, or an inline config mapping (an uploaded
config.json): never a path on the server, which ``load_model`` would otherwise read.  The planner's
options are the ``vramplan plan`` flags, by the same names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vramplan.catalog.models import list_models
from vramplan.errors import Problem, ScenarioError, UnknownNameError

__all__ = ["PlanRequest", "check_model", "check_scenario"]


def _catalog_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for m in list_models():
        for key in (m.id, m.id.split("/")[-1], *m.aliases):
            names.setdefault(key.strip().lower(), m.id)
    return names


def check_model(model: Any, where: str = "model") -> None:
    """A catalog name or an inline mapping; anything else is refused with the CLI's unknown-model message."""
    if isinstance(model, dict):
        return
    if not isinstance(model, str):
        raise ScenarioError([Problem(where, "must be a catalog id or alias, or an uploaded config.json",
                                     "see `vramplan models`")])
    names = _catalog_names()
    if model.strip().lower() not in names:
        # the same error (and suggestions) as an unknown name on the command line; a path is an unknown name
        raise UnknownNameError("model", model, list(names), where)


def check_scenario(doc: Any) -> dict[str, Any]:
    """The scenario document of a request body, its model checked."""
    if not isinstance(doc, dict):
        raise ScenarioError([Problem("scenario", "the body must be a JSON object (a scenario document)",
                                     "see examples/ for the format")])
    if "model" not in doc:
        raise ScenarioError([Problem("model", "no model given", "pass a scenario file or --model")])
    check_model(doc["model"])
    return doc


class PlanRequest(BaseModel):
    """The options of ``vramplan plan``, by their flag names (``--seq-len`` is ``seq_len``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | dict[str, Any]
    gpu: str
    num_gpus: str | int = "1"
    task: Literal["train", "serve"] = "train"
    seq_len: int | None = Field(None, ge=1)
    global_batch: int | None = Field(None, ge=1)
    global_batch_tokens: int | None = Field(None, ge=1)
    peft: Literal["none", "allow", "only", "lora", "qlora"] = "none"
    lora_rank: int = Field(16, ge=1)
    lora_alpha: float = 32
    allow_pure_bf16: bool = False
    max_micro_batch: int = Field(64, ge=1, le=4096)
    max_model_len: int | None = Field(None, ge=1)
    concurrency: int = Field(1, ge=1)
    allow_quantization: bool = False
    margin: float = Field(0.10, ge=0, lt=0.9)
    top: int = Field(5, ge=1, le=50)
    mfu: float = Field(0.40, gt=0, le=1)
    inter_node_gbps: float = Field(25.0, gt=0)
    gpus_per_node: int = Field(8, ge=1, le=1024)
    host_memory_gib: float | None = Field(None, gt=0)
