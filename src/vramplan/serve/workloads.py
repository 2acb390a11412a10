"""Request streams for the simulator: bundled length distributions, CSV traces, arrivals.

The bundled workloads (``serve/data/workloads.json``) carry the published mean prompt and
output lengths of common chat and summarisation datasets with their sources; lengths are
drawn from a log-normal with that mean and a coefficient of variation (std / mean).  For a
log-normal with mean mu and CV v: sigma^2 = ln(1 + v^2), and the log-mean is
ln(mu) - sigma^2 / 2.

A user trace is a CSV with one request per row: a prompt-length column (``prompt_tokens``,
``prompt_len``, ``prompt``, ``input_tokens``, ``input_len`` or ``input``), an
output-length column (``output_tokens``, ``output_len``, ``output``,
``completion_tokens``) and optionally ``arrival`` (the engine step it arrives at).

Arrivals: all at step 0 (``rate=None``, the saturated case the PagedAttention paper's
memory figures describe) or a Poisson process of ``rate`` requests per engine step.
Everything is drawn from ``random.Random(seed)``, so a seed fixes the stream.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from vramplan.errors import Problem, ScenarioError, UnknownNameError

__all__ = ["Trace", "Workload", "load_csv", "synthesize", "workload", "workload_names"]

PROMPT_COLUMNS = ("prompt_tokens", "prompt_len", "prompt", "input_tokens", "input_len", "input")
OUTPUT_COLUMNS = ("output_tokens", "output_len", "output", "completion_tokens")
# a row's bounds: a length within the largest --max-model-len a simulation takes (cli/serve_cmd.py), an arrival
# step far past any trace yet well inside the scheduler's 2**62 quiet-step horizon (serve/simulate.py)
MAX_CSV_TOKENS = 100_000_000
MAX_CSV_ARRIVAL = 10**12


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_mean: float
    output_mean: float
    prompt_cv: float
    output_cv: float
    unit: str
    source: str
    spread_source: str


@dataclass(frozen=True)
class Trace:
    """Requests as three integer sequences of equal length: arrival step, prompt, output tokens."""

    name: str
    arrival: tuple[int, ...]
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    source: str = ""

    def __len__(self) -> int:
        return len(self.prompt)

    @property
    def mean_prompt(self) -> float:
        return sum(self.prompt) / len(self.prompt) if self.prompt else 0.0

    @property
    def mean_output(self) -> float:
        return sum(self.output) / len(self.output) if self.output else 0.0

    @classmethod
    def of(cls, arrival: list[int], prompt: list[int], output: list[int], name: str = "trace") -> Trace:
        return cls(name, tuple(int(a) for a in arrival), tuple(int(p) for p in prompt), tuple(int(o) for o in output))


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    text = resources.files("vramplan.serve").joinpath("data/workloads.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)["workloads"]
    return data


def workload_names() -> list[str]:
    return sorted(_table())


def workload(name: str) -> Workload:
    table = _table()
    if name not in table:
        raise UnknownNameError("workload", name, list(table), "--workload")
    row = table[name]
    return Workload(name, float(row["prompt_mean"]), float(row["output_mean"]), float(row["prompt_cv"]),
                    float(row["output_cv"]), str(row["unit"]), str(row["source"]), str(row["spread_source"]))


def _lognormal(rng: random.Random, mean: float, cv: float, n: int) -> tuple[int, ...]:
    sigma2 = math.log1p(cv * cv)
    mu = math.log(mean) - sigma2 / 2
    sigma = math.sqrt(sigma2)
    draw = rng.lognormvariate
    return tuple(max(1, round(draw(mu, sigma))) for _ in range(n))


def _arrivals(rng: random.Random, n: int, rate: float | None) -> tuple[int, ...]:
    if rate is None or math.isinf(rate):
        return (0,) * n
    if rate <= 0:
        raise ScenarioError([Problem("--rate", f"rate must be > 0 requests per step, got {rate}",
                                     "give a positive rate, or omit it for all requests at step 0")])
    out: list[int] = []
    clock = 0.0
    for _ in range(n):
        clock += rng.expovariate(rate)
        out.append(math.floor(clock))
    return tuple(out)


def synthesize(name: str, n: int, seed: int = 0, rate: float | None = None) -> Trace:
    """``n`` requests drawn from the bundled workload ``name``; deterministic for a seed."""
    if n < 1:
        raise ScenarioError([Problem("--requests", f"need at least one request, got {n}", "use --requests >= 1")])
    w = workload(name)
    rng = random.Random(seed)
    prompt = _lognormal(rng, w.prompt_mean, w.prompt_cv, n)
    output = _lognormal(rng, w.output_mean, w.output_cv, n)
    return Trace(name, _arrivals(rng, n, rate), prompt, output, w.source)


def load_csv(path: str | Path, rate: float | None = None, seed: int = 0) -> Trace:
    """A user's trace of prompt and output lengths (and optionally arrival steps)."""
    p = Path(path)
    if not p.exists():
        raise ScenarioError([Problem("--csv", f"no such file: {p}", "give a CSV with prompt and output lengths")])
    if p.is_dir():
        raise ScenarioError([Problem("--csv", f"{p} is a folder", "give the path of a CSV file")])
    try:
        return _read_csv(p, rate, seed)
    except UnicodeDecodeError as exc:
        raise ScenarioError([Problem("--csv", f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                                     "give a CSV text file")]) from None


