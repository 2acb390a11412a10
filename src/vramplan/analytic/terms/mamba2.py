"""What a Mamba2 mixer layer saves for its backward in training, tensor by tensor (bytes for one micro-batch); an LFM2
gated short-convolution block's in ``short_conv_saved_tensors``.

Modelled: transformers 5.24's torch path of the mixer (``BambaMixer.forward`` in ``models/bamba/modeling_bamba.py``
with ``causal_conv1d_fn`` and ``mamba2_chunk_scan``), which is what runs without the ``mamba-ssm`` and
``causal-conv1d`` packages and without ``use_kernels=True``: ``mamba2_split_conv1d_scan_combined`` is decorated
with ``use_kernel_func_from_hub_with_fallback`` and returns None when no kernel is found, so ``forward`` falls
through to the torch code (``# Only kernels can use this shortcircuit, fallback to normal torch otherwise``).
The fused path (mamba-ssm's ``mamba_split_conv1d_scan_combined``, ``MambaSplitConv1dScanCombinedFn`` in
``mamba_ssm/ops/triton/ssd_combined.py``) saves only ``zxbcdt``, the conv weight and bias, ``dt``, ``A``, ``D``,
the RMSNorm and out_proj weights and recomputes the rest in its backward: it is *not* what is modelled here, and a
scenario cannot select it (vramplan has no option for it); the report says so as an assumption.

Every record below is made in the mixer's forward and freed at the end of the layer's backward (part
"attention": the mixer takes the attention's place in its decoder layer).  Notation: ``b`` sequences of ``s``
tokens, ``T = b s``; the chunk ``l`` (``mamba_chunk_size``), each sequence padded to ``S' = ceil(s / l) l``
(``pad_tensor_by_size``), ``P = b S'``, ``nc = S' / l`` chunks; ``H`` heads of ``d`` channels, ``I = H d``; ``g``
groups of state size ``n``, B and C repeated to every head (``N = H n``); ``conv_dim = I + 2 g n``, ``k`` =
``mamba_d_conv``; ``c``: bytes of the compute dtype; fp32 is 4 B.  Autograd's saved tensors follow
``tools/autograd/derivatives.yaml`` (mm saves its input; mul saves both operands that need it; exp and rsqrt
their result; silu, softplus, clamp and pow their input; masked_fill its mask; einsum runs as bmm on
contiguous copies of its operands, each copy saved).

* ``in_proj`` input: ``T h c``.
* the causal convolution's input: without autocast, a view of the ``in_proj`` output, whose whole storage stays:
  ``T (I + conv_dim + H) c``; under autocast the fp32 copy ``.to(weight.dtype)`` is cast back by conv1d (on
  autocast's lower-precision list): ``T conv_dim c``.
* the convolution's output, ``s + k - 1`` positions long (``padding = k - 1``, sliced to ``s``; SiLU saves the
  slice, which keeps the storage): ``b (s + k - 1) conv_dim c``.
* ``dt``: ``dt + dt_bias`` saved by softplus, softplus's output by clamp, and ``dt.float()`` by the two
  multiplications that discretize x and A: ``12 T H`` bytes in every precision (bf16: 2 + 2 + 4 + 4; fp32 or
  autocast, where softplus runs in fp32: 4 + 4 + 4, both ``.float()`` being the clamp output).
* ``A = -exp(A_log.float())``: the exp's result and A, ``8 H`` (per layer, not per token).
* the scan, in fp32 but for its einsums: they run as bmm, which autocast casts to the compute dtype (its
  lower-precision list), so under autocast their saved copies and their outputs (G, the states,
  ``C_times_states``) take ``e = c`` bytes an element, else ``e = 4``.  ``hidden_states.float()`` (``4 T I``; with fp32 compute it is the SiLU output itself,
  ``4 T conv_dim``, since x is a split view of it), the padded x of ``D_residual`` (``4 P I``), the
  discretized x copied by two einsums (``2 x 4 P I``), B padded (saved by ``B * decay_states``) and the copies
  of B and C made by the einsums for G, the states and ``C_times_states`` (``5 x 4 P N``), ``L = exp(segment_sum
  (A))``, ``G`` and M's copy for ``Y_diag`` (``3 x 4 P l H``), ``decay_states`` and ``state_decay_out``
  (``2 x 4 P H``), ``segment_sum``'s two boolean masks of each call (``2 l^2 + 2 (nc + 1)^2``), ``decay_chunk``
  (``4 b H (nc + 1)^2``), the concatenated states and the chunk-start states copied by their einsums
  (``4 b (nc + 1) I n + 4 b nc I n``), ``C_times_states`` (``4 P I``) and the scan's output, whose padded
  storage the slice keeps (``4 P I``).
* the gated RMSNorm, in fp32 (the scan's output is fp32): ``gate.float()`` (``4 T I``; none with fp32 compute,
  where it is a view of the ``in_proj`` output), its SiLU, the gated product, the normalized product (``4 T I``
  each), ``rsqrt`` per group (``4 T g``).
* without the gated norm (``MambaSpec.gated_norm`` False, ``FalconH1Mixer`` without ``mamba_rms_norm``):
  ``scan_output * silu(gate)`` saves the scan's output (counted above) and SiLU's output in the compute dtype
  (``T I c``); SiLU's input, the gate, is a view of the ``in_proj`` output (counted).
* ``out_proj`` input: the norm's output cast to the layer's dtype, or autocast's cast: ``T I c``.

Falcon-H1's mixer (``FalconH1Mixer``) also scales its input by ``ssm_in_multiplier`` (a Python float: the product
saves nothing, and is the ``in_proj`` input counted above) and multiplies ``in_proj``'s output by its ``mup_vector``
buffer (no gradient: the product saves only the buffer, and takes the output's place); with half weights and
without autocast that product has the output's size and dtype, so the records are the same.  Under autocast it is
fp32 (a half output times an fp32 buffer), which is not modelled (spec/checks.py refuses it).

Autocast's casts of the weights (``in_proj``, ``conv1d``, ``out_proj``) are the weight-cast terms'
(analytic/terms/casts.py), not the mixer's.

The sum equals the saved tensors that autograd's graph holds after a ``BambaMixer`` forward on the meta device,
storage by storage, at every shape the tests try (``tests/test_mamba2_train.py``), provided ``H > 1`` (with one
head the einsums' copies of x would be views).
"""

