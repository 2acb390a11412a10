"""The validation dataset: measured runs, each a scenario plus what was measured on it.

A dataset is a YAML or JSON file holding a list of entries (or a mapping with an
``entries`` list).  One entry::

    - id: fms-mistral7b-full-fp16-1xa100-bs4        # unique
      source: fms-acceleration                      # groups entries by publication
      citation: https://github.com/... (row 3)      # where the figure is printed
      quote: '... 72971724288.0 ...'                # the figure, verbatim
      scenario: {model: ..., task: train, ...}      # a vramplan scenario
      measured: {quantity: max_memory_allocated, bytes: 72971724288, as_published: '...'}
      outcome: fits                                 # fits | oom
      notes: settings not stated by the source, unit conversions

``measured.quantity`` names what was read on the GPU, so that the prediction of the
same quantity is compared with it:

========================  =============================================  ==================================
quantity                  what was read                                  compared with
========================  =============================================  ==================================
max_memory_allocated      ``torch.cuda.max_memory_allocated()``          ``per_gpu.peak_allocated_bytes``
max_memory_reserved       ``torch.cuda.max_memory_reserved()``           ``per_gpu.peak_reserved_bytes``
nvidia_smi                nvidia-smi / NVML used memory                  ``per_gpu.device_used_bytes``
kv_cache                  vLLM's KV-cache pool (``# GPU blocks``), or     ``serve.kv_cache_bytes``
                          llama.cpp's "CUDA0 KV buffer size"
weights_gpu               a serving engine's weights on the GPU          ``serve.weights_gpu_bytes``
                          (llama.cpp "CUDA0 model buffer size"; vLLM     (llama.cpp), else
                          "Model loading took", SGLang's weight load)    ``serve.weights_bytes``
compute_buffer            llama.cpp's "CUDA0 compute buffer size"        ``serve.compute_buffer_bytes``
peak_active               ``memory_stats()["active_bytes.all.peak"]``    ``per_gpu.peak_allocated_bytes``
allocated_plus_non_torch  max allocated + (nvidia-smi peak - max         ``peak_allocated_bytes +
                          reserved), as optimum's GPTQ benchmark         device_used_bytes - peak_reserved_bytes``
unknown                   not stated by the source                       nothing (fits/OOM only)
========================  =============================================  ==================================

Active bytes are the allocated blocks plus blocks freed but still awaiting a recorded
stream's work; with one stream they equal the allocated bytes, so ``peak_active`` is
compared with the allocated peak.  The spellings ``peak_allocated``, ``peak_reserved``
and ``device_used`` are accepted as synonyms.  For an ``oom`` entry ``bytes`` is the
device capacity, a lower bound on what the run needed, so it only checks the fits/OOM
verdict.  ``not_compared`` gives the reason when the figure cannot be compared with any
prediction although its quantity is known -- e.g. a run whose sequence lengths came from the
data (dynamic padding) so the scenario's ``seq_len`` is only a maximum; such an entry checks
the fits/OOM verdict only.  ``published_model`` names the model the source ran when the scenario names a
catalog model with the same architecture (a mirror, an instruction-tuned release, a
quantized re-upload).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vramplan.errors import Problem, ScenarioError, suggest

__all__ = [
    "QUANTITIES",
    "QUANTITY_ALIASES",
    "Dataset",
    "Entry",
    "Measured",
    "Quantity",
    "load_dataset",
    "parse_dataset",
]

Quantity = Literal[
    "max_memory_allocated", "max_memory_reserved", "nvidia_smi", "kv_cache", "peak_active",
    "allocated_plus_non_torch", "unknown", "weights_gpu", "compute_buffer",
]
QUANTITIES: tuple[str, ...] = (
    "max_memory_allocated", "max_memory_reserved", "nvidia_smi", "kv_cache", "peak_active",
    "allocated_plus_non_torch", "unknown", "weights_gpu", "compute_buffer",
)
QUANTITY_ALIASES: dict[str, str] = {
    "peak_allocated": "max_memory_allocated",
    "peak_allocated_bytes": "max_memory_allocated",
    "peak_reserved": "max_memory_reserved",
    "peak_reserved_bytes": "max_memory_reserved",
    "device_used": "nvidia_smi",
    "device_used_bytes": "nvidia_smi",
    "nvidia-smi": "nvidia_smi",
    "kv_cache_bytes": "kv_cache",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Measured(_Strict):
    """What was read on the GPU, converted to bytes, and the figure as printed."""

    quantity: Quantity
    bytes: int = Field(gt=0)
    as_published: str = ""

    @field_validator("quantity", mode="before")
    @classmethod
    def _alias(cls, v: Any) -> Any:
        if isinstance(v, str):
            key = v.strip().lower()
            return QUANTITY_ALIASES.get(key, key)
        return v

    @field_validator("as_published", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) else v


class Entry(_Strict):
    """One measured run."""

    id: str = Field(min_length=1)
    source: str = ""
    published_model: str = ""
    citation: str = ""
    quote: str = ""
    scenario: dict[str, Any]
    measured: Measured
    outcome: Literal["fits", "oom"]
    notes: str = ""
    not_compared: str = ""
    # the engine behaviours this entry motivated (docs/validation.md, "Motivated entries"); empty: none
    motivated: tuple[str, ...] = ()

    @property
    def compares_bytes(self) -> bool:
        """The measured bytes can be compared with a prediction (known quantity, fixed workload)."""
        return self.measured.quantity != "unknown" and not self.not_compared

    @property
    def group(self) -> str:
        """The publication this entry belongs to: ``source``, else the id up to its first dash."""
        return self.source or self.id.split("-", 1)[0]

    @property
    def task(self) -> str:
        """The scenario's task as written (``train`` when absent, the Scenario default)."""
        return str(self.scenario.get("task", "train"))

    @property
    def has_known_quantity(self) -> bool:
        return self.measured.quantity != "unknown"


