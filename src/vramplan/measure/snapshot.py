"""Read a ``torch.cuda.memory._snapshot()`` dump and explain the memory at the failing allocation.

The file format is the dict that ``torch.cuda.memory._dump_snapshot()`` pickles (PyTorch 2.x;
documented in the docstring of ``torch.cuda.memory._snapshot`` and written by
``torch/csrc/cuda/Module.cpp`` / ``memory_snapshot.cpp``)::

    {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
                   "requested_size", "stream", "segment_type": "small"|"large",
                   "segment_pool_id", "is_expandable", "frames",
                   "blocks": [{"address", "size", "requested_size",
                               "state": "active_allocated"|"active_pending_free"|"inactive",
                               "frames": [{"filename", "line", "name"}, ...]}]}],
     "device_traces": [[{"action": "alloc"|"free_requested"|"free_completed"|"segment_alloc"|
                                  "segment_free"|"segment_map"|"segment_unmap"|"snapshot"|"oom",
                         "addr" (or "device_free" for "oom"), "size", "stream", "time_us",
                         "frames"}, ...] per device],
     "allocator_settings": {...}}          # newer versions only

Frames are listed innermost first.  The trace is a ring buffer (``max_entries``) captured just
before the segments, so the segments are the state after the last trace entry.

What the reader computes (torch-free):

* the moment: the last ``"oom"`` entry if there is one, else the dump;
* the tensors alive at that moment: the allocated blocks of the dump, with every trace entry
  after the moment undone (an ``alloc`` after it was not yet alive, a ``free_requested`` after
  it was still alive);
* their totals by category and by top stack frame, the largest ones, and the reserved bytes;
* segment fragmentation at the dump (inactive bytes, largest inactive block, per segment);
* a timeline of live requested bytes and reserved bytes over the trace entries.

Categories come from frame names and file names (heuristics, stated in every report).
"""

from __future__ import annotations

import html
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from vramplan.alloc.rules import round_size
from vramplan.errors import MissingExtraError, Problem, ScenarioError

__all__ = [
    "CATEGORIES",
    "Frame",
    "OomEntry",
    "SegmentStat",
    "SnapshotError",
    "SnapshotReport",
    "TensorStat",
    "TimelinePoint",
    "analyze_snapshot",
    "categorize",
    "format_frame",
    "load_snapshot",
    "read_snapshot",
    "top_frame",
    "write_timeline_plot",
]

CATEGORIES = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "other")

CATEGORY_RULES = (
    ("optimizer_states: a frame in torch/optim, bitsandbytes/optim, deepspeed/ops/adam or apex "
    "optimizers, or a 'step'/'_init_group' in an optimizer file (states and step temporaries)"),
    ("gradients: allocated inside autograd's backward (torch/autograd, Tensor.backward, "
    "AccumulateGrad): parameter and activation gradients"),
    ("activations: recomputed in backward under torch.utils.checkpoint, or made in a module's "
    "forward (saved activations and forward temporaries)"),
    "kv_cache: a frame in transformers' cache_utils.py or named like a KV cache",
    "weights: Module.to/_apply/cuda/load_state_dict, from_pretrained, reset_parameters",
    "other: anything else, including allocations recorded without a stack",
)

_ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                      "segment_map", "segment_unmap", "snapshot", "oom", "user_defined"})
_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"})
_HOW_TO_MAKE = ("pass a file written by torch.cuda.memory._dump_snapshot() or by "
                "`with vramplan.record(path=...)`")


class SnapshotError(ScenarioError):
    """The snapshot file is missing, unreadable, or not in the torch 2.x snapshot format."""

    def __init__(self, where: str, message: str, hint: str = _HOW_TO_MAKE) -> None:
        super().__init__([Problem(where, message, hint)])


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str


@dataclass(frozen=True)
class TensorStat:
    """An allocation alive at the analysed moment."""

    address: int
    size_bytes: int        # block size (what torch counts as allocated)
    requested_bytes: int   # what the program asked for
    category: str
    top_frame: str
    size_exact: bool = True  # False when only the trace knew it (size = 512-byte rounding)


