"""`vramplan plan` (the fastest setup that fits, explained, exported) and `vramplan solve`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from vramplan.cli.common import progress
from vramplan.cli.flags import Given, scenario_flags, scenario_options

if TYPE_CHECKING:
    from vramplan.errors import Problem
    from vramplan.plan.result import PlanResult, SolveResult

Opt = typer.Option

# The planner's inputs that are scenario fields; its own (a GPU-count range, the PEFT policy, the
# global batch, the search limits) are written by hand below.
PLAN_FLAGS = scenario_flags(
    ["model", "hardware.gpu", "hardware.gpus_per_node", "train.seq_len", "train.peft.rank", "train.peft.alpha",
     "serve.max_model_len", "train.optimizer", "software.torchtitan"],
    notes={"train.peft.rank": "The planner's default: 16.", "train.peft.alpha": "The planner's default: 32.",
           "serve.max_model_len": "Required with --task serve.",
           "train.optimizer": "The planner's default: its own rows (AdamW fused, bitsandbytes 8-bit and paged "
                              "AdamW); a name searches only that optimizer.",
           "software.torchtitan": "torchtitan setups are estimated for it and torchtitan.toml is written in its "
                                  "layout (unset: the newest read)."})
PEFT_CHOICES = ("none", "allow", "only", "lora", "qlora")
# solve takes a whole scenario, so every scenario field is an option, as for estimate
SOLVE_FLAGS = scenario_flags([""])


def _flag_problems(given: Given) -> list[Problem]:
    """The planner's scenario-field options checked by the scenario schema itself (spec.load.parse_scenario), so
    that they meet the bounds they meet in `estimate` (issue 19: `--seq-len 10**12` and `--lora-alpha inf` raised
    pydantic's error from inside the search; `--lora-rank 0` and `--gpus-per-node 0` fell back to defaults).  A
    scenario file's values were checked when it was read."""
    from vramplan.cli.common import set_path
    from vramplan.errors import ScenarioError
    from vramplan.spec.load import parse_scenario

    doc: dict[str, Any] = {"model": "unchecked here"}  # the model is resolved, with its own messages, by the plan
    for f in given.flags:
        if f.name != "model" and given[f.name] is not None:
            set_path(doc, f.paths[0], given[f.name])
    try:
        parse_scenario(doc)
    except ScenarioError as exc:
        return list(exc.problems)
    return []


def _titan_release_problems(release: str) -> list[Problem]:
    """A torchtitan release the export has no job-config layout for, refused before the search."""
    from vramplan.errors import Problem
    from vramplan.facts.torchtitan_releases import torchtitan_release

    try:
        torchtitan_release(release)
    except ValueError as exc:
        return [Problem("--torchtitan-version", str(exc), "name one of them, or leave it out for the newest")]
    return []


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"


def _from_scenario(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Planning inputs taken from a scenario file (plan/scenario_inputs.py: each field carried, replaced with a
    note, or refused) and the notes."""
    from vramplan.plan.scenario_inputs import plan_inputs
    from vramplan.spec.load import parse_scenario, read_document

    got = plan_inputs(parse_scenario(read_document(path)))
    return got.values, got.notes


# The most GPU counts one plan searches: each count is a full search (issue 19: 1-100000 ran for minutes with
# no output); a list such as 8,16,32,64 or a range of up to this many counts covers a real choice.
MAX_PLAN_COUNTS = 64


def _count_problems(value: Any) -> list[Any]:
    """A GPU count, range or list naming more than ``MAX_PLAN_COUNTS`` counts, refused before the search."""
    from vramplan.errors import Problem

    total = 0
    for part in str(value or "1").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.strip().isdigit() and hi.strip().isdigit():
            total += max(0, int(hi) - int(lo) + 1)
        else:
            total += 1
    if total > MAX_PLAN_COUNTS:
        return [Problem("--num-gpus", f"{value!r} names {total:,} GPU counts; a plan searches at most "
                        f"{MAX_PLAN_COUNTS}", "give a shorter range or a list, e.g. 8,16,32,64")]
    return []


def _plan_bounds(margin: float, top: int, mfu: float, gbps: float, host: float | None, mmb: int,
                 gb: int | None, gbt: int | None, conc: int | None) -> list[Any]:
    """The planner's own numbers, bounded the way every command bounds them (spec.checks.number_problems)."""
    from vramplan.spec.checks import number_problems

    return [*number_problems("--margin", margin, 0, 0.9), *number_problems("--top", top, 1, 100),
            *number_problems("--mfu", mfu, 0, 1, low_open=True),
            *number_problems("--inter-node-gbps", gbps, 0, 1e6, low_open=True),
            *number_problems("--host-memory-gib", host, 0, 1e6, low_open=True),
            *number_problems("--max-micro-batch", mmb, 1, 4096),
            *number_problems("--global-batch", gb, 1, 100_000_000),
            *number_problems("--global-batch-tokens", gbt, 1, 10**15),
            *number_problems("--concurrency", conc, 1, 1_000_000)]


def render_plan(res: PlanResult, console: Console) -> None:
    from rich.table import Table

    c = res.chosen
    counts = ",".join(map(str, res.num_gpus))
    limit = (f"usable {_gib(res.usable_bytes)} of {_gib(res.capacity_bytes)} GiB per GPU" if res.task == "train"
             else f"vLLM gpu_memory_utilization {1 - res.margin:.2f} of {_gib(res.capacity_bytes)} GiB")
    console.print(f"[bold]{res.model}[/] · {res.task} · {counts} x {res.gpu} · margin {res.margin:.0%} ({limit})")
    verdict = "[bold green]FITS[/]" if c is not None else "[bold red]NOTHING FITS[/]"
    console.print(verdict)
    for line in res.explanation:
        console.print(line, highlight=False)
    ranked = ([c] if c else []) + res.runners_up
    if ranked:
        t = Table(title="Ranked setups (fastest first)", title_justify="left")
        for col in ("#", "setup", "GPUs", "step s" if res.task == "train" else "step ms",
                    "tokens/s", "GiB/GPU", "headroom", "trades"):
            t.add_column(col, justify="right" if col in ("#", "GPUs", "step s", "step ms", "tokens/s", "GiB/GPU",
                                                          "headroom") else "left", overflow="fold")
        for r in ranked:
            step = f"{r.step_time_s:,.2f}" if res.task == "train" else f"{r.step_time_s * 1e3:,.1f}"
            t.add_row(str(r.rank), r.label, str(r.setup["num_gpus"]), step, f"{r.tokens_per_s:,.0f}",
                      _gib(r.device_used_bytes), _gib(r.headroom_bytes), r.trade or "chosen")
        console.print(t)
    if c is not None:
        mem = Table(title="Chosen: memory per GPU at the peak", title_justify="left")
        mem.add_column("part")
        mem.add_column("GiB", justify="right")
        pg = c.report.per_gpu
        for k, v in pg.breakdown.items():
            if v:
                mem.add_row(k, _gib(v))
        for k, v in pg.outside_allocator.items():
            if v:
                mem.add_row(f"+ {k.replace('_', ' ')}", _gib(v))
        mem.add_row("[bold]device used[/]", f"[bold]{_gib(pg.device_used_bytes)}[/]")
        console.print(mem)
        tt = Table(title="Chosen: predicted time per " + ("step" if res.task == "train" else "decode step"),
                   title_justify="left")
        tt.add_column("term")
        tt.add_column("s", justify="right")
        for term, secs in c.step_time.items():
            if secs and term not in ("total_s", "tokens_per_s", "communication_s"):
                tt.add_row(term.removesuffix("_s").replace("_", " "), f"{secs:,.3f}")
        tt.add_row("[bold]total[/]", f"[bold]{c.step_time_s:,.3f}[/]")
        console.print(tt)
    if res.ladder:
        title = ("Decision tree, cheapest rung first (micro-batch 1)" if res.task == "train"
                 else "Tensor-parallel degrees (bf16 weights, no quantization)")
        lt = Table(title=title, title_justify="left")
        for col in ("#", "rung", "GiB/GPU", "over by", "verdict"):
            lt.add_column(col, justify="right" if col in ("#", "GiB/GPU", "over by") else "left", overflow="fold")
        for rung in res.ladder:
            if res.task == "train":
                verdict = "[green]fits[/]" if rung.fits else ", ".join(f"{p} {_gib(b)}" for p, b in rung.largest_parts)
            else:
                verdict = ("[green]fits[/]: " if rung.fits else "") + rung.why
            lt.add_row(str(rung.step), rung.title, _gib(rung.device_used_bytes),
                       _gib(rung.over_bytes) if rung.over_bytes else "-", verdict)
        console.print(lt)
    for s in res.suggestions:
        console.print(f"[yellow]would fit:[/] {s.text}", highlight=False)
    if len(res.by_gpu_count) > 1:
        bt = Table(title="Best per GPU count", title_justify="left")
        for col in ("GPUs", "best setup", "tokens/s"):
            bt.add_column(col)
        for b in res.by_gpu_count:
            bt.add_row(str(b.num_gpus), b.label if b.fits else "[red]nothing fits[/]",
                       f"{b.tokens_per_s:,.0f}" if b.fits else "-")
        console.print(bt)
    for n in res.notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    st = res.stats
    console.print(f"[dim]searched {st.candidates:,} candidates in {st.seconds * 1e3:,.0f} ms: "
                  f"{st.estimated:,} estimated, {st.bound_rejected:,} rejected by the memory bound, "
                  f"{st.pruned:,} pruned (slower than the answer)[/]")
    console.print("[dim]Assumptions:[/]")
    for a in res.assumptions:
        console.print(f"[dim]  - {a}[/]", highlight=False)


def render_solve(res: SolveResult, console: Console) -> None:
    if res.value is None:
        console.print(f"[bold red]{res.kind}: nothing fits[/] ({res.note})", highlight=False)
        return
    console.print(f"[bold]{res.kind}[/]: {res.knob} = [bold]{res.value:,}[/]  ({res.note})", highlight=False)
    if res.report is not None:
        pg = res.report.per_gpu
        limit = ("capacity, margin in gpu_memory_utilization" if res.report.scenario.get("task") == "serve"
                 else f"usable, margin {res.margin:.0%}")
        console.print(f"at that value: {_gib(pg.device_used_bytes)} of {_gib(res.usable_bytes)} GiB per GPU ({limit}); "
                      f"{res.probes} estimates", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``solve`` to the top-level app."""

    @app.command()
    @scenario_options(PLAN_FLAGS)
    def plan(
        scenario: Annotated[Path | None, typer.Argument(
            help="optional scenario file: model, GPU, count and job size are taken from it")] = None,
        num_gpus: Annotated[str | None, Opt(help="GPU count, range (1-8) or list (2,4,8)")] = None,
        task: Annotated[str | None, Opt(help="train | serve")] = None,
        global_batch: Annotated[int | None, Opt(help="train: sequences per optimizer step")] = None,
        global_batch_tokens: Annotated[int | None, Opt(help="train: tokens per optimizer step")] = None,
        peft: Annotated[str | None, Opt(help="none (full fine-tuning) | allow | only | lora | qlora")] = None,
        allow_pure_bf16: Annotated[bool, Opt(help="also search bf16-true (no fp32 master weights)")] = False,
        max_micro_batch: Annotated[int, Opt(help="largest micro-batch to try")] = 64,
        concurrency: Annotated[int | None, Opt(help="serve: sequences of max_model_len running at once")] = None,
        allow_quantization: Annotated[bool, Opt(help="serve: also try fp8/AWQ weights and an fp8 KV cache")] = False,
        margin: Annotated[float, Opt(help="fraction of GPU capacity kept free")] = 0.10,
        top: Annotated[int, Opt(help="setups to rank")] = 5,
        mfu: Annotated[float, Opt(help="fraction of dense peak FLOP/s the matmuls reach")] = 0.40,
        inter_node_gbps: Annotated[float, Opt(help="inter-node bandwidth per GPU, GB/s")] = 25.0,
        host_memory_gib: Annotated[float | None, Opt(help="host RAM per node for offload (checked if given)")] = None,
        export: Annotated[Path | None, Opt(help="write the chosen setup's config files to this directory")] = None,
        as_json: Annotated[bool, Opt("--json", help="print the plan as JSON")] = False,
        *,
        given: Given,
    ) -> None:
        """The fastest setup that fits, why cheaper ones do not, and its config files."""
        from vramplan.cli.common import fail as _fail
        out = Console(soft_wrap=False)
        from vramplan.errors import Problem, ScenarioError, VramplanError, suggest
        from vramplan.plan import ServeJob, TrainJob
        from vramplan.plan import plan as run_plan
        from vramplan.plan.steptime import PerfAssumptions

        try:
            base, file_notes = _from_scenario(scenario) if scenario is not None else ({}, [])
            flags = {**given.values, "num_gpus": num_gpus, "task": task, "global_batch": global_batch, "peft": peft,
                     "concurrency": concurrency}
            opts = {**base, **{k: v for k, v in flags.items() if v is not None}}
            if global_batch_tokens is not None and global_batch is None:
                opts.pop("global_batch", None)  # the tokens flag replaces a batch read from the scenario file
            problems = []
            if not opts.get("model"):
                problems.append(Problem("--model", "no model given", "pass --model or a scenario file"))
            if not opts.get("gpu"):
                problems.append(Problem("--gpu", "no GPU given", "pass --gpu (see `vramplan gpus`)"))
            t = opts.get("task", "train")
            if t not in ("train", "serve"):
                close = suggest(str(t), ["train", "serve"])
                problems.append(Problem("--task", f"{t!r} cannot be planned",
                                        f"did you mean {close[0]!r}?" if close else "use train or serve"))
            p = opts.get("peft", "none")
            if p not in PEFT_CHOICES:
                close = suggest(str(p), PEFT_CHOICES)
                problems.append(Problem("--peft", f"{p!r} is not a PEFT policy",
                                        f"did you mean {close[0]!r}?" if close else f"use one of {PEFT_CHOICES}"))
            if t == "train" and opts.get("seq_len") is None:
                problems.append(Problem("--seq-len", "no sequence length given", "pass --seq-len TOKENS"))
            if t == "serve" and opts.get("max_model_len") is None:
                problems.append(Problem("--max-model-len", "no max_model_len given", "pass --max-model-len TOKENS"))
            problems += _flag_problems(given)
            if export is not None and opts.get("torchtitan_version") is not None:
                problems += _titan_release_problems(str(opts["torchtitan_version"]))
            problems += _plan_bounds(margin, top, mfu, inter_node_gbps, host_memory_gib, max_micro_batch,
                                     global_batch, global_batch_tokens, concurrency)
            problems += _count_problems(opts.get("num_gpus"))
            if problems:
                raise ScenarioError(problems)
            job: TrainJob | ServeJob
            if t == "train":
                job = TrainJob(seq_len=int(opts["seq_len"]), global_batch=opts.get("global_batch"),
                               global_batch_tokens=global_batch_tokens, peft=p,
                               lora_rank=int(opts.get("lora_rank") or 16), lora_alpha=float(opts.get("lora_alpha") or 32),
                               allow_pure_bf16=allow_pure_bf16, max_micro_batch=max_micro_batch,
                               optimizer=opts.get("optimizer"), torchtitan=opts.get("torchtitan_version"))
            else:
                job = ServeJob(max_model_len=int(opts["max_model_len"]), concurrency=int(opts.get("concurrency") or 1),
                               allow_quantization=allow_quantization)
            assumptions = PerfAssumptions(mfu=mfu, inter_node_bytes_per_s=inter_node_gbps * 1e9)
            with progress("searching setups", quiet=as_json):
                res = run_plan(opts["model"], str(opts["gpu"]), opts.get("num_gpus") or "1", job, margin=margin,
                               top=top, assumptions=assumptions, gpus_per_node=int(opts.get("gpus_per_node") or 8),
                               host_memory_gib=host_memory_gib, preface_notes=file_notes,
                               offline=bool(opts.get("offline")))
            written: list[Path] = []
            if export is not None:
                from vramplan.export import write_export

                written = write_export(res, export)
        except VramplanError as exc:
            _fail(exc, given)
            return
        if as_json:
            doc = res.to_json_dict()
            if export is not None:
                doc["exported"] = [str(w) for w in written]
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            render_plan(res, out)
            if written:
                out.print(f"wrote {len(written)} files to {export}: " + ", ".join(w.name for w in written))
        if res.chosen is None:
            raise typer.Exit(1)

    @app.command()
    @scenario_options(SOLVE_FLAGS)
    def solve(
        kind: Annotated[str, typer.Argument(help="max-batch | max-seq | min-gpus")],
        scenario: Annotated[Path | None, typer.Argument(help="scenario file (.yaml, .json, .toml); optional with "
                                                              "--model and --gpu")] = None,
        margin: Annotated[float, Opt(help="fraction of GPU capacity kept free")] = 0.10,
        as_json: Annotated[bool, Opt("--json", help="print the answer as JSON")] = False,
        *,
        given: Given,
    ) -> None:
        """Push one knob of a scenario (a file and/or flags) as far as the estimator allows (largest batch,
        longest sequence, fewest GPUs), with the safety margin."""
        from vramplan.cli.common import fail as _fail
        from vramplan.cli.common import scenario_document
        out = Console(soft_wrap=False)
        from vramplan.errors import Problem, ScenarioError, VramplanError, suggest
        from vramplan.plan.solvers import solve as run_solve
        from vramplan.spec.checks import number_problems

        kinds = ("max-batch", "max-seq", "min-gpus")
        try:
            if kind not in kinds:
                close = suggest(kind, kinds)
                raise ScenarioError([Problem("KIND", f"unknown solver {kind!r}",
                                             f"did you mean {close[0]!r}?" if close else f"use one of {kinds}")])
            problems = number_problems("--margin", margin, 0, 0.9, hint="e.g. 0.1")
            if not problems and margin == 0.9:
                problems = [Problem("--margin", f"{margin} is outside [0, 0.9)", "e.g. 0.1")]
            if problems:
                raise ScenarioError(problems)
            doc = scenario_document(scenario, given)
            with progress(f"solving {kind}", quiet=as_json):
                res = run_solve(kind, doc, margin)
        except VramplanError as exc:
            _fail(exc, given)
            return
        if as_json:
            sys.stdout.write(json.dumps(res.to_json_dict(), indent=2) + "\n")
        else:
            render_solve(res, out)
        if res.value is None:
            raise typer.Exit(1)
