"""validation/holdout.yaml: loadable, cited, and disjoint from the sources of validation/published.yaml.

The holdout set is only useful while no engine has been fitted to it, so these tests guard what makes it a
holdout (every figure is cited and none of its sources is one the published set uses) and the conversions of
the quoted figures into bytes.  They do not run an engine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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


def _holdout() -> Dataset:
    return load_dataset(HOLDOUT)


def _by_id(entry_id: str) -> Entry:
    return next(e for e in _holdout().entries if e.id == entry_id)


def test_holdout_loads_with_the_dataset_loader() -> None:
    ds = _holdout()
    assert len(ds.entries) == 36


def test_ids_are_unique_in_the_raw_file() -> None:
    # parse_dataset refuses duplicates too; this reads the raw list so that the check does not depend on it
    raw: list[dict[str, Any]] = yaml.safe_load(HOLDOUT.read_text(encoding="utf-8"))
    ids = [r["id"] for r in raw]
    assert len(ids) == 36
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
