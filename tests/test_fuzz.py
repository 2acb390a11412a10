"""Property-based fuzzing of every input path (issue 19): scenario documents built from the schema's own
leaves, hostile config.json fields, and command lines.

The properties: the Python API returns a report or raises ``VramplanError`` (never another exception);
a command exits 0, 1 or 2 without a traceback; every call ends within ``CALL_SECONDS``.  The budget is
fixed (``derandomize=True``: the same cases on every run, so CI is reproducible; a case count per test:
300 + 250 + 250 + 100 = 900) and keeps the module at about 30 s of CPU time.  Each test prints how many
cases it ran (``pytest -s``).  The bound per call is SIGALRM's, so a hang fails the case instead of
stopping the run.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import vramplan
from vramplan.catalog.models import list_models
from vramplan.cli.common import set_path
from vramplan.cli.flags import scenario_flags
from vramplan.cli.main import app
from vramplan.errors import VramplanError

CALL_SECONDS = 20.0  # one estimate is milliseconds; the bound catches a hang, with room for a loaded machine
API_CASES = 300
CONFIG_CASES = 250
CLI_CASES = 250
def _fuzz(cases: int) -> settings:
    return settings(max_examples=cases, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MODELS = ["gpt2", "llama-3-8b", "mixtral-8x7b", "qwen2.5-7b", "llama-3-70b", "nope-model"]
GPUS = ["A100", "H100", "T4", "V100-16GB", "RTX-4090", "MI300X", "L4", "nope-gpu"]

# hostile values of every kind: huge and negative integers, NaN and infinities, odd text, wrong types
HOSTILE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 10**19, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0]),
    st.text(max_size=12), st.none(), st.booleans(), st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
LEAVES = scenario_flags([""])


def _leaf_value(choices: tuple[str, ...]) -> st.SearchStrategy[Any]:
    small = st.integers(min_value=1, max_value=64)
    return st.one_of(st.sampled_from(choices), HOSTILE) if choices else st.one_of(small, small, HOSTILE)


@st.composite
def scenario_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A scenario mapping: a real model and GPU most of the time, then a few leaves of the schema set to a
    valid choice, a small count, or a hostile value."""
    doc: dict[str, Any] = {"model": draw(st.one_of(st.sampled_from(MODELS), HOSTILE)),
                           "hardware": {"gpu": draw(st.one_of(st.sampled_from(GPUS), HOSTILE))}}
    for flag in draw(st.lists(st.sampled_from(LEAVES), max_size=5)):
        if flag.name in ("model", "gpu"):
            continue
        path = flag.paths[draw(st.integers(0, len(flag.paths) - 1))]
        try:
            set_path(doc, path, draw(_leaf_value(flag.choices)))
        except (AttributeError, TypeError):  # a hostile value already sits where a section goes
            pass
    if draw(st.booleans()):
        doc["task"] = draw(st.one_of(st.sampled_from(["train", "inference", "serve"]), HOSTILE))
    return doc


class CallTimeout(BaseException):
    """Raised in the middle of a call that ran past ``CALL_SECONDS``: a BaseException, so that neither the
    library's ``except Exception`` nor the CLI runner's catches it, and a hang fails the test instead of
    stopping the run."""


def _expire(_signum: int, _frame: object) -> None:
    raise CallTimeout(f"a call ran past {CALL_SECONDS:.0f} s")


def _timed(fn: Callable[[], Any]) -> Any:
    """``fn()`` under a wall-clock bound: SIGALRM interrupts it where the platform has it (POSIX, main thread);
    elsewhere the time is checked after the call."""
    alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if alarm:
        previous = signal.signal(signal.SIGALRM, _expire)
        signal.setitimer(signal.ITIMER_REAL, CALL_SECONDS)
    start = time.perf_counter()
    try:
        result = fn()
    except CallTimeout as exc:  # an assertion from here on, so that hypothesis reports and shrinks the case
        raise AssertionError(str(exc)) from None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    elapsed = time.perf_counter() - start
    assert elapsed < CALL_SECONDS, f"a call took {elapsed:.1f} s"
    return result


