"""`vramplan snapshot` (OOM snapshot reader) sub-commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from vramplan.errors import VramplanError

Opt = typer.Option


# a snapshot with a long allocation history is tens to hundreds of MB; 8 GiB refuses only a wrong path
MAX_SNAPSHOT_BYTES = 8 << 30


def human_bytes(n: float) -> str:
    """Bytes in the unit torch's OOM message would use (B, KiB, MiB, GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{int(n):,} B"


def render_snapshot(report: object, console: Console, top: int) -> None:
    from vramplan.measure.snapshot import SnapshotReport

    assert isinstance(report, SnapshotReport)
    r = report
    console.print(f"[bold]{r.source}[/] · device {r.device} · {r.trace_entries:,} trace entries · "
                  f"{len(r.segments)} segments")
    if r.oom is not None:
        console.print(f"[bold red]Out of memory[/] at trace entry {r.oom.trace_index}: tried to allocate "
                      f"{human_bytes(r.oom.request_bytes)} ({r.oom.category}, {r.oom.top_frame}); "
                      f"CUDA reported {human_bytes(r.oom.device_free_bytes)} free")
    else:
        console.print("No out-of-memory entry in the trace: figures are at the dump.")
    console.print(f"At that moment: {human_bytes(r.allocated_bytes)} allocated in {r.num_tensors:,} tensors "
                  f"({human_bytes(r.requested_bytes)} requested), {human_bytes(r.reserved_bytes)} reserved, "
                  f"{human_bytes(r.reserved_unallocated_bytes)} reserved but unallocated")
    console.print(f"Verdict: {r.verdict}")

    cat = Table(title="By category (heuristic)", title_justify="left")
    cat.add_column("category")
    cat.add_column("bytes", justify="right")
    cat.add_column("share", justify="right")
    for name, value in r.by_category.items():
        share = value / r.allocated_bytes if r.allocated_bytes else 0.0
        cat.add_row(name, human_bytes(value), f"{share:.1%}")
    console.print(cat)

    fr = Table(title="By top stack frame", title_justify="left")
    fr.add_column("frame")
    fr.add_column("bytes", justify="right")
    fr.add_column("tensors", justify="right")
    for frame, value, count in r.by_top_frame[:top]:
        fr.add_row(frame, human_bytes(value), f"{count:,}")
    console.print(fr)

    lt = Table(title=f"Largest tensors (top {min(top, len(r.largest))})", title_justify="left")
    for col in ("size", "requested", "category", "frame"):
        lt.add_column(col, justify="right" if col in ("size", "requested") else "left")
    for t in r.largest:
        lt.add_row(human_bytes(t.size_bytes) + ("" if t.size_exact else "*"), human_bytes(t.requested_bytes),
                   t.category, t.top_frame)
    console.print(lt)

    console.print(f"Segments at the dump: {human_bytes(r.dump_reserved_bytes)} reserved, "
                  f"{human_bytes(r.dump_allocated_bytes)} allocated, {human_bytes(r.inactive_bytes)} inactive "
                  f"(largest free block {human_bytes(r.largest_inactive_block_bytes)}); "
                  f"fragmentation 1 - allocated/reserved = {r.fragmentation:.1%}")
    st = Table(title="Most fragmented segments", title_justify="left")
    for col in ("address", "type", "size", "allocated", "inactive", "largest free", "blocks"):
        st.add_column(col, justify="left" if col in ("address", "type") else "right")
    for s in [s for s in r.segments if s.inactive_bytes][:top]:
        st.add_row(hex(s.address), s.segment_type + (" exp." if s.is_expandable else ""),
                   human_bytes(s.total_size), human_bytes(s.allocated_bytes), human_bytes(s.inactive_bytes),
                   human_bytes(s.largest_inactive_block_bytes), str(s.num_blocks))
    if st.row_count:
        console.print(st)
    if r.notes:
        console.print("[dim]Notes:[/]")
        for note in r.notes:
            console.print(f"[dim]  - {note}[/]")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("snapshot")
    def snapshot(
        file: Annotated[Path, typer.Argument(help="pickle from torch.cuda.memory._dump_snapshot() or vramplan.record()")],
        plot: Annotated[Path | None, Opt(help="write the timeline to FILE.png or FILE.html")] = None,
        device: Annotated[int | None, Opt(help="device index (default: the one that ran out of memory)")] = None,
        top: Annotated[int, Opt(help="rows in the frame, tensor and segment tables", min=1)] = 10,
        as_json: Annotated[bool, Opt("--json", help="print the analysis as JSON")] = False,
    ) -> None:
        """Explain an OOM snapshot: memory by category and stack frame, largest tensors, fragmentation."""
        from vramplan.cli.common import fail as _fail
        from vramplan.cli.common import guard_input, guard_output
        from vramplan.measure.snapshot import read_snapshot, write_timeline_plot

        console = Console(soft_wrap=False)
        try:
            guard_output("--plot", plot, (".png", ".html", ".htm"), ".png or .html")
            guard_input("FILE", file, MAX_SNAPSHOT_BYTES)
            report = read_snapshot(file, device=device, top=top)
            if plot is not None:
                write_timeline_plot(report, plot)
        except VramplanError as exc:
            _fail(exc)
            return
        if as_json:
            doc = report.to_json_dict()
            if plot is not None:
                doc["plot"] = str(plot)
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return
        render_snapshot(report, console, top)
        if plot is not None:
            console.print(f"timeline written to {plot}")
