"""Training Llama 3.2 Vision (mllama) with its vision model frozen (analytic/terms/cross_attention.py): the
cross-attention layers' saved tensors by hand, against transformers 5.24 on the CPU, and the settings still
refused (spec/checks.py ``_cross_train_problems``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.terms import step_terms
from vramplan.analytic.terms.context import StepContext, step_policy
from vramplan.analytic.terms.cross_attention import cross_sequence
from vramplan.analytic.terms.layers import layer_activations
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError

TINY = Path(__file__).resolve().parent / "data" / "mllama-tiny-shape" / "config.json"
# Llama-3.2-11B-Vision's shape (meta-llama/Llama-3.2-11B-Vision config.json): transformers 5.24's MllamaConfig
# defaults (h 4096, 40 layers, cross-attention at 3, 8, ..., 38, 32 heads, 8 KV heads, MLP 14,336) with 560-pixel
# tiles (4 x ((560 / 14)^2 + 1) = 6,404 vision positions per image)
ELEVEN_B: dict[str, Any] = {"model_type": "mllama", "torch_dtype": "bfloat16",
                            "vision_config": {"image_size": 560, "max_num_tiles": 4}, "text_config": {}}


def _ctx(model: Any, **train: Any) -> StepContext:
    r = resolve({"model": str(model) if isinstance(model, Path) else model, "hardware": {"gpu": "H100-80GB"}, "task": "train", "train": train})
    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)
    return StepContext(r, 0, attention, repeat)


def _terms(c: StepContext) -> dict[str, int]:
    return {t.name: t.nbytes for t in step_terms(c) if t.name.startswith(("saved.cross", "saved.vision_output", "saved.vision_model"))}


def test_eleven_b_lora_cross_layer_by_hand() -> None:
    c = _ctx(ELEVEN_B, peft={"method": "lora", "rank": 16}, images_per_sample=1, seq_len=1024)
    la = layer_activations(c)
    # bf16-mixed LoRA on q_proj and v_proj: c = 2, the frozen base's residual stream in bf16 (r = 2), adapters'
    # inputs cast back to bf16 by autocast.  Per text token of a cross-attention layer:
    #   input RMSNorm (frozen): fp32 copy 4 x 4096 + rsqrt 4                           = 16,388
    #   q_proj's LoRA: its input 2 x 4096 + lora_A's output 2 x 16                     =  8,224
    #   q_norm (frozen): fp32 copy 4 x 4096 + rsqrt per head 4 x 32                    = 16,512
    #   memory-efficient kernel: q 8,192 + output 8,192 + logsumexp 4 x 32             = 16,512
    #   the mask, its row of 6,404 keys padded to 6,408 (6,404 % 8 = 4): 2 x 6,408      = 12,816
    #   post-attention RMSNorm                                                         = 16,388
    #   frozen gated MLP: SiLU's input, its output and up's output 3 x 2 x 14,336      = 86,016
    text = 16_388 + 8_224 + 16_512 + 16_512 + 12_816 + 16_388 + 86_016
    assert text == 172_856
    # per vision position: v_proj's LoRA (input 2 x 4096 + lora_A's output 2 x 16 = 8,224); the keys do not require
    # grad (k_proj frozen, no adapter): no k_norm tensors; K and V repeated to 32 heads: 2 x 2 x 4096 = 16,384
    vision = 8_224 + 16_384
    assert vision == 24_608
    # and the two gates' tanh outputs (frozen, bf16), which the gates' products save: 4
    assert la.full[3] == 1024 * text + 6_404 * vision + 4 == 334_594_180
    assert la.full[3] == la.kept[3]
    # a self-attention layer (Llama's) has none of it; the first layer's input norm saves nothing (frozen prefix)
    assert la.full[2] == la.full[4] < la.full[3] and la.full[0] == la.full[2] - 16_388 * 1024
    # shared: the row mask [1, 1, 1024, 1] in bf16 (the mask itself is copied per layer); the vision output
    # 6,404 x 7,680 x 2 B to the loss; the projected states are saved by nothing (k_proj / v_proj frozen)
    assert _terms(c) == {"saved.cross_attention_mask": 2 * 1024, "saved.vision_output": 6_404 * 7_680 * 2}


def test_full_checkpointing_keeps_the_inputs_and_the_shared_states() -> None:
    c = _ctx(ELEVEN_B, peft={"method": "lora", "rank": 16}, images_per_sample=1, seq_len=1024,
             gradient_checkpointing="full")
    la = layer_activations(c)
    # every layer keeps its bf16 input, 1024 x 4096 x 2; the cross layer is recomputed whole (334,594,180 above)
    assert la.kept[3] == la.kept[0] == 1024 * 4096 * 2
    assert la.full[3] == 334_594_180
    # GradientCheckpointingLayer binds cross_attention_states and the masks to the backward: states 6,404 x 4096 x
    # 2; mask [1, 1, 1024, 6404] in bf16 and the row mask
    assert _terms(c) == {"saved.cross_attention_states": 6_404 * 4096 * 2,
                         "saved.cross_attention_mask": 2 * 1024 * 6_404 + 2 * 1024,
                         "saved.vision_output": 6_404 * 7_680 * 2}


def test_full_fine_tuning_with_the_tower_frozen_by_hand() -> None:
    c = _ctx(TINY, precision="bf16-mixed", freeze_vision_tower=True, images_per_sample=4, seq_len=8)
    la = layer_activations(c)
    # tiny shape: h 128, 4 heads of 32, 2 KV heads, MLP 256; 4 images x 2 tiles x 17 = 136 positions (aligned)
    # bf16-mixed full fine-tuning: c = 2, r = 4 (fp32 residual), autocast.  Per text token:
    #   input RMSNorm: the fp32 input (its own fp32 copy) and the normalised tensor (4 + 4) x 128 + rsqrt 4 = 1,028
    #   q_proj's input, cast to bf16 by autocast: 2 x 128                                         =   256
    #   q_norm: fp32 copy and bf16 normalised tensor (4 + 2) x 128 + rsqrt 4 x 4 heads            =   784
    #   kernel: q 256, output 256, logsumexp 4 x 4                                                =   528
    #   the mask, cast to bf16 per layer (r != c): 2 x 136                                        =   272
    #   the attention gate's input (o_proj's output): 2 x 128                                     =   256
    #   post-attention RMSNorm                                                                    = 1,028
    #   MLP: gate's and up's bf16 casts 2 x 256, SiLU's input, its output, up's, down's 4 x 512   = 2,560
    #   the MLP gate's input: (row mask x MLP output) promoted to fp32: 4 x 128                   =   512
    text = 1_028 + 256 + 784 + 528 + 272 + 256 + 1_028 + 2_560 + 512
    assert text == 7_224
    # per vision position: k_norm (4 + 2) x 64 + 4 x 2 KV heads = 392; K and V repeated to 4 heads 2 x 2 x 128 = 512
    vision = 392 + 512
    # the two gates' tanh outputs, fp32: 8
    assert la.full[1] == la.full[4] == 8 * text + 136 * vision + 8 == 180_744
    # shared: the projected states, bf16, saved by every k_proj / v_proj (136 x 128 x 2); the row mask (fp32)
    assert _terms(c) == {"saved.cross_attention_states": 136 * 128 * 2, "saved.cross_attention_mask": 4 * 8,
                         "saved.vision_output": 136 * 192 * 4}


def test_without_an_image_the_cross_layers_save_nothing() -> None:
    for ckpt in ("none", "full"):
        c = _ctx(TINY, peft={"method": "lora"}, images_per_sample=0, seq_len=8, gradient_checkpointing=ckpt)
        la = layer_activations(c)
        assert la.full[1] == la.kept[1] == la.full[4] == la.kept[4] == 0
        assert la.kept[0] > 0 and la.attn_transient[1] == la.mlp_transient[1] == 0
        assert _terms(c) == {}


def test_cross_layer_saved_bytes_equal_transformers_on_the_cpu() -> None:
    """transformers 5.24's ``MllamaForConditionalGeneration`` of the tiny shape, fp32 on the CPU in training mode,
    vision model and projector frozen, 8 text tokens and 4 images (136 vision positions): the tensors autograd saves
    (``saved_tensors_hooks``) inside a cross-attention layer, one per storage, parameters and the tensors every
    layer shares apart, equal the engine's layer; the shared ones equal ``cross_saved``'s.  (The CPU's SDPA kernel
    saves what CUDA's memory-efficient one does here: q, K and V, the output and an fp32 logsumexp; 136 keys need
    no padding.)"""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model = _tiny_train_model()
    for name, p in model.named_parameters():
        if name.startswith(("model.vision_model", "model.multi_modal_projector")):
            p.requires_grad_(False)
    saved = _saved_by_layer(model)
    shared = set(saved[1]) & set(saved[4])
    own = sum(n for k, n in saved[1].items() if k not in shared)
    c = _ctx(TINY, precision="fp32", freeze_vision_tower=True, images_per_sample=4, seq_len=8)
    la = layer_activations(c)
    # fp32: per text token 1,028 + 512 + 1,040 + 1,040 (q, output, logsumexp 16) + 512 (gate) + 1,028 + 4,608
    # (MLP) + 512 (MLP gate) = 10,280 -> 82,240; per vision position k_norm (4 + 4) x 64 + 8 = 520 and K, V
    # repeated 1,024 -> 136 x 1,544 = 209,984; the gates' tanh outputs 8: 292,232
    assert own == la.full[1] == 292_232
    terms = _terms(c)
    assert sum(saved[1][k] for k in shared) == terms["saved.cross_attention_states"] + terms["saved.cross_attention_mask"]


@pytest.mark.parametrize(("train", "words"), [
    ({"peft": {"method": "dora"}}, "dora is not modelled for it"),
    ({"peft": {"method": "qlora"}}, "qlora is not modelled for it"),
    ({"peft": {"method": "lora"}, "quantization": "nf4"}, "nf4 is not modelled for it"),
    ({"peft": {"method": "lora"}, "attention": "eager"}, "attention 'eager' is not modelled for its training"),
    ({"peft": {"method": "lora"}, "gradient_checkpointing": "selective"}, "selective checkpointing is not modelled"),
    ({"peft": {"method": "lora"}, "liger_kernels": True}, "Liger's mllama patch is not modelled"),
])
def test_training_settings_not_modelled_are_refused(train: dict[str, Any], words: str) -> None:
    doc = {"model": str(TINY), "hardware": {"gpu": "H100-80GB"}, "task": "train",
           "train": {"images_per_sample": 1, "seq_len": 64, **train}}
    with pytest.raises(ScenarioError, match=words):
        resolve(doc)


def test_parallel_layouts_are_refused() -> None:
    doc = {"model": str(TINY), "hardware": {"gpu": "H100-80GB", "num_gpus": 2}, "task": "train",
           "parallel": {"tp": 2}, "train": {"images_per_sample": 1, "seq_len": 64, "peft": {"method": "lora"}}}
    with pytest.raises(ScenarioError, match="without tensor, pipeline or context parallelism"):
        resolve(doc)


@pytest.mark.parametrize("train", [
    {"peft": {"method": "lora", "rank": 16, "target_modules": "all-linear"}, "gradient_checkpointing": "full"},
    {"freeze_vision_tower": True},
    {"gradient_checkpointing": "full"},
], ids=["lora-all-linear-full-ckpt", "full-tower-frozen", "full-tower-trained-ckpt"])
def test_the_allocator_stream_holds_the_cross_layers_and_shared_tensors(train: dict[str, Any]) -> None:
    """The event stream (analytic/events.py) allocates each cross-attention layer's records (text and vision
    positions) and the shared tensors (``cross_sequence``, beside a tower's): every layer's saved events sum to its
    closed-form bytes, and the stream's allocated peak is within 0.5% of the timeline's (512-byte rounding and the
    forward's short-lived temporaries, as for Llama: tests/test_analytic_events.py)."""
    from vramplan.alloc import replay
    from vramplan.analytic.events import train_run_events
    from vramplan.analytic.train import train_step

    doc = {"model": ELEVEN_B, "hardware": {"gpu": "H100-80GB"}, "task": "train",
           "train": {"images_per_sample": 2, "seq_len": 512, **train}}
    tr = train_step(resolve(doc))
    lay, c = tr.layout, tr.context
    assert lay is not None and isinstance(c, StepContext)
    la = layer_activations(c)
    assert [sum(lt.saved) for lt in lay.layers] == list(la.full)
    shared = sum(n for _, n, _ in cross_sequence(c))
    assert shared > 0 and sum(lay.vision_saved) == shared
    res = replay(train_run_events(lay))
    assert abs(res.peak_allocated_bytes / tr.peak.total - 1) < 0.005


@pytest.mark.parametrize(("version", "words"), [
    ("0.6", "vLLM 0.6 has no mllama model: MllamaForConditionalGeneration came in 0.6.2"),
    ("0.6.2", "vLLM 0.6.2 serves it on the V0 engine's encoder-decoder path (0.6.2 to 0.10.2)"),
    ("0.10.2", "vLLM 0.10.2 serves it on the V0 engine's encoder-decoder path"),
    ("0.11", ("vLLM 0.11 does not serve it: the model was removed with the V0 engine's encoder-decoder support "
              "after 0.10.2")),
    ("0.19", "vLLM 0.19 does not serve it"),
])
def test_vllm_serving_is_refused_by_release(version: str, words: str) -> None:
    """vLLM serves mllama from 0.6.2 (PR #8811) to 0.10.2 (registry.py _PREVIOUSLY_SUPPORTED_MODELS; PR #24907
    removed V0's encoder-decoder runner): refused as absent outside those releases, as not modelled inside."""
    doc = {"model": str(TINY), "hardware": {"gpu": "H100-80GB"}, "task": "serve",
           "serve": {"vllm_version": version}}
    with pytest.raises(ScenarioError, match=words.replace("(", r"\(").replace(")", r"\)")) as err:
        resolve(doc)
    assert "_PREVIOUSLY_SUPPORTED_MODELS" in str(err.value)


@settings(max_examples=25, deadline=None)
@given(images=st.integers(0, 6), seq=st.integers(12, 300), lora=st.booleans(), ckpt=st.sampled_from(["none", "full"]))
def test_cross_layer_saved_bytes_grow_with_images_and_text(images: int, seq: int, lora: bool, ckpt: str) -> None:
    """Four more images (the tiny shape's 34 positions per image keep a row's alignment to 8 keys every 4 images,
    so the mask stays where it was: one image more can move it from the shared tensors into every layer's padded
    copies, or back, and the step's bytes can then fall) raise a cross-attention layer's saved bytes and the step's
    (both layers and the shared tensors); one more text token never lowers them; without image the layer saves
    nothing and the shared terms are gone."""
    method: dict[str, Any] = {"peft": {"method": "lora"}} if lora else {"freeze_vision_tower": True}

    def saved(n: int, p: int) -> tuple[int, int]:
        c = _ctx(TINY, images_per_sample=n, seq_len=p, gradient_checkpointing=ckpt, **method)
        return layer_activations(c).full[1], sum(_terms(c).values())

    def step(x: tuple[int, int]) -> int:
        return 2 * x[0] + x[1]  # the tiny shape's two cross-attention layers and the shared tensors

    here, more_images, more_text = saved(images, seq), saved(images + 4, seq), saved(images, seq + 1)
    assert more_images[0] > here[0] and step(more_images) > step(here)
    assert more_text[0] >= here[0] and step(more_text) >= step(here)
    if images == 0:
        assert here == (0, 0)


def test_the_report_states_the_training_model() -> None:
    from vramplan.engine import estimate

    report = estimate(resolve({"model": ELEVEN_B, "hardware": {"gpu": "H100-80GB"}, "task": "train",
                               "train": {"peft": {"method": "lora", "rank": 16}, "images_per_sample": 1,
                                         "seq_len": 1024}})).to_json_dict()
    text = " ".join(report["assumptions"])
    assert "frozen (PEFT)" in text and "4 x 1,601 = 6,404 vision positions per image" in text
    assert "cross-attention layers in training: 1 image(s) per sample, 6,404 vision positions" in text
    assert "the vision model's own forward peak" in text
    assert report["verdict"] == "FITS"


def test_trained_vision_model_saved_bytes_equal_transformers_on_the_cpu() -> None:
    """Full fine-tuning with the vision model and projector trained: what autograd saves (``saved_tensors_hooks``,
    one per storage, parameters apart) from the vision model's first op to the projector's end, fp32 on the CPU
    with the tiny shape (2 tiles of 17 positions padded to 24: S = 48), equals ``trained_tower_bytes``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.analytic.terms.cross_attention import trained_tower_bytes

    model = _tiny_train_model()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}
    recording = [True]

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if recording[0] and st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    model.model.multi_modal_projector.register_forward_hook(lambda mod, args, out: recording.__setitem__(0, False))
    ids = torch.tensor([[1000] + list(range(5, 12))])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, pixel_values=torch.randn(1, 1, 2, 3, 56, 56), aspect_ratio_ids=torch.tensor([[2]]),
              aspect_ratio_mask=torch.ones(1, 1, 2, dtype=torch.long),
              cross_attention_mask=torch.ones(1, 8, 1, 2, dtype=torch.long), labels=ids.clamp(max=999))
    c = _ctx(TINY, precision="fp32", images_per_sample=1, seq_len=8)
    # fp32 (r = c = x = 4), d 64, I 128, 4 heads, 4 local + 2 global layers, T = 2, P = 17, S = 48:
    #   stem: pixels 4 x 2 x 3 x 56^2 = 75,264; ids 8; pre-tile embedding 4 x 2 x 64 = 512; tile position embedding
    #         4 x 34 x 64 = 8,704; layernorm_pre (4 x 64 + 8) x 34 = 8,976                               -> 93,464
    #   a layer per position: LayerNorms 2 x 264, q/k/v input 256, q k v 768, logsumexp 16, output 256, fc1 input
    #         256, GELU 2 x 512 = 3,104 -> x 48 x 6 layers = 893,952; global gates 2 x 2 x 256 x 48 = 49,152
    #   mask 4 x 48^2 = 9,216 (one, no autocast); layernorm_post 264 x 48 = 12,672; post-tile 512;
    #   projector input 4 x 34 x 192 = 26,112; tanh outputs (5 + 2 x 2) x 4 = 36
    expected = 93_464 + 893_952 + 49_152 + 9_216 + 12_672 + 512 + 26_112 + 36
    assert sum(saved.values()) == trained_tower_bytes(c) == expected == 1_085_116
    assert _terms(c)["saved.vision_model"] == expected


def test_eleven_b_trained_vision_model_by_hand() -> None:
    from vramplan.analytic.terms.cross_attention import trained_tower_bytes

    c = _ctx(ELEVEN_B, images_per_sample=1, seq_len=1024)
    # bf16-mixed full fine-tuning, one image: d 1280, I 5120, 16 heads, 32 local + 8 global layers, T = 4 tiles of
    # P = 1,601 positions padded to 1,608: S = 6,432; r = 4, c = x = 2 (autocast casts)
    #   stem: pixels 2 x 4 x 3 x 560^2 = 7,526,400; ids 8; pre-tile 4 x 4 x 1280 = 20,480; tile positions
    #         4 x 6,404 x 1280 = 32,788,480; layernorm_pre (4 x 1280 + 8) x 6,404 = 32,839,712      -> 73,175,080
    #   layers: per position 2 x 5,128 + 3 x 2,560 (q/k/v casts) + 7,680 (q, k, v) + 64 + 2,560 + 2,560 + 20,480
    #         = 51,280, x 6,432 x 40 = 13,193,318,400; global gates 8 x 2 x 2,560 x 6,432 = 263,454,720
    #   mask, a bf16 copy per layer: 40 x 2 x 6,432^2 = 3,309,649,920
    #   layernorm_post 5,128 x 6,432 = 32,983,296; post-tile 20,480; projector input 2 x 6,404 x 7,680 = 98,365,440
    #   tanh outputs (5 + 16) x 4 = 84
    expected = (73_175_080 + 13_193_318_400 + 263_454_720 + 3_309_649_920 + 32_983_296 + 20_480 + 98_365_440 + 84)
    assert trained_tower_bytes(c) == expected == 16_970_967_420  # 15.8 GiB
    # frozen, none of it
    assert trained_tower_bytes(_ctx(ELEVEN_B, images_per_sample=1, seq_len=1024, freeze_vision_tower=True)) == 0


def test_lora_cross_layer_saved_bytes_equal_transformers_on_the_cpu() -> None:
    """LoRA (rank 8 on q_proj and v_proj, no dropout) with every base weight frozen, fp32 on the CPU, the tiny shape,
    8 text tokens and 4 images: each adapted linear runs peft's ``LoraLayer`` forward, ``base(x) + lora_B(lora_A(
    x.to(lora_A.weight.dtype))) * scaling`` (peft 0.17 ``tuners/lora/layer.py`` ``Linear.forward``).  The
    cross-attention layer saves what the engine counts; v_proj's adapter keeps ``cross_attention_states`` itself (the
    cast to fp32 is a no-op), shared by the layers (``states_kept_by_lora``), and the frozen gates' tanh outputs are
    saved by their products all the same."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    nn = torch.nn

    class Lora(nn.Module):
        def __init__(self, base: Any, rank: int = 8) -> None:
            super().__init__()
            self.base = base
            self.lora_A = nn.Linear(base.in_features, rank, bias=False)
            self.lora_B = nn.Linear(rank, base.out_features, bias=False)

        def forward(self, x: Any) -> Any:
            return self.base(x) + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * 2.0

    model = _tiny_train_model()
    model.requires_grad_(False)
    for layer in model.model.language_model.layers:
        attn = getattr(layer, "self_attn", None) or layer.cross_attn
        attn.q_proj, attn.v_proj = Lora(attn.q_proj), Lora(attn.v_proj)
    saved = _saved_by_layer(model)
    shared = set(saved[1]) & set(saved[4])
    own = sum(n for k, n in saved[1].items() if k not in shared)
    c = _ctx(TINY, precision="fp32", peft={"method": "lora", "rank": 8}, images_per_sample=4, seq_len=8)
    # per text token: norms 2 x 516, q's adapter input 512 and lora_A output 32, q_norm 512 + 16, q, output 2 x 512,
    # logsumexp 16, the frozen MLP's SiLU input, output and up output 3 x 1,024 -> 6,216 x 8 = 49,728; per vision
    # position: v's lora_A output 32, K and V repeated 2 x 512 -> 1,056 x 136 = 143,616; tanh outputs 8
    assert own == layer_activations(c).full[1] == 49_728 + 143_616 + 8 == 193_352
    terms = _terms(c)
    assert sum(saved[1][k] for k in shared) == terms["saved.cross_attention_states"] + terms["saved.cross_attention_mask"]


