"""One test per catalog row: the adapter reproduces the published parameter count."""

from __future__ import annotations

import pytest

from vramplan.catalog.models import list_models, load_model
from vramplan.errors import UnknownNameError
from vramplan.spec.hf_config import model_from_config

ROWS = list_models()

# Counts from the issue, also in the catalog; each is exact.
PUBLISHED = {
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "openai-community/gpt2": 124_439_808,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    # Pythia model card, "Naming convention and parameter count" (total incl. embeddings).
    "EleutherAI/pythia-70m": 70_426_624,
    "EleutherAI/pythia-160m": 162_322_944,
    "EleutherAI/pythia-410m": 405_334_016,
    "EleutherAI/pythia-1.4b": 1_414_647_808,
    "EleutherAI/pythia-2.8b": 2_775_208_960,
    "EleutherAI/pythia-6.9b": 6_857_302_016,
    "EleutherAI/pythia-12b": 11_846_072_320,
    # Keras-Hub qwen_presets.py params.
    "Qwen/Qwen2.5-32B-Instruct": 32_763_876_352,
    # Keras-Hub bloom_presets.py params.
    "bigscience/bloom-560m": 559_214_592,
    "Qwen/Qwen2.5-72B-Instruct": 72_706_203_648,
}


def test_catalog_has_at_least_30_models() -> None:
    assert len(ROWS) >= 30


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_has_source_and_count(row) -> None:  # type: ignore[no-untyped-def]
    assert row.source.startswith("https://")
    assert row.revision
    spec = model_from_config(row.config, name=row.id)
    assert spec.num_parameters > 0
    if row.published_parameters is None:
        return
    expected = row.published_parameters
    if spec.model_type == "bert":
        # Published 335,141,888 is BertModel with its pooler (h*h + h = 1,049,600); vramplan models
        # BertForMaskedLM: no pooler, plus the MLM transform (h*h + h), its LayerNorm (2h) and the
        # decoder bias (V).  h = 1024, V = 30522: 335,141,888 - 1,049,600 + 1,049,600 + 2,048 + 30,522.
        expected = expected + 2 * 1024 + 30522
    assert spec.num_parameters == expected


@pytest.mark.parametrize(("model_id", "count"), sorted(PUBLISHED.items()))
def test_issue_counts(model_id: str, count: int) -> None:
    assert load_model(model_id).num_parameters == count


def test_tinyllama() -> None:
    # 1,100,048,384 published for TinyLlama-1.1B
    rows = [r for r in ROWS if "tinyllama" in r.id.lower()]
    assert rows and load_model(rows[0].id).num_parameters == 1_100_048_384


def test_aliases_and_case() -> None:
    assert load_model("LLAMA-2-7B").num_parameters == 6_738_415_616
    assert load_model("Llama-2-7b-hf").name == "meta-llama/Llama-2-7b-hf"


# Hugging Face ids that scenarios name for instruct/chat checkpoints, with the catalog row each resolves to.  An
# alias means the variant's config.json builds the identical ModelSpec (the row's notes name the compared copy);
# a variant whose memory-relevant keys differ (Mistral-7B-Instruct-v0.2: no sliding window, 32k positions;
# Qwen2.5-7B-Instruct: 32k positions against 131k in the base file) is a row of its own.
VARIANTS = {
    "meta-llama/Llama-2-7b-chat-hf": "meta-llama/Llama-2-7b-hf",
    "meta-llama/Meta-Llama-3-8B-Instruct": "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.2-1B-Instruct": "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B-Instruct": "meta-llama/Llama-3.2-3B",
    "mistralai/Mistral-7B-Instruct-v0.2": "mistralai/Mistral-7B-Instruct-v0.2",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistralai/Mistral-7B-v0.3",
    "Qwen/Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-3B-Instruct": "Qwen/Qwen2.5-3B",
    "Qwen/Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct": "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct": "Qwen/Qwen2.5-72B-Instruct",
    "EleutherAI/pythia-70m-deduped": "EleutherAI/pythia-70m",
    "EleutherAI/pythia-12b-deduped": "EleutherAI/pythia-12b",
    "EleutherAI/pythia-410m-deduped": "EleutherAI/pythia-410m-deduped",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2-7B-Instruct": "Qwen/Qwen2-7B-Instruct",
    "google/gemma-7b": "google/gemma-7b",
    "google/gemma-2-2b-it": "google/gemma-2-2b",
    "google/gemma-2-9b-it": "google/gemma-2-9b",
    "google/gemma-2-27b-it": "google/gemma-2-27b",
    "google/gemma-2b-it": "google/gemma-2b",
    "google/gemma-7b-it": "google/gemma-7b",
    "meta-llama/Llama-2-13b-chat-hf": "meta-llama/Llama-2-13b-hf",
    "meta-llama/Llama-2-70b-chat-hf": "meta-llama/Llama-2-70b-hf",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Llama-3.1-70B",
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": "meta-llama/Llama-3.1-8B",
    "codellama/CodeLlama-7b-Instruct-hf": "codellama/CodeLlama-7b-hf",
    "codellama/CodeLlama-34b-Instruct-hf": "codellama/CodeLlama-34b-hf",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
    "bigscience/bloomz-560m": "bigscience/bloom-560m",
    "allenai/OLMo-2-1124-7B-Instruct": "allenai/OLMo-2-1124-7B",
    "allenai/OLMo-2-1124-13B-Instruct": "allenai/OLMo-2-1124-13B",
    "google/gemma-3-1b-it": "google/gemma-3-1b-pt",
}


