"""What a request may ask for, checked before the library sees it (the server is safe to expose).

A scenario's ``model`` is a catalog id or alias, or an inline config mapping (an uploaded
config.json): never a path on the server, which ``load_model`` would otherwise read.  The planner's
options are the ``vramplan plan`` flags, by the same names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vramplan.catalog.hub import HubOptions, fetch_hub_model, parse_hub_id
from vramplan.catalog.models import list_models
from vramplan.errors import Problem, ScenarioError, UnknownNameError, suggest

__all__ = ["SIZE_LIMITS", "KvRequest", "PlanRequest", "check_model", "check_scenario", "kv_document"]


@lru_cache(maxsize=1)
def _catalog_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for m in list_models():
        for key in (m.id, m.id.split("/")[-1], *m.aliases):
            names.setdefault(key.strip().lower(), m.id)
    return names


# A request limit, not a model fact: the engine's work grows with the layer and expert counts of a
# config (one set of records and allocator events per layer), so an uploaded config.json may not ask for
# more than ten times the largest in the catalog (Llama-3.1-405B: 126 layers; Qwen3-Next-80B-A3B: 512 routed
# experts), which keeps a request inside the time limit and an abandoned one short.
SIZE_LIMITS = {"num_hidden_layers": 1280, "n_layer": 1280, "num_layers": 1280, "n_layers": 1280,
               "num_local_experts": 5120, "n_routed_experts": 5120, "num_experts": 5120}


def _sections(cfg: dict[str, Any], where: str, depth: int = 3) -> list[tuple[str, dict[str, Any]]]:
    """The config and every nested ``*_config`` mapping under it (a VLM's ``text_config``, Qwen3-Omni's
    ``thinker_config.text_config`` and ``talker_config``), each with its dotted place."""
    out = [(where, cfg)]
    if depth > 0:
        for k, v in cfg.items():
            if k.endswith("_config") and isinstance(v, dict):
                out += _sections(v, f"{where}.{k}", depth - 1)
    return out


def _check_sizes(cfg: dict[str, Any], where: str) -> None:
    problems = []
    for place, section in _sections(cfg, where):
        for key, limit in SIZE_LIMITS.items():
            v = section.get(key)
            if isinstance(v, int) and v > limit:
                problems.append(Problem(f"{place}.{key}", f"{v:,} is more than this server estimates ({limit:,})",
                                        "run `vramplan estimate` locally for such a model"))
    if problems:
        raise ScenarioError(problems)


def check_model(model: Any, where: str = "model", hub: HubOptions | None = None) -> str | dict[str, Any]:
    """The model to estimate: a catalog name or an inline mapping as given; with ``hub`` (a server started with
    ``--allow-hub``), a Hub id not in the catalog, read into the Hugging Face cache here (``catalog/hub.py``) so
    that the library finds it there.  Anything else is refused with the CLI's unknown-model message."""
    if isinstance(model, dict):
        _check_sizes(model, where)
        return model
    if not isinstance(model, str):
        raise ScenarioError([Problem(where, "must be a catalog id or alias, or an uploaded config.json",
                                     "see `vramplan models`")])
    names = _catalog_names()
    if model.strip().lower() in names:
        return model
    if parse_hub_id(model) is not None:
        if hub is None:
            close = suggest(model, list(names))
            did = f"did you mean {', '.join(repr(c) for c in close)}? Or " if close else ""
            # only the job's model may be an uploaded config.json (a draft model is a name: serve.speculative.model)
            upload = "upload its config.json, or " if where == "model" else ""
            raise ScenarioError([Problem(where, f"{model!r} is not in the catalog, and this server reads no "
                                         "Hugging Face Hub ids",
                                         f"{did}{upload}start the server with `vramplan web --allow-hub`")])
        _check_sizes(fetch_hub_model(model, hub, suggest(model, list(names))).config, where)
        return model.strip()
    # the same error (and suggestions) as an unknown name on the command line; a path is an unknown name
    raise UnknownNameError("model", model, list(names), where)


