"""Write the snapshot fixtures used by tests/test_snapshot*.py (deterministic; run to refresh).

    PYTHONPATH=src python tests/data/snapshots/make_snapshots.py

The files follow the dict that ``torch.cuda.memory._dump_snapshot()`` pickles in PyTorch 2.x
(``torch.cuda.memory._snapshot`` docstring; ``torch/csrc/cuda/memory_snapshot.cpp``): segments
with device, address, total_size, allocated_size, active_size, requested_size, stream,
segment_type, segment_pool_id, is_expandable, frames and blocks (address, size,
requested_size, state, frames); device_traces with action, addr (device_free for "oom"),
size, stream, time_us and frames; allocator_settings.  Frames are innermost first.

* ``oom_small.pickle``: written by hand, small enough to check every number by hand
  (the expected figures are in tests/test_snapshot.py).
* ``train_step_oom.pickle``: a 4-layer MLP training step driven through vramplan's allocator
  model (so segments, splits and addresses follow PyTorch's rules) with a 200 MiB capacity; the
  first AdamW step runs out of memory.
* ``expandable_no_oom.pickle``: the same step with ``expandable_segments:True``, no OOM, a
  ring-buffer trace that lost its first entries, a block pending free and C++ frames.
* bad inputs: ``not_a_pickle.pickle``, ``truncated.pickle``, ``wrong_structure.pickle``,
  ``missing_keys.pickle``, ``unsafe.pickle`` (references a global), ``bad_block.pickle``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from vramplan.alloc.caching import AllocatorOutOfMemory, Block, CachingAllocator

HERE = Path(__file__).resolve().parent
MiB = 2**20
KiB = 2**10
BASE = 0x7F0000000000

SITE = "/opt/conda/lib/python3.11/site-packages"


def fr(filename: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": filename, "line": line, "name": name}


# Stacks, innermost first, as torch records them with stacks="python".
FR_WEIGHTS = [fr(f"{SITE}/torch/nn/modules/module.py", 1326, "convert"),
              fr(f"{SITE}/torch/nn/modules/module.py", 942, "_apply"),
              fr(f"{SITE}/torch/nn/modules/module.py", 1340, "to"),
              fr("/home/user/train.py", 20, "main")]
FR_FORWARD = [fr(f"{SITE}/torch/nn/modules/linear.py", 125, "forward"),
              fr(f"{SITE}/torch/nn/modules/module.py", 1762, "_call_impl"),
              fr(f"{SITE}/torch/nn/modules/module.py", 1751, "_wrapped_call_impl"),
              fr("/home/user/model.py", 42, "forward"),
              fr(f"{SITE}/torch/nn/modules/module.py", 1762, "_call_impl"),
              fr("/home/user/train.py", 28, "main")]
FR_LOSS = [fr(f"{SITE}/torch/nn/functional.py", 3494, "cross_entropy"),
           fr("/home/user/train.py", 29, "main")]
FR_BACKWARD = [fr(f"{SITE}/torch/autograd/graph.py", 824, "_engine_run_backward"),
               fr(f"{SITE}/torch/autograd/__init__.py", 353, "backward"),
               fr(f"{SITE}/torch/_tensor.py", 648, "backward"),
               fr("/home/user/train.py", 30, "main")]
FR_OPTIM = [fr(f"{SITE}/torch/optim/adamw.py", 177, "_init_group"),
            fr(f"{SITE}/torch/optim/adamw.py", 223, "step"),
            fr(f"{SITE}/torch/optim/optimizer.py", 493, "wrapper"),
            fr("/home/user/train.py", 35, "main")]
FR_UNWIND = [fr("/home/user/train.py", 36, "main")]
CPP = [fr("??", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"),
       fr("??", 0, "torch::autograd::AccumulateGrad::apply")]

SETTINGS_DEFAULT = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": 2**64 - 1,
                    "garbage_collection_threshold": 0.0, "expandable_segments": False,
                    "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                    "pinned_use_cuda_host_register": False, "roundup_power2_divisions": {}}


def block(address: int, size: int, requested: int, state: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": requested, "state": state, "frames": frames}


def segment(address: int, blocks: list[dict[str, Any]], segment_type: str, frames: list[dict[str, Any]],
            expandable: bool = False) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = [b for b in blocks if b["state"] != "inactive"]
    return {"device": 0, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": sum(b["size"] for b in active),
            "requested_size": sum(b["requested_size"] for b in active), "stream": 0,
            "segment_type": segment_type, "segment_pool_id": (0, 0), "is_expandable": expandable,
            "frames": frames, "blocks": blocks}


class Trace:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def add(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        e: dict[str, Any] = {"action": action}
        e["device_free" if action == "oom" else "addr"] = addr
        e.update(size=size, stream=0, time_us=1_700_000_000_000_000 + 10 * len(self.entries), frames=frames)
        self.entries.append(e)


def oom_small() -> dict[str, Any]:
    """Hand-built: the arithmetic is in tests/test_snapshot.py."""
    s0, s1, s2, s3, s4 = BASE, BASE + 32 * MiB, BASE + 64 * MiB, BASE + 160 * MiB, BASE + 192 * MiB
    t = Trace()
    t.add("segment_alloc", s0, 10 * MiB, FR_FORWARD)         # 0
    t.add("alloc", s0, 10 * MiB, FR_FORWARD)                 # 1  scratch
    t.add("free_requested", s0, 10 * MiB, FR_FORWARD)        # 2
    t.add("free_completed", s0, 10 * MiB, FR_FORWARD)        # 3
    t.add("segment_alloc", s1, 20 * MiB, FR_WEIGHTS)         # 4
    t.add("alloc", s1, 8 * MiB, FR_WEIGHTS)                  # 5  W1
    t.add("segment_alloc", s2, 64 * MiB, FR_WEIGHTS)         # 6
    t.add("alloc", s2, 64 * MiB, FR_WEIGHTS)                 # 7  W2
    t.add("alloc", s1 + 8 * MiB, 6 * MiB, FR_FORWARD)        # 8  A1
    t.add("alloc", s1 + 14 * MiB, 6 * MiB, FR_FORWARD)       # 9  T
    t.add("snapshot", 0, 84 * MiB, [])                       # 10
    t.add("free_requested", s1 + 14 * MiB, 6 * MiB, FR_FORWARD)   # 11
    t.add("free_completed", s1 + 14 * MiB, 6 * MiB, FR_FORWARD)   # 12
    t.add("segment_alloc", s3, 2 * MiB, FR_BACKWARD)         # 13
    t.add("alloc", s3, 524_000, FR_BACKWARD)                 # 14 g1
    t.add("alloc", s3 + 512 * KiB, 1 * MiB, FR_BACKWARD)     # 15 q
    t.add("alloc", s3 + 1536 * KiB, 512 * KiB, FR_BACKWARD)  # 16 p
    t.add("free_requested", s3 + 512 * KiB, 1 * MiB, FR_BACKWARD)   # 17
    t.add("free_completed", s3 + 512 * KiB, 1 * MiB, FR_BACKWARD)   # 18
    t.add("free_requested", s3 + 1536 * KiB, 512 * KiB, FR_BACKWARD)  # 19 p pending (other stream)
    t.add("segment_alloc", s4, 40 * MiB, FR_BACKWARD)        # 20
    t.add("alloc", s4, 40 * MiB, FR_BACKWARD)                # 21 X
    t.add("free_requested", s4, 40 * MiB, FR_BACKWARD)       # 22
    t.add("free_completed", s4, 40 * MiB, FR_BACKWARD)       # 23
    t.add("alloc", s4, 32 * MiB, FR_BACKWARD)                # 24 G
    t.add("segment_free", s0, 10 * MiB, FR_OPTIM)            # 25 release_cached_blocks
    t.add("oom", 30 * MiB, 40 * MiB, FR_OPTIM)               # 26
    t.add("free_requested", s1 + 8 * MiB, 6 * MiB, FR_UNWIND)  # 27 A1 dies while unwinding
    t.add("free_completed", s1 + 8 * MiB, 6 * MiB, FR_UNWIND)  # 28
    segments = [
        segment(s1, [block(s1, 8 * MiB, 8 * MiB, "active_allocated", FR_WEIGHTS),
                     block(s1 + 8 * MiB, 12 * MiB, 0, "inactive", [])], "large", FR_WEIGHTS),
        segment(s2, [block(s2, 64 * MiB, 64 * MiB, "active_allocated", FR_WEIGHTS)], "large", FR_WEIGHTS),
        segment(s3, [block(s3, 512 * KiB, 524_000, "active_allocated", FR_BACKWARD),
                     block(s3 + 512 * KiB, 1 * MiB, 0, "inactive", []),
                     block(s3 + 1536 * KiB, 512 * KiB, 512 * KiB, "active_pending_free", FR_BACKWARD)],
                "small", FR_BACKWARD),
        segment(s4, [block(s4, 32 * MiB, 32 * MiB, "active_allocated", FR_BACKWARD),
                     block(s4 + 32 * MiB, 8 * MiB, 0, "inactive", [])], "large", FR_BACKWARD),
    ]
    return {"segments": segments, "device_traces": [t.entries], "allocator_settings": dict(SETTINGS_DEFAULT)}


class Program:
    """Drives the allocator model and records what torch would: trace entries and block stacks."""

    def __init__(self, expandable: bool, capacity: int | None, cpp_frames: bool = False) -> None:
        self.alloc = CachingAllocator(expandable_segments=expandable, capacity_bytes=capacity)
        self.trace = Trace()
        self.frames: dict[int, list[dict[str, Any]]] = {}    # block address -> allocation stack
        self.seg_frames: dict[int, list[dict[str, Any]]] = {}
        self.cpp = cpp_frames
        self.context: list[dict[str, Any]] = []
        self.alloc.on_device_event = self._device_event
        self.capacity = capacity

    def _stack(self, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return (CPP[:1] + frames) if self.cpp else frames

    def _device_event(self, action: str, addr: int, size: int) -> None:
        if action in ("segment_alloc", "segment_map"):
            self.seg_frames.setdefault(addr, self._stack(self.context))
        self.trace.add(action, addr, size, self._stack(self.context))

    def malloc(self, nbytes: int, frames: list[dict[str, Any]]) -> Block:
        self.context = frames
        try:
            b = self.alloc.malloc(nbytes)
        except AllocatorOutOfMemory as exc:
            assert self.capacity is not None
            free = self.capacity - exc.info.reserved_bytes
            self.trace.add("oom", free, exc.info.rounded_bytes, self._stack(frames))
            raise
        self.frames[b.addr] = self._stack(frames)
        self.trace.add("alloc", b.addr, nbytes, self._stack(frames))
        return b

    def free(self, b: Block, frames: list[dict[str, Any]], complete: bool = True) -> None:
        self.trace.add("free_requested", b.addr, b.requested, self._stack(frames))
        if complete:
            self.trace.add("free_completed", b.addr, b.requested, self._stack(frames))
            self.alloc.free(b)

    def dump(self, pending: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        out = []
        for s in self.alloc.segment_views():
            blocks = []
            for bv in s.blocks:
                if bv.state == "allocated":
                    state = "active_pending_free" if bv.address in pending else "active_allocated"
                    blocks.append(block(bv.address, bv.size, bv.requested_size, state,
                                        self.frames.get(bv.address, [])))
                else:
                    blocks.append(block(bv.address, bv.size, 0, "inactive", []))
            seg_fr = self.seg_frames.get(s.address, [])
            out.append(segment(s.address, blocks, s.segment_type, seg_fr, s.is_expandable))
        return out


def train_step(p: Program) -> tuple[list[Block], Block]:
    """4 x Linear(1024 -> 4096) fp32 with bias, a batch whose activations are 8 MiB per layer."""
    params: list[Block] = []
    for _ in range(4):
        params.append(p.malloc(16 * MiB, FR_WEIGHTS))   # weight 4096 x 1024 x 4 B
        params.append(p.malloc(16 * KiB, FR_WEIGHTS))   # bias 4096 x 4 B
    acts = [p.malloc(8 * MiB, FR_FORWARD) for _ in range(4)]
    loss = p.malloc(4, FR_LOSS)
    grads: list[Block] = []
    for layer in reversed(range(4)):
        grads.append(p.malloc(16 * MiB, FR_BACKWARD))
        grads.append(p.malloc(16 * KiB, FR_BACKWARD))
        if layer > 0:
            grad_in = p.malloc(8 * MiB, FR_BACKWARD)
            p.free(grad_in, FR_BACKWARD)
        p.free(acts[layer], FR_BACKWARD)
    return params, loss


def train_step_oom() -> dict[str, Any]:
    p = Program(expandable=False, capacity=200 * MiB)
    params, _ = train_step(p)
    try:
        for w in params:                                   # AdamW's first step: lazy state init
            p.malloc(w.requested, FR_OPTIM)                # exp_avg
            p.malloc(w.requested, FR_OPTIM)                # exp_avg_sq
    except AllocatorOutOfMemory:
        pass
    else:  # pragma: no cover - the fixture must hold an OOM
        raise AssertionError("expected an OOM")
    settings = dict(SETTINGS_DEFAULT)
    return {"segments": p.dump(), "device_traces": [p.trace.entries], "allocator_settings": settings}


def expandable_no_oom(keep_last: int = 40) -> dict[str, Any]:
    p = Program(expandable=True, capacity=None, cpp_frames=True)
    params, loss = train_step(p)
    states = []
    for w in params:
        states.append(p.malloc(w.requested, FR_OPTIM))
        states.append(p.malloc(w.requested, FR_OPTIM))
    p.free(loss, FR_UNWIND, complete=False)                # still in use by another stream
    settings = dict(SETTINGS_DEFAULT, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
                    expandable_segments=True)
    return {"segments": p.dump(pending=frozenset({loss.addr})),
            "device_traces": [p.trace.entries[-keep_last:]], "allocator_settings": settings}


def bad_inputs() -> dict[str, bytes]:
    good = pickle.dumps(oom_small(), protocol=4)
    bad_block = oom_small()
    del bad_block["segments"][0]["blocks"][0]["size"]
    return {
        "not_a_pickle.pickle": b"this is a text file, not a memory snapshot\n",
        "truncated.pickle": good[: len(good) // 2],
        "wrong_structure.pickle": pickle.dumps([1, 2, 3], protocol=4),
        "missing_keys.pickle": pickle.dumps({"segments": []}, protocol=4),
        # calls builtins.len('abc') when loaded unsafely: must be refused, not executed
        "unsafe.pickle": b"cbuiltins\nlen\n(S'abc'\ntR.",
        "bad_block.pickle": pickle.dumps(bad_block, protocol=4),
    }


def build() -> dict[str, bytes]:
    files = {
        "oom_small.pickle": pickle.dumps(oom_small(), protocol=4),
        "train_step_oom.pickle": pickle.dumps(train_step_oom(), protocol=4),
        "expandable_no_oom.pickle": pickle.dumps(expandable_no_oom(), protocol=4),
    }
    files.update(bad_inputs())
    return files


def main() -> None:
    for name, content in build().items():
        (HERE / name).write_bytes(content)
        print(f"wrote {name} ({len(content):,} bytes)")


if __name__ == "__main__":
    main()