def _read_csv(p: Path, rate: float | None, seed: int) -> Trace:
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields = [f.strip().lower() for f in (reader.fieldnames or [])]
        pcol = next((c for c in PROMPT_COLUMNS if c in fields), None)
        ocol = next((c for c in OUTPUT_COLUMNS if c in fields), None)
        if pcol is None or ocol is None:
            raise ScenarioError([Problem(
                "--csv", f"{p} has columns {fields or 'none'}; a prompt-length and an output-length column are needed",
                f"name them e.g. prompt_tokens and output_tokens (accepted: {', '.join(PROMPT_COLUMNS)}; "
                f"{', '.join(OUTPUT_COLUMNS)})")])
        prompts: list[int] = []
        outputs: list[int] = []
        arrivals: list[int] = []
        has_arrival = "arrival" in fields
        for i, raw in enumerate(reader, start=2):
            row = {k.strip().lower(): (v or "").strip() for k, v in raw.items() if k}
            try:
                pr, out = int(float(row[pcol])), int(float(row[ocol]))
                arr = int(float(row["arrival"])) if has_arrival else 0
            except (ValueError, KeyError, OverflowError):  # OverflowError: int(float("inf"))
                raise ScenarioError([Problem("--csv", f"{p} line {i}: lengths must be finite numbers, got {row}",
                                             "fix or remove that row")]) from None
            if not (1 <= pr <= MAX_CSV_TOKENS and 1 <= out <= MAX_CSV_TOKENS and 0 <= arr <= MAX_CSV_ARRIVAL):
                raise ScenarioError([Problem(
                    "--csv", f"{p} line {i}: prompt and output must be in [1, {MAX_CSV_TOKENS:,}] and arrival in "
                    f"[0, {MAX_CSV_ARRIVAL:,}]", "fix or remove that row")])
            prompts.append(pr)
            outputs.append(out)
            arrivals.append(arr)
    if not prompts:
        raise ScenarioError([Problem("--csv", f"{p} has no requests", "add one row per request")])
    arrival = list(arrivals) if has_arrival else list(_arrivals(random.Random(seed), len(prompts), rate))
    order = sorted(range(len(prompts)), key=lambda i: arrival[i])  # stable
    return Trace(p.stem, tuple(arrival[i] for i in order), tuple(prompts[i] for i in order),
                 tuple(outputs[i] for i in order), str(p))