from __future__ import annotations

from vramplan.analytic.activations import SavedTensor
from vramplan.analytic.terms.gated_deltanet import gated_deltanet_saved_tensors
from vramplan.analytic.terms.lightning import lightning_saved_tensors
from vramplan.analytic.terms.mamba1 import mamba1_saved_tensors
from vramplan.spec.model import MambaSpec, ModelSpec
from vramplan.units import ceil_div

__all__ = ["frozen_mixer_dropped", "kbit_fp32_path_tensor", "mixer_adapter_inputs", "mixer_backward_per_token",
           "mixer_recompute_per_token", "mixer_saved_tensors", "mixer_train_notes"]

FP32 = 4


def mixer_saved_tensors(ms: MambaSpec, hidden: int, c: int, autocast: bool, batch: int,
                        seq: int, half_weights: bool = False) -> tuple[SavedTensor, ...]:
    """One Mamba2 mixer layer's saved tensors for ``batch`` sequences of ``seq`` tokens (module docstring), in
    bytes; ``c``: bytes of the compute dtype; ``autocast``: mixed precision (fp32 weights under autocast);
    ``half_weights``: half parameters (Mamba-1's ``D.float()`` copies them, analytic/terms/mamba1.py)."""
    if ms.kind == "mamba1":
        return mamba1_saved_tensors(ms, hidden, c, autocast, batch, seq, half_weights)
    if ms.kind == "short_conv":
        return short_conv_saved_tensors(ms, c, batch, seq)
    if ms.kind == "gated_deltanet" and not autocast:
        return gated_deltanet_saved_tensors(ms, hidden, c, batch, seq)
    if ms.kind == "lightning" and not autocast:
        return lightning_saved_tensors(ms, hidden, c, batch, seq)
    if ms.kind != "mamba2":
        raise ValueError(f"the saved tensors of {ms.kind} layers are not modelled")
    t = batch * seq
    chunk = ms.chunk_size
    padded = ceil_div(seq, chunk) * chunk
    p, nc = batch * padded, padded // chunk
    heads, inter, n, conv = ms.n_heads, ms.intermediate_size, ms.state_size, ms.conv_dim
    rep = heads * n  # B and C repeated to every head
    fp32_compute = c == FP32 and not autocast
    e = c if autocast else FP32  # the einsums' bmm operands and outputs: autocast casts them to the compute dtype
    rows = [
        ("mixer.in_proj_input", t * hidden * c),
        ("mixer.conv_input", t * (conv if autocast else inter + conv + heads) * c),
        ("mixer.conv_output", batch * (seq + ms.conv_kernel - 1) * conv * c),
        ("mixer.dt", 12 * t * heads),
        ("mixer.A", 2 * FP32 * heads),
        ("scan.x_fp32", FP32 * t * (conv if fp32_compute else inter)),
        ("scan.x_padded_D_residual", FP32 * p * inter),
        ("scan.x_einsum_copies", 2 * e * p * inter),
        ("scan.B_C", FP32 * p * rep + 4 * e * p * rep),
        ("scan.L_G_M", FP32 * p * chunk * heads + 2 * e * p * chunk * heads),
        ("scan.decays", 2 * FP32 * p * heads),
        ("scan.masks", 2 * chunk * chunk + 2 * (nc + 1) ** 2),
        ("scan.decay_chunk", (FP32 + (e if autocast else 0)) * batch * heads * (nc + 1) ** 2),
        ("scan.states", e * batch * (2 * nc + 1) * inter * n),
        ("scan.C_times_states", e * p * inter),
        ("scan.output", FP32 * p * inter),
        ("norm.gate_fp32", 0 if fp32_compute or not ms.gated_norm else FP32 * t * inter),
        ("norm.gated", 3 * FP32 * t * inter if ms.gated_norm else 0),
        ("norm.rsqrt", FP32 * t * ms.n_groups if ms.gated_norm else 0),
        ("gate.silu", 0 if ms.gated_norm else t * inter * c),
        ("mixer.out_proj_input", t * inter * c),
    ]
    return tuple(SavedTensor(name, nbytes) for name, nbytes in rows if nbytes)


