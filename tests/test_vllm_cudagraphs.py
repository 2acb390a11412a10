"""vLLM's CUDA graphs from the capture mechanism (facts/vllm_cudagraphs.py, serve/cudagraphs.py) and the start-up
verdict their band gives (serve/vllm.py ``_start_risk``, report/band.py)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.engine import estimate
from vramplan.facts.vllm_cudagraphs import (
    CUDAGRAPH_RULES,
    GRAPH_LOGS,
    SEGMENT_BYTES_HIGH,
    SEGMENT_BYTES_LOW,
    SEGMENT_BYTES_POINT,
    capture_sizes,
    cudagraph_rule,
    graph_segments,
    log_segment_bytes,
)
from vramplan.serve.cudagraphs import cudagraph_estimate
from vramplan.serve.vllm import decide
from vramplan.units import GiB

LLAMA = "meta-llama/Llama-3.1-8B"
runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def _doc(version: str, **serve: Any) -> dict[str, Any]:
    return {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
            "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "vllm_version": version, **serve}}


def _decide(version: str, **serve: Any) -> Any:
    return decide(resolve(_doc(version, **serve)), version=version)


def test_rules_are_ordered_and_cite_their_source() -> None:
    firsts = [r.first for r in CUDAGRAPH_RULES]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)
    for rule in CUDAGRAPH_RULES:
        assert rule.sources and all(rule.first <= rel for rel in rule.read_at)
    assert cudagraph_rule((0, 6, 1)) == (CUDAGRAPH_RULES[0], False)  # 0.6.1 not read: 0.6.0's rule
    assert cudagraph_rule((0, 19, 0))[1]


def _sizes(release: tuple[int, int, int], seqs: int, tokens: int, blackwell: bool = False,
           query_len: int = 1) -> tuple[int, ...]:
    return capture_sizes(cudagraph_rule(release)[0], seqs, tokens, blackwell, query_len)


def test_capture_sizes_by_release() -> None:
    # V0: [1, 2, 4] + multiples of 8 up to the first >= max_num_seqs: 100 -> 104, 3 + 13 sizes
    assert _sizes((0, 6, 4), 100, 8192) == (1, 2, 4, *range(8, 105, 8))
    # V1 0.8: [1, 2, 4] + range(8, 513, 8) no larger than max_num_batched_tokens
    assert _sizes((0, 8, 0), 1024, 100) == (1, 2, 4, *range(8, 97, 8))
    # 0.10-0.11: up to min(2 x max_num_seqs, 512) in steps of 8
    assert _sizes((0, 11, 0), 8, 8192) == (1, 2, 4, 8, 16)
    # 0.12 on: steps of 8 below 256, of 16 from 256; 1024 sequences -> 512: 3 + 31 + 17 = 51 sizes
    assert len(_sizes((0, 19, 0), 1024, 8192)) == 51 and _sizes((0, 19, 0), 1024, 8192)[-1] == 512
    # 0.13 on: 1 + num_speculative_tokens per sequence: 128 x 3 x 2 = 768 -> 512 (0.12 stays at 256)
    assert _sizes((0, 12, 0), 128, 8192, query_len=3)[-1] == 256
    assert _sizes((0, 13, 0), 128, 8192, query_len=3)[-1] == 512
    # 0.21 on: max_num_batched_tokens 300 (within 512) is appended after 288
    assert _sizes((0, 21, 0), 256, 300)[-3:] == (272, 288, 300)
    assert _sizes((0, 20, 0), 256, 300)[-1] == 288
    # 0.28 on: 1024 on a compute-capability-10 device: 3 + 31 + 49 (256..1024 by 16) = 83 sizes
    assert len(_sizes((0, 28, 0), 1024, 8192, blackwell=True)) == 83
    assert _sizes((0, 27, 0), 1024, 8192, blackwell=True)[-1] == 512
    # 0.31 on: max_num_seqs 100 (within 200) is appended between 96 and 104
    assert 100 in _sizes((0, 31, 0), 100, 8192) and 100 not in _sizes((0, 30, 0), 100, 8192)


def test_segments_by_mode() -> None:
    sizes = (1, 2, 4, 8, 16)
    v0, pw, both = (cudagraph_rule(r)[0] for r in ((0, 6, 4), (0, 10, 0), (0, 11, 0)))
    # 32 layers: 33 pieces.  V0: 5 whole-model graphs of 33 segments; piecewise: 5 x 33 graphs
    assert graph_segments(v0, sizes, 32, 8) == (5, 165)
    assert graph_segments(pw, sizes, 32, 8) == (165, 165)
    # FULL_AND_PIECEWISE: + a FULL decode graph for 1, 2, 4, 8 (<= 8 sequences): 165 + 4 graphs, (5 + 4) x 33
    assert graph_segments(both, sizes, 32, 8) == (169, 297)
    # a proposer of 28 layers: 5 x 29 more piecewise graphs and segments
    assert graph_segments(both, sizes, 32, 8, draft_layers=28) == (169 + 145, 297 + 145)


def test_segment_band_from_printed_logs() -> None:
    # facts/vllm_cudagraphs.py log_segment_bytes: (901,943,132 - 60,817,408) // 3,366 = 249,888 (0.19.0, Llama-3.1-8B,
    # H100) and (558,345,748 - 54,525,952) // 3,182 = 158,334 (0.21.0, Qwen3-8B, RTX A5000)
    assert [log_segment_bytes(g) for g in GRAPH_LOGS] == [249_888, 158_334]
    assert (SEGMENT_BYTES_LOW, SEGMENT_BYTES_HIGH, SEGMENT_BYTES_POINT) == (158_334, 249_888, 204_111)


def test_v0_graphs_by_hand_and_vllms_own_warning() -> None:
    # V0 (0.6.4), Llama-3.1-8B, 256 sequences: 35 sizes up to 256, 35 whole-model graphs x 33 = 1,155 segments; pool
    # (eager) (2 x 4096 + 3 x 14,336) x 256 x 2 = 26,214,400; point 26,214,400 + 1,155 x 204,111 = 261,962,605, band
    # + 1,155 x 158,334 = 209,090,170 to + 1,155 x 249,888 = 314,835,040
    d = _decide("0.6.4")
    assert (len(d.cudagraph_capture_sizes), d.cudagraph_graphs, d.cudagraph_pool_bytes) == (35, 35, 26_214_400)
    assert (d.cudagraph_bytes_low, d.cudagraph_bytes, d.cudagraph_bytes_high) == (209_090_170, 261_962_605,
                                                                                  314_835_040)
    # 0.6.0-0.6.3 print "CUDA graphs can take additional 1~3 GiB memory per GPU": the band's high end is 3 GiB
    old = _decide("0.6.0")
    assert old.cudagraph_bytes == 261_962_605 and old.cudagraph_bytes_high == 3 * GiB
    assert any("1~3 GiB" in a for a in old.assumptions)
    # 0.96 x 85,017,755,648 leaves 3,400,710,226 - the CUDA context 731,906,048 = 2.49 GiB: within 0.6.0's 3 GiB
    risky = _decide("0.6.0", gpu_memory_utilization=0.96)
    # V0 captures up to max_num_seqs (no capture-size option to name); (85,017,755,648 - 731,906,048 - 3 GiB) /
    # 85,017,755,648 = 0.953 -> 0.95
    assert risky.may_not_start and risky.start_risk_fix == (
        "serve.gpu_memory_utilization <= 0.95, or serve.cuda_graphs: false (--enforce-eager), or fewer capture sizes "
        "(a lower serve.max_num_seqs)")
    assert not _decide("0.6.4", gpu_memory_utilization=0.96).may_not_start


def test_capture_may_run_out_of_memory_inside_the_band() -> None:
    # vLLM 0.11 on an H100 (85,017,755,648 B, CUDA context 731,906,048): 67 sizes up to 512, (67 + 67) x 33 = 4,422
    # segments, band 60,817,408 + 4,422 x 158,334 = 760,970,356 to + 4,422 x 249,888 = 1,165,822,144
    d = _decide("0.11", gpu_memory_utilization=0.98)
    assert (d.cudagraph_bytes_low, d.cudagraph_bytes_high) == (760_970_356, 1_165_822_144)
    # 0.98: requested 83,317,400,535, room 85,017,755,648 - 83,317,400,535 - 731,906,048 = 968,449,065: above the
    # point 963,396,250, below the high bound: it starts by the point but may not
    assert d.starts and d.may_not_start and d.cudagraph_bytes == 963_396_250
    assert "need 0.71 to 1.09 GiB (0.90 GiB expected), while 0.90 GiB is left outside" in d.start_risk
    # the fix leaves room for the high bound: (85,017,755,648 - 731,906,048 - 1,165,822,144) / 85,017,755,648
    # = 0.9777 -> 0.97, where it starts without the risk
    assert d.start_risk_fix.startswith("serve.gpu_memory_utilization <= 0.97, or serve.cuda_graphs: false")
    assert not _decide("0.11", gpu_memory_utilization=0.97).may_not_start
    # 0.99 leaves 118,271,492 B, below the point: it does not start, and the fix is the same 0.97
    over = _decide("0.11", gpu_memory_utilization=0.99)
    assert not over.starts and over.fix == "serve.gpu_memory_utilization <= 0.97 or --enforce-eager"
    assert not over.may_not_start and not over.start_risk
    # eager: no graphs, no risk
    assert not _decide("0.11", gpu_memory_utilization=0.98, cuda_graphs=False).may_not_start


def test_subtracted_estimate_carries_no_capture_risk() -> None:
    # 0.20 on subtracts the estimate from the KV budget: the graphs live inside gpu_memory_utilization
    d = _decide("0.20", gpu_memory_utilization=0.99)
    assert d.starts and d.cudagraph_subtracted and not d.may_not_start
    assert d.to_dict()["may_not_start"] is False and "start_risk" not in d.to_dict()


def test_explicit_kv_budget_risk() -> None:
    # kv_cache_memory_bytes skips the utilisation rule: the room is total - non-KV - KV - context
    base = _decide("0.19")
    room_mid = (base.cudagraph_bytes + base.cudagraph_bytes_high) // 2
    kv = base.total_memory_bytes - base.non_kv_bytes - base.cuda_context_bytes - room_mid
    d = _decide("0.19", kv_cache_memory_bytes=kv)
    assert d.starts and d.may_not_start
    over = d.cudagraph_bytes_high - room_mid
    assert d.start_risk_fix.startswith(f"serve.kv_cache_memory_bytes <= {kv - over},")


def test_explicit_kv_budget_keeps_the_graphs_outside_from_0_20() -> None:
    # Worker.determine_available_memory returns kv_cache_memory_bytes before it profiles the graphs (0.20-0.33): no
    # estimate is subtracted, the graphs are captured outside the explicit budget, so the risk is checked there too
    plain = _decide("0.29.0")
    assert plain.cudagraph_subtracted
    kv = plain.total_memory_bytes - plain.non_kv_bytes - plain.cuda_context_bytes - plain.cudagraph_bytes - (1 << 20)
    d = _decide("0.29.0", kv_cache_memory_bytes=kv)
    assert not d.cudagraph_subtracted and d.starts and d.may_not_start  # 1 MiB above the point, below the high end
    assert not _decide("0.29.0", kv_cache_memory_bytes=kv - d.cudagraph_bytes_high).may_not_start


def test_verdict_and_cli_say_may_not_start() -> None:
    rep = estimate(_doc("0.11", gpu_memory_utilization=0.98))
    assert rep.fits and rep.verdict == "MAY NOT FIT" and rep.serve.start_risk.startswith("vLLM may not start")
    ok = estimate(_doc("0.11"))
    assert ok.verdict == "FITS" and ok.serve.start_risk == ""
    args = ["serve", "--model", LLAMA, "--gpu", "H100", "--max-model-len", "16384", "--gpu-memory-utilization",
            "0.98"]
    res = runner.invoke(app, args, env=ENV)
    assert res.exit_code == 0, res.stderr
    assert "MAY NOT START" in res.stdout and "change: serve.gpu_memory_utilization <= 0.97" in res.stdout
    doc = json.loads(runner.invoke(app, [*args, "--json"], env=ENV).stdout)
    assert doc["fits"] is True and doc["may_not_start"] is True and doc["vllm"]["may_not_start"] is True
    assert doc["vllm"]["cudagraph_bytes_high"] == 1_165_822_144


@given(seqs=st.integers(1, 2048), tokens=st.integers(1, 32768), release=st.sampled_from(CUDAGRAPH_RULES),
       layers=st.integers(1, 128))
def test_band_is_ordered_and_grows_with_sequences(seqs: int, tokens: int, release: Any, layers: int) -> None:
    def pool(n: int) -> int:
        return n * 1000

    est = cudagraph_estimate(release.first, seqs, tokens, layers, pool)
    more = cudagraph_estimate(release.first, seqs + 1, tokens, layers, pool)
    assert est.low_bytes <= est.bytes <= est.high_bytes
    assert est.pool_bytes == est.largest * 1000
    if release.sizes != "v0":  # V1 never captures beyond max_num_batched_tokens
        assert est.largest <= tokens
    if release.append_seqs and seqs in est.sizes and seqs not in more.sizes:
        # 0.31+ appends max_num_seqs to the sizes when it is not one of them: one sequence more can capture one graph
        # fewer (test_appended_sequence_count_can_shrink_the_graphs)
        return
    assert more.bytes >= est.bytes and more.segments >= est.segments


def test_appended_sequence_count_can_shrink_the_graphs() -> None:
    # vLLM 0.31 VllmConfig._set_cudagraph_sizes appends max_num_seqs to the capture sizes when it is within the
    # maximum and not among them: 3 sequences over 4 batched tokens capture 1, 2, 4 and the appended 3; 4 sequences
    # capture 1, 2, 4 only, one graph fewer
    (rule,) = [r for r in CUDAGRAPH_RULES if r.first == (0, 31, 0)]
    three = cudagraph_estimate(rule.first, 3, 4, 1, lambda n: n * 1000)
    four = cudagraph_estimate(rule.first, 4, 4, 1, lambda n: n * 1000)
    assert 3 in three.sizes and 3 not in four.sizes and set(four.sizes) <= set(three.sizes)
    assert four.graphs < three.graphs and four.bytes < three.bytes