def _saved_by_layer(model: Any) -> dict[object, dict[int, int]]:
    """The tiny model's forward with 4 image tiles over 8 tokens: each decoder layer's saved tensors (by storage,
    parameters left out), keyed by layer index (None: outside the layers)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[object, dict[int, int]] = {}
    current: list[object] = [None]

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved.setdefault(current[0], {})[st.data_ptr()] = st.nbytes()
        return t

    for i, layer in enumerate(model.model.language_model.layers):
        layer.register_forward_pre_hook(lambda mod, args, i=i: current.__setitem__(0, i))
        layer.register_forward_hook(lambda mod, args, out: current.__setitem__(0, None))
    ids = torch.tensor([[1000] * 4 + list(range(5, 9))])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, pixel_values=torch.randn(1, 4, 2, 3, 56, 56), aspect_ratio_ids=torch.tensor([[2] * 4]),
              aspect_ratio_mask=torch.ones(1, 4, 2, dtype=torch.long),
              cross_attention_mask=torch.ones(1, 8, 4, 2, dtype=torch.long), labels=ids.clamp(max=999))
    return saved


def _tiny_train_model() -> Any:
    """transformers' ``MllamaForConditionalGeneration`` of the tiny shape, SDPA, seeded, in training mode."""
    import torch
    import transformers

    raw = json.loads(TINY.read_text())
    cfg = transformers.MllamaConfig(vision_config=raw["vision_config"], text_config=raw["text_config"],
                                    image_token_index=1000)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.MllamaForConditionalGeneration(cfg).train()
