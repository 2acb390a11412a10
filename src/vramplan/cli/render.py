"""Text rendering of reports and catalog listings (rich tables with a bar per part)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vramplan.report import Report
from vramplan.units import GB, GiB

BAR_WIDTH = 30


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def _bar(n: int, total: int) -> str:
    if total <= 0 or n <= 0:
        return ""
    cells = max(1, round(BAR_WIDTH * n / total))
    return "█" * cells


def render_report(report: Report, console: Console) -> None:
    pg = report.per_gpu
    model = report.model.get("name", "?")
    gpu = report.gpu.get("name", "?")
    task = report.scenario.get("task", "?")
    n = report.scenario.get("hardware", {}).get("num_gpus", 1)
    verdict = "[bold green]FITS[/]" if report.fits else "[bold red]DOES NOT FIT[/]"
    if report.tight:
        verdict = "[bold yellow]FITS, TIGHT[/] (headroom within the estimate's error)"
    band = ""
    if report.verdict is not None:  # the calibrated band's verdict (report/band.py)
        colour = {"FITS": "green", "MAY NOT FIT": "yellow", "DOES NOT FIT": "red"}[report.verdict]
        verdict = f"[bold {colour}]{report.verdict}[/]"
        if pg.device_used_bytes_low is not None and pg.device_used_bytes_high is not None:
            band = f" (band {_gib(pg.device_used_bytes_low)}-{_gib(pg.device_used_bytes_high)} GiB)"
    console.print(f"[bold]{model}[/] · {task} · {n} x {gpu} · engine: {report.engine}")
    console.print(f"{verdict}: {_gib(pg.device_used_bytes)} GiB{band} of {_gib(pg.capacity_bytes)} GiB per GPU "
                  f"(headroom {_gib(pg.headroom_bytes)} GiB); peak in {pg.peak_phase}")
    if report.band:
        cov = report.band.get("coverage", 0.9)
        console.print(f"[dim]band: {cov:.0%} interval calibrated on published runs of other sources; "
                      "FITS only when its high bound fits[/]")
    table = Table(title="Memory per GPU at the peak", title_justify="left")
    table.add_column("part")
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    for key, value in pg.breakdown.items():
        if not value:
            continue
        table.add_row(key, _gib(value), _bar(value, pg.peak_allocated_bytes))
        detail = pg.breakdown_detail.get(key, {})
        if len(detail) > 1:
            for sub, v in detail.items():
                table.add_row(f"  [dim]{sub}[/]", f"[dim]{_gib(v)}[/]", "")
    table.add_section()
    table.add_row("[bold]peak allocated[/]", f"[bold]{_gib(pg.peak_allocated_bytes)}[/]", "max_memory_allocated()")
    table.add_row("peak reserved", _gib(pg.peak_reserved_bytes), "max_memory_reserved()")
    for key, value in pg.outside_allocator.items():
        if value:
            table.add_row(f"+ {key.replace('_', ' ')}", _gib(value), "outside PyTorch's allocator")
    table.add_row("[bold]device used[/]", f"[bold]{_gib(pg.device_used_bytes)}[/]", "as nvidia-smi shows")
    console.print(table)
    _render_lifecycle(report, console)
    if report.host.offloaded_bytes or report.host.nvme_bytes:
        console.print(f"host memory for offload: {_gib(report.host.offloaded_bytes)} GiB"
                      + (f"; NVMe: {_gib(report.host.nvme_bytes)} GiB" if report.host.nvme_bytes else ""))
    if report.serve.num_gpu_blocks:
        sv = report.serve
        console.print(f"KV cache: {_gib(sv.kv_cache_bytes)} GiB, {sv.num_gpu_blocks:,} blocks, "
                      f"max concurrency {sv.max_concurrency} at max_model_len")
    if report.assumptions:
        console.print("[dim]Assumptions:[/]")
        for a in report.assumptions:
            console.print(f"[dim]  - {a}[/]")


def _render_lifecycle(report: Report, console: Console) -> None:
    """One line per phase of the job (training): allocated, reserved, device used; the peak's phase marked."""
    pg = report.per_gpu
    if not pg.lifecycle:
        return
    console.print("Job phases (GiB allocated / reserved / device used):")
    for name, row in pg.lifecycle.items():
        mark = "  [bold]<- peak[/]" if name == pg.lifecycle_peak_phase else ""
        console.print(f"  {name}: {_gib(row['allocated_bytes'])} / {_gib(row['reserved_bytes'])} / "
                      f"{_gib(row['device_used_bytes'])}{mark}", highlight=False)
    if report.host.load_peak_bytes:
        console.print(f"  host RAM while loading: {_gib(report.host.load_peak_bytes)} GiB per process", highlight=False)


def render_remedies(remedies: list[dict[str, object]], assumed: dict[str, object], console: Console) -> None:
    """A job that does not fit: the verified changes that make it fit, then the settings taken as defaults."""
    if remedies:
        console.print("[bold]Would fit (each change estimated again: verdict FITS, with a 10% margin):[/]")
        for r in remedies:
            used, cap = r["device_used_bytes"], r["capacity_bytes"]
            assert isinstance(used, int) and isinstance(cap, int)
            console.print(f"  - {r['text']}: {_gib(used)} of {_gib(cap)} GiB", highlight=False)
    else:
        console.print("No single change tried makes it fit: see `vramplan plan`.")
    if assumed:
        console.print("[dim]Settings assumed (not given, defaults):[/] "
                      + ", ".join(f"{k}={v}" for k, v in assumed.items()), highlight=False)


def render_models(rows: list[object], console: Console) -> None:
    from vramplan.catalog.models import CatalogModel
    from vramplan.spec.hf_config import model_from_config

    table = Table(title="Model catalog")
    for col in ("id", "type", "parameters", "layers", "hidden", "heads/kv", "vocab"):
        table.add_column(col, justify="right" if col not in ("id", "type") else "left")
    for row in rows:
        assert isinstance(row, CatalogModel)
        m = model_from_config(row.config, name=row.id)
        table.add_row(row.id, m.model_type, f"{m.num_parameters / 1e9:,.2f}B", str(m.num_layers),
                      str(m.hidden_size), f"{m.num_attention_heads}/{m.num_kv_heads}", f"{m.vocab_size:,}")
    console.print(table)


def render_gpus(rows: list[object], console: Console) -> None:
    from vramplan.spec.gpu import GpuSpec

    table = Table(title="GPU catalog")
    for col in ("name", "arch", "memory (nominal)", "total_memory GiB", "HBM TB/s", "bf16 TFLOP/s"):
        table.add_column(col, justify="left" if col in ("name", "arch") else "right")
    for g in rows:
        assert isinstance(g, GpuSpec)
        bf16 = g.dense_flops_per_s.get("bf16") or 0
        table.add_row(g.name, g.architecture, f"{g.nominal_memory_bytes / GB:,.0f} GB",
                      _gib(g.total_memory_bytes) if g.total_memory_bytes else "?",
                      f"{g.hbm_bytes_per_s / 1e12:,.2f}", f"{bf16 / 1e12:,.0f}" if bf16 else "-")
    console.print(table)
