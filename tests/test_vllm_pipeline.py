"""vLLM pipeline parallelism at start-up (serve/vllm.py): vLLM's layer split, each rank's weights and profile
peak, every rank's KV pool from its own budget and layers, the engine's fewest blocks, the refusals, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import ScenarioError
from vramplan.serve.vllm import decide, pp_stage_layers, serve_weights_bytes

SNAP = Path(__file__).parent / "snapshots"
ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}


def _serve(model: str, pp: int, tp: int = 1, gpu: str = "H100", version: str = "0.19", max_len: int = 8192,
           **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp * pp},
            "parallel": {"tp": tp, "pp": pp},
            "serve": {"gpu_memory_utilization": 0.9, "max_model_len": max_len, "vllm_version": version, **serve}}


@pytest.mark.parametrize(("layers", "pp", "sizes"), [
    # get_pp_indices: layers // pp each, the remainder one each to partitions[-2], [-3], ...
    (61, 4, [15, 15, 16, 15]),  # 61 = 4 x 15 + 1: partitions[-2] (stage 2) takes it
    (94, 4, [23, 24, 24, 23]),  # 94 = 4 x 23 + 2: stages 2 and 1
    (7, 4, [2, 2, 2, 1]),  # 7 = 4 x 1 + 3: stages 2, 1 and 0, never the last
    (32, 4, [8, 8, 8, 8]),
    (30, 1, [30]),
])
def test_vllm_layer_split(layers: int, pp: int, sizes: list[int]) -> None:
    stages = [pp_stage_layers(layers, pp, s) for s in range(pp)]
    assert [len(s) for s in stages] == sizes
    # contiguous and covering every layer once
    assert [i for s in stages for i in s] == list(range(layers))


def test_stage_weights_by_hand() -> None:
    # TinyLlama-1.1B (22 layers, h 2048, intermediate 5632, 4 KV heads of 64, vocab 32,000, untied), bf16, pp 2:
    # 11 layers each. One layer: q 2048 x 2048 + k, v 2048 x 256 each + o 2048 x 2048 + gate, up, down
    # 3 x 2048 x 5632 + two norms 2 x 2048 = 4,194,304 + 1,048,576 + 4,194,304 + 34,603,008 + 4096 = 44,044,288.
    # stage 0: 11 x 44,044,288 + embedding 32,000 x 2048 = 484,487,168 + 65,536,000 = 550,023,168 -> x 2 B
    # stage 1: 484,487,168 + LM head 65,536,000 + final norm 2048 = 550,025,216 -> x 2 B
    r = resolve(_serve("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 2, max_len=2048))
    assert serve_weights_bytes(r, 0)[0] == 1_100_046_336
    assert serve_weights_bytes(r, 1)[0] == 1_100_050_432
    d = decide(r, version="0.19")
    rotary = d.rotary_cache_bytes  # every stage builds the rotary cache: 2048 positions x 64 x 2 B = 262,144
    assert rotary == 262_144
    assert [st.weights_bytes for st in d.stages] == [1_100_046_336 + rotary, 1_100_050_432 + rotary]


def test_tied_embeddings_on_the_last_stage() -> None:
    # SmolLM-135M ties its head to the embedding (h 576, vocab 49,152, 30 layers -> 15 + 15): vLLM builds
    # embed_tokens on the last rank too, so stage 1 holds stage 0's bytes plus the final norm, 576 x 2 B = 1152 B
    # (without the tied head it would hold 49,152 x 576 x 2 = 56,623,104 B less)
    r = resolve(_serve("HuggingFaceTB/SmolLM-135M", 2, max_len=2048))
    first, last = serve_weights_bytes(r, 0)[0], serve_weights_bytes(r, 1)[0]
    assert last - first == 1152


def test_kv_pool_is_the_fewest_blocks_of_any_stage() -> None:
    # Llama-3.1-8B, pp 4 (8 layers each), vLLM 0.19, 8192 batched tokens: page 16 x 4096 B = 65,536 B per layer
    d = decide(resolve(_serve("meta-llama/Llama-3.1-8B", 4)), version="0.19")
    assert [st.layers for st in d.stages] == [8, 8, 8, 8]
    for st in d.stages:
        assert st.own_blocks == st.available_kv_bytes // 65_536 // 8
    fewest = min(st.own_blocks for st in d.stages)
    assert d.num_gpu_blocks == fewest and d.kv_cache_tokens == fewest * 16
    # the last stage runs the sampler (1024 requests x 128,256 entries), so its budget is the smallest
    assert d.binding_stage == 3 and d.stages[3].own_blocks < min(st.own_blocks for st in d.stages[:3])
    assert all(st.kv_cache_bytes == fewest * 65_536 * 8 for st in d.stages)
    # a middle stage = the first stage + the received intermediate tensors, hidden states and residual:
    # 2 x 8192 x 4096 x 2 B = 134,217,728 B (neither runs the sampler)
    assert d.stages[1].activation_peak_bytes - d.stages[0].activation_peak_bytes == 134_217_728
    # the first stage's weights hold the embedding, a middle one's none: 128,256 x 4096 x 2 B = 1,050,673,152 B
    assert d.stages[0].weights_bytes - d.stages[1].weights_bytes == 1_050_673_152
    # one NCCL communicator for the pipeline group on every stage
    assert d.nccl_bytes > 0 and all(st.nccl_bytes == d.nccl_bytes for st in d.stages)


def test_pp1_has_no_stage_rows() -> None:
    d = decide(resolve(_serve("meta-llama/Llama-3.1-8B", 1)), version="0.19")
    assert d.stages == () and "stages" not in d.to_dict()


def test_uneven_split_binds_on_a_longer_stage() -> None:
    # Qwen3-235B-A22B, 94 layers over pp 4 on H200s: 23/24/24/23; the 24-layer stages hold more weights and more
    # KV layers, so one of them has the fewest blocks (the first of the two: ties go to the lower stage)
    d = decide(resolve(_serve("Qwen/Qwen3-235B-A22B", 4, gpu="H200", quantization="fp8-block", max_num_seqs=32,
                              version="0.27.1")), version="0.27.1")
    assert [st.layers for st in d.stages] == [23, 24, 24, 23]
    assert d.binding_stage == 1 and d.stages[1].own_blocks == d.stages[2].own_blocks == d.num_gpu_blocks


@pytest.mark.parametrize(("model", "pp", "serve", "where", "says"), [
    ("meta-llama/Llama-3.1-8B", 2, {"speculative": {"method": "ngram", "num_speculative_tokens": 2}},
     "serve.speculative", "speculative decoding with pipeline parallelism"),
    ("meta-llama/Llama-3.1-8B", 2, {"max_loras": 1}, "serve.max_loras", "with pipeline parallelism"),
    ("meta-llama/Llama-3.1-8B", 2, {"cpu_offload_gb": 4}, "serve.cpu_offload_gb", "with pipeline parallelism"),
    ("meta-llama/Llama-3.1-8B", 2, {"vllm_version": "0.6.5"}, "serve.vllm_version", "V0 engine"),
    ("google/gemma-3-27b-pt", 2, {}, "parallel.pp", "several KV-cache groups"),  # sliding-window and full
    ("HuggingFaceTB/SmolLM-135M", 32, {}, "parallel.pp", "30 layers"),  # 32 stages, 30 layers
])
def test_what_pipeline_parallelism_is_not_modelled_with(model: str, pp: int, serve: dict[str, Any], where: str,
                                                         says: str) -> None:
    doc = _serve(model, pp, **serve)
    with pytest.raises(ScenarioError) as exc:
        decide(resolve(doc), version=doc["serve"]["vllm_version"])
    assert exc.value.problems[0].where == where and says in exc.value.problems[0].message


def test_cli_pp_sets_the_gpus_and_prints_every_stage() -> None:
    res = CliRunner().invoke(app, ["serve", "--model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--gpu", "H100",
                                   "--pp", "2", "--vllm-version", "0.19", "--max-model-len", "2048", "--json"], env=ENV)
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)["vllm"]
    assert v["pp"] == 2 and [s["layers"] for s in v["stages"]] == [11, 11]
    assert v["num_gpu_blocks"] == min(s["own_blocks"] for s in v["stages"])
    res = CliRunner().invoke(app, ["serve", "--model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--gpu", "H100",
                                   "--pp", "2", "--vllm-version", "0.19", "--max-model-len", "2048"], env=ENV)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pipeline stages"))
    table = "\n".join(lines[start:start + 7]) + "\n"
    snap = SNAP / "serve_pp2_stages.txt"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snap.write_text(table)
    assert table == snap.read_text()
    assert "pp=2 (stage 1 shown, the binding one)" in lines[0]


def test_pipeline_with_a_vision_encoder_is_refused() -> None:
    """Which pipeline rank holds a vision tower and profiles the encoder is not modelled: refused, naming pp."""
    import pytest as _pytest

    from vramplan.engine import estimate as _estimate
    from vramplan.errors import ScenarioError as _ScenarioError

    with _pytest.raises(_ScenarioError) as err:
        _estimate({"model": "Qwen/Qwen2.5-VL-7B-Instruct", "task": "serve", "hardware": {"gpu": "H100", "num_gpus": 2},
                   "parallel": {"pp": 2}})
    assert "vision encoder" in str(err.value) and "parallel.pp" in str(err.value)
