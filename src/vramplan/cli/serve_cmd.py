"""`vramplan serve`, `vramplan kv`, `vramplan simulate` and `vramplan generate`.

The commands only parse options, call the library and render; every number comes from
``vramplan.serve`` and ``vramplan.analytic``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vramplan.cli.common import deep_merge as _merge
from vramplan.cli.common import fail as _fail
from vramplan.cli.common import guard_input, guard_output, progress, save_figure
from vramplan.cli.common import set_path as _set
from vramplan.cli.flags import Given, scenario_flags, scenario_options
from vramplan.errors import MissingExtraError, Problem, ScenarioError, VramplanError
from vramplan.spec.checks import number_problems
from vramplan.units import GB, GiB

if TYPE_CHECKING:
    from vramplan.spec.model import ModelSpec

__all__ = ["register"]

Opt = typer.Option


def _console() -> Console:
    """A console made when a command prints, so it takes the width of that moment (see cli/main.py)."""
    return Console(soft_wrap=False)


# the formats matplotlib writes that the --plot help names
_FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
# the most requests a simulation replays; the step loop and its timeline grow with the requests (issue 19:
# --requests 100000000 ran without end), so the count is capped and said so
MAX_SIM_REQUESTS = 100_000
MAX_CSV_BYTES = 16 << 20  # 100,000 rows of a few numbers are about 2 MB


def _emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"








MAX_LIST_VALUES = 64  # rows or columns of one table


def _int_list(text: str, option: str, high: int) -> list[int]:
    """A comma-separated list of at most ``MAX_LIST_VALUES`` integers in [1, ``high``] (the scenario schema's
    bound for the same quantity: train.seq_len / serve.max_model_len 100,000,000 tokens, inference.batch_size
    1,000,000 sequences)."""
    if len(text) > 4096:  # 64 values of 9 digits and their commas are about 640 characters
        raise ScenarioError([Problem(option, f"a list of {len(text):,} characters", f"give at most "
                                     f"{MAX_LIST_VALUES} values")])
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ScenarioError([Problem(option, f"{text!r} is not a comma-separated list of integers",
                                     f"e.g. {option} 1024,4096")]) from None
    if not values or any(v < 1 for v in values):
        raise ScenarioError([Problem(option, f"{text!r}: values must be integers >= 1", f"e.g. {option} 1024,4096")])
    if any(v > high for v in values):
        raise ScenarioError([Problem(option, f"{max(values):,} is more than {high:,}",
                                     f"give values in [1, {high:,}]")])
    if len(values) > MAX_LIST_VALUES:
        raise ScenarioError([Problem(option, f"{len(values):,} values; a table takes at most {MAX_LIST_VALUES}",
                                     "give fewer values")])
    return values


def _scenario(scenario: Path | None, task: str, flags: dict[str, Any]) -> dict[str, Any]:
    from vramplan.spec.load import read_document

    base: dict[str, Any] = read_document(scenario) if scenario is not None else {}
    if base.get("task", task) != task:
        raise ScenarioError([Problem("task", f"this command needs task: {task}, the scenario has task: {base['task']}",
                                     f"use `vramplan {'estimate' if task == 'train' else task}` or change task")])
    over: dict[str, Any] = {"task": task, **flags}
    doc = _merge(base, over)
    if "model" not in doc:
        raise ScenarioError([Problem("model", "no model given", "pass a scenario file or --model")])
    par = doc.get("parallel", {})
    dp = (doc.get("serve") or {}).get("dp") or 1
    if "num_gpus" not in doc.get("hardware", {}) and (par.get("tp") or par.get("pp") or dp > 1):
        # one engine: tensor x pipeline parallel GPUs (each may be absent: 1), times the data-parallel replicas
        doc.setdefault("hardware", {})["num_gpus"] = (par.get("tp") or 1) * (par.get("pp") or 1) * dp
    return doc


# ---------------------------------------------------------------------------- serve


SERVE_FLAGS = scenario_flags(["model", "hardware.gpu", "hardware.capacity_gib", "hardware.memory_in_use_gib", "parallel.tp",
                              "parallel.pp", "parallel.ep", "serve", "offline"],
                             notes={"parallel.tp": "vLLM's tensor_parallel_size; the GPU count (x pp x dp) when not given.",
                                    "parallel.pp": "vLLM's pipeline_parallel_size; the report shows every stage.",
                                    "parallel.ep": ("vLLM --enable-expert-parallel: tp x serve.dp; SGLang --ep-size, "
                                                    "dividing tp.")},
                             renamed={"serve.engine": "engine"})


@scenario_options(SERVE_FLAGS)
def _serve(
    scenario: Annotated[Path | None, typer.Argument(help="scenario file with task: serve (optional)")] = None,
    enforce_eager: Annotated[bool, Opt("--enforce-eager", help="no torch.compile / CUDA graphs (= --no-cuda-graphs)")] = False,
    subtract_cudagraphs: Annotated[bool, Opt("--subtract-cudagraphs",
                                             help="subtract CUDA-graph memory from the KV budget (newer vLLM)")] = False,
    as_json: Annotated[bool, Opt("--json", help="print JSON")] = False,
    *,
    given: Given,
) -> None:
    """What the serving engine (vLLM; SGLang with --engine sglang; llama.cpp with --engine llamacpp) allocates
    at start-up: KV pool, concurrency, largest context, or why it won't start."""
    from vramplan.catalog.resolve import resolve
    from vramplan.serve.llamacpp import LlamaCppDecision
    from vramplan.serve.report import serve_document, serve_outcome

    try:
        over = given.document("serve")
        if enforce_eager:
            _set(over, "serve.cuda_graphs", False)
        doc = _scenario(scenario, "serve", over)
        sr = serve_outcome(resolve(doc), subtract_cudagraphs=subtract_cudagraphs)
    except VramplanError as exc:
        _fail(exc, given)
        return
    d = sr.decision
    if isinstance(d, LlamaCppDecision):
        _serve_llamacpp(d, serve_document(sr) if as_json else None)
        return
    if as_json:
        _emit(serve_document(sr))
    elif sr.engine == "sglang":
        _render_sglang(d)
    else:
        _render_serve(d)
    if not d.starts or d.device_used_bytes + d.in_use_by_others_bytes > d.total_memory_bytes:
        raise typer.Exit(1)


