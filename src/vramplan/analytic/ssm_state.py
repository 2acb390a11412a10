"""A model's Mamba2 or Mamba mixers at inference (a hybrid's, or every layer of a pure state-space model): their
fixed-size state per sequence and their prefill temporaries.

**State (transformers 5.24, ``cache_utils.py`` ``LinearAttentionLayer``).**  ``BambaModel.forward`` builds a
``DynamicCache(config=...)`` whose mixer layers (``layer_types`` "linear_attention") are ``LinearAttentionLayer``s.
Per mixer layer and sequence it keeps

* the convolution state, ``lazy_initialization``'s ``torch.zeros((*conv_states.shape[:-1], conv_kernel_size))``:
  ``conv_dim x conv_kernel`` elements (``BambaMixer`` passes ``conv_kernel_size=self.conv_kernel_size``, so
  transformers keeps all ``mamba_d_conv`` taps where vLLM keeps ``d_conv - 1``: ``MambaStateShapeCalculator.
  mamba2_state_shape``, ``vllm/model_executor/layers/mamba/mamba_utils.py``), in the dtype of the ``in_proj``
  output, the compute dtype;
* the recurrent (SSM) state, ``torch.zeros_like(recurrent_states)`` of the scan's ``final_state``:
  ``n_heads x head_dim x state_size`` elements in fp32, because ``mamba2_chunk_scan`` (torch path) (``modeling_bamba.py``)
  computes the states from ``hidden_states.float()`` and B, C ``.float()`` (the torch path, below).

Worked example, Bamba-9B's shape (hidden 4096, ``mamba_expand`` 2 -> intermediate 8192, 128 heads of 64,
1 group, state 128, ``d_conv`` 4; 29 mixer layers), bf16: conv_dim = 8192 + 2 * 1 * 128 = 8448; conv state
8448 * 4 * 2 B = 67,584 B; SSM state 128 * 64 * 128 * 4 B = 4,194,304 B; per layer 4,261,888 B, per sequence
29 * 4,261,888 = 123,594,752 B, whatever the sequence length.

**Decode temporaries (``mamba2_selective_state_update``, torch path).**  One token's update of one mixer layer
makes, per sequence and element of its ``H x head_dim x n`` state: ``dA = exp(dt.float() * A.float())`` (fp32),
``dB = dt * B`` and ``dBx = dB * x`` (compute dtype), and ``state * dA`` (fp32) alive while ``+ dBx`` writes the
new state (fp32): ``12 + 2c`` bytes per element at that addition (c: bytes of the compute dtype).  Bamba-9B,
bf16: 128 * 64 * 128 * 16 B = 16,777,216 B per sequence.

**Prefill temporaries (the torch chunked scan).**  transformers runs its torch scan (``mamba2_chunk_scan`` in
``modeling_bamba.py``) unless hub kernels are asked for (``use_kernels=True``) or the ``mamba_ssm`` package is
installed (``use_kernel_func_from_hub_with_fallback``, ``integrations/hub_kernels.py``: hub kernels, then the
original package, then the torch path).
Its locals stay alive until it returns, so with the prompt padded to ``P = ceil(p / l) * l`` (``l`` =
``mamba_chunk_size``), ``H`` heads, ``I = H * head_dim`` and ``n`` = ``state_size``, at its end it holds in fp32:
the padded ``D_residual``, the discretized ``hidden_states``, ``Y_diag``, ``C_times_states``, ``Y_off`` and
``output`` (``P x I`` each: 6), ``B`` and ``C`` repeated to every head and ``B_decay`` (``P x H x n`` each: 3),
``L`` (``exp(segment_sum(A))``), ``G`` and ``M`` (``P x l x H`` each: 3) and ``new_states``
(``(P / l + 1) x I x n``).  In the compute dtype the mixer holds the ``in_proj`` output (``p x (I + conv_dim +
H)``), the causal convolution's output (``(p + d_conv - 1) x conv_dim``) and its activation (``p x conv_dim``).
The einsums' own transient copies are not counted (the traced engine sees them: about a tenth more on
transformers' Bamba test configuration, tests/data/bamba-tester).

**Mamba-1 mixers (``MambaSpec.kind`` "mamba1": ``mamba``, ``falcon_mamba``; transformers 5.24
``modeling_mamba.py``).**  The same ``LinearAttentionLayer`` keeps per layer and sequence the convolution state
``I x d_conv`` in the compute dtype (``update_conv_state`` with ``conv_kernel_size=self.conv_kernel_size``) and the
recurrent state ``I x n`` in fp32: ``mamba_selective_scan``'s loop starts from a compute-dtype zero state and each
step's ``discrete_A[:, :, i] * ssm_state + deltaB_u[:, :, i]`` is fp32 (``discrete_A`` is ``exp`` of the fp32 A times
the fp32 ``dt``), and ``update_recurrent_state`` initializes the cache's tensor from that final state.

Prefill (``mamba_selective_scan``'s torch recurrent loop: the hub kernel only under ``use_kernels=True`` or with
the ``mamba_ssm`` package, ``use_mambapy`` False by default, ``use_associative_scan`` only while compiling).  With
``b`` sequences of ``p`` tokens, ``I`` channels, ``n`` states, dt rank ``r`` and compute dtype ``c`` bytes, at the scan's
last two operations (``scan_output + hidden_states * D`` in fp32, then ``* F.silu(z)``) it holds in fp32
``discrete_A``, ``discrete_B`` and ``deltaB_u`` (``b p I n`` each: 3) and ``dt`` (``b p I``), plus ``12 + 2c`` bytes per
``b p I`` element for the list of per-step outputs (``c``), the running ``scan_output`` (``4``), the product or
``silu(z)`` beside it (``4 + c`` at the larger of the two) and the result (``4``); the mixer keeps meanwhile the
``in_proj`` output (``b p 2I``), the activated convolution (``b p I``), the ``x_proj`` output (``b p (r + 2n)``) and the
``dt_proj`` product (``b p I``) in the compute dtype (B and C are views of the ``x_proj`` output, which they keep
whole); FalconMamba rebinds dt, B and C to their normalized copies, which frees the ``x_proj`` output (and the
normalized dt once ``dt_proj`` has read it): ``b p 2n`` there instead of ``b p (r + 2n)``.  Worked example,
falcon-mamba-7b's shape (hidden 4096, I = 8192, n = 16, r = 256), b = 1, p = 1000, bf16: 3 x 1000 x 8192 x 16 x 4
= 1,572,864,000; 1000 x 8192 x (4 + 12 + 4) = 163,840,000; 1000 x 2 x (4 x 8192 + 2 x 16) = 65,600,000;
1,802,304,000 B.

Decode (``mamba_selective_state_update``): ``dA``, ``dB`` and ``dBx`` in fp32 (dt and B are cast by ``.float()``),
``state * dA`` and the new state: 20 bytes per element of the ``I x n`` state.
"""

