from vramplan.units import GB, GiB, bytes_for, canonical_dtype, dtype_bits, fmt_bytes


def test_gb_and_gib_are_distinct() -> None:
    assert GB == 1_000_000_000
    assert GiB == 1_073_741_824
    # an "80 GB" A100 (80 GiB of HBM) in decimal GB: 80 * 2**30 / 1e9 = 85.899...
    assert round(80 * GiB / GB, 3) == 85.899


def test_dtype_table() -> None:
    assert dtype_bits("bfloat16") == 16
    assert dtype_bits("torch.float32") == 32
    assert canonical_dtype("float8_e4m3fn") == "fp8"
    # 7 nf4 values = 28 bits -> 4 whole bytes
    assert bytes_for(7, "nf4") == 4


def test_fmt() -> None:
    assert fmt_bytes(GiB) == "1.00 GiB"
    assert fmt_bytes(GB, "GB") == "1.00 GB"
