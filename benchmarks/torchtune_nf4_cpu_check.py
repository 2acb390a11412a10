"""CPU check of torchao's NF4Tensor (the QLoRA weight of framework torchtune): its stored bytes, and the live
bytes of its dequantization, against ``facts/torchtune.py``.

torchao is not a vramplan dependency: install the release torchtune pinned into a scratch folder and point
``TORCHAO_PATH`` at it (CPU PyTorch is enough)::

    python -m pip install --no-deps --target /tmp/torchao-0.7.0 torchao==0.7.0
    TORCHAO_PATH=/tmp/torchao-0.7.0 PYTHONPATH=src python benchmarks/torchtune_nf4_cpu_check.py

Every storage a dispatched op returns is tracked with a weakref finalizer, so the peak is the most bytes alive
at once inside ``NF4Tensor.get_original_weight`` (``weight.to(torch.bfloat16)``).  Result with torchao 0.7.0 and
torch 2.13 (CPU): 1,024 x 512 stores 270,434 B and peaks at 7,364,672 B; 4,096 x 1,024 stores 2,163,234 B and
peaks at 58,917,376 B, the values of ``torchao_nf4_bytes`` and ``torchao_nf4_dequant_peak_bytes``.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.environ.get("TORCHAO_PATH", "/tmp/torchao-0.7.0"))
from torchao.dtypes.nf4tensor import to_nf4  # after the path above

from vramplan.facts.torchtune import torchao_nf4_bytes, torchao_nf4_dequant_peak_bytes


class LiveBytes(TorchDispatchMode):
    """The bytes of the plain tensors' storages alive at once, and their peak, while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def _track(self, t: Any) -> None:
        if type(t) is not torch.Tensor:
            return
        st = t.untyped_storage()
        key, n = st.data_ptr(), st.nbytes()
        if key in self.seen or n == 0:
            return
        self.seen.add(key)
        self.live += n
        self.peak = max(self.peak, self.live)

        def done(k: int = key, nbytes: int = n) -> None:
            self.live -= nbytes
            self.seen.discard(k)

        weakref.finalize(st, done)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            self._track(o)
        return out


def main() -> int:
    bad = 0
    for rows, cols in ((1024, 512), (4096, 1024)):
        n = rows * cols
        q = to_nf4(torch.randn(rows, cols, dtype=torch.bfloat16))
        stored = sum(getattr(q, a).numel() * getattr(q, a).element_size()
                     for a in ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4"))
        mode = LiveBytes()
        with mode:
            q.to(torch.bfloat16)
        ok = stored == torchao_nf4_bytes(n) and mode.peak == torchao_nf4_dequant_peak_bytes(n)
        bad += not ok
        print(f"{rows} x {cols}: stored {stored:,} (facts {torchao_nf4_bytes(n):,}), dequantization peak "
              f"{mode.peak:,} (facts {torchao_nf4_dequant_peak_bytes(n):,}) {'ok' if ok else 'DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