def _api(doc: Any) -> None:
    try:
        report = _timed(lambda: vramplan.estimate(doc))
    except VramplanError:
        return
    assert report.per_gpu.device_used_bytes >= 0
    assert sum(report.per_gpu.breakdown.values()) == report.per_gpu.peak_allocated_bytes


def test_fuzz_api_scenarios() -> None:
    ran: list[int] = []

    @_fuzz(API_CASES)
    @given(doc=scenario_docs())
    def check(doc: dict[str, Any]) -> None:
        ran.append(1)
        _api(doc)

    check()
    print(f"\nfuzz: {len(ran)} scenario documents through vramplan.estimate")
    assert len(ran) >= API_CASES // 2


CONFIG = next(m for m in list_models("smollm2-135m")).config
CONFIG_KEYS = sorted(k for k, v in CONFIG.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool))


def test_fuzz_config_json_fields() -> None:
    ran: list[int] = []

    @_fuzz(CONFIG_CASES)
    @given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), HOSTILE, min_size=1, max_size=3),
           task=st.sampled_from(["train", "inference", "serve"]))
    def check(changes: dict[str, Any], task: str) -> None:
        ran.append(1)
        _api({"model": {**CONFIG, **changes}, "task": task, "hardware": {"gpu": "A100"}})

    check()
    print(f"\nfuzz: {len(ran)} config.json variants through vramplan.estimate")
    assert len(ran) >= CONFIG_CASES // 2


runner = CliRunner()
ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
TEXT = st.one_of(st.sampled_from(["0", "-5", "nan", "inf", "1e30", "9" * 30, "", "abc", "1-100000", "2,4",
                                  "/dev/zero", "/nonexistent/x.png", "out.xyz", "3"]),
                 # just past the schema's bounds (65,536 ranks, 100,000,000 tokens, 64 bits) and far past them
                 st.sampled_from(["65537", "100000001", "9223372036854775808", "99999999999", "-0", "1e-300"]),
                 st.integers(-10, 10**6).map(str), st.integers(10**6, 10**13).map(str),
                 st.text(alphabet="abc019-.,", max_size=8))
COMMANDS: dict[str, list[str]] = {
    "estimate": ["--model", "--gpu", "--micro-batch-size", "--seq-len", "--num-gpus", "--tp", "--ep", "--zero-stage",
                 "--precision", "--lora-alpha", "--peft", "--task", "--capacity-gib", "--engine"],
    "serve": ["--model", "--gpu", "--tp", "--block-size", "--max-model-len", "--gpu-memory-utilization", "--dtype"],
    "generate": ["--model", "--gpu", "--batch-size", "--prompt-len", "--new-tokens", "--quantization"],
    "kv": ["--seq", "--batch", "--tp", "--block-size", "--budget-gb", "--kv-cache-dtype", "--plot"],
    "simulate": ["--capacity-tokens", "--requests", "--rate", "--block-size", "--max-num-seqs", "--workload",
                 "--plot", "--mode", "--max-num-batched-tokens", "--shared-prefix", "--max-model-len", "--csv"],
    "plan": ["--model", "--gpu", "--num-gpus", "--seq-len", "--global-batch", "--top", "--margin", "--mfu",
             "--lora-rank", "--lora-alpha", "--gpus-per-node", "--peft", "--task", "--max-model-len"],
    "solve": ["--model", "--gpu", "--micro-batch-size", "--margin", "--num-gpus"],
    "compare": ["--model", "--gpu", "--setup", "--setup", "--engine"],
}
# values that keep a run short (a plan over few GPU counts, a small simulation) appear often
SHORT = {"--requests": st.integers(1, 300).map(str), "--num-gpus": st.sampled_from(["1", "2", "8", "1-4", "0"]),
         "--seq": st.sampled_from(["512", "1024,2048", "0", "x"]), "--setup": st.sampled_from(
             ["micro-batch-size=2", "seq-len=nan", "tp=3", "x", "zero-stage=3 num-gpus=2"])}


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    args = [cmd]
    if cmd == "kv":
        args.append(draw(st.sampled_from(MODELS)))
    if cmd == "solve":
        args.append(draw(st.sampled_from(["max-batch", "max-seq", "min-gpus", "max-x"])))
    if cmd in ("estimate", "serve", "generate", "plan", "solve", "compare"):
        args += ["--model", draw(st.sampled_from(MODELS)), "--gpu", draw(st.sampled_from(GPUS))]
    if cmd == "simulate":
        args += ["--capacity-tokens", "20000", "--requests", "50"]
    if cmd == "plan":
        args += ["--seq-len", "1024", "--global-batch", "8", "--num-gpus", "1"]
    for opt in draw(st.lists(st.sampled_from(COMMANDS[cmd]), max_size=4)):
        args += [opt, draw(SHORT.get(opt, TEXT))]
    return args