@dataclass(frozen=True)
class SegmentStat:
    """One segment at the dump, with its fragmentation."""

    address: int
    total_size: int
    segment_type: str
    is_expandable: bool
    allocated_bytes: int
    pending_free_bytes: int
    inactive_bytes: int
    largest_inactive_block_bytes: int
    internal_free_bytes: int   # allocated block bytes beyond what was requested (rounding)
    num_blocks: int


@dataclass(frozen=True)
class OomEntry:
    trace_index: int
    request_bytes: int       # the rounded size the allocator could not find
    device_free_bytes: int   # what cudaMemGetInfo reported free at the failure
    category: str
    top_frame: str
    time_us: int | None = None


class TimelinePoint(NamedTuple):
    entry: int               # trace entry index (-1: before the first entry)
    action: str
    live_bytes: int          # live requested bytes after the entry
    reserved_bytes: int      # reserved bytes after the entry


@dataclass(frozen=True)
class SnapshotReport:
    source: str
    device: int
    devices: tuple[int, ...]
    moment: str                     # "oom" or "dump"
    trace_entries: int
    oom: OomEntry | None
    allocated_bytes: int            # live tensors at the moment (block sizes)
    requested_bytes: int
    reserved_bytes: int
    num_tensors: int
    by_category: dict[str, int]
    by_top_frame: list[tuple[str, int, int]]   # (frame, bytes, count), largest first
    largest: list[TensorStat]
    segments: list[SegmentStat]
    timeline: list[TimelinePoint]
    baseline_live_bytes: int        # live requested bytes before the first trace entry
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    # -- derived figures -------------------------------------------------------------
    @property
    def reserved_unallocated_bytes(self) -> int:
        return self.reserved_bytes - self.allocated_bytes

    @property
    def dump_reserved_bytes(self) -> int:
        return sum(s.total_size for s in self.segments)

    @property
    def dump_allocated_bytes(self) -> int:
        return sum(s.allocated_bytes for s in self.segments)

    @property
    def inactive_bytes(self) -> int:
        return sum(s.inactive_bytes for s in self.segments)

    @property
    def largest_inactive_block_bytes(self) -> int:
        return max((s.largest_inactive_block_bytes for s in self.segments), default=0)

    @property
    def fragmentation(self) -> float:
        """1 - allocated / reserved over the dump's segments (0 when nothing is reserved)."""
        reserved = self.dump_reserved_bytes
        return 0.0 if reserved == 0 else 1.0 - self.dump_allocated_bytes / reserved

    @property
    def shortfall_bytes(self) -> int | None:
        """Bytes missing for the failed request even if every free byte were usable.

        ``request - (device free + reserved but unallocated)``; <= 0 means the memory existed
        but not in one piece (fragmentation); None without an OOM.
        """
        if self.oom is None:
            return None
        return self.oom.request_bytes - (self.oom.device_free_bytes + self.reserved_unallocated_bytes)

    @property
    def verdict(self) -> str:
        if self.oom is None:
            return "no out-of-memory error in this snapshot; figures are at the dump"
        short = self.shortfall_bytes
        assert short is not None
        if short <= 0:
            return ("fragmentation: the free memory (CUDA free + reserved but unallocated) would hold "
                    "the request, but not in one piece; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                    "usually avoids this")
        return (f"out of memory: even perfectly packed, {short:,} more bytes were needed; "
                "reduce what is alive at this point (batch, sequence, checkpointing, sharding)")

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "device": self.device,
            "devices": list(self.devices),
            "moment": self.moment,
            "trace_entries": self.trace_entries,
            "oom": None if self.oom is None else {
                "trace_index": self.oom.trace_index, "request_bytes": self.oom.request_bytes,
                "device_free_bytes": self.oom.device_free_bytes, "category": self.oom.category,
                "top_frame": self.oom.top_frame, "time_us": self.oom.time_us,
                "shortfall_bytes": self.shortfall_bytes},
            "verdict": self.verdict,
            "allocated_bytes": self.allocated_bytes,
            "requested_bytes": self.requested_bytes,
            "reserved_bytes": self.reserved_bytes,
            "reserved_unallocated_bytes": self.reserved_unallocated_bytes,
            "num_tensors": self.num_tensors,
            "by_category": dict(self.by_category),
            "by_top_frame": [{"frame": f, "bytes": b, "count": c} for f, b, c in self.by_top_frame],
            "largest": [{"address": t.address, "size_bytes": t.size_bytes,
                         "requested_bytes": t.requested_bytes, "category": t.category,
                         "top_frame": t.top_frame, "size_exact": t.size_exact} for t in self.largest],
            "segments": {
                "count": len(self.segments),
                "reserved_bytes": self.dump_reserved_bytes,
                "allocated_bytes": self.dump_allocated_bytes,
                "inactive_bytes": self.inactive_bytes,
                "largest_inactive_block_bytes": self.largest_inactive_block_bytes,
                "fragmentation": round(self.fragmentation, 6),
                "per_segment": [{
                    "address": s.address, "total_size": s.total_size, "segment_type": s.segment_type,
                    "is_expandable": s.is_expandable, "allocated_bytes": s.allocated_bytes,
                    "pending_free_bytes": s.pending_free_bytes, "inactive_bytes": s.inactive_bytes,
                    "largest_inactive_block_bytes": s.largest_inactive_block_bytes,
                    "internal_free_bytes": s.internal_free_bytes, "num_blocks": s.num_blocks}
                    for s in self.segments],
            },
            "timeline": {
                "baseline_live_bytes": self.baseline_live_bytes,
                "points": [{"entry": p.entry, "action": p.action, "live_bytes": p.live_bytes,
                            "reserved_bytes": p.reserved_bytes} for p in downsample(self.timeline, 500)],
            },
            "allocator_settings": _jsonable(self.allocator_settings),
            "category_rules": list(CATEGORY_RULES),
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------- loading

class _SafeUnpickler(pickle.Unpickler):
    """Snapshot pickles hold only dicts, lists, tuples, strings and numbers: refuse any global."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the file references {module}.{name}")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Load a snapshot pickle without executing code, and check its top-level structure."""
    p = Path(path)
    where = str(p)
    if not p.exists():
        raise SnapshotError(where, "file not found")
    if p.is_dir():
        raise SnapshotError(where, "is a directory, not a snapshot file")
    try:
        with p.open("rb") as fh:
            data = _SafeUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if text.startswith("the file references"):
            raise SnapshotError(where, f"refused to load: {text}; a memory snapshot contains only "
                                "dicts, lists, strings and numbers") from None
        raise SnapshotError(where, f"not a pickle file ({text})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError,
            MemoryError, UnicodeDecodeError) as exc:
        raise SnapshotError(where, f"not a pickle file ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise SnapshotError(where, f"cannot read the file ({exc.strerror or exc})") from None
    _check_top(data, where)
    return data  # type: ignore[no-any-return]


def _check_top(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise SnapshotError(where, "expected a dict with 'segments' and 'device_traces' "
                            f"(the torch.cuda.memory._snapshot() format), found a {type(data).__name__}")
    missing = [k for k in ("segments", "device_traces") if k not in data]
    if missing:
        found = ", ".join(repr(k) for k in list(data)[:8]) or "none"
        raise SnapshotError(where, f"not a memory snapshot: missing {', '.join(repr(m) for m in missing)} "
                            f"(keys found: {found})")
    if not isinstance(data["segments"], list):
        raise SnapshotError(f"{where}: segments", f"expected a list, found a {type(data['segments']).__name__}")
    traces = data["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError(f"{where}: device_traces", "expected a list (one per device) of lists of entries")


# ---------------------------------------------------------------------------- parsing

@dataclass
class _Block:
    address: int
    size: int
    requested: int
    state: str
    frames: tuple[Frame, ...]


@dataclass
class _Segment:
    device: int
    address: int
    total_size: int
    segment_type: str
    is_expandable: bool
    blocks: list[_Block]


@dataclass
class _Entry:
    action: str
    addr: int
    size: int
    frames: tuple[Frame, ...]
    device_free: int
    time_us: int | None


def _int(d: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if v is None:
        raise SnapshotError(where, f"missing {key!r}")
    if isinstance(v, bool) or not isinstance(v, int):
        raise SnapshotError(where, f"{key!r} should be an integer, found {type(v).__name__}")
    return v


def _dict(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise SnapshotError(where, f"expected a dict, found a {type(v).__name__}")
    return v


def _frames(v: Any, where: str) -> tuple[Frame, ...]:
    if v is None:
        return ()
    if not isinstance(v, list):
        raise SnapshotError(where, f"'frames' should be a list, found a {type(v).__name__}")
    out = []
    for f in v:
        if not isinstance(f, dict):
            raise SnapshotError(where, "each frame should be a dict with filename, line and name")
        line = f.get("line", 0)
        out.append(Frame(str(f.get("filename", "?")), line if isinstance(line, int) else 0,
                         str(f.get("name", "?"))))
    return tuple(out)


def _parse_segments(raw: list[Any], where: str) -> list[_Segment]:
    segs: list[_Segment] = []
    for i, s in enumerate(raw):
        w = f"{where}: segments[{i}]"
        sd = _dict(s, w)
        address = _int(sd, "address", w)
        total = _int(sd, "total_size", w)
        blocks_raw = sd.get("blocks")
        if not isinstance(blocks_raw, list):
            raise SnapshotError(w, "missing 'blocks' (a list)")
        blocks: list[_Block] = []
        addr = address
        for j, b in enumerate(blocks_raw):
            wb = f"{w}.blocks[{j}]"
            bd = _dict(b, wb)
            size = _int(bd, "size", wb)
            state = bd.get("state")
            if state not in _STATES:
                raise SnapshotError(wb, f"unknown block state {state!r} (expected active_allocated, "
                                    "active_pending_free or inactive)")
            if "frames" not in bd and isinstance(bd.get("history"), list) and bd["history"]:
                # torch 2.0 layout: the allocation context sits in history[0]
                h0 = _dict(bd["history"][0], wb)
                frames = _frames(h0.get("frames"), wb)
                requested = _int(h0, "real_size", wb, size)
            else:
                frames = _frames(bd.get("frames"), wb)
                requested = _int(bd, "requested_size", wb, size)
            baddr = _int(bd, "address", wb, addr)
            blocks.append(_Block(baddr, size, requested, str(state), frames))
            addr = baddr + size
        segs.append(_Segment(_int(sd, "device", w, 0), address, total,
                             str(sd.get("segment_type", "large")), bool(sd.get("is_expandable", False)),
                             blocks))
    return segs


def _parse_trace(raw: list[Any], where: str) -> list[_Entry]:
    out: list[_Entry] = []
    for i, e in enumerate(raw):
        w = f"{where}[{i}]"
        ed = _dict(e, w)
        action = ed.get("action")
        if not isinstance(action, str):
            raise SnapshotError(w, f"'action' should be a string, found {type(action).__name__}")
        size = _int(ed, "size", w, 0)
        if action == "oom":
            addr, device_free = 0, _int(ed, "device_free", w, ed.get("addr", 0))
        else:
            # actions newer than this reader are kept but change nothing
            needs_addr = action in _ACTIONS and action not in ("snapshot", "user_defined")
            addr, device_free = _int(ed, "addr", w, None if needs_addr else 0), 0
        t = ed.get("time_us")
        out.append(_Entry(str(action), addr, size, _frames(ed.get("frames"), w), device_free,
                          t if isinstance(t, int) and not isinstance(t, bool) else None))
    return out


# ---------------------------------------------------------------------------- heuristics

_TORCH_FILE = re.compile(
    r"(^|/)(site|dist)-packages/torch/|(^|/)torch/(nn|optim|autograd|utils|amp|cuda|distributed|fx|"
    r"_dynamo|_inductor|_functorch|_refs|_prims|_decomp|_tensor\.py|_ops\.py|functional\.py|"
    r"overrides\.py|_compile\.py)")
_OMIT_FRAME = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
               "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")


def format_frame(f: Frame) -> str:
    """``file.py:line:name`` as torch's memory viewer prints it."""
    return f"{f.filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{f.line}:{f.name}"


def top_frame(frames: Sequence[Frame]) -> str:
    """The innermost Python frame outside torch itself (the model's or the script's line).

    Falls back to the innermost Python frame, then the innermost recorded frame.
    """
    py = [f for f in frames if f.filename.endswith(".py")]
    for f in py:
        if not _TORCH_FILE.search(f.filename.replace("\\", "/")):
            return format_frame(f)
    if py:
        return format_frame(py[0])
    for f in frames:
        if not any(o in f.name for o in _OMIT_FRAME):
            return format_frame(f)
    return "<no stack recorded>"


def categorize(frames: Sequence[Frame]) -> str:
    """Memory category from the allocation's stack (a heuristic; see ``CATEGORY_RULES``)."""
    items = [(f.name, f.filename.replace("\\", "/")) for f in frames]
    if not items:
        return "other"
    for n, p in items:
        if ("/torch/optim/" in p or "/bitsandbytes/optim/" in p or "deepspeed/ops/adam" in p
                or "/apex/optimizers/" in p or (n in ("step", "_init_group") and "optim" in p.lower())):
            return "optimizer_states"
    backward = any(
        n in ("_engine_run_backward", "run_backward")
        or (n == "backward" and ("/torch/autograd/" in p or p.endswith("torch/_tensor.py")))
        or "torch::autograd::Engine" in n or "AccumulateGrad" in n
        for n, p in items)
    if backward:
        if any(p.endswith("torch/utils/checkpoint.py") or "recompute" in n for n, p in items):
            return "activations"
        return "gradients"
    if any(p.endswith("cache_utils.py") or "kv_cache" in n.lower() for n, p in items):
        return "kv_cache"
    weight_names = ("from_pretrained", "load_checkpoint_and_dispatch", "set_module_tensor_to_device",
                    "_load_state_dict_into_meta_model", "reset_parameters", "_init_weights")
    for n, p in items:
        if (p.endswith("torch/nn/modules/module.py")
                and n in ("_apply", "to", "cuda", "convert", "load_state_dict", "_load_from_state_dict")):
            return "weights"
        if n in weight_names:
            return "weights"
    if any(n == "forward" or (p.endswith("torch/nn/modules/module.py") and n in ("_call_impl",
                                                                                   "_wrapped_call_impl"))
           for n, p in items):
        return "activations"
    return "other"


# ---------------------------------------------------------------------------- analysis

@dataclass
class _Live:
    size: int
    requested: int
    frames: tuple[Frame, ...]
    exact: bool


def read_snapshot(path: str | Path, device: int | None = None, top: int = 10) -> SnapshotReport:
    """``load_snapshot`` + ``analyze_snapshot``."""
    return analyze_snapshot(load_snapshot(path), device=device, top=top, source=str(path))


def analyze_snapshot(data: Mapping[str, Any], *, device: int | None = None, top: int = 10,
                     source: str = "<snapshot>") -> SnapshotReport:
    """Explain a snapshot dict: the memory at its last OOM (or at the dump), see module docs."""
    _check_top(data, source)
    segments = _parse_segments(data["segments"], source)
    traces_raw: list[list[Any]] = data["device_traces"]
    devices = sorted({s.device for s in segments} | {i for i, t in enumerate(traces_raw) if t})
    if device is None:
        with_oom = [i for i, t in enumerate(traces_raw)
                    if any(isinstance(e, dict) and e.get("action") == "oom" for e in t)]
        device = with_oom[-1] if with_oom else (devices[0] if devices else 0)
    elif device not in devices:
        raise SnapshotError("--device", f"device {device} has no segments or trace in this snapshot",
                            f"devices present: {', '.join(map(str, devices)) or 'none'}")
    trace = _parse_trace(traces_raw[device], f"{source}: device_traces[{device}]") \
        if device < len(traces_raw) else []
    segs = [s for s in segments if s.device == device]
    notes: list[str] = []

    live: dict[int, _Live] = {}
    for s in segs:
        for b in s.blocks:
            if b.state == "active_allocated":
                live[b.address] = _Live(b.size, b.requested, b.frames, True)
    reserved = sum(s.total_size for s in segs)

    free_action = "free_requested" if any(e.action == "free_requested" for e in trace) else "free_completed"
    alloc_of_free: dict[int, int] = {}
    last_alloc: dict[int, int] = {}
    for i, e in enumerate(trace):
        if e.action == "alloc":
            last_alloc[e.addr] = i
        elif e.action == free_action:
            j = last_alloc.pop(e.addr, None)
            if j is not None:
                alloc_of_free[i] = j
    oom_index = max((i for i, e in enumerate(trace) if e.action == "oom"), default=None)

    n = len(trace)
    live_req = sum(x.requested for x in live.values())
    points: list[TimelinePoint] = [TimelinePoint(0, "", 0, 0)] * n
    at_moment: dict[int, _Live] = dict(live) if oom_index is None else {}
    reserved_at_moment = reserved
    mismatches = 0
    for i in range(n - 1, -1, -1):
        e = trace[i]
        points[i] = TimelinePoint(i, e.action, live_req, reserved)
        if i == oom_index:
            at_moment = dict(live)
            reserved_at_moment = reserved
        if e.action == "alloc":
            if live.pop(e.addr, None) is None:
                mismatches += 1
            live_req -= e.size
        elif e.action == free_action:
            j = alloc_of_free.get(i)
            src = trace[j] if j is not None else e
            live[e.addr] = _Live(round_size(max(src.size, 1)), src.size, src.frames, False)
            live_req += e.size
        elif e.action in ("segment_alloc", "segment_map"):
            reserved -= e.size
        elif e.action in ("segment_free", "segment_unmap"):
            reserved += e.size
    baseline = live_req
    timeline = [TimelinePoint(-1, "start", baseline, reserved)] + points

    tensors = [TensorStat(addr, x.size, x.requested, categorize(x.frames), top_frame(x.frames), x.exact)
               for addr, x in at_moment.items()]
    by_cat: dict[str, int] = {}
    frames_acc: dict[str, list[int]] = {}
    for t in tensors:
        by_cat[t.category] = by_cat.get(t.category, 0) + t.size_bytes
        acc = frames_acc.setdefault(t.top_frame, [0, 0])
        acc[0] += t.size_bytes
        acc[1] += 1
    by_category = dict(sorted(by_cat.items(), key=lambda kv: (-kv[1], kv[0])))
    by_frame = sorted(((f, v[0], v[1]) for f, v in frames_acc.items()), key=lambda r: (-r[1], r[0]))
    largest = sorted(tensors, key=lambda t: (-t.size_bytes, t.address))[:max(top, 0)]

    oom: OomEntry | None = None
    if oom_index is not None:
        e = trace[oom_index]
        oom = OomEntry(oom_index, e.size, e.device_free, categorize(e.frames), top_frame(e.frames),
                       e.time_us)
        n_oom = sum(1 for x in trace if x.action == "oom")
        if n_oom > 1:
            notes.append(f"the trace holds {n_oom} out-of-memory errors; the last one is analysed")

    seg_stats = [_segment_stat(s) for s in segs]
    seg_stats.sort(key=lambda s: (-s.inactive_bytes, s.address))

    unknown = sorted({e.action for e in trace} - _ACTIONS)
    if unknown:
        notes.append(f"trace actions not understood and ignored: {', '.join(unknown)}")
    notes.append("categories are heuristics from stack-frame names (see category_rules)")
    if not any(b.frames for s in segs for b in s.blocks) and not any(e.frames for e in trace):
        notes.append("no stack frames were recorded (record with context='all'); every tensor is 'other'")
    if baseline > 0 and n:
        notes.append(f"{baseline:,} requested bytes were already allocated before the first trace entry "
                     "(the trace keeps only the last max_entries events)")
    if any(not t.size_exact for t in tensors):
        notes.append("tensors freed after the OOM are known from the trace only: their block size is "
                     "taken as the request rounded to 512 bytes")
    if mismatches:
        notes.append(f"{mismatches} trace allocations had no matching block at the dump (inconsistent trace)")
    if oom is not None:
        notes.append("segments and fragmentation are those of the dump, taken just after the OOM")
    if not trace:
        notes.append("no allocation trace (record with torch.cuda.memory._record_memory_history()); "
                     "figures are at the dump")

    settings = data.get("allocator_settings")
    return SnapshotReport(
        source=source, device=device, devices=tuple(devices),
        moment="oom" if oom is not None else "dump", trace_entries=n, oom=oom,
        allocated_bytes=sum(t.size_bytes for t in tensors),
        requested_bytes=sum(t.requested_bytes for t in tensors),
        reserved_bytes=reserved_at_moment, num_tensors=len(tensors),
        by_category=by_category, by_top_frame=by_frame, largest=largest, segments=seg_stats,
        timeline=timeline, baseline_live_bytes=baseline,
        allocator_settings=dict(settings) if isinstance(settings, dict) else {}, notes=notes)


def _segment_stat(s: _Segment) -> SegmentStat:
    alloc = pending = inactive = largest = internal = 0
    for b in s.blocks:
        if b.state == "active_allocated":
            alloc += b.size
            internal += max(b.size - b.requested, 0)
        elif b.state == "inactive":
            inactive += b.size
            largest = max(largest, b.size)
        else:
            pending += b.size
    return SegmentStat(s.address, s.total_size, s.segment_type, s.is_expandable, alloc, pending,
                       inactive, largest, internal, len(s.blocks))


def downsample(points: Sequence[TimelinePoint], limit: int) -> list[TimelinePoint]:
    """At most ``limit`` points, keeping in each bucket the point with the most live bytes."""
    if len(points) <= limit or limit <= 0:
        return list(points)
    step = -(-len(points) // limit)
    return [max(points[i:i + step], key=lambda p: p.live_bytes) for i in range(0, len(points), step)]


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


# ---------------------------------------------------------------------------- plots

def write_timeline_plot(report: SnapshotReport, path: str | Path) -> Path:
    """Live (requested) and reserved bytes over the trace entries; ``.png`` or ``.html``.

    PNG needs matplotlib (``pip install 'vramplan[plot]'``); HTML is a self-contained page that
    draws with the web page's chart code (Chart.js and charts.js inlined, the data embedded) and
    needs nothing, not even a network.
    """
    out = Path(path)
    suffix = out.suffix.lower()
    if suffix not in (".png", ".html", ".htm"):
        raise ScenarioError([Problem("--plot", f"unsupported plot file {out.name!r}",
                                     "use a .png or .html file name")])
    if not report.timeline or report.trace_entries == 0:
        raise ScenarioError([Problem("--plot", "the snapshot has no allocation trace to plot",
                                     "record with torch.cuda.memory._record_memory_history() or "
                                     "vramplan.record()")])
    if suffix == ".png":
        _write_png(report, out)
    else:
        out.write_text(_timeline_html(report), encoding="utf-8")
    return out


def _write_png(report: SnapshotReport, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingExtraError("PNG plots need matplotlib: pip install 'vramplan[plot]' "
                                "(or write an .html plot, which needs nothing)") from exc
    pts = downsample(report.timeline, 4000)
    mib = 2**20
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot([p.entry for p in pts], [p.reserved_bytes / mib for p in pts], label="reserved", color="#999999")
    ax.plot([p.entry for p in pts], [p.live_bytes / mib for p in pts], label="live tensors (requested)",
            color="#1f77b4")
    if report.oom is not None:
        ax.axvline(report.oom.trace_index, color="#d62728", linestyle="--",
                   label=f"OOM: {report.oom.request_bytes / mib:,.1f} MiB requested")
    ax.set_xlabel("trace entry")
    ax.set_ylabel("MiB")
    ax.set_title(f"{Path(report.source).name} - device {report.device}")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _timeline_html(report: SnapshotReport) -> str:
    # the page's chart code (web/static/charts.js, drawSnapshot) with Chart.js and the data inlined
    from vramplan.trace.timeline import chart_page

    title = f"{Path(report.source).name} - device {report.device}"
    oom = None if report.oom is None else {"trace_index": report.oom.trace_index,
                                           "request_bytes": report.oom.request_bytes}
    data = {"title": title, "oom": oom,
            "points": [p._asdict() for p in downsample(report.timeline, 2000)]}
    mib = 2**20
    note = ("" if report.oom is None else
            f"; OOM: {report.oom.request_bytes / mib:,.1f} MiB requested at trace entry {report.oom.trace_index}")
    before = (f"<h3>{html.escape(title)}</h3><p>grey: reserved; blue: live tensors (requested bytes)"
              f"{html.escape(note)}; {html.escape(report.verdict)}</p>")
    return chart_page(title, data, "drawSnapshot", before)