def _print_outcome(verdict: str, d: Any) -> None:
    """A serving engine's verdict, its message and fix, and its assumptions, under the start-up table."""
    risk, risk_fix = getattr(d, "start_risk", ""), getattr(d, "start_risk_fix", "")
    _console().print(f"{verdict}" + (f": {d.problem}" if d.problem else f": {risk}" if risk else ""), highlight=False)
    if d.fix or risk_fix:
        _console().print(f"change: {d.fix or risk_fix}", highlight=False)
    _console().print("[dim]Assumptions:[/]")
    for a in d.assumptions:
        _console().print(f"[dim]  - {a}[/]", highlight=False)


def _start_table(engine: str, total_memory_bytes: int, in_use_by_others_bytes: int = 0) -> Table:
    """The start-up table of a serving engine: term, GiB and how, from the device's total memory."""
    t = Table(title=f"{engine} start-up memory per GPU", title_justify="left")
    t.add_column("term")
    t.add_column("GiB", justify="right")
    t.add_column("how", no_wrap=False)
    t.add_row("total memory", _gib(total_memory_bytes), "torch.cuda.mem_get_info()")
    if in_use_by_others_bytes:
        t.add_row("other processes", _gib(in_use_by_others_bytes), "hardware.memory_in_use_gib")
    return t


def _render_sglang(d: Any) -> None:
    verdict = "[bold green]STARTS[/]" if d.starts else "[bold red]WILL NOT START[/]"
    _console().print(f"[bold]{d.model}[/] · SGLang {d.release} · {d.gpu} · tp={d.tp} · "
                     f"context_len {d.context_len:,} · mem_fraction_static {d.mem_fraction_static}")
    t = _start_table("SGLang", d.total_memory_bytes, d.in_use_by_others_bytes)
    t.add_row("free at start", _gib(d.free_at_start_bytes),
              "total - CUDA context - NCCL" + (" - other processes" if d.in_use_by_others_bytes else "")
              + " ('Load weight begin')")
    t.add_row("static budget", _gib(d.static_budget_bytes), f"{d.mem_fraction_static} x free at start")
    t.add_row("  weights", _gib(d.weights_bytes), f"parameters {_gib(d.parameters_bytes)} + rotary cache (fp32)")
    t.add_row("[bold]  KV pool[/]", f"[bold]{_gib(d.kv_cache_bytes)}[/]",
              f"{d.max_total_num_tokens:,} tokens x {d.cell_size_bytes:,} B (page {d.page_size})")
    t.add_section()
    t.add_row("reserve", _gib(d.reserve_bytes), "activations, CUDA graphs, request-to-token table")
    t.add_row("  request-to-token table", _gib(d.req_to_token_bytes),
              f"{d.req_to_token_rows:,} rows x {d.req_to_token_width:,} slots x 4 B")
    t.add_row("[bold]device used[/]", f"[bold]{_gib(d.device_used_bytes)}[/]", "activations and CUDA graphs apart")
    _console().print(t)
    _console().print(f"max_total_num_tokens {d.max_total_num_tokens:,} · max_running_requests "
                     f"{d.max_running_requests:,} · concurrency at context_len {d.context_len:,}: "
                     f"{d.max_concurrency:.2f}x · chunked_prefill_size {d.chunked_prefill_size} · "
                     f"cuda_graph_max_bs {d.cuda_graph_max_bs}")
    _print_outcome(verdict, d)