class Dataset(_Strict):
    path: str = ""
    entries: tuple[Entry, ...]


def _where(index: int, entry_id: str | None, loc: tuple[int | str, ...]) -> str:
    head = f"entries[{index}]" + (f" ({entry_id})" if entry_id else "")
    tail = ".".join(str(x) for x in loc)
    return f"{head}.{tail}" if tail else head


def _problems(index: int, raw: Any, exc: ValidationError) -> list[Problem]:
    entry_id = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else None
    out: list[Problem] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _where(index, entry_id, loc)
        if err["type"] == "extra_forbidden":
            parent: type[BaseModel] = Measured if loc[:1] == ("measured",) else Entry
            close = suggest(str(loc[-1]), list(parent.model_fields))
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(parent.model_fields)}"
            out.append(Problem(where, "unknown key", hint))
        elif err["type"] == "literal_error" and loc[-1:] == ("quantity",):
            close = suggest(str(err.get("input")), [*QUANTITIES, *QUANTITY_ALIASES])
            hint = f"did you mean {close[0]!r}?" if close else f"choose one of {', '.join(QUANTITIES)}"
            out.append(Problem(where, f"{err.get('input')!r} is not a known quantity", hint))
        elif err["type"] == "missing":
            out.append(Problem(where, "missing", "every entry needs id, scenario, measured and outcome"))
        else:
            out.append(Problem(where, err["msg"].replace("Input should be", "must be"), ""))
    return out


def parse_dataset(data: Any, path: str = "") -> Dataset:
    """Validate a parsed dataset document; every problem is reported at once."""
    name = path or "dataset"
    if isinstance(data, dict) and "entries" in data:
        data = data["entries"]
    if not isinstance(data, list):
        raise ScenarioError([Problem(name, "must hold a list of entries (or a mapping with an 'entries' list)",
                                     "see validation/published.yaml for the format")])
    if not data:
        raise ScenarioError([Problem(name, "holds no entries", "add at least one measured run")])
    problems: list[Problem] = []
    entries: list[Entry] = []
    for i, raw in enumerate(data):
        if not isinstance(raw, dict):
            problems.append(Problem(f"entries[{i}]", "must be a mapping with id, scenario, measured, outcome", ""))
            continue
        try:
            entries.append(Entry.model_validate(raw))
        except ValidationError as exc:
            problems.extend(_problems(i, raw, exc))
    seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.id in seen:
            problems.append(Problem(f"entries ({e.id})", "duplicate id", "give every entry its own id"))
        seen[e.id] = i
    if problems:
        raise ScenarioError(problems)
    return Dataset(path=path, entries=tuple(entries))


def load_dataset(path: str | Path) -> Dataset:
    """Read a dataset file (.yaml, .yml or .json); bad files raise ScenarioError with every problem."""
    p = Path(path)
    if not p.exists():
        raise ScenarioError([Problem("DATASET", f"no such file: {p}",
                                     "give the path of a dataset file such as validation/published.yaml")])
    if p.is_dir():
        raise ScenarioError([Problem("DATASET", f"{p} is a folder", "give the path of a .yaml or .json file")])
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError([Problem("DATASET", f"cannot read {p}: {exc}", "")]) from None
    try:
        data = yaml.safe_load(text)  # YAML is a superset of JSON
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # deep nesting, a 5,000-digit integer
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ScenarioError([Problem("DATASET", f"{p} is not valid YAML/JSON: {first}", "fix the syntax")]) from None
    return parse_dataset(data, str(p))