def kbit_fp32_path_tensor(ms: MambaSpec, batch: int, seq: int) -> SavedTensor:
    """What a frozen Mamba2 mixer keeps over a bitsandbytes base prepared by peft (fp32 norms and residual stream)
    under half autocast, beyond the autocast records (``mixer_saved_tensors``), ``T = b s`` tokens.

    bitsandbytes' ``Linear4bit`` and ``Linear8bitLt`` return their input's dtype (``out.to(inp_dtype)``; the traced
    engine's ``QuantLinear`` does the same), so in_proj's output is fp32, kept whole by the gate's view that the
    gated norm's SiLU saves: ``4 (2 I + 2 g n + H)`` a token where autocast's matmul gives a half one (``2`` of the
    same).  transformers' torch convolution path (``causal_conv1d_fn``'s reference) then works on the fp32 xBC: the
    half copy autocast's conv1d makes of it, kept by the convolution (``2 (I + 2 g n)``), the fp32 output it casts back
    to its input's dtype (``4 (I + 2 g n)``), whose views x, B and C the scan takes without its ``.float()`` copies,
    and the gate needs no fp32 copy either (``8 I`` fewer); and the convolution weight's half cast (``2 conv k`` a
    layer).  Net: ``T (2 I + 16 g n + 2 H) + 2 (I + 2 g n) k``, equal to the traced engine's graphs of a frozen Mamba2
    stack over a 4-bit base with LoRA on in_proj on five shapes (tests/test_families_state_space.py)."""
    inner, gn, conv = ms.intermediate_size, max(1, ms.n_groups) * ms.state_size, ms.conv_dim
    return SavedTensor("mixer.kbit_fp32_path", batch * seq * (2 * inner + 16 * gn + 2 * ms.n_heads)
                       + 2 * conv * ms.conv_kernel)


def frozen_mixer_dropped(ms: MambaSpec, adapted: frozenset[str], half: bool = True,
                         batch: int = 1, autocast: bool = False) -> dict[str, int | float]:
    """What a Mamba2 mixer whose weights are frozen (PEFT) does not save of ``mixer_saved_tensors``' records, as
    the share of each record left out (``adapted``: the module names carrying an adapter).

    autograd saves an operand only for the gradient of an input that requires grad (derivatives.yaml): with the
    weights frozen, ``in_proj`` and ``out_proj`` (``F.linear``) no longer save their inputs (they were kept for the
    weights' gradients; the input's gradient needs the weight only), unless the module carries a LoRA adapter,
    whose ``lora_A`` saves that same input; and the gated norm's ``weight * hidden`` no longer saves ``hidden``,
    one of the norm's three fp32 tensors; ``D * pad(x)`` keeps no padded x, ``exp(A_log)`` no result, and in a half
    dtype ``A * dt`` no dt.  The convolution keeps its input (``convolution_backward`` takes input and
    weight for any gradient); the scan has no weight.  (peft 0.21 ``_check_lora_target_modules_mamba`` refuses
    ``out_proj`` and ``conv1d`` as LoRA targets of Nemotron-H, Falcon-H1 and the Mamba models; Bamba's and Granite
    4.0-H's ``out_proj`` take one, ``all-linear`` included.)"""
    out: dict[str, int | float] = {}
    if ms.kind == "mamba1":
        return _frozen_mamba1_dropped(ms, adapted, half, batch)
    if ms.kind == "gated_deltanet":
        # Qwen3-Next's Gated DeltaNet (gated_deltanet_saved_tensors): in_proj_qkvz and in_proj_ba read one input, which
        # either's lora_A keeps; ``-A_log.float().exp() * softplus(...)`` keeps -exp (for the softplus's gradient) but
        # neither exp's result nor the softplus output (A_log's gradient only); the gated norm's ``weight * hidden``
        # keeps no ``hidden``: half of each record.  Equal to autograd's graph with peft's LoRA on the meta device
        # (tests/test_families_qwen3_next.py)
        out = {"gdn.A": 1 / 2, "gdn.softplus": 1 / 2, "norm.weighted": 1 / 2}
        if not {"in_proj_qkvz", "in_proj_ba"} & adapted:
            out["gdn.in_proj_input"] = 1.0
        if "out_proj" not in adapted:
            out["gdn.out_proj_input"] = 1.0
        return out
    if ms.kind == "short_conv":
        # LFM2's block (short_conv_saved_tensors): in_proj's and out_proj's inputs go with their frozen weights; the
        # products B * x and C * conv keep both operands (each needs the other's gradient: the input requires grad),
        # and the convolution keeps its input (convolution_backward takes input and weight for any gradient)
        return {record: 1.0 for module, record in (("in_proj", "conv_block.in_proj_input"),
                                                   ("out_proj", "conv_block.out_proj_input")) if module not in adapted}
    for module, record in (("in_proj", "mixer.in_proj_input"), ("out_proj", "mixer.out_proj_input")):
        if module not in adapted:
            out[record] = 1.0
    if ms.gated_norm:
        out["norm.gated"] = 1 / 3
    # D frozen: ``D * pad(x)`` keeps no padded x (D's gradient only); A_log frozen: ``exp(A_log)``'s result goes, and in
    # a half dtype without autocast so does the fp32 dt that ``A * dt`` kept for A's gradient (in fp32 and under
    # autocast another op keeps that tensor).
    # Read off BambaMixer's, NemotronHMamba2Mixer's and FalconH1Mixer's frozen graphs on the meta device
    # (tests/test_hybrid_peft.py)
    out.update({"scan.x_padded_D_residual": 1.0, "mixer.A": 1 / 2})
    if half and not autocast:
        out["mixer.dt"] = 1 / 3
    return out