def _check_serve(serve: Any, hub: HubOptions | None) -> Any:
    """The two keys of ``serve`` that name something the library would read: ``gguf.file``, a local GGUF file
    (``serve/gguf.py`` opens it), refused; ``speculative.model``, a draft model that ``load_model`` would also
    read from a path or the Hub, checked as ``model`` is."""
    if not isinstance(serve, dict):
        return serve
    gguf = serve.get("gguf")
    if isinstance(gguf, dict) and gguf.get("file") is not None:
        raise ScenarioError([Problem("serve.gguf.file", "this server reads no file named in a request",
                                     "give the file type as serve.gguf.quant (e.g. Q4_K_M), or run `vramplan serve` "
                                     "where the file is")])
    spec = serve.get("speculative")
    if isinstance(spec, dict) and isinstance(spec.get("model"), str):
        draft = check_model(spec["model"], where="serve.speculative.model", hub=hub)
        return {**serve, "speculative": {**spec, "model": draft}}
    return serve


def check_scenario(doc: Any, hub: HubOptions | None = None) -> dict[str, Any]:
    """The scenario document of a request body, its model checked (and read from the Hub with ``hub``), and
    the serving keys that name a file or a model (``_check_serve``)."""
    if not isinstance(doc, dict):
        raise ScenarioError([Problem("scenario", "the body must be a JSON object (a scenario document)",
                                     "see examples/ for the format")])
    if "model" not in doc:
        raise ScenarioError([Problem("model", "no model given", "pass a scenario file or --model")])
    checked = {**doc, "model": check_model(doc["model"], hub=hub)}
    if "serve" in doc:
        checked["serve"] = _check_serve(doc["serve"], hub)
    return checked


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


class KvRequest(BaseModel):
    """The options of ``vramplan kv``, by their flag names; ``seq`` and ``batch`` are lists."""

    model_config = ConfigDict(extra="forbid")

    model: str | dict[str, Any]
    seq: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [512, 1024, 2048, 4096, 8192],
                                                   min_length=1, max_length=64)
    batch: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 8, 32], min_length=1, max_length=64)
    kv_cache_dtype: Literal["auto", "fp16", "bf16", "fp8", "int8"] = "auto"
    dtype: Literal["fp16", "bf16", "fp32"] = "bf16"
    tp: int = Field(1, ge=1)
    block_size: int = Field(16, ge=1)
    budget_gb: float | None = Field(None, gt=0)


def kv_document(q: KvRequest) -> dict[str, Any]:
    """The document of ``vramplan kv --json`` (cli/serve_cmd.py), from the same library calls."""
    from vramplan.analytic.kv_cache import kv_spec, page_capacity
    from vramplan.catalog.models import load_model
    from vramplan.units import GB, dtype_bits

    m = load_model(q.model, where="model")
    spec = kv_spec(m, q.kv_cache_dtype, dtype_bits(q.dtype) // 8, q.tp)
    payload: dict[str, Any] = {
        "model": m.name, "attention_kind": spec.attention_kind, "kv_cache_dtype": q.kv_cache_dtype,
        "elem_bytes": spec.elem_bytes, "tp": q.tp, "bytes_per_token": spec.bytes_per_token,
        "layer_bytes_per_token": spec.uniform_layer_bytes_per_token, "block_size": q.block_size,
        "block_bytes": spec.block_bytes(q.block_size), "layers": len(spec.layers),
        "sliding_layers": sum(1 for la in spec.layers if la.window),
        "growth": [{"seq_len": s, "batch": b, "kv_bytes": spec.sequence_bytes(s) * b} for s in q.seq for b in q.batch],
    }
    if m.mamba is not None:
        from vramplan.analytic.ssm_state import ssm_state_bytes

        payload["ssm_state_bytes_per_sequence"] = ssm_state_bytes(m, 1, dtype_bits(q.dtype) // 8)
    if q.budget_gb:
        cap = page_capacity(spec, int(q.budget_gb * GB), q.block_size, tuple(q.seq))
        payload["page_capacity"] = {"budget_bytes": cap.budget_bytes, "page_tokens": cap.page_tokens,
                                    "page_bytes": cap.page_bytes, "total_pages": cap.total_pages,
                                    "total_tokens": cap.total_tokens,
                                    "max_sequences": {str(k): v for k, v in cap.max_sequences.items()}}
    return payload
