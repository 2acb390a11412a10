"""A hybrid model's Mamba2 mixers at inference: their fixed-size state per sequence and their prefill temporaries.

**State (transformers 5.24, ``cache_utils.py`` ``LinearAttentionLayer``).**  ``BambaModel.forward`` builds a
``DynamicCache(config=...)`` whose mixer layers (``layer_types`` "linear_attention") are ``LinearAttentionLayer``s.
Per mixer layer and sequence it keeps

* the convolution state, ``lazy_initialization``'s ``torch.zeros((*conv_states.shape[:-1], conv_kernel_size))``:
  ``conv_dim x conv_kernel`` elements (``BambaMixer`` passes ``conv_kernel_size=self.conv_kernel_size``, so
  transformers keeps all ``mamba_d_conv`` taps where vLLM keeps ``d_conv - 1``), in the dtype of the ``in_proj``
  output, the compute dtype;
* the recurrent (SSM) state, ``torch.zeros_like(recurrent_states)`` of the scan's ``final_state``:
  ``n_heads x head_dim x state_size`` elements in fp32, because ``torch_chunk_scan`` (``modeling_bamba.py``)
  computes the states from ``hidden_states.float()`` and B, C ``.float()``.

Worked example, Bamba-9B's shape (hidden 4096, ``mamba_expand`` 2 -> intermediate 8192, 128 heads of 64,
1 group, state 128, ``d_conv`` 4; 29 mixer layers), bf16: conv_dim = 8192 + 2 * 1 * 128 = 8448; conv state
8448 * 4 * 2 B = 67,584 B; SSM state 128 * 64 * 128 * 4 B = 4,194,304 B; per layer 4,261,888 B, per sequence
29 * 4,261,888 = 123,594,752 B, whatever the sequence length.

**Prefill temporaries (``torch_chunk_scan``).**  transformers runs the torch scan unless hub kernels are asked
for (``use_kernels=True``; ``integrations/hub_kernels.py``).  With the prompt padded to ``P = ceil(p / l) * l``
(``l`` = ``mamba_chunk_size``) and ``H`` heads, at ``M = G * L.permute(...)`` the live fp32 tensors are the
padded ``D_residual`` and the discretized ``hidden_states`` (``P x intermediate`` each), ``B`` and ``C`` repeated
to every head (``P x H x state_size`` each), and ``L`` (``exp(segment_sum(A))``, ``H x P x l``), ``G`` and ``M``
(``P x l x H`` each); in the compute dtype the ``in_proj`` output (``p x (intermediate + conv_dim + H)``) and the
convolution's output and activation (``p x conv_dim`` each).
"""

from __future__ import annotations

from vramplan.spec.model import ModelSpec
from vramplan.units import ceil_div

__all__ = ["mixer_prefill_bytes", "ssm_state_bytes", "ssm_state_layer_bytes"]

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
    padded = ceil_div(prompt, ms.chunk_size) * ms.chunk_size
    h = ms.n_heads
    half = batch * prompt * (ms.intermediate_size + ms.conv_dim + h + 2 * ms.conv_dim) * c
    fp32 = batch * padded * (2 * ms.intermediate_size + 2 * h * ms.state_size + 3 * ms.chunk_size * h) * FP32_BYTES
    return half + fp32
