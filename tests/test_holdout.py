"""validation/holdout.yaml: loadable, cited, and disjoint from the sources of validation/published.yaml.

The holdout set is only useful while no engine has been fitted to it, so these tests guard what makes it a
holdout (every figure is cited and none of its sources is one the published set uses) and the conversions of
the quoted figures into bytes.  They do not run an engine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from vramplan.catalog.resolve import resolve
from vramplan.validate.dataset import Dataset, Entry, load_dataset

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = ROOT / "validation" / "holdout.yaml"
PUBLISHED = ROOT / "validation" / "published.yaml"

# A URL ends at whitespace, a quote or a closing bracket; trailing sentence punctuation is not part of it.
_URL = re.compile(r"https?://[^\s'\"()<>]+")


def _urls(text: str) -> set[str]:
    return {u.rstrip(".,;:") for u in _URL.findall(text)}


# a file of a GitHub repository at any ref: github.com/OWNER/REPO/blob/REF/PATH -> github.com/OWNER/REPO/PATH
_BLOB = re.compile(r"^https?://github\.com/([^/]+)/([^/]+)/(?:blob|tree|raw)/[^/]+/(.+?)(?:#.*)?$")


def _repo_files(urls: set[str]) -> set[str]:
    """The repository files among ``urls`` with the commit or tag dropped: the same page at two refs is one source."""
    return {f"{m[1]}/{m[2]}/{m[3]}".lower() for u in urls if (m := _BLOB.match(u))}


def _holdout() -> Dataset:
    return load_dataset(HOLDOUT)


def _by_id(entry_id: str) -> Entry:
    return next(e for e in _holdout().entries if e.id == entry_id)


# Each batch of the file, in order: (its number, its entries, the date in its marker line, the marker's wording, its
# least number of publications, whether its cited URLs must be new too: batch 2 was checked by source only).  Batch 1
# has no marker line; each later batch follows a comment line "# ---- batch N, collected DATE, WORDING".
_SCORED = "scored once before engine changes"
BATCH_ROWS: list[tuple[int, int, str, str, int, bool]] = [
    (1, 36, "", "", 0, False),
    (2, 26, "2026-11-26", _SCORED, 6, False),
    (3, 20, "2026-11-26", "not scored by the collector", 6, True),
    (4, 36, "2026-11-26", _SCORED, 10, True),
    (5, 55, "2026-11-26", _SCORED, 10, True),
    (6, 54, "2026-11-26", _SCORED, 10, True),
    (7, 41, "2026-11-26", _SCORED, 10, True),
    (8, 36, "2026-11-26", _SCORED, 10, True),
    (9, 30, "2026-11-26", _SCORED, 10, True),
    (10, 18, "2026-11-27", _SCORED, 7, True),
    (11, 32, "2026-11-27", _SCORED, 13, True),
    (12, 21, "2026-11-27", _SCORED, 11, True),
    (13, 16, "2026-11-27", _SCORED, 8, True),
    (14, 26, "2026-11-27", _SCORED, 7, True),
    (15, 23, "2026-11-27", _SCORED, 9, True),
    (16, 26, "2026-11-27", _SCORED, 17, True),
    (17, 15, "2026-11-27", _SCORED, 11, True),
    (18, 34, "2026-11-27", _SCORED, 10, True),
    (19, 13, "2026-11-27", _SCORED, 5, True),
    (20, 25, "2026-11-28", _SCORED, 14, True),
    (21, 25, "2026-11-28", _SCORED, 12, True),
    (22, 39, "2026-11-28", _SCORED, 13, True),
    (23, 4, "2026-11-28", _SCORED, 3, True),
    (24, 19, "2026-11-28", _SCORED, 9, True),
    (25, 20, "2026-11-28", _SCORED, 16, True),
    (26, 14, "2026-11-28", _SCORED, 7, True),
    (27, 15, "2026-11-28", _SCORED, 13, True),
    (28, 1, "2026-11-28", _SCORED, 1, True),
    (29, 7, "2026-11-29", _SCORED, 4, True),
    (30, 14, "2026-11-29", _SCORED, 13, True),
    (31, 12, "2026-11-29", _SCORED, 8, True),
    (32, 8, "2026-11-29", _SCORED, 5, True),
    (33, 3, "2026-11-29", _SCORED, 2, True),
    (34, 17, "2026-11-29", _SCORED, 4, True),
    (35, 6, "2026-11-29", _SCORED, 5, True),
    (36, 1, "2026-11-29", _SCORED, 1, True),
    (37, 20, "2026-11-29", _SCORED, 7, True),
]
ALL_ENTRIES = sum(row[1] for row in BATCH_ROWS)


def _mark(n: int) -> str | None:
    row = next((r for r in BATCH_ROWS if r[0] == n), None)
    return f"# ---- batch {n}, collected {row[2]}, {row[3]}" if row is not None and n > 1 else None


def test_holdout_loads_with_the_dataset_loader() -> None:
    ds = _holdout()
    assert len(ds.entries) == ALL_ENTRIES


def test_ids_are_unique_in_the_raw_file() -> None:
    # parse_dataset refuses duplicates too; this reads the raw list so that the check does not depend on it
    raw: list[dict[str, Any]] = yaml.safe_load(HOLDOUT.read_text(encoding="utf-8"))
    ids = [r["id"] for r in raw]
    assert len(ids) == ALL_ENTRIES
    assert len(set(ids)) == len(ids)


def test_every_entry_cites_a_url_and_quotes_the_figure() -> None:
    for e in _holdout().entries:
        assert _urls(e.citation), f"{e.id}: no URL in its citation"
        assert e.quote.strip(), f"{e.id}: no quote"
        assert e.source, f"{e.id}: no source group"


def test_no_holdout_source_is_used_by_the_published_set() -> None:
    published_text = PUBLISHED.read_text(encoding="utf-8")
    published_urls = _urls(published_text)
    holdout = _holdout()
    holdout_urls = set().union(*(_urls(e.citation) for e in holdout.entries))
    assert holdout_urls, "the holdout cites no URL"
    assert not holdout_urls & published_urls
    # nor the same repository file at another commit (Lit-GPT's tutorials/finetune_lora.md at 0cc02afa and v0.4.0)
    assert not _repo_files(holdout_urls) & _repo_files(published_urls)
    # nor as a substring (a published citation with a suffix or an anchor)
    for url in holdout_urls:
        assert url not in published_text, url
    published_sources = {str(r.get("source", "")) for r in yaml.safe_load(published_text)}
    assert not {e.source for e in holdout.entries} & published_sources


def test_the_url_pattern_splits_citations_as_written() -> None:
    # the pattern the disjointness test relies on, on a citation of the holdout's form
    text = "https://github.com/a/b/blob/main/x.md (table); config https://github.com/a/b/blob/main/c.yaml."
    assert _urls(text) == {"https://github.com/a/b/blob/main/x.md", "https://github.com/a/b/blob/main/c.yaml"}


def test_every_scenario_resolves() -> None:
    for e in _holdout().entries:
        resolve(e.scenario)  # raises ScenarioError for an unknown model, GPU or setting


def test_oom_entries_carry_the_device_capacity_and_no_quantity() -> None:
    for e in _holdout().entries:
        if e.outcome != "oom":
            continue
        assert e.measured.quantity == "unknown", e.id
        assert e.measured.bytes == resolve(e.scenario).gpu.total_memory_bytes, e.id


def test_quoted_figures_converted_to_bytes() -> None:
    # can-i-finetune-this prints GiB to 4 decimals: 3.0324 x 2^30 = 3,256,014,706.7 -> 3,256,014,707
    assert _by_id("cif-qwen25-05b-lora-r16-s1024-b1-paged8-4080").measured.bytes == 3_256_014_707
    # 11.5068 x 1,073,741,824 = 12,355,332,419.6 -> 12,355,332,420
    assert _by_id("cif-qwen25-15b-qlora-r16-s4096-b1-paged8-4080").measured.bytes == 12_355_332_420
    # LitGPT prints max_memory_allocated / 1e9: 19.73 GB = 19,730,000,000 B
    assert _by_id("lgh-llama3-8b-lora-r32-qv-mb1-a10g").measured.bytes == 19_730_000_000
    # vLLM KV pool: Qwen2-7B has 28 layers x 4 KV heads x 128 x 2 (K, V) x 2 B = 57,344 B per token;
    # 93,872 tokens (5,867 blocks x 16) x 57,344 = 5,382,995,968 B = 5.0133 GiB (printed 5.01 GiB)
    assert _by_id("dl-vllm01011-qwen2-7b-a100-u025-kv").measured.bytes == 5_382_995_968
    # tensor parallel 2: 2 KV heads per GPU, 28,672 B per token; 1,192,160 x 28,672 = 34,181,611,520 B
    assert _by_id("dl-vllm01011-qwen2-7b-tp2-a100-u050-kv").measured.bytes == 34_181_611_520


def test_batch2_figures_converted_to_bytes() -> None:
    # AutoAWQ prints torch.cuda.max_memory_allocated() / 1024**3 to 2 decimals: 4.35 x 2^30 = 4,670,776,934.4
    assert _by_id("awq016-mistral7b-gemm-b1-p64-n64-4090").measured.bytes == 4_670_776_934
    # 16.82 x 1,073,741,824 = 18,060,337,479.7 -> 18,060,337,480
    assert _by_id("awq016-mistral7b-gemm-b8-p2048-n2048-4090").measured.bytes == 18_060_337_480
    # vLLM V1 pool: Qwen3-235B-A22B, 94 layers x (4 KV heads / TP 4) x 128 x 2 (K, V) x 2 B = 48,128 B per token;
    # 178,880 tokens x 48,128 = 8,609,136,640
    assert _by_id("vllm21348-qwen3-235b-a22b-fp8-tp4-h100-vllm-kv").measured.bytes == 8_609_136_640
    # SGLang: 367,404 tokens x 48,128 = 17,682,419,712 (K alone 8,841,209,856 B = 8.23 GiB, as printed)
    assert _by_id("vllm21348-qwen3-235b-a22b-fp8-tp4-h100-sglang-kv").measured.bytes == 17_682_419_712
    # vLLM 0.2: 3,028 blocks x 16 tokens x (32 layers x 32 heads x 128 x 2 x 2 B = 524,288) = 25,400,705,024
    assert _by_id("vllm1267-llongorca-7b-16k-rtx6000ada-kv").measured.bytes == 25_400_705_024


def test_batch2_dynamic_length_rows_are_not_compared() -> None:
    # PEFT's MetaMathQA runs pad each batch to its longest sample: the figure is kept but only the verdict is checked
    rows = [e for e in _holdout().entries if e.source == "peft-method-comparison-metamathqa"]
    assert len(rows) == 4
    assert all(e.not_compared and not e.compares_bytes for e in rows)


def test_batch3_figures_converted_to_bytes() -> None:
    # llama.cpp prints MiB to 2 decimals: 4155.99 x 2^20 = 4,357,871,370.2 -> 4,357,871,370
    assert _by_id("llamacpp9881-llama3-8b-q4_0-ctx8192-4070-model-buffer").measured.bytes == 4_357_871_370
    # 8192 cells x 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 1,073,741,824 = 1024.00 MiB, as printed
    assert _by_id("llamacpp9881-llama3-8b-q4_0-ctx8192-4070-kv-buffer").measured.bytes == 1_073_741_824
    # vLLM V1 pool: Llama-3.1-70B, 80 layers x 8 KV heads x 128 x 2 x 2 B = 327,680 B per token;
    # 1,381 blocks x 16 x 327,680 = 7,240,417,280 (1,381 x 16 / 2,048 = 10.79, the printed concurrency)
    assert _by_id("vllm12569-llama31-70b-w8a8-int8-v1-u098-2k-kv").measured.bytes == 7_240_417_280
    # vLLM's "GB" in 'Loading model weights took 67.7229 GB' is GiB: 67.7229 x 2^30 = 72,716,910,173.0
    assert _by_id("vllm12569-llama31-70b-w8a8-int8-v1-u098-2k-weights").measured.bytes == 72_716_910_173
    # torchtune logs max_memory_allocated() / 1e9: 16.43 GB = 16,430,000,000 B
    assert _by_id("torchtune1603-llama31-8b-generate-bf16-p6-n300-4090").measured.bytes == 16_430_000_000
    # axolotl's README: 27.7 GiB x 2^30 = 29,742,648,524.8 -> 29,742,648,525
    assert _by_id("axolotl-seedoss36b-qlora-r32-s2048-packed-mb2-cce").measured.bytes == 29_742_648_525


def test_batch4_figures_converted_to_bytes() -> None:
    # ms-swift's get_max_cuda_memory is max_memory_reserved() / 1024**3: 13.72 x 2^30 = 14,731,737,825.3 -> 14,731,737,825
    assert _by_id("swift-yi6b-chat-lora-r8-qkv-s512-mb1-a100").measured.bytes == 14_731_737_825
    # vLLM V1 'Model loading took 14.2474 GiB': 14.2474 x 2^30 = 15,298,029,263.3 -> 15,298,029,263
    assert _by_id("vllm17469-qwen3-30b-a3b-tp4-a10-v085-1k-weights").measured.bytes == 15_298_029_263
    # llama.cpp KV: 32,000 cells x 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 4,194,304,000 = 4000.00 MiB
    assert _by_id("llamacpp7450-mistral7b-v02-q2_k-ctx32000-b2961-kv-buffer").measured.bytes == 4_194_304_000
    # nvidia-smi MiB: 23859 x 2^20 = 25,017,974,784
    assert _by_id("vllm7553-yi15-34b-tp4-4090-v054-graphs-nvsmi").measured.bytes == 25_017_974_784
    # LitGPT prints max_memory_allocated() / 1e9: 18.83 GB = 18,830,000,000 B
    assert _by_id("litgpt1558-generate-gemma-7b-it-bf16-l4").measured.bytes == 18_830_000_000
    # Unsloth prints max_memory_reserved() / 1024**3 to 3 decimals: 9.359 x 2^30 = 10,049,149,730.8 -> 10,049,149,731
    assert _by_id("unsloth-prashantsaikia-llama31-8b-qlora-r16-all-mb2-a10g").measured.bytes == 10_049_149_731


def test_batch5_figures_converted_to_bytes() -> None:
    # torchtitan's log prints max_memory_reserved in GiB: 59.48 x 2^30 = 63,866,163,691.5 -> 63,866,163,692
    assert _by_id("tt355-llama3-8b-fsdp2-opsac-b1-s8192-8xa100-adamw-fused").measured.bytes == 63_866_163_692
    # vLLM V0 'Loading model weights took 5.2032 GB' divides by 2^30: 5,586,893,458.6 -> 5,586,893,459
    assert _by_id("vllm13882-qwen25-7b-bnb4-8gib-v073-weights").measured.bytes == 5_586_893_459
    # llama.cpp 'CUDA0 model buffer size = 18508.35 MiB': 18,508.35 x 2^20 = 19,407,411,609.6 -> 19,407,411,610
    assert _by_id("llamacpp11861-r1-distill-qwen32b-q4km-ctx16384-fa-model-buffer").measured.bytes == 19_407_411_610
    # vLLM V1 KV pool: Mistral-7B 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B per token;
    # 840,160 tokens x 131,072 = 110,121,451,520 B
    assert _by_id("armlp-dgxspark-mistral7b-v02-gptq-gb10-v011-kv").measured.bytes == 110_121_451_520
    # torchtune's tutorials print GB = 10^9 B: 15.57 GB = 15,570,000,000 B
    assert _by_id("ttdocs-llama2-7b-lora-qv-r8-b2-s512-1gpu-reserved").measured.bytes == 15_570_000_000


def test_batch5_worked_back_settings_are_not_compared() -> None:
    # settings derived from the printed figure itself cannot test a prediction of that figure
    for entry_id in ("jamepeng-llamacpppy1-r1-distill-qwen7b-f16-ctx2048-kv", "llamasharp1099-qwen25-3b-q8-4080s-ctx4096-kv",
                     "ollama8471-command-r7b-f16-ngl32-model-buffer"):
        assert not _by_id(entry_id).compares_bytes, entry_id
    assert _by_id("llamasharp1099-qwen25-3b-q8-4080s-ctx4096-compute").compares_bytes


def test_batch9_figures_converted_to_bytes() -> None:
    # ollama's llama.cpp prints MiB to 2 decimals: 8376.27 x 2^20 = 8,783,155,691.5 -> 8,783,155,692
    assert _by_id("ollama3390-deepseek-v2-lite-q4_0-ctx2048-rx6800xt-model-buffer").measured.bytes == 8_783_155_692
    # vLLM 0.27.1 pool: Qwen3-235B-A22B at TP 4, 94 layers x (4 KV heads / 4) x 128 x 2 (K, V) x 2 B = 48,128 B per
    # token; 621,392 tokens x 48,128 = 29,906,354,176
    assert _by_id("kubesimplify-vllm0271-qwen3-235b-fp8-tp4-rtxpro6000-kv").measured.bytes == 29_906_354_176
    # SGLang: Qwen3-14B at TP 4, 40 layers x (8 KV heads / 4) x 128 x 2 x 2 B = 40,960 B per token;
    # 298,447 x 40,960 = 12,224,389,120 (K alone 6,112,194,560 B = 5.69 GiB, as printed)
    assert _by_id("sglangperf-qwen3-14b-tp4-4090-mfs080-kv").measured.bytes == 12_224_389_120
    # bitsandbytes' benchmark divides by 1024**2: 11609.8 x 2^20 = 12,173,757,644.8 -> 12,173,757,645
    assert _by_id("bnb-optbench-qwen3-06b-fp32-adamw-b2-s128-a100").measured.bytes == 12_173_757_645
    # torchao's tutorial prints max_memory_reserved() / 1e9: 8.91 GB = 8,910,000,000 B
    assert _by_id("torchao-serving-phi4mini-bf16-gen-p17-n128-h100").measured.bytes == 8_910_000_000


def test_batch10_figures_converted_to_bytes() -> None:
    # torch.cuda.memory_reserved() / 1024**3 printed to 4 decimals: 26.2617 x 2^30 = 28,198,285,658.9 -> 28,198,285,659
    assert _by_id("rasbt-gpt2-124m-fp32-eager-b8-s1024-a100-baseline").measured.bytes == 28_198_285_659
    # torchtitan logs max_memory_reserved in GiB: 49.58 x 2^30 = 53,236,119,633.9 -> 53,236,119,634
    assert _by_id("tt996-llama3-8b-fsdp8-b1-s8192-opsac-baseline-h100").measured.bytes == 53_236_119_634
    # vLLM 0.27.1's pool: Qwen3-8B, 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 147,456 B per token;
    # 45,088 tokens x 147,456 = 6,648,496,128 (6.19 GiB, as printed)
    assert _by_id("ryangu-vllm0271-qwen3-8b-gb10-u020-kv").measured.bytes == 6_648_496_128
    # an OOM entry carries the GPU's capacity: H100 SXM 80 GB, 85,017,755,648 B (the catalog's total_memory)
    oom = _by_id("axolotl2412-smollm2-1.7b-full-s16384-packed-nogc-adamw8bit-1xh100-oom")
    assert oom.measured.bytes == 85_017_755_648 and oom.outcome == "oom"


def test_batch11_figures_converted_to_bytes() -> None:
    # the per-rank reserved peaks are printed in MiB: 34,278 x 2^20 = 35,943,088,128
    assert _by_id("gpjt-llama3-8b-full-z3-fp16-b1-s512-8gpu-reserved").measured.bytes == 35_943_088_128
    # vLLM 0.19.0's pool in tokens: Qwen3-32B, 64 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 262,144 B per token;
    # 39,200 tokens x 262,144 = 10,276,044,800 (9.57 GiB, as printed)
    assert _by_id("cssnoeasy-vllm0190-qwen3-32b-bf16-a100pcie-len8192-u090-eager-kv").measured.bytes == 10_276_044_800
    # llama.cpp prints MiB: 1024.00 x 2^20 = 1,073,741,824
    assert _by_id("llamacpprs-llama2-7b-q4km-ctx2048-3090-kv-buffer").measured.bytes == 1_073_741_824
    # an OOM entry carries the GPU's capacity: RTX 4090, 25,386,352,640 B (the catalog's total_memory)
    oom = _by_id("sglang9506-qwen3-30b-a3b-gptq-int4-4090-mf060-oom")
    assert oom.measured.bytes == 25_386_352_640 and oom.outcome == "oom"


def test_batch12_figures_converted_to_bytes() -> None:
    # vLLM's blocks: Llama-3.2-3B in fp16, 28 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 114,688 B a token, x 16 a
    # block = 1,835,008; 3,637 blocks x 1,835,008 = 6,673,924,096
    assert _by_id("hfcookbook-sdk-llama32-3b-t4-v082-u089-kv").measured.bytes == 6_673_924_096
    # Llama-2-7B: 32 x 32 x 128 x 2 x 2 = 524,288 B a token, 8,388,608 a block; 7,191 x 8,388,608 = 60,322,480,128
    assert _by_id("giae550-llama2-7b-lora4-h100-v081-kv").measured.bytes == 60_322_480_128
    # Qwen3-8B: 36 x 8 x 128 x 2 x 2 = 147,456 B a token; 89,040 tokens x 147,456 = 13,129,482,240
    assert _by_id("distserving-qwen3-8b-rtx5090-v0240-u092-32k-kv").measured.bytes == 13_129_482_240
    # nvidia-smi prints MiB: 29,914 x 2^20 = 31,367,102,464
    assert _by_id("distserving-qwen3-8b-rtx5090-v0240-u092-32k-nvsmi").measured.bytes == 31_367_102_464
    # an OOM entry carries the GPU's capacity: A100 40GB, 42,298,834,944 B (the catalog's total_memory)
    oom = _by_id("liger311-llama3-8b-full-sft-bf16-adamw-b2-s512-1gpu-a100-40gb-oom")
    assert oom.measured.bytes == 42_298_834_944 and oom.outcome == "oom"


def test_batch13_figures_converted_to_bytes() -> None:
    # vLLM's pool in tokens: Qwen2.5-7B, 28 layers x 4 KV heads x 128 x 2 (K, V) x 2 B = 57,344 B a token;
    # 444,592 tokens x 57,344 = 25,494,683,648
    assert _by_id("ddiiwoong-vllm0085-qwen25-7b-bf16-ctx32768-l40s-kv").measured.bytes == 25_494_683_648
    # OPT-125m: 12 x 12 heads x 64 x 2 x 2 = 36,864 B a token; 547,744 x 36,864 = 20,192,034,816
    assert _by_id("ddiiwoong-vllm0090-opt125m-ctx2048-a10g-kv").measured.bytes == 20_192_034_816
    # vLLM's "Model loading took 14.2488 GiB": 14.2488 x 2^30 = 15,299,532,502.2 -> 15,299,532,502
    assert _by_id("ddiiwoong-vllm0085-qwen25-7b-bf16-ctx32768-l40s-weights").measured.bytes == 15_299_532_502
    # an OOM entry carries the GPU's capacity: A800 80GB, 85,173,731,328 B (the catalog's total_memory)
    oom = _by_id("limo-10-qwen25-32b-full-sft-z3-fa2-bs1-s32768-8xa800-oom")
    assert oom.measured.bytes == 85_173_731_328 and oom.outcome == "oom"


def test_batch14_figures_converted_to_bytes() -> None:
    # torch.cuda.max_memory_allocated() / 2**20 printed as 10585.814453125 MiB: x 2^20 = 11,100,030,976
    assert _by_id("fitcheck-qwen25-7b-qlora-r16-s1024-b1-sdpa-t4").measured.bytes == 11_100_030_976
    # Lit-GPT's generate prints "Memory used: 14.50 GB" from max_memory_allocated / 1e9: 14,500,000,000
    assert _by_id("litgpt-quantize-falcon7b-bf16-new256-a100-40gb").measured.bytes == 14_500_000_000
    # an OOM entry carries the GPU's capacity: A100 40GB, 42,298,834,944 B (the catalog's total_memory)
    oom = _by_id("litgpt-issue781-mistral-7b-lora-bf16true-mb4-a100-40gb-oom")
    assert oom.measured.bytes == 42_298_834_944 and oom.outcome == "oom"


def test_batch15_figures_converted_to_bytes() -> None:
    # Liger-Kernel's chart labels torch.cuda.max_memory_allocated in MiB: 51154.27 x 2^20 = 53,639,139,819.52 -> 53,639,139,820
    assert _by_id("ligerhf-qwen2-7b-full-fsdp4-bf16-adamw-gc-b32-s512-nolig-4xa100-80gb").measured.bytes == 53_639_139_820
    # vLLM's "Model loading took 7.1550 GiB": 7.1550 x 2^30 = 7,682,622,750.72 -> 7,682,622,751
    assert _by_id("ray-vlm-batch-qwen25vl-3b-l4-vllm0110-len8192-weights").measured.bytes == 7_682_622_751


def test_batch16_figures_converted_to_bytes() -> None:
    # vLLM 0.6.4's "kv_cache_size=110.52GiB": 110.52 x 2^30 = 118,669,946,388.48 -> 118,669,946,388
    assert _by_id("vllm10702-llama31-70b-tp8-h200-v064-u095-len131072-kv").measured.bytes == 118_669_946_388
    # vLLM's "Model loading took 13.1664 GB" (GiB: memory_profiling divides by 2^30): 13.1664 x 2^30 =
    # 14,137,314,351.51 -> 14,137,314,352
    assert _by_id("vllm16378-gemma3-27b-tp4-a100-40gb-v080-v0-len65536-weights").measured.bytes == 14_137_314_352
    # llama.cpp's "CUDA0 model buffer size = 10750.86 MiB": 10,750.86 x 2^20 = 11,273,093,775.36 -> 11,273,093,775
    assert _by_id("llamacpp13729-qwen3-30b-a3b-q4km-ngl30-4080s-b5466-model-buffer").measured.bytes == 11_273_093_775
    # an OOM entry carries the GPU's capacity: RTX 3090, 25,286,672,384 B (the catalog's total_memory)
    oom = _by_id("subgraphrag19-llama31-8b-rtx3090-vllm055-len131072-fails")
    assert oom.measured.bytes == 25_286_672_384 and oom.outcome == "oom"


def test_batch17_figures_converted_to_bytes() -> None:
    # vLLM's "Model loading took 8.8011 GiB": 8.8011 x 2^30 = 9,450,109,167.2 -> 9,450,109,167
    assert _by_id("gpustack4660-qwen3-8b-fp8-4090-vllm0130-u050-weights").measured.bytes == 9_450_109_167
    # an OOM entry carries the GPU's capacity: A100 40GB, 42,298,834,944 B (the catalog's total_memory); with
    # capacity_gib 11.61: 11.61 x 2^30 = 12,466,142,576.6 -> 12,466,142,576
    oom = _by_id("litgpt553-llama2-7b-lora-r8-qv-s2048-b1-bf16mixed-a100-40gb-oom")
    assert oom.measured.bytes == 42_298_834_944 and oom.outcome == "oom"
    assert _by_id("olmocr424-olmocr2-7b-fp8-vllm0112-rtx4070s-len16384-oom").measured.bytes == 12_466_142_576


def test_batch18_figures_converted_to_bytes() -> None:
    # vLLM's "model weights take 10.45GiB": 10.45 x 2^30 = 11,220,602,470.4 -> 11,220,602,470
    assert _by_id("vllmpr13109-deepseek-coder-v2-lite-awq-v073dev-weights").measured.bytes == 11_220_602_470
    # an OOM entry carries the GPU's capacity: RTX 3090, 25,286,672,384 B (the catalog's total_memory)
    oom = _by_id("alpaca73-llama7b-full-fsdp-4x3090-bf16-mb1-oom")
    assert oom.measured.bytes == 25_286_672_384 and oom.outcome == "oom"


def test_batch19_figures_converted_to_bytes() -> None:
    # vLLM 0.6's "Loading model weights took 18.4902 GB" (its GB is bytes / 2^30): 18.4902 x 2^30 = 19,853,701,074.4
    assert _by_id("vllmpr10909-bamba98b-fp32-tp2-h100-weights").measured.bytes == 19_853_701_074
    # "Model loading took 2.2 GiB memory": 2.2 x 2^30 = 2,362,232,012.8 -> 2,362,232,012
    assert _by_id("ywh-c500-vllm0170-lfm25-12b-fp16-u070-len1024-eager-weights").measured.bytes == 2_362_232_012


def test_batch20_figures_converted_to_bytes() -> None:
    # vLLM 0.6's "Loading model weights took 5.7915 GB" (its GB is bytes / 2^30): 5.7915 x 2^30 = 6,218,575,773.7,
    # entered rounded: 6,218,575,774
    assert _by_id("b20h-tickertaka-vllm066-qwen25-3b-t4-eager-weights").measured.bytes == 6_218_575_774
    # DeepSpeed's "MaxMemAllocated=54.06GB" (torch.cuda.max_memory_allocated() / 2^30): 54.06 x 2^30 =
    # 58,046,483,005.4 -> 58,046,483,005
    assert _by_id("b20g-ds4158-opt13b-dschat-step1-lora128-trainable-base-z0-fp16-b16-s512-maxalloc"
                  ).measured.bytes == 58_046_483_005
    # an OOM entry carries the GPU's capacity: V100 32GB, 34,072,559,616 B (the catalog's total_memory)
    oom = _by_id("b20g-tf10754-gpt2-runclm-defaults-fp32-b8-s1024-v100-32-oom")
    assert oom.measured.bytes == 34_072_559_616 and oom.outcome == "oom"


def test_batch21_figures_converted_to_bytes() -> None:
    # torchtitan's log "memory: 49.66GiB(52.28%)" (max_memory_reserved / 2^30): 49.66 x 2^30 = 53,322,018,979.8,
    # entered rounded: 53,322,018,980
    assert _by_id("b21j-tt1287-llama3-8b-fsdp8-bf16-opsac-mb1-s8192-h100-95gib").measured.bytes == 53_322_018_980
    # an OOM entry carries the GPU's capacity: H100 80GB, 85,045,051,392 B (the catalog's H100-SXM total_memory)
    oom = next(e for e in _holdout().entries if e.id.startswith("b21k-ulysses") and e.outcome == "oom")
    assert oom.measured.bytes == resolve(oom.scenario).gpu.total_memory_bytes



def test_batch22_figures_converted_to_bytes() -> None:
    # GPTQ-for-LLaMa's README, LLaMA-7B 4-bit group 128: "4891" MiB of torch memory: 4,891 x 2^20 = 5,128,585,216
    assert _by_id("b22o-gptqforllama-llama7b-gptq4-g128-decode2048-3090").measured.bytes == 5_128_585_216
    # the bitsandbytes nf4 row beside it, 5102 MiB: 5,102 x 2^20 = 5,349,834,752
    assert _by_id("b22o-gptqforllama-llama7b-bnb-nf4-decode2048-3090").measured.bytes == 5_349_834_752
    # every OOM entry of the batch carries its GPU's capacity as vramplan computes it
    ooms = [e for e in _holdout().entries if e.id.startswith("b22") and e.outcome == "oom"]
    assert len(ooms) == 16  # n: 5 ZeRO + 2 FSDP + 2 DeepSpeed offload; o: 1; p: 6
    for e in ooms:
        assert e.measured.bytes == resolve(e.scenario).gpu.total_memory_bytes, e.id

def test_batch23_figures_converted_to_bytes() -> None:
    # LitGPT's tutorial prints torch.cuda.max_memory_allocated() / 1e9: 5.923729408 GB = 5,923,729,408 B
    assert _by_id("b23s-litgpt-api-benchmark-phi2-bf16-kv500-a10g").measured.bytes == 5_923_729_408
    # ... and 11.534106624 GB = 11,534,106,624 B at the page's first version (fp32 weights)
    assert _by_id("b23s-litgpt-api-benchmark-phi2-fp32-kv500-a10g").measured.bytes == 11_534_106_624
    # "at least 42GB of VRAM": 42 x 10^9
    assert _by_id("b23r-galore6-llama2-7b-full-adamw8bit-purebf16-b1-s1024").measured.bytes == 42_000_000_000
    # the one OOM carries the A100 40GB's capacity as vramplan computes it
    e = _by_id("b23r-tf29822-mistral7b-fromconfig-fp32-galore-b1-s512-oom-a100-40")
    assert e.outcome == "oom" and e.measured.bytes == resolve(e.scenario).gpu.total_memory_bytes == 42_298_834_944


def test_batch24_figures_converted_to_bytes() -> None:
    # Unsloth prints round(torch.cuda.max_memory_reserved() / 1024^3, 3) as "GB": 13.508 x 2^30 = 14,504,104,559 B
    assert _by_id("unsloth-nb-tinyllama-qlora-r32-s4096-b2-packed-nogc-fp16-t4").measured.bytes == 14_504_104_559
    # vLLM 0.7.2's "Loading model weights took 19.3952 GB" divides by 2^30: 19.3952 x 2^30 = 20,825,437,425 B
    assert _by_id("b24q-wz-qwen25-72b-awq-tp2-a40-v072-weights").measured.bytes == 20_825_437_425
    # nvidia-smi's 36091MiB = 36,091 x 2^20 = 37,844,156,416 B
    assert _by_id("b24q-wz-qwen25-72b-awq-tp2-a40-v072-smi").measured.bytes == 37_844_156_416
    # Qwen's "GPU Memory(MB)" taken as MiB: 9,323 x 2^20 = 9,775,874,048 B
    assert _by_id("b24q-qwen3speed-8b-fp8-in1-gen2048-h20").measured.bytes == 9_775_874_048
    # llama.cpp's "CUDA0 compute buffer size = 231,06 MiB" (a decimal comma): 231.06 x 2^20 = 242,283,971 B
    assert _by_id("llamacpp7439-phi3-medium-q4km-ngl15-ctx512-2060-compute").measured.bytes == 242_283_971


def test_batch25_figures_converted_to_bytes() -> None:
    # Unsloth's "Peak reserved memory = 9.383 GB" is round(max_memory_reserved / 1024^3, 3): 9.383 x 2^30 =
    # 10,074,919,534.6, rounded to 10,074,919,535 B
    assert _by_id("unsloth-nb-gemma2-9b-alpaca-qlora-r16-mb2-fp16-t4").measured.bytes == 10_074_919_535
    # TRL's notebook divides by 1024^3 too: 38.139 x 2^30 = 40,951,439,425.5 -> 40,951,439,426 B
    assert _by_id("trlnb-wordle-grpo-qwen3-17b-full-vllmcoloc015-b1-a100-40gb").measured.bytes == 40_951_439_426
    # SGLang's "memory pool(kv cache) 110GB" in GiB: 110 x 2^30 = 118,111,600,640 B
    assert _by_id("b25s-sgl7873-llama3-8b-tp2-h200-mf085-kv").measured.bytes == 118_111_600_640
    # vLLM's "Loading model weights took 3.7418 GB" divides by 2^30: 3.7418 x 2^30 = 4,017,727,157 B
    assert _by_id("b25s-genlm10-llama3-8b-tp4-v070-weights").measured.bytes == 4_017_727_157


def test_batch26_figures_converted_to_bytes() -> None:
    # vLLM's "Model loading took 17.6110 GiB" divides by 2^30: 17.6110 x 2^30 = 18,909,667,262.5 -> 18,909,667,262 B
    assert _by_id("b26v-vllm16199-gemma3-27b-awq-a10-v083-len4096-weights").measured.bytes == 18_909_667_262
    # llama.cpp's "CUDA0 model buffer size = 1918.35 MiB": 1918.35 x 2^20 = 2,011,535,769.6 -> 2,011,535,770 B
    assert _by_id("b26l-ollama8310-llama32-3b-q4km-ctx8192-np4-model-buffer").measured.bytes == 2_011_535_770
    # vLLM's "# GPU blocks: 78897" of 16 tokens of Llama 3 8B's 32 x 8 x 128 x 2 x 2 = 131,072 B: 165,459,001,344 B; the
    # fp8 KV's 157,794 blocks of half the bytes are the same pool
    assert _by_id("b26p-rocm-vllm-llama3-8b-mi300x-len8192-kv-auto").measured.bytes == 78_897 * 16 * 131_072
    assert _by_id("b26p-rocm-vllm-llama3-8b-mi300x-len8192-kv-fp8").measured.bytes == 157_794 * 16 * 65_536


def test_batch27_figures_converted_to_bytes() -> None:
    # torchtitan's logged max reserved "32.8" GiB: 32.8 x 2^30 = 35,218,731,827.2 -> 35,218,731,827 B
    assert _by_id("tohtana-tp-qwen3-32b-torchtitan-tp8-purebf16-fullac-b1-s2048-8xh100").measured.bytes == 35_218_731_827
    # the repository's own loop prints max_memory_allocated / 1e9: 34.6 GB = 34,600,000,000 B
    assert _by_id("tohtana-tp-qwen3-32b-dtensor-tp8-bf16-autocast-fullac-b1-s2048-8xh100").measured.bytes == 34_600_000_000
    # Unsloth's "Peak reserved memory = 3.342 GB" is max_memory_reserved / 1024^3: 3.342 x 2^30 = 3,588,445,175.8
    # -> 3,588,445,176 B
    assert _by_id("unsloth-nb-phi35-mini-conv-qlora-r16-mb2-fp16-t4").measured.bytes == 3_588_445_176


def test_batch28_figures_converted_to_bytes() -> None:
    # the notebook prints round(torch.cuda.max_memory_reserved() / 1024**3, 3) = 61.922 GiB: 61.922 x 2^30 =
    # 66,488,241,225.7 -> 66,488,241,226 B
    assert _by_id("b21k-trlnb-sft-nemotron3-nano-30b-a3b-lora-r8-s128-b1-paged8-a100-80").measured.bytes == 66_488_241_226


# (marker, next batch's marker, entries before it, its entries, its least number of publications, whether its cited
# URLs must be new too), for every batch after the first
BATCHES = [(_mark(n), _mark(n + 1), sum(r[1] for r in BATCH_ROWS[:i]), entries, publications, new_urls)
           for i, (n, entries, _, _, publications, new_urls) in enumerate(BATCH_ROWS) if n > 1]


@pytest.mark.parametrize(("mark", "next_mark", "before", "entries", "publications", "new_urls"), BATCHES,
                         ids=[f"batch{r[0]}" for r in BATCH_ROWS if r[0] > 1])
def test_each_batch_follows_its_marker_and_brings_new_sources(mark: str | None, next_mark: str | None, before: int,
                                                              entries: int, publications: int, new_urls: bool) -> None:
    assert mark is not None
    text = HOLDOUT.read_text(encoding="utf-8")
    head, sep, tail = text.partition(mark)
    assert sep, f"the comment line {mark!r} is missing"
    earlier = yaml.safe_load(head)
    body = tail.split("\n", 1)[1]
    batch = yaml.safe_load(body.partition(next_mark)[0] if next_mark else body)
    assert len(earlier) == before
    assert len(batch) == entries
    # a batch uses none of the sources (nor, from batch 3 on, the cited URLs) of the batches before it
    sources = {str(r["source"]) for r in batch}
    assert not sources & {str(r["source"]) for r in earlier}
    assert len(sources) >= publications
    if new_urls:
        earlier_urls = set().union(*(_urls(str(r["citation"])) for r in earlier))
        assert not set().union(*(_urls(str(r["citation"])) for r in batch)) & earlier_urls