def _serve_llamacpp(d: Any, document: dict[str, Any] | None) -> None:
    """llama.cpp's buffers (serve/llamacpp.py), as its JSON document or as its own log lines and a table."""
    fits = d.starts and d.device_used_bytes + d.in_use_by_others_bytes <= d.total_memory_bytes
    if document is not None:
        _emit(document)
    else:
        c = _console()
        c.print(f"[bold]{d.model}[/] · llama.cpp · {d.gpu} · {d.source} · n_ctx {d.kv_size:,} · "
                f"{d.gpu_slots}/{d.n_layer + 1} layers on the GPU", highlight=False)
        t = Table(title="llama.cpp start-up memory on the GPU", title_justify="left")
        t.add_column("buffer")
        t.add_column("GiB", justify="right")
        t.add_row("model buffer (weights)", _gib(d.model_buffer_bytes))
        t.add_row(f"KV buffer (K {d.cache_type_k}, V {d.cache_type_v})", _gib(d.kv_bytes))
        t.add_row("compute buffer", _gib(d.compute_buffer_bytes))
        t.add_row("CUDA context", _gib(d.cuda_context_bytes))
        t.add_section()
        t.add_row("[bold]device used[/]", f"[bold]{_gib(d.device_used_bytes)}[/]")
        t.add_row("on the host (weights + KV)", _gib(d.host_weights_bytes + d.kv_host_bytes))
        c.print(t)
        c.print("llama.cpp would print:", highlight=False)
        for line in d.log_lines():
            c.print(f"  {line}", highlight=False, markup=False)
        c.print(f"largest n_ctx that fits: {d.n_ctx_that_fits:,} · sequences: {d.n_parallel}", highlight=False)
        c.print(("[bold green]STARTS[/]" if fits else "[bold red]WILL NOT START[/]")
                + (f": {escape(d.problem)}" if d.problem else ""), highlight=False)
        if d.fix:
            c.print(f"change: {d.fix}", highlight=False)
        c.print("[dim]Assumptions:[/]")
        for a in d.assumptions:
            c.print(f"[dim]  - {escape(a)}[/]", highlight=False)
    if not fits:
        raise typer.Exit(1)


def _render_serve(d: Any) -> None:
    verdict = ("[bold red]WILL NOT START[/]" if not d.starts else "[bold yellow]MAY NOT START[/]"
               if d.may_not_start else "[bold green]STARTS[/]")
    _console().print(f"[bold]{d.model}[/] · vLLM {d.version} (V1) · {d.gpu} · tp={d.tp} · "
               + (f"pp={d.pp} (stage {d.binding_stage} shown, the binding one) · " if d.stages else "") +
               f"max_model_len {d.max_model_len:,} · utilisation {d.gpu_memory_utilization}")
    t = _start_table("vLLM", d.total_memory_bytes, d.in_use_by_others_bytes)
    t.add_row("requested", _gib(d.requested_bytes), f"{d.gpu_memory_utilization} x total")
    t.add_row("  weights", _gib(d.weights_bytes), f"parameters {_gib(d.parameters_bytes)} + rotary cache")
    t.add_row("  activation peak", _gib(d.activation_peak_bytes),
              f"profile run: {d.max_num_batched_tokens} tokens, {d.dummy_requests} requests "
              f"(forward {_gib(d.forward_peak_bytes)}, sampler {_gib(d.sampler_peak_bytes)})")
    t.add_row("  non-torch increase", _gib(d.non_torch_bytes), "first forward, outside PyTorch")
    graphs_how = (f"{len(d.cudagraph_capture_sizes)} sizes up to {d.cudagraph_capture_sizes[-1]}, band "
                  f"{_gib(d.cudagraph_bytes_low)}-{_gib(d.cudagraph_bytes_high)}" if d.cudagraph_capture_sizes else "")
    if d.cudagraph_subtracted:
        t.add_row("  CUDA graphs", _gib(d.cudagraph_bytes), f"estimate subtracted from the budget ({graphs_how})")
    t.add_row("[bold]  KV cache available[/]", f"[bold]{_gib(d.available_kv_bytes)}[/]", "requested - the above")
    t.add_section()
    t.add_row("outside the budget", _gib(d.cuda_context_bytes + d.nccl_bytes + (
        0 if d.cudagraph_subtracted else d.cudagraph_bytes)), "CUDA context, NCCL, CUDA graphs"
              + (f" ({graphs_how})" if graphs_how and not d.cudagraph_subtracted else ""))
    t.add_row("[bold]device used[/]", f"[bold]{_gib(d.device_used_bytes)}[/]", "as nvidia-smi shows")
    host = [(n, b) for n, b in (("weights (cpu_offload_gb)", d.cpu_offload_bytes), ("swap space", d.host_swap_bytes),
                                ("LoRA adapters (max_cpu_loras, at most)", d.host_lora_cache_bytes)) if b]
    for name, b in host:
        t.add_row(f"on the host: {name}", _gib(b), "host RAM per GPU")
    if d.sleep_level:
        t.add_row(f"asleep (level {d.sleep_level}): on the GPU", _gib(d.asleep_device_bytes),
                  "device used - weights - KV cache")
        t.add_row(f"asleep (level {d.sleep_level}): on the host", _gib(d.asleep_host_bytes),
                  "the weights" if d.sleep_level == 1 else "the model's buffers")
    _console().print(t)
    _console().print(f"KV: {d.kv_spec.describe()}; page {d.page_bytes:,} B x {d.layers_per_group} layers"
               f"{f' x {len(d.groups)} groups' if len(d.groups) > 1 else ''}")
    _console().print(f"num_gpu_blocks {d.num_gpu_blocks:,} · GPU KV cache size {d.kv_cache_tokens:,} tokens · "
               f"maximum concurrency for {d.max_model_len:,} tokens per request {d.max_concurrency:.2f}x · "
               f"largest max_model_len that fits {d.max_model_len_that_fits:,}")
    if d.stages:
        _console().print(_stage_table(d))
    _print_outcome(verdict, d)