def mixer_adapter_inputs(ms: MambaSpec, hidden: int) -> tuple[tuple[str, tuple[str, ...], int], ...]:
    """The linears of a mixer that take LoRA adapters, as (record name, modules reading one input, its width): the
    adapters' own records (``activations.mixer_adapter_tensors``) replace the frozen base's input records
    (``frozen_mixer_dropped`` with no module adapted).  Mamba-1's ``dt_proj`` is left out: the torch path multiplies
    its weight (its adapter runs only over a quantized base, a ``b s dt_rank`` input: not counted)."""
    if ms.kind == "gated_deltanet":
        return (("gdn.in_proj", ("in_proj_qkvz", "in_proj_ba"), hidden),
                ("gdn.out_proj", ("out_proj",), ms.n_heads * ms.head_dim))
    if ms.kind == "short_conv":
        return (("conv_block.in_proj", ("in_proj",), hidden), ("conv_block.out_proj", ("out_proj",), hidden))
    x_proj = (("mixer.x_proj", ("x_proj",), ms.intermediate_size),) if ms.kind == "mamba1" else ()
    return (("mixer.in_proj", ("in_proj",), hidden), *x_proj, ("mixer.out_proj", ("out_proj",), ms.intermediate_size))


def _frozen_mamba1_dropped(ms: MambaSpec, adapted: frozenset[str], half: bool, batch: int) -> dict[str, int | float]:
    """``frozen_mixer_dropped`` for a Mamba-1 mixer (analytic/terms/mamba1.py's records; ``half``: a half compute
    dtype).  Frozen, ``in_proj``, ``x_proj`` and ``out_proj`` (``F.linear``) keep no input unless the module carries an
    adapter (whose ``lora_A`` saves it); ``A = -exp(A_log.float())`` records nothing (A_log needs no gradient) and
    ``A * dt`` keeps A only, half of "scan.A"; ``dt_proj.weight @ time_step^T`` (the torch path multiplies the weight,
    so an adapter on ``dt_proj`` is never run, unless the base is quantized: ``config._is_quantized`` runs
    ``dt_proj`` as a module, whose adapter keeps the normalized time step, ``T r c``, not counted) keeps no normalized
    time step (FalconMamba, Jamba); Jamba's frozen norm
    weights keep no normalized tensors; and in a half dtype the SiLU output, which only ``x * D`` (D frozen) and
    ``x_proj`` kept (the scan keeps its fp32 copy), goes too, unless ``x_proj`` carries an adapter and the batch is one
    sequence (for more, matmul's reshape of the transposed input is a copy, which the adapter's ``lora_A`` keeps as
    "mixer.x_proj_input" in the SiLU output's place).  Equal to
    autograd's graph of transformers' frozen mixers with peft's LoRA on the meta device (tests/test_mamba1_train.py).
    (peft 0.21 ``_check_lora_target_modules_mamba`` refuses ``out_proj`` and ``conv1d`` on ``mamba`` and
    ``falcon_mamba``, not on ``jamba``.)"""
    out: dict[str, int | float] = {record: 1.0 for module, record in (
        ("in_proj", "mixer.in_proj_input"), ("x_proj", "mixer.x_proj_input"), ("out_proj", "mixer.out_proj_input"))
        if module not in adapted}
    out.update({"scan.A": 1 / 2, "mixer.dt_norm_output": 1.0, "mixer.bc_dt_norm_weights": 1.0})
    if half and ("x_proj" not in adapted or batch > 1):
        out["mixer.silu_output"] = 1.0
    return out


def short_conv_saved_tensors(ms: MambaSpec, c: int, batch: int, seq: int) -> tuple[SavedTensor, ...]:
    """One LFM2 convolution block's saved tensors (``Lfm2ShortConv.forward``, ``modeling_lfm2.py`` 5.24, without a
    cache: transformers' torch ``causal_conv1d_fn``), ``h`` channels, ``k = conv_L_cache``, ``T = b s`` tokens:

    * ``in_proj``'s input (mm saves it): ``T h c``;
    * ``BCx``, ``in_proj``'s output, whose views B, C and x the products ``B * x`` and ``C * conv`` save: ``3 T h c``;
    * the convolution's input (``F.conv1d`` saves input and weight): without autocast ``B * x`` itself (its
      ``.to(weight.dtype)`` is a no-op), under autocast the fp32 ``.to(weight.dtype)`` copy cast back to the compute
      dtype by conv1d (on autocast's lower-precision list; the fp32 copy is saved by nothing): ``T h c`` either way;
    * the convolution's output, ``s + k - 1`` positions long (``padding = k - 1``, sliced to ``s``; the product with
      C saves the slice, which keeps the storage): ``b (s + k - 1) h c``;
    * ``out_proj``'s input, the contiguous transpose of ``C * conv``: ``T h c``.

    In all ``c h b (7 s + k - 1)`` bytes.  Autocast's copies of the weights are the weight-cast terms'.  Equal to
    autograd's graph on the meta device (tests/test_families_lfm2.py)."""
    t, h = batch * seq, ms.intermediate_size
    rows = [
        ("conv_block.in_proj_input", t * h * c),
        ("conv_block.BCx", 3 * t * h * c),
        ("conv_block.conv_input", t * h * c),
        ("conv_block.conv_output", batch * (seq + ms.conv_kernel - 1) * h * c),
        ("conv_block.out_proj_input", t * h * c),
    ]
    return tuple(SavedTensor(name, nbytes) for name, nbytes in rows)