from __future__ import annotations

from vramplan.spec.model import MambaSpec, ModelSpec
from vramplan.units import ceil_div

__all__ = ["broadcast_product_bytes", "mixer_decode_bytes", "mixer_prefill_bytes", "ssm_state_bytes", "ssm_state_layer_bytes",
           "ssm_state_note"]

FP32_BYTES = 4


def ssm_state_layer_bytes(m: ModelSpec, c: int) -> tuple[int, int]:
    """One mixer layer's (convolution state, SSM state) bytes per sequence in transformers' cache; (0, 0) when
    ``m`` has no mixers.  ``c``: bytes of the compute dtype (the convolution state's dtype)."""
    ms = m.mamba
    if ms is None:
        return 0, 0
    return ms.conv_dim * ms.conv_kernel * c, ms.ssm_state_elements * FP32_BYTES


def ssm_state_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """Every mixer layer's state for ``batch`` sequences (independent of their length)."""
    if m.mamba is None:
        return 0
    conv, ssm = ssm_state_layer_bytes(m, c)
    return batch * len(m.mamba.layers) * (conv + ssm)


def mixer_prefill_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """The running mixer layer's live tensors during the prefill's chunked scan (module docstring); 0 without
    mixers."""
    ms = m.mamba
    if ms is None:
        return 0
    if ms.kind == "mamba1":
        return _mamba1_prefill_bytes(ms, batch, prompt, c)
    padded = ceil_div(prompt, ms.chunk_size) * ms.chunk_size
    h, inter, n = ms.n_heads, ms.intermediate_size, ms.state_size
    half = batch * c * (prompt * (inter + ms.conv_dim + h) + (prompt + ms.conv_kernel - 1) * ms.conv_dim
                        + prompt * ms.conv_dim)
    chunks = padded // ms.chunk_size
    fp32 = batch * FP32_BYTES * (padded * (6 * inter + 3 * h * n + 3 * ms.chunk_size * h)
                                 + (chunks + 1) * inter * n)
    return half + fp32