@pytest.mark.parametrize(("name", "row_id"), sorted(VARIANTS.items()))
def test_variant_names_resolve(name: str, row_id: str) -> None:
    assert load_model(name).name == row_id


def test_variant_rows_differ_from_base() -> None:
    # Mistral-7B-Instruct-v0.2 has the v0.1 shapes (same 7,241,732,096 parameters) but full attention over 32k
    # positions: v0.1 keeps a 4096-token window in every layer.
    v01, v02 = load_model("mistralai/Mistral-7B-v0.1"), load_model("mistralai/Mistral-7B-Instruct-v0.2")
    assert v01.num_parameters == v02.num_parameters == 7_241_732_096
    assert {ls.sliding_window for ls in v01.layers} == {4096}
    assert {ls.sliding_window for ls in v02.layers} == {None}
    assert v02.max_position_embeddings == 32768
    # Qwen2.5-7B-Instruct: base shapes, 32768 positions (vLLM's default max_model_len) against 131072.
    base, inst = load_model("Qwen/Qwen2.5-7B"), load_model("Qwen/Qwen2.5-7B-Instruct")
    assert base.num_parameters == inst.num_parameters == 7_615_616_512
    assert (base.max_position_embeddings, inst.max_position_embeddings) == (131072, 32768)


def test_typo_suggests() -> None:
    with pytest.raises(UnknownNameError) as exc:
        load_model("llama-2-7bb")
    assert "llama-2-7b" in exc.value.suggestions


def test_moe_and_mla_facts() -> None:
    mix = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert mix.moe is not None and mix.moe.num_experts == 8 and mix.moe.top_k == 2
    # active: non-expert params + 2/8 of expert params
    assert mix.num_active_parameters < mix.num_parameters // 3
    v3 = load_model("deepseek-ai/DeepSeek-V3")
    assert v3.mla is not None and v3.mla.kv_lora_rank == 512 and v3.mla.qk_rope_head_dim == 64


def test_gemma2_alternates_sliding_window() -> None:
    g = load_model("google/gemma-2-9b")
    windows = [ls.sliding_window for ls in g.layers]
    assert windows[0] == 4096 and windows[1] is None
    assert g.tie_word_embeddings and g.norm == "gemma_rms" and g.sandwich_norms


def test_pythia_vocab_padding() -> None:
    # Pythia pads the 50,254-token vocabulary to a multiple of 128 up to 2.8B (50,304), 256 for 6.9B (50,432) and
    # 512 for 12B (50,688): total - non-embedding = 2 x V x h on the card, e.g. 12B: 11,846,072,320 - 11,327,027,200
    # = 519,045,120 = 2 x 50,688 x 5,120.
    assert load_model("pythia-2.8b").vocab_size == 50304
    assert load_model("pythia-6.9b").vocab_size == 50432
    assert load_model("pythia-12b").vocab_size == 50688
    assert load_model("pythia-12b").parallel_residual