def mixer_backward_per_token(ms: MambaSpec | None, hidden: int, r: int, frozen: bool, c: int | None = None) -> int:
    """Per token, the most a Mamba2 mixer's backward holds beside its saved tensors: the incoming gradient of its output
    (``r h``, the residual stream's dtype) and the gradients the chunked scan's backward makes, at the backward's peak;
    or, past it, the incoming and outgoing residual gradients (``2 r h``).

    Read off transformers 5.24's ``NemotronHMamba2Mixer`` torch path on the meta device, every tensor followed
    (benchmarks/mixer_backward_transient.py, the peak of the live bytes in the backward above its start, fitted over
    two token counts and 13 shapes: h 256-1024, I 256-512, groups 1-4, state 16-64, chunk 64-128, bf16 and fp32; every
    fit exact): ``r h + 20 I - 4 g`` bytes with frozen weights (five fp32 I-wide gradients; the fp32 rsqrt of each
    group freed before the peak), ``r h + (16 - c) I - 4 g`` with trained ones (``c``: the compute dtype's bytes, ``r``
    without it; the peak falls later, where the weight gradients are made: out_proj's and the norm's, ``w I (h + 1)``
    per layer, are the gradients' term, not counted here).  The chunk, the state size and the batch shape leave it
    unchanged.  Under half autocast over fp32 weights (the traced engine's emulation of CUDA autocast) the scan's part
    is the half-precision one (``20 I`` frozen, ``14 I`` trained, exact); the mixer's output is half there and its
    isolated backward starts from a half gradient (``2 h``), while in the model the residual stream's fp32 gradient
    (``r h``, counted) is what arrives: at most ``2 h`` over, and out_proj's half weight cast, freed before the peak
    (``2 h I`` a layer), is not taken off.

    LFM2's gated short-convolution block (``Lfm2ShortConv``, the torch ``causal_conv1d_fn``), read off the same way
    (benchmarks/mixer_backward_transient.py, h 256-1024, bf16 and fp32, 2 x 512 and 1 x 2,048 tokens, every row exact):
    ``r h + 3 c w`` per token with frozen weights (the gradients of B, C and x beside the block's output gradient,
    ``c``: the compute dtype's bytes, ``w``: the block's width), ``r h + 2 c w`` with trained ones (out_proj's weight
    gradient, ``c w h`` per layer, is the gradients' term)."""
    if ms is not None and ms.kind == "short_conv":
        return r * hidden + (3 if frozen else 2) * (r if c is None else c) * ms.intermediate_size
    if ms is None or ms.kind != "mamba2":
        return 2 * r * hidden
    inner, g = ms.intermediate_size, max(1, ms.n_groups)
    scan = 20 * inner if frozen else (16 - (r if c is None else c)) * inner
    return max(2 * r * hidden, r * hidden + scan - 4 * g)


def mixer_recompute_per_token(ms: MambaSpec | None, hidden: int, r: int, frozen: bool, batch: int, seq: int,
                              autocast: bool = False) -> int:
    """Per token, the most a Mamba2 mixer's forward holds above what it keeps at its end: what a recomputed mixer
    (activation checkpointing) adds on top of its saved tensors and its output's incoming gradient before its
    backward starts.  0 for other mixers.

    Read off transformers 5.24's ``NemotronHMamba2Mixer`` torch path on the meta device, every tensor followed, and
    exact on 14 shapes (h 256-1024, I 256-2048, groups 1-8, state 16-128, chunk 32-128, 1-4 sequences of 512-2048
    tokens) in each of bf16, fp32 and fp32 under bf16 autocast (``autocast``), frozen and trained
    (benchmarks/mixer_backward_transient.py; under autocast with trained weights within 8 B a token, a convolution
    bias's half cast).  The forward peaks where ``mamba2_chunk_scan`` makes its output
    contiguous (``(Y_diag + Y_off).contiguous()``): alive then and freed before the forward ends are the discretized
    x, the padded x, A and B, A's cumulative sum, ``Y_diag``, ``B_decay``, the zero initial state (``4 b I n``), the
    chunk states' einsum output (``4 b (nc + 1) I n``), ``Y_off``, the sum and its contiguous copy, and in half
    precision the convolution's SiLU output and dt's clamp (``c conv_dim + c H``); made after it and kept are the
    output with ``D``'s residual, the gated norm's tensors (three ``4 I`` ones with a half input, two with fp32, where
    ``gate.float()`` is a view), the norm's rsqrt per group (``4 g``), out_proj's output (``c h``) and a transposed
    out_proj weight (``c h I``).  Trained weights keep the discretized x and the padded x (``6 I`` fewer with a half
    input, ``8 I`` with fp32).  Where out_proj's input copy, the SiLU output and the gated product are freed after
    its matmul, the forward can instead peak there (half input: ``c conv_dim + 4 I``, and ``c I`` with frozen
    weights; fp32: ``4 I`` frozen).  The tokens are taken as whole chunks (sequences padded to the chunk size add up
    to a chunk of the padded tensors, not counted).

    ``autocast``: fp32 weights and input under half (bf16/fp16) CUDA autocast, the mixed-precision Trainer's forward,
    read off the traced engine's emulation of CUDA autocast (vramplan.trace.cuda: torch's own autocast casts no meta
    tensor), on the same shapes (``_autocast_recompute_per_token``): 1.2-2x the fp32 figure, which stood for it
    before (its table had been measured under a CPU autocast region, which casts no meta tensor)."""
    if ms is None or ms.kind != "mamba2":
        return 0
    inner, heads, g, n = ms.intermediate_size, ms.n_heads, max(1, ms.n_groups), ms.state_size
    conv, big = inner + 2 * g * n, heads * n
    half = r < FP32
    tokens = max(1, batch * seq)
    chunks = ceil_div(seq, max(1, ms.chunk_size))
    if autocast:
        return _autocast_recompute_per_token(ms, hidden, frozen, batch, tokens, chunks, half)
    i_coef = (8 if frozen else 2) if half else (12 if frozen else 4)
    per_token = ((r * conv + r * heads) if half else 0) + 8 * heads + i_coef * inner + 8 * big - 4 * g - r * hidden
    per_batch = 4 * batch * (chunks + 1) * inner * n + 4 * batch * inner * n - r * hidden * inner
    at_scan = per_token + per_batch // tokens
    at_out_proj = (r * conv + 4 * inner + (r * inner if frozen else 0)) if half else (4 * inner if frozen else 0)
    return max(0, at_scan, at_out_proj)