def broadcast_product_bytes(ms: MambaSpec, batch: int, seq: int) -> int:
    """The largest fp32 product transformers before 5.18 materializes in one Mamba2 scan over ``batch`` sequences of
    ``seq`` tokens (facts/transformers.py ``MAMBA2_SCAN_EINSUM_RELEASE``); with ``P = batch x padded tokens``, chunk
    ``l``, ``H`` heads of ``d`` channels (``I = H d``), state ``n`` (B and C repeated to every head) and ``nc`` chunks:
    ``C * B`` for G, ``P l H n``; ``M * x`` for Y_diag, ``P l I``; ``B_decay * x`` for the chunk states and
    ``C * states`` for C_times_states, ``P I n`` each; ``decay_chunk * states`` for the inter-chunk recurrence,
    ``batch (nc + 1)^2 I n``; 4 B an element (B, C and x are ``.float()`` copies, so autocast does not reach them).

    Worked example, the synthetic Bamba of benchmarks/gpu/configs (64 heads of 64, state 128, chunk 256) at 8 x 2,048
    tokens: P = 16,384; G's product 16,384 x 256 x 64 x 128 x 4 = 137,438,953,472 B (the 128 GiB the H100 was asked
    for), Y_diag's 16,384 x 256 x 4,096 x 4 = 68,719,476,736 B, the states' 16,384 x 4,096 x 128 x 4 =
    34,359,738,368 B, the recurrence's 8 x 81 x 4,096 x 128 x 4 = 1,358,954,496 B: the largest is G's."""
    chunk = ms.chunk_size
    padded = ceil_div(seq, chunk) * chunk
    p, nc = batch * padded, padded // chunk
    inter, n = ms.intermediate_size, ms.state_size
    return FP32_BYTES * max(p * chunk * ms.n_heads * n, p * chunk * inter, p * inter * n, batch * (nc + 1) ** 2 * inter * n)


def _mamba1_prefill_bytes(ms: MambaSpec, batch: int, prompt: int, c: int) -> int:
    """A Mamba-1 mixer's live tensors at the end of ``mamba_selective_scan`` (module docstring)."""
    inter, n, r = ms.intermediate_size, ms.state_size, ms.time_step_rank
    scan = 3 * inter * n * FP32_BYTES + inter * (FP32_BYTES + 12 + 2 * c)
    held = c * (4 * inter + 2 * n + (0 if ms.bc_dt_norms else r))
    return batch * prompt * (scan + held)


def ssm_state_note(m: ModelSpec, c: int) -> str | None:
    """What a KV-cache table leaves out for a hybrid model: its mixers' state per sequence (None without mixers)."""
    if m.mamba is None:
        return None
    kind = "Mamba2" if m.mamba.kind == "mamba2" else "Mamba"
    where = ("beside the KV cache of the same layers" if m.mamba.parallel_attention
             else f"beside the KV cache of the {len(m.mamba.shared_attention_layers)} that run a shared block"
             if m.mamba.shared_attention_layers else "no KV cache there")
    return (f"plus {ssm_state_bytes(m, 1, c):,} B per sequence of {kind} convolution and SSM state in "
            f"{len(m.mamba.layers)} mixer layers ({where}), whatever the sequence length")


def mixer_decode_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """One mixer layer's single-token state update at its peak (module docstring); 0 without mixers."""
    if m.mamba is None:
        return 0
    if m.mamba.kind == "mamba1":
        return batch * m.mamba.ssm_state_elements * 5 * FP32_BYTES
    return batch * m.mamba.ssm_state_elements * (3 * FP32_BYTES + 2 * c)