def test_qwen25_instruct_rows_have_32k_positions() -> None:
    # Qwen2.5 1.5B/32B/72B-Instruct share the base shapes but their config.json has 32768 positions against 131072
    # in the base file, so each is a row of its own; 0.5B keeps 32768 in both files and is an alias.
    for size, count in (("1.5B", 1_543_714_304), ("32B", 32_763_876_352), ("72B", 72_706_203_648)):
        base, inst = load_model(f"Qwen/Qwen2.5-{size}"), load_model(f"Qwen/Qwen2.5-{size}-Instruct")
        assert base.num_parameters == inst.num_parameters == count
        assert (base.max_position_embeddings, inst.max_position_embeddings) == (131072, 32768)
    assert load_model("Qwen/Qwen2.5-0.5B-Instruct").max_position_embeddings == 32768


def test_codellama_34b_vocab_and_nemo_head_dim() -> None:
    # CodeLlama-34B has no infilling tokens: 32,000 entries (7B/13B: 32,016).  Count, h = 8192, V = 32000, 48 layers:
    # embed + head 2 x 32000 x 8192 = 524,288,000; per layer q,o 2 x 8192^2 = 134,217,728, k,v 2 x 8192 x 1024 =
    # 16,777,216, MLP 3 x 8192 x 22016 = 541,065,216, norms 2 x 8192 = 16,384 -> 692,076,544 x 48 = 33,219,674,112;
    # + final norm 8192 = 33,743,970,304.
    cl34 = load_model("codellama/CodeLlama-34b-hf")
    assert cl34.vocab_size == 32000 and cl34.num_kv_heads == 8
    assert cl34.num_parameters == 33_743_970_304
    # Mistral NeMo: 32 heads of 128 over hidden 5120 (head_dim is not hidden / heads = 160).
    nemo = load_model("mistralai/Mistral-Nemo-Base-2407")
    assert nemo.head_dim == 128 and nemo.hidden_size == 5120 and nemo.num_kv_heads == 8


def test_r1_distill_and_olmo2_facts() -> None:
    # R1-Distill-Qwen-1.5B unties the Qwen2.5-1.5B embeddings: the extra lm_head is 151,936 x 1,536 = 233,373,696,
    # 1,543,714,304 (tied) + 233,373,696 = 1,777,088,000.
    r1 = load_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    assert not r1.tie_word_embeddings and r1.num_parameters == 1_777_088_000
    # OLMo 2 normalises q and k (qk_norm) and places its norms after each sublayer.
    o7 = load_model("allenai/OLMo-2-1124-7B")
    assert o7.qk_norm and o7.vocab_size == 100352 and o7.num_kv_heads == 32


def test_names_are_unique_across_rows() -> None:
    # The lookup index keeps the first row that claims a name, so a second row claiming the same id, short id or
    # alias (case-insensitively) would be unreachable under it.
    owner: dict[str, str] = {}
    for row in ROWS:
        for name in {row.id, row.id.split("/")[-1], *row.aliases}:
            key = name.strip().lower()
            assert owner.setdefault(key, row.id) == row.id, (name, owner[key], row.id)


def test_state_space_rows_count_by_hand() -> None:
    # falcon-mamba-7b: h 4096, intermediate 8192, state 16, dt_rank 256, conv 4, vocab 65024, 64 layers, untied.
    # Per layer: in_proj 4096 x 16384 = 67,108,864; conv1d 8192 x 4 + bias 8192 = 40,960; x_proj 8192 x (256 + 32)
    # = 2,359,296; dt_proj 256 x 8192 + bias 8192 = 2,105,344; A_log 8192 x 16 = 131,072; D 8192; out_proj
    # 8192 x 4096 = 33,554,432; norm 4096 -> 105,312,256 x 64 = 6,739,984,384; + embeddings and head
    # 2 x 65024 x 4096 = 532,676,608; + final norm 4096 = 7,272,665,088.
    assert load_model("tiiuae/falcon-mamba-7b").num_parameters == 7_272_665_088
    # Mamba-Codestral-7B (mamba2): h 4096, intermediate 8192, 128 heads, 8 groups, state 128, conv 4, vocab 32768.
    # Per layer: in_proj 4096 x (2 x 8192 + 2 x 8 x 128 + 128 = 18,560) = 76,021,760; conv1d over 8192 + 2,048 =
    # 10,240 channels x 4 + bias = 51,200; dt_bias, A_log, D 3 x 128 = 384; gated norm 8192; out_proj 33,554,432;
    # norm 4096 -> 109,640,064 x 64 = 7,016,964,096; + 2 x 32768 x 4096 = 268,435,456; + 4096 = 7,285,403,648.
    assert load_model("mistralai/Mamba-Codestral-7B-v0.1").num_parameters == 7_285_403_648


