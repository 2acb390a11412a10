"""One test per GPU row, plus lookup behaviour."""

from __future__ import annotations

import pytest

from vramplan.catalog.gpus import list_gpus, resolve_gpu
from vramplan.errors import ScenarioError, UnknownNameError
from vramplan.units import GB, GiB

ROWS = list_gpus()
REQUIRED = ["V100-16GB", "V100-32GB", "T4", "A10G", "A100-40GB", "A100-80GB", "L4", "L40S", "RTX-A6000",
            "RTX-3090", "RTX-4090", "RTX-5090", "H100-SXM", "H100-PCIe", "H100-NVL", "H200", "GH200", "B200",
            "MI250X", "MI300X"]


def test_at_least_20() -> None:
    assert len(ROWS) >= 20
    names = {g.name for g in ROWS}
    assert set(REQUIRED) <= names


@pytest.mark.parametrize("gpu", ROWS, ids=[g.name for g in ROWS])
def test_row(gpu) -> None:  # type: ignore[no-untyped-def]
    assert gpu.sources, "every row needs a source"
    assert gpu.nominal_memory_bytes > 0
    assert gpu.hbm_bytes_per_s > 0
    assert gpu.sm_count > 0 or gpu.notes, "an unknown SM count must be explained"
    if gpu.total_memory_bytes:
        # usable (totalGlobalMem) never exceeds the physical HBM, which is the marketed number of GiB
        # (NVIDIA's "80GB" is 80 GiB) or, for a few cards, the marketed GB
        assert gpu.total_memory_bytes <= max(gpu.nominal_memory_bytes, gpu.nominal_memory_bytes // GB * GiB)
        assert gpu.total_memory_bytes > 0.85 * gpu.nominal_memory_bytes // GB * GB


# GPUs of published measurements that did not resolve before, by the names those measurements and
# nvidia-smi / torch.cuda.get_device_name use, with the catalog row each must land on
PUBLISHED_NAMES = {
    "RTX 3060 (12 GB)": "RTX-3060", "NVIDIA GeForce RTX 3060": "RTX-3060",
    "RTX 4080": "RTX-4080", "NVIDIA GeForce RTX 4080": "RTX-4080",
    "P100": "P100-PCIe", "Tesla P100-PCIE-16GB": "P100-PCIe", "Tesla P100-SXM2-16GB": "P100-SXM2",
    "H800": "H800-SXM", "NVIDIA H800": "H800-SXM", "NVIDIA H800 PCIe": "H800-PCIe",
    "A800": "A800-80GB", "NVIDIA A800-SXM4-80GB": "A800-80GB", "NVIDIA A800 80GB PCIe": "A800-80GB-PCIe",
    "MI210": "MI210", "AMD Instinct MI210": "MI210",
    "RTX 4060 Ti (16 GB)": "RTX-4060-Ti-16GB", "NVIDIA GeForce RTX 4060 Ti 16GB": "RTX-4060-Ti-16GB",
    "RTX A5000": "RTX-A5000", "NVIDIA RTX A5000": "RTX-A5000",
    "RTX 3080 12GB": "RTX-3080-12GB", "NVIDIA GeForce RTX 3080": "RTX-3080", "NVIDIA GeForce RTX 3080 Ti": "RTX-3080-Ti",
    "NVIDIA GeForce RTX 3090 Ti": "RTX-3090-Ti", "NVIDIA GeForce RTX 4070 Ti": "RTX-4070-Ti",
    "NVIDIA GeForce RTX 4070 Ti SUPER": "RTX-4070-Ti-SUPER", "NVIDIA GeForce RTX 4080 SUPER": "RTX-4080-SUPER",
    "NVIDIA GeForce RTX 2080 Ti": "RTX-2080-Ti", "NVIDIA TITAN RTX": "TITAN-RTX", "TITAN RTX": "TITAN-RTX",
    "NVIDIA GeForce GTX 1080 Ti": "GTX-1080-Ti", "Tesla P40": "P40", "Tesla V100S-PCIE-32GB": "V100S-32GB",
    "NVIDIA A30": "A30", "NVIDIA A2": "A2", "NVIDIA RTX A4000": "RTX-A4000", "NVIDIA A800 40GB Active": "A800-40GB",
    "NVIDIA L20": "L20", "AMD Instinct MI100": "MI100",
}


@pytest.mark.parametrize(("name", "row"), PUBLISHED_NAMES.items())
def test_published_gpu_names_resolve(name: str, row: str) -> None:
    assert resolve_gpu(name).name == row


def test_name_normalisation_keeps_old_names() -> None:
    # brackets and "12 GB" vs "12GB" are spelling, not identity; existing aliases still resolve
    assert resolve_gpu("A100 (80 GB)").name == resolve_gpu("a100-80gb").name == "A100-80GB"
    assert resolve_gpu("NVIDIA A100 80GB PCIe").name == "A100-80GB-PCIe"


def test_architectures_match_compute_capability() -> None:
    nvidia = {"pascal": ("6.0", "6.1"), "volta": ("7.0",), "turing": ("7.5",), "ampere": ("8.0", "8.6"),
              "ada": ("8.9",), "hopper": ("9.0",), "blackwell": ("10.0", "10.3", "12.0", "12.1")}
    amd = {"cdna1": ("gfx908",), "cdna2": ("gfx90a",), "cdna3": ("gfx942",), "cdna4": ("gfx950",)}
    for g in ROWS:
        table = nvidia if g.vendor == "nvidia" else amd
        assert g.compute_capability in table[g.architecture], g.name


def test_pascal_totals_are_the_cited_printouts() -> None:
    # P100 PCIe on Kaggle, torch total_memory=16276MB: 16,276 x 1,048,576 = 17,066,622,976
    assert resolve_gpu("Tesla P100-PCIE-16GB").total_memory_bytes == 17_066_622_976
    # P40 deviceQuery '22919 MBytes (24032378880 bytes)': below 24 GiB = 25,769,803,776 (GDDR5 ECC)
    assert resolve_gpu("Tesla P40").total_memory_bytes == 24_032_378_880


def test_oom_message_totals_are_the_lower_rounding_end() -> None:
    # A800 80GB: "total capacity of 79.33 GiB" -> 79.325 GiB = 85,174,570,188.8 B -> floor to MiB:
    # 85,174,570,188 // 1,048,576 = 81,228 MiB = 85,173,731,328 B
    assert resolve_gpu("NVIDIA A800-SXM4-80GB").total_memory_bytes == 81_228 * 1_048_576 == 85_173_731_328
    # A30: 23.525 GiB = 25,259,776,409.6 B -> 24,089 MiB = 25,259,147,264 B
    assert resolve_gpu("NVIDIA A30").total_memory_bytes == 24_089 * 1_048_576 == 25_259_147_264


def test_no_printout_falls_back_to_nominal() -> None:
    # H800: no published totalGlobalMem, so the loader uses the marketed 80 x 10^9 B (74.5 GiB)
    assert resolve_gpu("NVIDIA H800").total_memory_bytes == 80_000_000_000


def test_a100_80gb_total_memory() -> None:
    # torch reports 79.25 GiB for the A100 80GB SXM (85,100,068,864 B from deviceQuery)
    assert resolve_gpu("nvidia a100-sxm4-80gb").total_memory_bytes == 85_100_068_864


def test_typo() -> None:
    with pytest.raises(UnknownNameError) as exc:
        resolve_gpu("H10O")
    assert exc.value.suggestions


def test_ambiguous_4060_ti_is_not_guessed() -> None:
    # torch prints "NVIDIA GeForce RTX 4060 Ti" for the 8 GB and the 16 GB card: resolving it to the
    # 16 GB row would be optimistic, so the name is refused and the 16 GB row suggested
    with pytest.raises(ScenarioError) as exc:
        resolve_gpu("NVIDIA GeForce RTX 4060 Ti")
    assert "'RTX-4060-Ti-16GB'" in str(exc.value) and "capacity_gib" in str(exc.value)


def test_names_without_separators_resolve() -> None:
    # "rtx4090" and "H100 SXM5 80GB" are the catalog's "rtx-4090" and "h100-sxm5-80gb" without separators
    from vramplan.catalog.gpus import resolve_gpu

    assert resolve_gpu("rtx4090").name == "RTX-4090"
    assert resolve_gpu("H100 SXM5 80GB").name == "H100-SXM"


def test_ambiguous_name_refused_in_any_spelling() -> None:
    import pytest

    from vramplan.catalog.gpus import resolve_gpu
    from vramplan.errors import ScenarioError

    with pytest.raises(ScenarioError, match="names two cards"):
        resolve_gpu("RTX4060Ti")


def test_bare_family_name_is_reported_as_an_assumption() -> None:
    # "a100" resolves to the 80 GB card; the report says so and names the smaller variant
    from vramplan import estimate

    doc = {"model": "meta-llama/Llama-2-7b-hf", "task": "inference", "hardware": {"gpu": "a100"}}
    notes = estimate(doc).assumptions
    assert any("'a100' taken as A100-80GB" in a and "A100-40GB" in a for a in notes)
    named = estimate({**doc, "hardware": {"gpu": "A100-80GB"}}).assumptions
    assert not any("taken as" in a for a in named)


# the GPUs people ask about in 2025-2026, by the names torch / nvidia-smi / product pages use
NEW_ROWS = {
    "DGX Spark": "GB10", "NVIDIA GB10": "GB10", "RTX 5080": "RTX-5080", "NVIDIA GeForce RTX 5070 Ti": "RTX-5070-Ti",
    "RTX 5070": "RTX-5070", "RTX 5060 Ti 16GB": "RTX-5060-Ti-16GB",
    "NVIDIA GeForce RTX 5090 Laptop GPU": "RTX-5090-Laptop", "RTX 5080 Laptop": "RTX-5080-Laptop",
    "RTX 5070 Ti Laptop": "RTX-5070-Ti-Laptop", "RTX 5070 Laptop": "RTX-5070-Laptop",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "RTX-PRO-6000-Blackwell",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX-PRO-6000-Blackwell-Server",
    "B300": "B300", "GB300": "GB300", "NVIDIA H20": "H20", "NVIDIA L20": "L20", "MI325X": "MI325X",
    "AMD Instinct MI355X": "MI355X",
}


@pytest.mark.parametrize(("name", "row"), NEW_ROWS.items())
def test_new_gpu_rows_resolve(name: str, row: str) -> None:
    assert resolve_gpu(name).name == row


def test_rtx_5060_ti_total_is_the_cited_printout() -> None:
    # deviceQuery's cudaDeviceProp.totalGlobalMem for 'NVIDIA GeForce RTX 5060 Ti' (Jumperkables/cuda-benchmarking):
    # 16,617,897,984 bytes = 16 GiB (17,179,869,184) - 561,971,200 (535.9 MiB); above 8 GiB, so the 16 GB card, and
    # above the 16,000,000,000 the derived rule would give.
    g = resolve_gpu("RTX 5060 Ti 16GB")
    assert g.total_memory_bytes == 16_617_897_984 == 2**34 - 561_971_200
    assert g.total_memory_bytes > g.nominal_memory_bytes


def test_derived_totals_are_the_marketed_decimal_capacity() -> None:
    # a row without a published torch total_memory says so (total_memory_derived) and holds x * 10^9 bytes:
    # RTX 5070 "12 GB" -> 12,000,000,000, below 12 GiB = 12,884,901,888 less any driver reserve
    g = resolve_gpu("RTX 5070")
    assert g.total_memory_bytes == g.nominal_memory_bytes == 12_000_000_000
    assert resolve_gpu("RTX 5090 Laptop").total_memory_bytes == 24_000_000_000


def test_printed_totals_of_the_new_cards() -> None:
    # RTX 5080: torch's repr prints total_memory // 2^20 = 16302 "MB"; the lower end 16,302 x 1,048,576 is kept
    assert resolve_gpu("RTX 5080").total_memory_bytes == 16_302 * 2**20 == 17_093_885_952
    # GB10: cuDeviceTotalMem_v2 = 130,602,405,888 B = 121.63 GiB, below vLLM's cudaMemGetInfo total 121.69 GiB
    gb10 = resolve_gpu("DGX Spark").total_memory_bytes
    assert gb10 == 130_602_405_888 and round(gb10 / 2**30, 2) == 121.63
    assert gb10 < 121.685 * 2**30  # below the lowest value vLLM's "121.69 GiB" can stand for
    # B300: the run's own device_total_bytes, 287,428,771,840 = 267.69 GiB, below the marketed 288 x 10^9 (which the
    # decimal fallback would have taken: optimistic by 571,228,160 B); GB300 takes the B300's figure
    b300 = resolve_gpu("B300")
    assert b300.total_memory_bytes == 287_428_771_840 and round(287_428_771_840 / 2**30, 2) == 267.69
    assert b300.nominal_memory_bytes - b300.total_memory_bytes == 571_228_160
    assert resolve_gpu("GB300").total_memory_bytes == b300.total_memory_bytes
    # the RTX PRO 6000 Workstation Edition takes the Server Edition's printed total (same 97,887 MiB in nvidia-smi)
    assert resolve_gpu("RTX PRO 6000 Blackwell Workstation Edition").total_memory_bytes == 97_245 * 2**20


def test_rtx_5080_laptop_total_is_the_printed_banner() -> None:
    # Unsloth prints round(total_memory / 1024**3, 3) = 15.471 on native Linux: [15.4705, 15.4715) GiB =
    # [16,611,322,888, 16,612,396,630) B holds one whole MiB count, 15,842 (15,842 / 1,024 = 15.47070; 15,841 gives
    # 15.46973 -> 15.470): 15,842 x 1,048,576 = 16,611,540,992 = 16 GiB - 542 MiB, above the 16 x 10^9 fallback
    g = resolve_gpu("RTX 5080 Laptop")
    assert g.total_memory_bytes == 15_842 * 2**20 == 16_611_540_992 == 2**34 - 542 * 2**20
    assert round(g.total_memory_bytes / 2**30, 3) == 15.471 and round((15_841 * 2**20) / 2**30, 3) != 15.471
    assert g.total_memory_bytes > g.nominal_memory_bytes


def test_a_card_sold_with_two_memory_sizes_is_refused_by_its_bare_name() -> None:
    # torch prints "NVIDIA GeForce RTX 5060 Ti" for the 8 GB and the 16 GB card alike
    with pytest.raises(ScenarioError, match="two cards"):
        resolve_gpu("NVIDIA GeForce RTX 5060 Ti")


@pytest.mark.parametrize(("name", "row"), [
    ("A10G-24GB", "A10G"), ("a10g_24gb", "A10G"), ("A10G 24GB", "A10G"), ("L4-24GB", "L4"),
    ("RTX 4090-24GB", "RTX-4090"), ("RTX-5090-32GB", "RTX-5090"), ("A100-40GB", "A100-40GB"),
    ("A100-80GB", "A100-80GB"), ("H100-80GB", "H100-SXM"), ("MI300X-192GB", "MI300X"),
])
def test_a_size_suffix_resolves_to_the_row(name: str, row: str) -> None:
    assert resolve_gpu(name).name == row


@pytest.mark.parametrize("name", ["A10G-40GB", "H100-94GB", "L4-48GB"])
def test_a_size_suffix_that_does_not_match_the_row_is_unknown(name: str) -> None:
    # an 'H100-94GB' (the NVL's memory) must not be answered with the 80 GB row's memory
    with pytest.raises(UnknownNameError):
        resolve_gpu(name)


# Rows without a half-precision tensor rate, each for a stated reason: Pascal has no tensor cores (P40 and
# GTX 1080 Ti run FP16 at 1/64 of FP32), and NVIDIA publishes for GB10 only a sparse FP4 figure that does not fix
# its FP16 rate.  Every other row needs one, since the planner ranks setups by speed and refuses a GPU without it.
NO_HALF_RATE = {"P40", "GTX-1080-Ti", "GB10"}


@pytest.mark.parametrize("gpu", ROWS, ids=[g.name for g in ROWS])
def test_tensor_rows_have_a_half_precision_rate(gpu) -> None:  # type: ignore[no-untyped-def]
    rates = gpu.dense_flops_per_s
    has_half = bool(rates.get("bf16") or rates.get("fp16"))
    assert has_half == (gpu.name not in NO_HALF_RATE)


def test_blackwell_rates_follow_the_published_figures() -> None:
    rates = {g.name: g.dense_flops_per_s for g in ROWS}
    # GeForce: NVIDIA's AI TOPS are FP4 with 2:4 sparsity; dense FP16 with FP32 accumulate = AI TOPS / 16.
    # RTX 5080: 1801 / 16 = 112.5625 TF; RTX 5070 Laptop: 798 / 16 = 49.875 TF; the RTX 5090 row's 3352 / 16 = 209.5 TF.
    assert rates["RTX-5080"]["bf16"] == 112_562_500_000_000
    assert rates["RTX-5070-Laptop"]["bf16"] == 49_875_000_000_000
    assert rates["RTX-5090"]["bf16"] == 3352 * 10**12 // 16
    # RTX 5060 Ti: 36 SMs x 512 FLOP per SM per clock x 2.572 GHz = 47,407,104,000,000.
    assert rates["RTX-5060-Ti-16GB"]["bf16"] == 36 * 512 * 2_572_000_000
    # HGX B300: 36 PF FP16/BF16 with sparsity for 8 GPUs -> 36 / 8 / 2 = 2.25 PF dense per GPU.
    assert rates["B300"]["bf16"] == 36 * 10**15 // 16
    # MI355X: 256 CUs x 4096 FP16 FLOP per CU per clock x 2.4 GHz = 2,516,582,400,000,000.
    assert rates["MI355X"]["bf16"] == 256 * 4096 * 2_400_000_000


@pytest.mark.parametrize(("name", "gib", "mib"), [
    # PyTorch's out-of-memory message prints the total to 0.01 GiB: the row holds the smallest whole MiB that
    # rounds to it, ceil((x - 0.005) x 1024) MiB
    ("L40", 44.40, 45_461),          # QwenLM/Qwen3-VL issue 2097: ceil(44.395 x 1024 = 45,460.48)
    ("L20", 44.53, 45_594),          # Tencent-Hunyuan/HunyuanCustom issue 36: ceil(45,593.6)
    ("RTX-A4000", 15.61, 15_980),    # DengKaiCQ/VGGT-Long issue 6: ceil(15,979.52)
    ("RTX-4070-Ti", 11.70, 11_976),  # Kwai-Kolors/Kolors issue 11: ceil(11,975.68)
    ("MI325X", 255.98, 262_119),     # vllm-project/vllm issue 41962 (ROCm: "HIP out of memory"): ceil(262,118.4)
    ("MI355X", 287.98, 294_887),     # a Kimi-K3 on 8 x MI355X playbook (HIP): ceil(287.975 x 1024 = 294,886.4)
    ("RTX-PRO-6000-Blackwell-Server", 94.97, 97_245),  # an SM120 set-up note: ceil(94.965 x 1024 = 97,244.16)
])
def test_totals_read_off_out_of_memory_messages(name: str, gib: float, mib: int) -> None:
    g = resolve_gpu(name)
    assert g.total_memory_bytes == mib * 2**20
    assert round(g.total_memory_bytes / 2**30, 2) == gib  # prints back as the message did
    assert (mib - 1) / 1024 < gib - 0.005 <= mib / 1024  # the smallest such MiB


def test_48gb_gddr6_ecc_cards_are_below_the_marketed_capacity() -> None:
    # the marketed 48 x 10^9 B (44.70 GiB) the L40 and L20 rows held before is above what both report (44.40 and
    # 44.53 GiB): ECC on a GDDR6 card takes 1/16 of it before the driver's reserve
    for name in ("L40", "L20", "L40S"):
        g = resolve_gpu(name)
        assert g.total_memory_bytes < 48 * 10**9 < g.nominal_memory_bytes + 1
    # the A2 (16 GB GDDR6, ECC on) takes the T4's printed total, not 16 x 10^9
    assert resolve_gpu("A2").total_memory_bytes == resolve_gpu("T4").total_memory_bytes == 15_655_829_504