def _autocast_recompute_per_token(ms: MambaSpec, hidden: int, frozen: bool, batch: int, tokens: int,
                                  chunks: int, half_input: bool = False) -> int:
    """``mixer_recompute_per_token`` under half autocast over fp32 weights and an fp32 input (2-byte compute dtype);
    ``half_input``: over half weights and a half input (adapters on a bf16 base under the mixed-precision Trainer),
    below.

    In ``mamba2_chunk_scan`` the einsums run as autocast's bmm on half copies of their fp32 operands and return half
    tensors, while the elementwise ops promote to fp32.  At the contiguous copy of ``Y_diag + Y_off`` (the peak), alive
    and freed before the forward ends: in_proj's half output ``2 (2 I + 2 g n + H)``, the convolution's half SiLU output
    ``2 (I + 2 g n)``, the discretized and padded x, Y_off, the sum and its copy (``4 I`` each), the padded dt and A's
    cumulative sum (``4 H`` each), the padded B and B_decay (``4 H n`` each), ``M = G * L`` in fp32 (``4 H l`` a
    token, ``l`` the chunk: G is half, L fp32), the half Y_diag (``2 I``), the half zero initial state and chunk
    states (``2 b I n``, ``2 b (nc + 1) I n``), and with frozen weights the half cast of the input that in_proj used
    (``2 h``); made after it and kept: the output with D's residual, the gate's fp32 copy, its SiLU and the gated
    product (``4 I`` each), the rsqrt per group (``4 g``), out_proj's half output (``2 h``) and its half weight cast
    (``2 h I``, a layer's), and with trained weights the normalized product and out_proj's half input (``4 I + 2 I``).
    So ``12 I + 8 g n + 10 H + 8 H n + 4 H l - 4 g`` a token frozen, ``6 I + 8 g n + 10 H + 8 H n + 4 H l - 4 g - 2 h``
    trained, plus ``2 b I n + 2 b (nc + 1) I n - 2 h I`` over the tokens.  Where out_proj's output is made, the
    forward can instead peak above its end by in_proj's output, the SiLU output, the gated product (``4 I``) and,
    frozen, out_proj's half input and the input's cast: ``12 I + 8 g n + 2 H + 2 h`` frozen, ``10 I + 8 g n + 2 H``
    trained.  A trained convolution bias's half cast (``2 (I + 2 g n)`` a layer) is left out.

    Over half weights and a half input, in_proj makes no cast and its half output stays (the convolution keeps its
    xBC view): ``8 I + 4 g n + 8 H + 8 H n + 4 H l - 4 g - 2 h`` a token frozen, ``2 I + ...`` trained (out_proj's
    half input and the normalized product kept, ``6 I``), the same per-batch part (out_proj's transposed half weight
    in place of the cast, ``2 h I``); where out_proj's output is made, the SiLU output, out_proj's half input and the
    gated product (``8 I + 4 g n``, trained ``6 I + 4 g n``).  Exact on the 14 shapes
    (benchmarks/mixer_backward_transient.py)."""
    inner, heads, g, n = ms.intermediate_size, ms.n_heads, max(1, ms.n_groups), ms.state_size
    gn, big, hl = g * n, heads * n, heads * max(1, ms.chunk_size)
    per_batch = 2 * batch * inner * n + 2 * batch * (chunks + 1) * inner * n - 2 * hidden * inner
    if half_input:
        scan = 4 * gn + 8 * heads + 8 * big + 4 * hl - 4 * g - 2 * hidden + (8 * inner if frozen else 2 * inner)
        return max(0, scan + per_batch // tokens, (8 if frozen else 6) * inner + 4 * gn)
    scan = 8 * gn + 10 * heads + 8 * big + 4 * hl - 4 * g + (12 * inner if frozen else 6 * inner - 2 * hidden)
    at_out_proj = 8 * gn + 2 * heads + (12 * inner + 2 * hidden if frozen else 10 * inner)
    return max(0, scan + per_batch // tokens, at_out_proj)


# over a bitsandbytes 8-bit base the traced engine's Linear8bitLt keeps each linear's input for its backward (trace/
# quant.py), in_proj's and out_proj's fp32 ones (4 h + 4 I a token a mixer layer), which the frozen mixer's records
# leave out; measured on mixer-only testers against the traced engine (tests/test_families_state_space.py)
KBIT_MIXER_NOTE = ("not modelled: over a bitsandbytes 8-bit base under mixed precision, the inputs the traced engine's "
                   "Linear8bitLt keeps for its backward in each Mamba2 mixer (in_proj's and out_proj's fp32 ones, "
                   "4 h + 4 I bytes a token): up to 11% under the traced engine on mixer-only stacks, less where "
                   "attention and MLP layers share the step")


def _peft_mixer_notes(m: ModelSpec, ms: MambaSpec, recomputed: bool, kbit_autocast: bool = False) -> list[str]:
    """``mixer_train_notes`` under adapters, for the mixer kinds whose frozen records are modelled; ``kbit_autocast``:
    a bitsandbytes 8-bit base under autocast (``KBIT_MIXER_NOTE`` for Mamba2 mixers)."""
    if ms.kind == "short_conv":
        frozen = ("adapters on LFM2: each frozen convolution block saves its tensors less in_proj's and out_proj's "
                  "inputs (unless the module carries an adapter: frozen_mixer_dropped), its backward r h + 3 c w a "
                  "token (mixer_backward_per_token); blocks and MLPs before the first adapter record nothing "
                  "(analytic/terms/frozen_prefix.py); within -5% to +5% of the traced engine without checkpointing "
                  "(tests/test_hybrid_peft.py)")
        late = ("not modelled: the rest of what a recomputed convolution block holds in its backward under "
                "checkpointing (within 0.1% of the traced engine on LFM2's proportions, MLP 3 x hidden; up to 14% "
                "under on a convolution-heavy test shape with a 16-wide MLP)")
        return [frozen, *mixer_train_notes(m), *([late] if recomputed else [])]
    if ms.kind in _FROZEN_MIXER_NOTES:
        kbit = [KBIT_MIXER_NOTE] if kbit_autocast and ms.kind == "mamba2" else []
        return [_FROZEN_MIXER_NOTES[ms.kind], *mixer_train_notes(m), *kbit]
    return []


# what a training estimate with adapters states of each kind's frozen mixers (``_peft_mixer_notes``)
_FROZEN_MIXER_NOTES = {
    "mamba2": ("adapters on Mamba2 mixers: each frozen mixer saves transformers' torch path's tensors less in_proj's "
               "and out_proj's inputs (unless the module carries an adapter), the gated norm's weight-product input, "
               "D's padded x and exp(A_log)'s result (and in a half dtype without autocast A * dt's dt) "
               "(frozen_mixer_dropped, equal to the frozen mixers' graphs on the meta device); mixers and MLPs before "
               "the first adapter record nothing (analytic/terms/frozen_prefix.py); the last mixer's forward holds its "
               "scan's temporaries (transients.mixer_forward); over a bitsandbytes base under autocast the mixer runs "
               "from fp32 projections (kbit_fp32_path_tensor); without checkpointing, within -4% to +2% of the traced "
               "engine (transformers' and peft's own modules) on the shapes tests/test_hybrid_peft.py, "
               "tests/test_families_falcon_h1.py and tests/test_families_state_space.py try"),
    "gated_deltanet": ("adapters on Qwen3-Next: each frozen Gated DeltaNet layer saves transformers' torch path's "
                       "tensors less the input of in_proj_qkvz and in_proj_ba (unless either carries an adapter) and of "
                       "out_proj (unless it does), exp(A_log)'s result, the softplus output and the gated norm's "
                       "weight-product input (frozen_mixer_dropped, equal to autograd's graph with peft's LoRA on the "
                       "meta device); layers before the first adapter record nothing (analytic/terms/frozen_prefix.py)"),
    "mamba1": ("adapters on Mamba-1 mixers: each frozen mixer saves transformers' torch path's tensors less in_proj's, "
               "x_proj's and out_proj's inputs (unless the module carries an adapter), exp(A_log)'s result, the "
               "normalized time step and the norms' weight products, and in a half dtype the SiLU output "
               "(frozen_mixer_dropped, equal to autograd's graph with peft's LoRA on the meta device); an adapter on "
               "dt_proj never runs (the torch path multiplies dt_proj.weight itself) but over a quantized base "
               "(config._is_quantized: dt_proj runs as a module), where its lora_A keeps the normalized time step "
               "(b s dt_rank, not counted); mixers before the first adapter record nothing "
               "(analytic/terms/frozen_prefix.py), the first adapted one counted whole; within -0.3% to +0.9% of the "
               "traced engine (tests/test_mamba1_train.py)"),
}


def mixer_train_notes(m: ModelSpec, peft: bool = False, recomputed: bool = False,
                      kbit_autocast: bool = False) -> list[str]:
    """What a hybrid model's training estimate assumes of its Mamba2 mixers (none without mixers); ``peft``: the
    estimate trains adapters (the frozen mixers' records, ``frozen_mixer_dropped``); ``recomputed``: under activation
    checkpointing; ``kbit_autocast``: over a bitsandbytes 8-bit base under autocast."""
    ms = m.mamba
    if ms is None:
        return []
    if peft and ms.kind in ("short_conv", "mamba2", "mamba1", "gated_deltanet"):
        return _peft_mixer_notes(m, ms, recomputed, kbit_autocast)
    if ms.kind == "gated_deltanet":
        return [(f"{len(ms.layers)} of {m.num_layers} layers are Gated DeltaNet linear attention, run by transformers "
                 "5.24's torch torch_chunk_gated_delta_rule and causal_conv1d_fn (the fla and causal-conv1d packages "
                 "absent, use_kernels off); each saves its projections' inputs, the convolution's input and output, "
                 "the chunked rule's fp32 chunk tensors and every chunk's incoming state "
                 "(analytic/terms/gated_deltanet.py)"),
                ("not modelled: the gradients a Gated DeltaNet layer's backward makes inside the chunked rule "
                 "(counted: the incoming and outgoing residual gradients only)")]
    if ms.kind == "lightning":
        return [(f"{len(ms.layers)} of {m.num_layers} layers are lightning (linear) attention, run by transformers "
                 "5.24's block-wise loop (MiniMaxLightningAttention.forward without a cache); each saves its "
                 "projections' inputs, every block's decayed scores, decayed query and key, the contiguous copies "
                 "matmul makes of the strided query, key and value, every block's incoming state, and the output "
                 "norm's and gate's tensors (analytic/terms/lightning.py)"),
                ("not modelled: the gradients a lightning attention layer's backward makes inside its block loop "
                 "(counted: the incoming and outgoing residual gradients only)")]
    if ms.kind == "short_conv":
        return [(f"{len(ms.layers)} of {m.num_layers} layers are gated short-convolution blocks, run by transformers "
                 "5.24's torch causal_conv1d_fn (the causal-conv1d package absent, use_kernels off); each saves "
                 "in_proj's input and output, the convolution's input and padded output and out_proj's input "
                 "(analytic/terms/mamba2.py short_conv_saved_tensors)")]
    if ms.kind == "mamba1":
        return [(f"{len(ms.layers)} of {m.num_layers} layers are Mamba mixers, run by transformers 5.24's torch path "
                 "(mamba_selective_scan's recurrent loop: the mamba-ssm and causal-conv1d packages absent, use_kernels "
                 "off); each saves its projections' inputs, the convolution's output, the discretized A and B "
                 "(b s inner state fp32 each) and every token's fp32 state with its copy in the compute dtype "
                 "(FalconMamba's weightless norms on dt, B and C: their fp32 inputs, rsqrt and normalized copies; "
                 "Jamba's weighted ones also the normalized tensor each weight multiplies; analytic/terms/mamba1.py); mamba-ssm's MambaInnerFn would save its inputs only and recompute the "
                 "rest (far less memory, not modelled); the loop's backward holds the gradients of the discretized A "
                 "and of deltaB_u (each b s inner state fp32, the autograd engine's sums of every step's "
                 "select_backward) and one step's select output (analytic/terms/mamba1.py)")]
    where = " beside each layer's attention" if ms.parallel_attention else ""
    torch_path = (f"{len(ms.layers)} of {m.num_layers} layers are Mamba2 mixers{where}, run by transformers 5.24's torch path "
            "(mamba2_chunk_scan: the mamba-ssm and causal-conv1d packages absent, use_kernels off); their saved "
            "tensors are that path's (the fused mamba_split_conv1d_scan_combined kernel would save only its "
            "inputs and weights and recompute the rest: less memory, not modelled)")
    gradients = ("a mixer's backward holds its output's gradient and the chunked scan's gradients beside its saved "
                 "tensors: r h + 20 I - 4 g bytes a token with frozen weights, r h + (16 - r) I - 4 g with trained ones; "
                 "recomputed under checkpointing, its forward first holds the scan's temporaries above what it keeps "
                 "(mixer_recompute_per_token); both read off transformers' own mixer, every tensor followed "
                 "(benchmarks/mixer_backward_transient.py)")
    recompute = ("not modelled: the rest of what a recomputed hybrid layer holds in its backward with full "
                 "checkpointing (the traced engine shows more in the MoE and MLP blocks); the estimate is under the "
                 "traced engine's by up to 1% on transformers' Bamba test configuration, up to 9% with adapters and "
                 "up to 4% in full fine-tuning on the shapes tests/test_hybrid_peft.py tries")
    if ms.shared_attention_layers:
        rank = f"rank-{ms.shared_adapter_rank} adapters on q/k/v and" if ms.shared_attention_adapters else "a rank-" + \
            f"{ms.shared_adapter_rank} adapter on"
        return [torch_path, (f"{len(ms.shared_attention_layers)} of them first run a shared transformer block "
                             "(transformers 5.24's Zamba2AttentionDecoderLayer, the shared weights' gradients summed "
                             f"over their layers): each saves its 2 x hidden norm and attention input, {rank} the "
                             "MLP's gate_up, the MLP and the per-layer linear's input "
                             "(analytic/terms/shared_block.py)"), gradients, recompute]
    return [torch_path, gradients, recompute]