def test_encoder_decoder_and_mamba_rows_count_by_hand() -> None:
    # google-t5/t5-small (tied head): shared 32128 x 512 = 16,449,536. Encoder layer: q, k, v, o 4 x 512^2 =
    # 1,048,576; wi 512 x 2048 + wo 2048 x 512 = 2,097,152; two norms 1,024 -> 3,146,752 x 6 = 18,880,512; + relative
    # bias 32 x 8 = 256 + final norm 512 = 18,881,280. Decoder layer adds cross-attention 1,048,576 and a norm 512 ->
    # 4,195,840 x 6 = 25,175,040 + 256 + 512 = 25,175,808. 16,449,536 + 18,881,280 + 25,175,808 = 60,506,624.
    assert load_model("google-t5/t5-small").num_parameters == 60_506_624
    # facebook/bart-base (tied head, final_logits_bias a buffer): shared 50265 x 768 = 38,603,520. Per stack: positions
    # (1024 + 2) x 768 = 787,968 and layernorm_embedding 1,536. Encoder layer: attention 4 x (768^2 + 768) = 2,362,368,
    # fc1 768 x 3072 + 3072 = 2,362,368, fc2 3072 x 768 + 768 = 2,360,064, two norms 3,072 -> 7,087,872 x 6 =
    # 42,527,232; encoder 43,316,736. Decoder layer adds cross-attention 2,362,368 and a norm 1,536 -> 9,451,776 x 6
    # = 56,710,656; decoder 57,500,160. 38,603,520 + 43,316,736 + 57,500,160 = 139,420,416.
    assert load_model("facebook/bart-base").num_parameters == 139_420_416
    # state-spaces/mamba-130m-hf (tied head): h 768, intermediate 1536, state 16, dt rank 48, conv 4, vocab 50280.
    # Per block: in_proj 768 x 3072 = 2,359,296; conv1d 1536 x 4 + 1536 = 7,680; x_proj 1536 x (48 + 32) = 122,880;
    # dt_proj 48 x 1536 + 1536 = 75,264; A_log 1536 x 16 = 24,576; D 1536; out_proj 1536 x 768 = 1,179,648; norm 768
    # -> 3,771,648 x 24 = 90,519,552; + embeddings 50280 x 768 = 38,615,040; + final norm 768 = 129,135,360.
    assert load_model("state-spaces/mamba-130m-hf").num_parameters == 129_135_360


def test_qwen3_vl_8b_row_counts_by_hand() -> None:
    # Qwen/Qwen3-VL-8B-Instruct (config.json as kohya-ss/musubi-tuner vendors it), untied head:
    # language model: embed and head 2 x 151,936 x 4,096 = 1,244,659,712; per layer q/o 2 x 4,096^2 = 33,554,432,
    # k/v 2 x 4,096 x 1,024 = 8,388,608, q/k norms 256, MLP 3 x 4,096 x 12,288 = 150,994,944, norms 8,192
    # -> 192,946,432 x 36 = 6,946,071,552; final norm 4,096 -> 8,190,735,360.
    # tower: patch_embed 1,152 x 3 x 2 x 16 x 16 + 1,152 = 1,770,624; pos_embed 2,304 x 1,152 = 2,654,208;
    # per block norms 4,608 + qkv 3,984,768 + proj 1,328,256 + fc1 4,962,512 + fc2 4,959,360 = 15,239,504, x 27 =
    # 411,466,608; merger 2,304 + 21,238,272 + 18,878,464 = 40,119,040; 3 DeepStack mergers (norm over 4,608)
    # 3 x 40,125,952 = 120,377,856 -> 576,388,336.
    m = load_model("qwen3-vl-8b")
    assert m.name == "Qwen/Qwen3-VL-8B-Instruct"
    assert m.vision_parameters == 576_388_336
    assert m.num_parameters - m.vision_parameters == 8_190_735_360
    assert m.num_parameters == 8_767_123_696
