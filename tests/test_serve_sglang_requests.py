"""SGLang's request table, running limit and speculative topk by release (serve/sglang_requests.py REQ_RULES,
serve/sglang_options.py TOPK_RULES): each rule by hand, and the start-up decision they change."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.serve.sglang import decide_sglang
from vramplan.serve.sglang_options import TOPK_RULES, draft_shape
from vramplan.serve.sglang_requests import (
    REQ_RULES,
    captured_graph_bs,
    estimated_reqs,
    req_rule_for,
    request_pool,
)

CTX = 131_072  # Llama-3.1-8B's context
EAGLE = {"method": "eagle", "model": "lmsys/sglang-EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3}


def doc(tp: int = 1, **serve: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100-SXM", "num_gpus": tp},
            "parallel": {"tp": tp}, "serve": {"engine": "sglang", **serve}}


def rule(release: str) -> Any:
    return req_rule_for(tuple(int(x) for x in release.split(".")))  # type: ignore[arg-type]


def test_rule_of_each_release() -> None:
    got = {v: (rule(v).extra_row, rule(v).draft_width, rule(v).resolve)
           for v in ("0.4.1", "0.4.6", "0.4.7", "0.4.10", "0.5.1", "0.5.9", "0.5.10", "0.5.13", "0.5.14", "0.5.23")}
    assert got == {"0.4.1": (True, False, "tp_worker"), "0.4.6": (True, False, "tp_worker"),
                   "0.4.7": (False, False, "tp_worker"), "0.4.10": (False, False, "tp_worker"),
                   "0.5.1": (False, True, "tp_worker"), "0.5.9": (False, True, "tp_worker"),
                   "0.5.10": (False, True, "estimated_cap"), "0.5.13": (False, True, "estimated_cap"),
                   "0.5.14": (False, True, "capacity_cap"), "0.5.23": (False, True, "capacity_cap")}
    # every row names the wheel, the file and a line it was read at
    assert all("wheel" in r.sources[0] and ".py:" in r.sources[0] for r in REQ_RULES)
    assert all("wheel" in t.sources[0] and ".py:" in t.sources[0] for t in TOPK_RULES)


def test_estimate() -> None:
    # int(444,058 / 131,072 x 512) = int(1734.6) = 1734 -> at least 2048
    assert estimated_reqs(444_058, CTX) == 2048
    # int(1,000,000 / 8,192 x 512) = 62,500 -> at most 4096; int(600,000 / 8,192 x 512) = 37,500 -> 4096;
    # int(49,152 / 8,192 x 512) = 3072
    assert estimated_reqs(1_000_000, 8192) == 4096 and estimated_reqs(49_152, 8192) == 3072


def test_tp_worker_extra_row_before_047() -> None:
    p = request_pool(rule("0.4.1"), 444_058, 444_058, 444_058, CTX, None, 1, None)
    # 2048 + 1 rows; running min(444,058 // 2, 2049) = 2049; (2049) x (131,072 + 4) x 4 B = 1,074,298,896 B
    assert (p.max_num_reqs, p.rows, p.running, p.width) == (2048, 2049, 2049, 131_076)
    assert p.table_bytes == 1_074_298_896
    q = request_pool(rule("0.4.7"), 444_058, 444_058, 444_058, CTX, None, 1, None)
    # 2048 rows: 2048 x 131,076 x 4 = 1,073,774,592 B
    assert (q.rows, q.running, q.table_bytes) == (2048, 2048, 1_073_774_592)


def test_small_pool_before_and_from_0510() -> None:
    # 2,620 tokens at a context of 131,072: the estimate is 2048; half the pool is 1,310
    old = request_pool(rule("0.5.9"), 2620, 2620, 2620, CTX, None, 1, None)
    assert (old.rows, old.running) == (2048, 1310)  # the table keeps 2048 rows, the scheduler runs 1,310
    new = request_pool(rule("0.5.10"), 2620, 2620, 2620, CTX, None, 1, None)
    assert (new.max_num_reqs, new.rows, new.running) == (1310, 1310, 1310)  # min(2048, 2620 // 2)
    assert new.table_bytes == 1310 * 131_076 * 4 == 686_838_240


def test_given_limit_by_release() -> None:
    # 10,000 given at dp 2, 1,000,000 tokens at a context of 8,192 (estimate 4096, half the pool 500,000)
    args = (1_000_000, 1_000_000, 1_000_000, 8192, 10_000, 2, None)
    old, mid, late = (request_pool(rule(v), *args) for v in ("0.5.9", "0.5.10", "0.5.14"))
    assert (old.rows, old.running) == (10_000, 5000)  # the table has the given rows, each DP rank runs 10,000 // 2
    assert (mid.rows, mid.running) == (4096, 4096)  # min(10,000 // 2, 4096)
    assert (late.rows, late.running) == (5000, 5000)  # min(10,000 // 2, 500,000)
    # 0.5.14: 48 given over a pool of 60 tokens: min(48, 60 // 2) = 30; 0.5.10: min(48, 2048) = 48
    assert request_pool(rule("0.5.14"), 60, 60, 60, CTX, 48, 1, None).rows == 30
    assert request_pool(rule("0.5.10"), 60, 60, 60, CTX, 48, 1, None).rows == 48


def test_draft_token_columns_from_051() -> None:
    # 4 draft tokens: 131,072 + 4 + 4 columns from 0.5.1; 0.4.10 has context + 4 only
    assert request_pool(rule("0.5.1"), 1000, 1000, 1000, CTX, 48, 1, 4).width == 131_080
    assert request_pool(rule("0.4.10"), 1000, 1000, 1000, CTX, 48, 1, 4).width == 131_076
    assert request_pool(rule("0.5.1"), 1000, 1000, 1000, CTX, 48, 1, None).width == 131_076


def test_captured_graph_bs() -> None:
    assert captured_graph_bs(256, 48) == 48 and captured_graph_bs(256, 2048) == 256


def test_decision_small_pool_0510() -> None:
    # fraction 0.195 on an H100: 84,467,326,648 x 0.195 - 16,127,631,360 = 343,497,336 B // 131,072 = 2,620 tokens
    old = decide_sglang(resolve(doc(sglang_version="0.5.9", mem_fraction_static=0.195)))
    new = decide_sglang(resolve(doc(sglang_version="0.5.10", mem_fraction_static=0.195)))
    assert old.max_total_num_tokens == new.max_total_num_tokens == 2620
    assert (old.max_num_reqs, old.req_to_token_rows, old.max_running_requests) == (2048, 2048, 1310)
    assert old.req_to_token_bytes == 1_073_774_592  # 2048 x 131,076 x 4
    assert (new.max_num_reqs, new.req_to_token_rows, new.max_running_requests) == (1310, 1310, 1310)
    assert new.req_to_token_bytes == 686_838_240  # 1310 x 131,076 x 4
    assert new.device_used_bytes == old.device_used_bytes - (1_073_774_592 - 686_838_240)


def test_decision_eagle_graphs_capped_by_the_table() -> None:
    d = decide_sglang(resolve(doc(sglang_version="0.5.10", speculative=EAGLE)))
    # 48 running requests by default: 48 rows of 131,072 + 4 + 4 draft tokens; decode graphs up to 48 of 256
    assert (d.req_to_token_rows, d.req_to_token_width) == (48, 131_080)
    assert d.req_to_token_bytes == 48 * 131_080 * 4 == 25_167_360
    assert d.cuda_graph_max_bs == 256 and d.cuda_graph_captured_bs == 48
    assert d.to_dict()["cuda_graph_captured_bs"] == 48
    assert any("captured up to batch 48" in a for a in d.assumptions)
    assert any("draft worker's CUDA graphs" in a and "4096 MiB" in a for a in d.assumptions)
    # without speculative decoding the table has 2048 rows: the key is absent
    assert "cuda_graph_captured_bs" not in decide_sglang(resolve(doc(sglang_version="0.5.10"))).to_dict()


def test_topk_headroom_0_4_8() -> None:
    spec = {**EAGLE, "eagle_topk": 4, "num_draft_tokens": 8}
    d = decide_sglang(resolve(doc(sglang_version="0.4.8", speculative=spec)))
    # profiled 423,436 (tests/test_serve_sglang_options.py); headroom 48 x (3 x 4 + 8) + 100 = 1,060
    assert d.speculative_headroom_tokens == 1060 and d.max_total_num_tokens == 423_436 + 1060
    assert any("--speculative-eagle-topk 4, --speculative-num-draft-tokens 8" in a for a in d.assumptions)
    # 0.4.8 sets topk back to 1 with pages of 16 (and the draft tokens to steps + 1): 48 x (3 + 4) + 100 = 436
    p = decide_sglang(resolve(doc(sglang_version="0.4.8", page_size=16, speculative=spec)))
    assert p.speculative_headroom_tokens == 436
    assert any("set to 1 because page_size > 1" in a for a in p.assumptions)


def test_topk_columns_0_5_3() -> None:
    spec = {**EAGLE, "eagle_topk": 4, "num_draft_tokens": 8}
    d = decide_sglang(resolve(doc(sglang_version="0.5.3", speculative=spec)))
    # 0.5.3: shared headroom 48 x (12 + 8) + 100 = 1,060; rows 131,072 + 4 + 8 wide: 48 x 131,084 x 4 = 25,168,128 B
    assert d.speculative_headroom_tokens == 1060 and d.req_to_token_bytes == 25_168_128


def _tk(s: Any) -> tuple[int, int]:
    return s.topk, s.draft_tokens


def test_draft_shape_by_release() -> None:
    # 0.4.5: topk to 1 with pages, the draft tokens kept: headroom would read 3 x 1 + 8
    assert _tk(draft_shape((0, 4, 5), "eagle", 3, 4, 8, 16)) == (1, 8)
    # 0.4.6 on: at topk 1 the draft tokens are steps + 1
    s = draft_shape((0, 4, 6), "eagle", 3, 4, 8, 16)
    assert (s.topk, s.draft_tokens) == (1, 4) and "set to 1" in s.note and "adjusted" in s.note
    # 0.4.9-0.5.1 accept topk > 1 with pages
    assert _tk(draft_shape((0, 4, 9), "eagle", 3, 4, 8, 16)) == (4, 8)
    assert _tk(draft_shape((0, 5, 1), "mtp", 3, 4, 8, 16)) == (4, 8)
    # topk 1 with other draft tokens: adjusted to steps + 1 (0.5.3)
    s = draft_shape((0, 5, 3), "eagle", 3, 1, 7, 1)
    assert (s.topk, s.draft_tokens) == (1, 4) and "7 adjusted to steps + 1 = 4" in s.note
    # n-gram: 12 draft tokens by default
    assert _tk(draft_shape((0, 5, 3), "ngram", 3, 1, None, 1)) == (1, 12)


@pytest.mark.parametrize(("release", "backends"), [("0.5.2", "flashinfer"), ("0.5.3", "flashinfer"),
                                                    ("0.5.6", "flashinfer, fa3"), ("0.5.12", "flashinfer, fa3"),
                                                    ("0.5.13", "flashinfer, fa3, triton"),
                                                    ("0.5.23", "flashinfer, fa3, triton")])
def test_topk_with_pages_refused_where_sglang_raises(release: str, backends: str) -> None:
    v = tuple(int(x) for x in release.split("."))
    with pytest.raises(ScenarioError) as e:
        draft_shape(v, "eagle", 3, 4, 8, 16)  # type: ignore[arg-type]
    assert f"one of {backends} (" in str(e.value) and "serve.speculative.eagle_topk" in str(e.value)


@pytest.mark.parametrize(("spec", "serve", "where"), [
    ({**EAGLE, "eagle_topk": 4}, {"sglang_version": "0.5.3"}, "serve.speculative.num_draft_tokens"),
    ({"method": "ngram", "eagle_topk": 2}, {"sglang_version": "0.5.3"}, "serve.speculative.eagle_topk"),
    ({**EAGLE, "eagle_topk": 2, "num_draft_tokens": 5}, {"sglang_version": "0.4.3"}, "serve.speculative.eagle_topk"),
])
def test_topk_refusals(spec: dict[str, Any], serve: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as e:
        decide_sglang(resolve(doc(speculative=spec, **serve)))
    assert where in str(e.value)


def test_topk_is_an_sglang_option() -> None:
    bad = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100-SXM"},
           "serve": {"speculative": {"method": "draft", "model": "meta-llama/Llama-3.2-1B", "eagle_topk": 2,
                                     "num_draft_tokens": 4}}}
    with pytest.raises(ScenarioError) as e:
        resolve(bad)
    assert "serve.speculative.eagle_topk" in str(e.value) and "serve.speculative.num_draft_tokens" in str(e.value)


def test_given_limit_below_the_dp_size() -> None:
    # one request given over 2 DP ranks: 1 // 2 = 0 each until 0.5.22 (start-up asserts), max(1, 0) = 1 from 0.5.23
    assert request_pool(rule("0.5.22"), 10_000, 10_000, 10_000, CTX, 1, 2, None).running == 0
    assert request_pool(rule("0.5.23"), 10_000, 10_000, 10_000, CTX, 1, 2, None).running == 1
    assert rule("0.5.23").at_least_one and not rule("0.5.22").at_least_one

    def run(release: str) -> Any:
        return decide_sglang(resolve({"model": "deepseek-ai/DeepSeek-V2-Lite", "task": "serve",
                                      "hardware": {"gpu": "H100-SXM", "num_gpus": 2}, "parallel": {"tp": 2},
                                      "serve": {"engine": "sglang", "sglang_version": release, "dp_attention": 2,
                                                "max_running_requests": 1}}))

    old, new = run("0.5.22"), run("0.5.23")
    assert not old.starts and old.problem.startswith("max_running_request is zero")
    assert "serve.max_running_requests" in old.fix
    assert new.starts and new.max_running_requests == 1 and new.req_to_token_rows == 1