def _stage_table(d: Any) -> Table:
    """vLLM's pipeline ranks: each one's layers, weights, profile peak, KV budget and blocks; the engine keeps the
    fewest (the binding stage's)."""
    t = Table(title="pipeline stages (the engine keeps the fewest blocks)", title_justify="left")
    for name in ("stage", "layers", "weights GiB", "activation GiB", "KV budget GiB", "own blocks", "KV GiB"):
        t.add_column(name, justify="left" if name == "stage" else "right")
    for st in d.stages:
        mark = " (binding)" if st.stage == d.binding_stage else ""
        t.add_row(f"{st.stage}{mark}", f"{st.first_layer}-{st.first_layer + st.layers - 1}", _gib(st.weights_bytes),
                  _gib(st.activation_peak_bytes), _gib(st.available_kv_bytes), f"{st.own_blocks:,}",
                  _gib(st.kv_cache_bytes))
    return t


# ---------------------------------------------------------------------------- kv


def _kv(
    model: Annotated[str, typer.Argument(help="catalog id/alias or path to config.json")],
    seq: Annotated[str, Opt(help="sequence lengths, comma-separated")] = "512,1024,2048,4096,8192",
    batch: Annotated[str, Opt(help="batch sizes, comma-separated")] = "1,8,32",
    kv_cache_dtype: Annotated[str, Opt(help="auto | fp16 | bf16 | fp8 | int8")] = "auto",
    dtype: Annotated[str, Opt(help="model dtype for kv_cache_dtype auto: fp16 | bf16 | fp32")] = "bf16",
    tp: Annotated[int, Opt(help="tensor-parallel size (KV heads are split per rank)")] = 1,
    block_size: Annotated[int, Opt(help="tokens per page/block")] = 16,
    budget_gb: Annotated[float | None, Opt(help="a KV budget in GB (1e9 B): pages and sequences it holds")] = None,
    plot: Annotated[Path | None, Opt(help="write a KV-growth figure (PNG/SVG/PDF)")] = None,
    as_json: Annotated[bool, Opt("--json", help="print JSON")] = False,
) -> None:
    """KV-cache bytes per token and per block, and its growth with sequence length and batch."""
    from vramplan.analytic.cross_attention import cross_cache_note, cross_images, cross_kv_bytes
    from vramplan.analytic.encoder_decoder import cross_cache_bytes, encoder_decoder_cache_note
    from vramplan.analytic.kv_cache import KV_DTYPES, kv_spec, page_capacity
    from vramplan.analytic.ssm_state import ssm_state_bytes, ssm_state_note
    from vramplan.catalog.models import load_model
    from vramplan.units import dtype_bits

    try:
        seqs = _int_list(seq, "--seq", 100_000_000)
        batches = _int_list(batch, "--batch", 1_000_000)
        problems = []
        if kv_cache_dtype not in KV_DTYPES:
            problems.append(Problem("--kv-cache-dtype", f"{kv_cache_dtype!r} is not allowed", f"choose {', '.join(KV_DTYPES)}"))
        if dtype not in ("fp16", "bf16", "fp32"):
            problems.append(Problem("--dtype", f"{dtype!r} is not allowed", "choose fp16, bf16 or fp32"))
        problems += number_problems("--tp", tp, 1, 1024)
        problems += number_problems("--block-size", block_size, 1, 1024)
        problems += number_problems("--budget-gb", budget_gb, 0, 1e6, low_open=True)
        guard_output("--plot", plot, _FIGURE_SUFFIXES, ".png, .svg or .pdf")
        if problems:
            raise ScenarioError(problems)
        m = load_model(model, where="model")
        _kv_tp_check(model, m, tp)
        if budget_gb and (other := _state_beside_kv(m, cross_images(m, 1, 1) is not None)):
            # page_capacity counts attention pages only: refused rather than a count without the other state
            raise ScenarioError([Problem("--budget-gb", f"{m.name} keeps {other} beside its attention pages, which "
                                         "the page count does not hold", "use `vramplan serve` (vLLM's start-up "
                                         "with its state pages) or drop --budget-gb")])
        spec = kv_spec(m, kv_cache_dtype, dtype_bits(dtype) // 8, tp)
        table = {s: {b: spec.sequence_bytes(s) * b for b in batches} for s in seqs}
        cap = page_capacity(spec, int(budget_gb * GB), block_size, tuple(seqs)) if budget_gb else None
        if plot is not None:
            _plot_kv(plot, m.name, seqs, batches, table)
    except VramplanError as exc:
        _fail(exc)
        return
    if as_json:
        payload: dict[str, Any] = {
            "model": m.name, "attention_kind": spec.attention_kind, "kv_cache_dtype": kv_cache_dtype,
            "elem_bytes": spec.elem_bytes, "tp": tp, "bytes_per_token": spec.bytes_per_token,
            "layer_bytes_per_token": spec.uniform_layer_bytes_per_token, "block_size": block_size,
            "block_bytes": spec.block_bytes(block_size), "layers": len(spec.layers),
            "sliding_layers": sum(1 for la in spec.layers if la.window),
            "growth": [{"seq_len": s, "batch": b, "kv_bytes": table[s][b]} for s in seqs for b in batches],
        }
        if m.mamba is not None:
            payload["ssm_state_bytes_per_sequence"] = ssm_state_bytes(m, 1, dtype_bits(dtype) // 8)
        if (ci := cross_images(m, 1, 1)) is not None:
            payload["cross_attention_bytes_per_image"] = cross_kv_bytes(m, ci, dtype_bits(dtype) // 8)
        if m.encoder_decoder is not None:
            payload["cross_attention_bytes_per_source_token"] = cross_cache_bytes(m, 1, 1, dtype_bits(dtype) // 8)
        if cap is not None:
            payload["page_capacity"] = {"budget_bytes": cap.budget_bytes, "page_tokens": cap.page_tokens,
                                        "page_bytes": cap.page_bytes, "total_pages": cap.total_pages,
                                        "total_tokens": cap.total_tokens,
                                        "max_sequences": {str(k): v for k, v in cap.max_sequences.items()}}
        _emit(payload)
        return
    _console().print(f"[bold]{m.name}[/] · {spec.describe()}")
    _console().print(f"per block of {block_size} tokens: {spec.block_bytes(block_size):,} B "
               f"({spec.uniform_layer_bytes_per_token * block_size:,} B per layer)")
    for note in (ssm_state_note(m, dtype_bits(dtype) // 8), cross_cache_note(m, dtype_bits(dtype) // 8),
                 encoder_decoder_cache_note(m, dtype_bits(dtype) // 8)):
        if note is not None:
            _console().print(note)
    t = Table(title="KV cache, GiB", title_justify="left")
    t.add_column("tokens", justify="right")
    for b in batches:
        t.add_column(f"batch {b}", justify="right")
    for s in seqs:
        t.add_row(f"{s:,}", *[_gib(table[s][b]) for b in batches])
    _console().print(t)
    if cap is not None:
        _console().print(f"{budget_gb:g} GB ({_gib(cap.budget_bytes)} GiB) budget: {cap.total_pages:,} pages of {block_size} tokens "
                   f"({cap.page_bytes:,} B) = {cap.total_tokens:,} tokens; sequences at once: "
                   + ", ".join(f"{k:,} tokens -> {v:,}" for k, v in cap.max_sequences.items()))
    if plot is not None:
        _console().print(f"figure written to {plot}")


def _kv_tp_check(name: str, m: Any, tp: int) -> None:
    """The same tensor-parallel checks as ``serve`` (spec.load.cross_check on a one-replica serve scenario)."""
    from vramplan.spec.load import cross_check
    from vramplan.spec.scenario import Scenario

    if tp == 1:
        return
    sc = Scenario.model_validate({"model": name, "task": "serve", "hardware": {"num_gpus": tp}, "parallel": {"tp": tp}})
    problems = [Problem("--tp", p.message, p.hint) for p in cross_check(sc, m) if p.where.startswith("parallel")]
    if problems:
        raise ScenarioError(problems)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the dev environment
        raise MissingExtraError("--plot needs matplotlib: pip install 'vramplan[plot]'") from None
    return plt


def _plot_kv(path: Path, name: str, seqs: list[int], batches: list[int], table: dict[int, dict[int, int]]) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for b in batches:
        ax.plot(seqs, [table[s][b] / GiB for s in seqs], marker="o", label=f"batch {b}")
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("KV cache (GiB)")
    ax.set_title(f"KV cache growth: {name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        save_figure(fig, path, "--plot")
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------- simulate


def _simulate(
    workload: Annotated[str | None, Opt(help="bundled workload: sharegpt | alpaca | lmsys-chat | arxiv-summarization")] = None,
    csv: Annotated[Path | None, Opt(help="a CSV of prompt/output lengths (and optionally arrival steps)")] = None,
    requests: Annotated[int, Opt(help="requests to draw from a bundled workload")] = 1000,
    seed: Annotated[int, Opt(help="random seed")] = 0,
    rate: Annotated[float | None, Opt(help="Poisson arrivals per engine step (default: all at step 0)")] = None,
    capacity_tokens: Annotated[int | None, Opt(help="KV capacity in token slots")] = None,
    model: Annotated[str | None, Opt(help="derive the capacity from vLLM's decision for this model ...")] = None,
    gpu: Annotated[str | None, Opt(help="... on this GPU")] = None,
    tp: Annotated[int | None, Opt(help="tensor-parallel size for the derived capacity")] = None,
    gpu_memory_utilization: Annotated[float | None, Opt(help="for the derived capacity (0.9)")] = None,
    mode: Annotated[str, Opt(help="both | paged | contiguous")] = "both",
    block_size: Annotated[int, Opt(help="tokens per block (paged)")] = 16,
    max_model_len: Annotated[int, Opt(help="max tokens per request (the contiguous reservation)")] = 2048,
    max_num_seqs: Annotated[int, Opt(help="concurrent sequences")] = 256,
    max_num_batched_tokens: Annotated[int, Opt(help="tokens per engine step")] = 8192,
    reservation: Annotated[str, Opt(help="contiguous reservation: max | pow2 | oracle")] = "max",
    shared_prefix: Annotated[int, Opt(help="tokens every prompt shares (paged stores their blocks once)")] = 0,
    plot: Annotated[Path | None, Opt(help="write the figures (PNG/SVG/PDF)")] = None,
    as_json: Annotated[bool, Opt("--json", help="print JSON")] = False,
) -> None:
    """Replay requests through continuous batching: contiguous reservations vs paged blocks."""
    from dataclasses import replace

    from vramplan.serve.simulate import SimConfig, SimResult, simulate
    from vramplan.serve.workloads import load_csv, synthesize

    try:
        problems = []
        if mode not in ("both", "paged", "contiguous"):
            problems.append(Problem("--mode", f"{mode!r} is not allowed", "choose both, paged or contiguous"))
        if reservation not in ("max", "pow2", "oracle"):
            problems.append(Problem("--reservation", f"{reservation!r} is not allowed", "choose max, pow2 or oracle"))
        if workload is not None and csv is not None:
            problems.append(Problem("--workload", "give either --workload or --csv, not both", ""))
        if capacity_tokens is None and model is None:
            problems.append(Problem("--capacity-tokens", "no KV capacity given",
                                    "give --capacity-tokens N, or --model and --gpu to use vLLM's num_gpu_blocks"))
        if capacity_tokens is not None and model is not None:
            problems.append(Problem("--capacity-tokens", "give --capacity-tokens or --model/--gpu, not both", ""))
        problems += _simulate_bounds(requests, rate, capacity_tokens, gpu_memory_utilization, block_size,
                                     max_model_len, max_num_seqs, max_num_batched_tokens, shared_prefix)
        problems += number_problems("--tp", tp, 1, 1024)  # as serve's and kv's (0 fell back to 1)
        guard_input("--csv", csv, MAX_CSV_BYTES)
        guard_output("--plot", plot, _FIGURE_SUFFIXES, ".png, .svg or .pdf")
        if problems:
            raise ScenarioError(problems)
        capacity_source = "given"
        if capacity_tokens is None:
            capacity_tokens, capacity_source = _capacity_from_vllm(model, gpu, tp, gpu_memory_utilization,
                                                                   block_size, max_model_len, max_num_seqs,
                                                                   max_num_batched_tokens)
        trace = load_csv(csv, rate=rate, seed=seed) if csv is not None else synthesize(
            "sharegpt" if workload is None else workload, requests, seed=seed, rate=rate)
        if len(trace) > MAX_SIM_REQUESTS:
            raise ScenarioError([Problem("--csv", f"{len(trace):,} requests; a simulation replays at most "
                                         f"{MAX_SIM_REQUESTS:,}", "use the first rows, or a sample")])
        base = SimConfig(capacity_tokens=capacity_tokens, block_size=block_size, max_model_len=max_model_len,
                         max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         reservation=reservation,  # type: ignore[arg-type]
                         shared_prefix=shared_prefix)
        modes = ["contiguous", "paged"] if mode == "both" else [mode]
        with progress(f"simulating {len(trace):,} requests", quiet=as_json):
            results = [simulate(trace, replace(base, mode=mo)) for mo in modes]  # type: ignore[arg-type]
        if plot is not None:
            _plot_sim(plot, trace.name, results)
    except VramplanError as exc:
        _fail(exc)
        return
    if as_json:
        _emit({"trace": {"name": trace.name, "requests": len(trace), "source": trace.source, "seed": seed,
                         "rate": rate, "mean_prompt": trace.mean_prompt,
                         "mean_output": trace.mean_output},
               "capacity_tokens": capacity_tokens, "capacity_source": capacity_source,
               "results": {r.mode: r.to_dict() for r in results}})
        return
    _console().print(f"[bold]{trace.name}[/]: {len(trace):,} requests, mean prompt {trace.mean_prompt:,.1f}, "
               f"mean output {trace.mean_output:,.1f} tokens · KV capacity {capacity_tokens:,} tokens "
               f"({capacity_source})")
    t = Table(title="KV memory over busy steps (shares of occupied memory)", title_justify="left")
    t.add_column("")
    for r in results:
        t.add_column(r.mode + (f" ({r.config.reservation})" if r.mode == "contiguous" else
                               f" (block {r.config.block_size})"), justify="right")
    rows: list[tuple[str, Callable[[SimResult], str]]] = [
        ("token states", lambda r: f"{r.share('used'):.1%}"),
        ("waste", lambda r: f"{r.waste:.1%}"),
        ("  reservation", lambda r: f"{r.share('reservation'):.1%}"),
        ("  internal", lambda r: f"{r.share('internal'):.1%}"),
        ("  external", lambda r: f"{r.share('external'):.1%}"),
        ("KV utilisation of capacity", lambda r: f"{r.utilisation:.1%}"),
        ("mean / max running sequences", lambda r: f"{r.mean_running:,.1f} / {r.max_running:,}"),
        ("preemptions (recompute)", lambda r: f"{r.preemptions:,}"),
        ("engine steps", lambda r: f"{r.steps:,}"),
        ("throughput (output tokens / step)", lambda r: f"{r.throughput:,.2f}"),
        ("rejected (longer than the capacity)", lambda r: f"{r.rejected:,}"),
    ]
    for label, fn in rows:
        t.add_row(label, *[fn(r) for r in results])
    _console().print(t)
    if len(results) == 2 and results[0].throughput:
        _console().print(f"paged / contiguous throughput: {results[1].throughput / results[0].throughput:.2f}x")
    if plot is not None:
        _console().print(f"figure written to {plot}")


def _simulate_bounds(requests: int, rate: float | None, capacity: int | None, util: float | None, block: int,
                     max_len: int, seqs: int, batched: int, prefix: int) -> list[Problem]:
    """The simulation's own numbers, bounded (spec.checks.number_problems, as every command's)."""
    return [*number_problems("--requests", requests, 1, MAX_SIM_REQUESTS),
            *number_problems("--rate", rate, 0, 1e6, low_open=True),
            *number_problems("--capacity-tokens", capacity, 1, 2**40),
            *number_problems("--gpu-memory-utilization", util, 0, 1, low_open=True),
            *number_problems("--block-size", block, 1, 1024),
            *number_problems("--max-model-len", max_len, 1, 100_000_000),
            *number_problems("--max-num-seqs", seqs, 1, 1_000_000),
            *number_problems("--max-num-batched-tokens", batched, 1, 100_000_000),
            *number_problems("--shared-prefix", prefix, 0, 100_000_000)]


def _capacity_from_vllm(model: str | None, gpu: str | None, tp: int | None, util: float | None, block: int,
                        max_len: int, seqs: int, batched: int) -> tuple[int, str]:
    from vramplan.catalog.resolve import resolve
    from vramplan.serve.vllm import decide

    doc: dict[str, Any] = {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp or 1},
                           "parallel": {"tp": tp or 1},
                           "serve": {"block_size": block, "max_model_len": max_len, "max_num_seqs": seqs,
                                     "max_num_batched_tokens": batched}}
    if util is not None:
        doc["serve"]["gpu_memory_utilization"] = util
    d = decide(resolve(doc))
    if d.mamba_layers:
        # the simulation pages tokens only; a hybrid model's pool also holds one state page per request and mixer group
        raise ScenarioError([Problem("--model", f"{d.model} has {d.mamba_layers} mixer layers (Mamba, Gated DeltaNet "
                                     "or short convolution) whose state pages the simulation does not model",
                                     "give --capacity-tokens, or simulate an attention-only model")])
    if not d.starts:
        raise ScenarioError([Problem("--model", d.problem, d.fix)])
    return d.num_gpu_blocks * block, f"vLLM {d.version}: {d.num_gpu_blocks:,} blocks for {d.model} on {d.gpu}"


def _plot_sim(path: Path, name: str, results: list[Any]) -> None:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        ax1.plot(r.timeline["step"], r.timeline["running"], label=r.mode, linewidth=1)
    ax1.set_xlabel("engine step")
    ax1.set_ylabel("concurrent sequences")
    ax1.set_title(f"Concurrent sequences over time ({name})")
    ax1.legend()
    ax1.grid(alpha=0.3)
    parts = ["used", "reservation", "internal", "external"]
    labels = ["token states", "reservation", "internal fragmentation", "external fragmentation"]
    colors = ["#4c72b0", "#dd8452", "#c44e52", "#8172b3"]
    bottoms = [0.0] * len(results)
    xs = [r.mode for r in results]
    for part, label, color in zip(parts, labels, colors, strict=True):
        vals = [100 * r.share(part) for r in results]
        ax2.bar(xs, vals, bottom=bottoms, label=label, color=color)
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax2.set_ylabel("% of occupied KV memory")
    ax2.set_title("KV memory: token states vs waste")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    try:
        save_figure(fig, path, "--plot")
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------- generate


GENERATE_FLAGS = scenario_flags(["model", "hardware.gpu", "hardware.capacity_gib", "hardware.memory_in_use_gib", "parallel.tp", "inference",
                                 "offline"])


@scenario_options(GENERATE_FLAGS)
def _generate(
    scenario: Annotated[Path | None, typer.Argument(help="scenario file with task: inference (optional)")] = None,
    as_json: Annotated[bool, Opt("--json", help="print JSON")] = False,
    *,
    given: Given,
) -> None:
    """Hugging Face generate: the peak over prefill and decode, and the largest batch and prompt that fit."""
    from vramplan.analytic.generate import generate_step
    from vramplan.catalog.resolve import resolve
    from vramplan.engine import estimate
    from vramplan.plan.solvers import max_batch_size, max_prompt_len

    try:
        doc = _scenario(scenario, "inference", given.document("inference"))
        r = resolve(doc)
        report = estimate(r)
        ir = generate_step(r)
        mb = max_batch_size(r)
        mp = max_prompt_len(r)
    except VramplanError as exc:
        _fail(exc, given)
        return
    phases = {mo.phase: mo.total for mo in ir.moments}
    if as_json:
        _emit({"report": report.to_json_dict(), "phases": phases, "max_batch_size": mb, "max_prompt_len": mp})
    else:
        from vramplan.cli.render import render_report

        render_report(report, _console())
        inf = r.scenario.inference
        _console().print("phases (allocated): " + ", ".join(f"{k} {_gib(v)} GiB" for k, v in phases.items()))
        _console().print(f"largest batch that fits at {inf.prompt_len:,} + {inf.new_tokens:,} tokens: {mb:,}; "
                   f"longest prompt at batch {inf.batch_size} and {inf.new_tokens:,} new tokens: {mp:,}")
    if not report.fits:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
    app.command("serve")(_serve)
    app.command("kv")(_kv)
    app.command("simulate")(_simulate)
    app.command("generate")(_generate)


def _state_beside_kv(m: ModelSpec, cross: bool) -> str:
    """What a model keeps per sequence besides its attention pages ("" for none); ``cross``: it reads images
    through cross-attention layers."""
    if m.mamba is not None:
        return "the Mamba mixers' state (one page per sequence)"
    if m.encoder_decoder is not None:
        return "the cross-attention cache of the encoder's output"
    if cross:
        return "the cross-attention layers' cache of every image"
    return ""
