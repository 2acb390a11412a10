"""Units, defined once.

Bytes are integers everywhere inside vramplan; the unit is in the name
(``weights_bytes``, ``hbm_bytes_per_s``).  Decimal and binary prefixes are
never mixed: a GB is 10**9 bytes (what vendors print on the box), a GiB is
2**30 bytes (what ``nvidia-smi`` and PyTorch's OOM messages print).
An "80 GB" A100 therefore holds 80 GiB of HBM, of which PyTorch reports
``total_memory`` = 79.25 GiB = 85.1 GB.
"""

from __future__ import annotations

from typing import Final

KB: Final = 10**3
MB: Final = 10**6
GB: Final = 10**9
TB: Final = 10**12
KiB: Final = 2**10
MiB: Final = 2**20
GiB: Final = 2**30

# Storage size of one element, in bits.  One table for the whole project:
# quantized formats are listed by the bits of their packed payload only; the
# scales and zero points they also need are modelled in analytic/weights.py.
DTYPE_BITS: Final[dict[str, int]] = {
    "fp64": 64,
    "fp32": 32,
    "tf32": 32,  # tf32 is a matmul mode; tensors are stored as fp32
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,  # e4m3 / e5m2
    "int8": 8,
    "uint8": 8,
    "bool": 8,  # torch.bool occupies one byte per element
    "int4": 4,
    "nf4": 4,
    "fp4": 4,
    "int32": 32,
    "int64": 64,
}

DTYPE_ALIASES: Final[dict[str, str]] = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float64": "fp64",
}


def canonical_dtype(name: str) -> str:
    """Map a dtype spelling (``bfloat16``, ``torch.float16``, ``bf16``) to the table's key."""
    key = name.strip().lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BITS:
        raise KeyError(name)
    return key


def dtype_bits(name: str) -> int:
    return DTYPE_BITS[canonical_dtype(name)]


def bytes_for(numel: int, dtype: str) -> int:
    """Bytes to store ``numel`` elements of ``dtype``, rounded up to a whole byte.

    >>> bytes_for(7, "nf4")   # 28 bits -> 4 bytes
    4
    """
    return (numel * dtype_bits(dtype) + 7) // 8


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(n: int, multiple: int) -> int:
    return ceil_div(n, multiple) * multiple


def fmt_bytes(n: float, unit: str = "GiB", digits: int = 2) -> str:
    """Human text for a byte count in a stated unit (GiB by default, as nvidia-smi)."""
    scale = {"B": 1, "KB": KB, "MB": MB, "GB": GB, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TB": TB}[unit]
    return f"{n / scale:,.{digits}f} {unit}"