def test_fuzz_command_lines() -> None:
    ran: list[int] = []

    @_fuzz(CLI_CASES)
    @given(args=command_lines())
    def check(args: list[str]) -> None:
        ran.append(1)
        res = _timed(lambda: runner.invoke(app, args, env=ENV))
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
        assert res.exit_code in (0, 1, 2), (args, res.exit_code, res.stderr[-500:])
        assert "Traceback" not in res.stderr, (args, res.stderr[-2000:])

    check()
    print(f"\nfuzz: {len(ran)} command lines through the CLI")
    assert len(ran) >= CLI_CASES // 2


PLAN_CASES = 100
# a numeric option's hostile values: zero, negative, just past a schema bound (65,536 ranks, 100,000,000
# tokens, 1,024 GPUs per node), past 64 bits, not finite, not a number
NUMBERS = st.sampled_from(["0", "-1", "65537", "100000001", "1025", "99999999999", "9223372036854775808", "9" * 30,
                           "nan", "inf", "-inf", "1e30", "abc", ""])
PLAN_OPTIONS = {"train": ("--seq-len", "--global-batch", "--lora-rank", "--lora-alpha", "--gpus-per-node", "--top",
                          "--margin"),
                "serve": ("--max-model-len", "--gpus-per-node", "--top", "--margin")}  # a task's own options


@st.composite
def plan_lines(draw: st.DrawFn) -> list[str]:
    """A plan that reaches the search: a real model and GPU, one GPU count, the PEFT policy and task drawn, every
    option of the job valid but one, drawn from hostile values (the command lines above rarely get this far: most
    stop at a bad model, GPU or missing size)."""
    task = draw(st.sampled_from(["train", "serve"]))
    args = ["plan", "--model", "gpt2", "--gpu", draw(st.sampled_from(["A100", "T4"])), "--num-gpus", "1",
            "--task", task]
    if task == "train":
        args += ["--peft", draw(st.sampled_from(["none", "lora", "qlora"]))]
    valid = {"--seq-len": "128", "--global-batch": "4", "--lora-rank": "8", "--lora-alpha": "16", "--gpus-per-node": "8",
             "--max-model-len": "512", "--top": "3", "--margin": "0.1"}
    hostile = draw(st.sampled_from(PLAN_OPTIONS[task]))  # one bad value at a time: the others do not stop it first
    for opt in PLAN_OPTIONS[task]:
        args += [opt, draw(st.one_of(NUMBERS, TEXT)) if opt == hostile else valid[opt]]
    return args


def test_fuzz_plan_options() -> None:
    ran: list[int] = []

    @_fuzz(PLAN_CASES)
    @given(args=plan_lines())
    def check(args: list[str]) -> None:
        ran.append(1)
        res = _timed(lambda: runner.invoke(app, args, env=ENV))
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
        assert res.exit_code in (0, 1, 2), (args, res.exit_code, res.stderr[-500:])

    check()
    print(f"\nfuzz: {len(ran)} plan command lines through the search")
    assert len(ran) >= PLAN_CASES // 2


def test_the_time_bound_interrupts_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is a real one: a call that would sleep for a minute is stopped after half a second."""
    if not hasattr(signal, "setitimer"):
        pytest.skip("no SIGALRM on this platform: the bound is checked after each call")
    monkeypatch.setattr(sys.modules[__name__], "CALL_SECONDS", 0.5)
    start = time.perf_counter()
    with pytest.raises(AssertionError, match="a call ran past 0 s"):
        _timed(lambda: time.sleep(60))
    assert time.perf_counter() - start < 5
