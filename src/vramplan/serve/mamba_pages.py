"""vLLM's KV cache for a hybrid attention + Mamba2 or Mamba-1 model (``ModelSpec.mamba``; Gated DeltaNet, short
convolution and Zamba2's shared-attention hybrids below): the mixers' state pages
beside the attention blocks, as the V1 engine lays them out from 0.10.2 (Mamba-1: 0.11.0) to 0.25.x
(``facts/vllm_releases.py`` ``MAMBA_HYBRID_RULES``, ``MAMBA1_V1_FROM``; the release rules are cited there); and a model
without attention, whose layers form one group of state pages (``state_space_layout``).

1. **The state page** (``MambaSpec.page_size_bytes``, vllm/v1/kv_cache_interface.py): one mixer layer's state for
   one request, the convolution state ``(d_conv - 1) x conv_dim`` plus the SSM state ``n_heads x head_dim x
   d_state`` (``MambaStateShapeCalculator.mamba2_state_shape``, vllm/model_executor/layers/mamba/mamba_utils.py),
   both in the model dtype: ``mamba_cache_dtype`` and ``mamba_ssm_cache_dtype`` default to "auto", the model dtype
   for the first and the first's dtype for the second (``MambaStateDtypeCalculator._mamba_state_dtype``).  Mamba-1
   (``mamba1_state_shape``, ``mamba1_state_dtype``: the same dtype rule): ``(d_conv - 1) x intermediate`` and
   ``intermediate x d_state``, which ``MambaSpec`` writes as ``intermediate`` heads of width 1 without groups.
2. **The attention block** is raised until one attention page (``block_size x`` the layer's K and V bytes per
   token) holds a state page, in multiples of the kernel alignment (16), and the state page is padded to it
   (``mamba_page_size_padded``): every layer's page has the same size.
3. **Groups**: the attention layers and the mixer layers are split into groups of the same layer count
   (``_get_kv_cache_groups_uniform_page_size``); ``num_gpu_blocks = available // page // group size``.  A request
   takes ``cdiv(max_model_len, block)`` blocks in each attention group and one block in each mixer group
   (``MambaSpec.max_memory_usage_bytes``: one page without prefix caching).

The other hybrid families (``facts/vllm_releases.py`` ``LINEAR_MIXER_V1_FROM``) take the same page padding, block
and group rules (each is ``IsHybrid``: ``HybridAttentionMambaModelConfig`` sizes the page from the class's
``get_mamba_state_shape_from_config``); their state pages:

* Gated DeltaNet (Qwen3-Next, ``gated_delta_net_state_shape``): conv ``(linear_conv_kernel_dim - 1) x (2 nk dk + nv
  dv)`` and temporal ``nv x dk x dv``, both in the model dtype (``gated_delta_net_state_dtype``): ``MambaSpec``'s
  ``intermediate_size`` is that conv_dim (no groups), ``n_heads x head_dim x state_size`` the temporal state.
* Short convolution (LFM2, ``short_conv_state_shape``): ``(conv_L_cache - 1) x conv_dim`` in the model dtype, no
  temporal state (``n_heads`` 0; ``conv_dim`` is the hidden size).
* Zamba2 (``Zamba2ForCausalLM``): a Mamba2 mixer in every layer (``mamba2_state_shape`` with ``mamba_expand x
  hidden``) and one ``Attention`` per hybrid layer (``Zamba2Attention.dpa_list``, vllm/model_executor/models/zamba2.py:
  161-182 at 0.10.2: "KV cache is unique for every attention layer"), of ``num_attention_heads`` KV heads of
  ``attention_head_dim`` (``ModelConfig.get_head_size``'s zamba2 case).  Those attention layers are built in
  ``Zamba2Model.__init__`` before the decoder layers (zamba2.py:700-708), so they come first in the KV-cache spec and
  the first group is an attention group.

Worked examples in bf16, vLLM 0.11.0's rules (groups of the smaller layer count):

* Qwen3-Next-80B-A3B (12 attention layers of 2 KV heads of 256; 36 Gated DeltaNet layers, nk 16, nv 32, dk = dv =
  128, kernel 4): conv_dim 2 x 16 x 128 + 32 x 128 = 8192; state page 3 x 8192 x 2 + 32 x 128 x 128 x 2 = 49,152 +
  1,048,576 = 1,097,728 B; attention per token 2 x 2 x 256 x 2 = 2048 B; block 16 x cdiv(1,097,728, 16 x 2048) =
  16 x 34 = 544 tokens, page 544 x 2048 = 1,114,112 B; groups of 12: one attention group, 3 mixer groups.
* LFM2-1.2B (6 attention layers of 8 KV heads of 64; 10 convolution layers over 2048 channels, conv_L_cache 3):
  state page 2 x 2048 x 2 = 8192 B; attention per token 2 x 8 x 64 x 2 = 2048 B; block max(16, 16 x cdiv(8192,
  16 x 2048)) = 16 tokens, page 32,768 B (the state page padded 4x); groups of 6: one attention group, 2 mixer groups.
* Zamba2 at transformers' ``Zamba2Config`` defaults (hidden 2560, 54 layers of which 9 hybrid, 32 heads of
  attention_head_dim 2 x 2560 / 32 = 160; mixers of 8 heads of 640, 1 group, state 64, d_conv 4): conv_dim 5120
  + 2 x 64 = 5248; state page 3 x 5248 x 2 + 8 x 640 x 64 x 2 = 31,488 + 655,360 = 686,848 B; attention per token
  2 x 32 x 160 x 2 = 20,480 B; block 16 x cdiv(686,848, 16 x 20,480) = 16 x 3 = 48 tokens, page 983,040 B; groups of
  9: one attention group, 6 mixer groups.

Worked example, Bamba-9B's shape in bf16 (3 attention layers with 8 KV heads of 128; 29 mixers of 128 heads of 64,
1 group, state 128, d_conv 4, intermediate 8192): conv_dim 8192 + 2 x 128 = 8448; state page 3 x 8448 x 2
+ 128 x 64 x 128 x 2 = 50,688 + 2,097,152 = 2,147,840 B; attention per token 2 x 8 x 128 x 2 = 4096 B;
block 16 x cdiv(2,147,840, 16 x 4096) = 16 x 33 = 528 tokens, page 528 x 4096 = 2,162,688 B (the state page
padded by 0.69%); groups of 3 layers: one attention group and cdiv(29, 3) = 10 mixer groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.facts.vllm_releases import MambaHybridRule
from vramplan.spec.model import MambaSpec
from vramplan.units import ceil_div

__all__ = ["HybridLayout", "hybrid_layout", "mamba_state_page_bytes", "mixer_profile_width", "state_space_layout"]

KERNEL_ALIGNMENT = 16  # FlashAttention / FlashInfer: block sizes in multiples of 16 (``MultipleOf(16)``)


def mamba_state_page_bytes(ms: MambaSpec, dtype_bytes: int, ssm_bytes: int | None = None) -> int:
    """One mixer layer's state for one request, unpadded: ``(d_conv - 1) x conv_dim`` elements in the model dtype
    and ``n_heads x head_dim x d_state`` in ``ssm_bytes`` (None: the model dtype too) (tp = 1)."""
    ssm = dtype_bytes if ssm_bytes is None else ssm_bytes
    return (ms.conv_kernel - 1) * ms.conv_dim * dtype_bytes + ms.ssm_state_elements * ssm


def mixer_profile_width(ms: MambaSpec, hidden: int = 0) -> int:
    """Elements per token alive in a mixer layer during the profile run (no attention metadata: the mixer skips
    the scan).

    * Mamba2 (``MambaMixer2.forward_cuda`` "profile run"): the ``in_proj`` output (gate, x|B|C and dt:
      ``intermediate + conv_dim + n_heads``), the contiguous copy of x|B|C (``conv_dim``) and the gated norm's output
      (``intermediate``).
    * Gated DeltaNet (Qwen3-Next, 0.10.2-0.11.x): nothing (the custom op returns before ``in_proj``); short
      convolution (LFM2): ``5 x conv_dim + 2 x hidden`` (``ShortConv.forward_cuda`` "V1 profile run").
    * Mamba-1 (``MambaMixer.forward_cuda``, vllm/model_executor/layers/mamba/mamba_mixer.py, "V1 profile run", the
      same from 0.11.0 to 0.26.0): the ``in_proj`` output (x and gate, ``2 x intermediate``), the contiguous copy of x
      (``intermediate``) and ``out_proj``'s result (``hidden``), returned beside the decoder layer's ``output =
      torch.empty_like(hidden_states)`` (``hidden``; mamba.py and jamba.py), which the profile run leaves unwritten:
      ``3 x intermediate + 2 x hidden``.
    """
    if ms.kind == "mamba1":
        return 3 * ms.intermediate_size + 2 * hidden
    if ms.kind == "gated_deltanet":
        # 0.10.2-0.11.x: ``gdn_attention``'s ``_forward`` returns at "V1 profile run" before ``in_proj``
        # (qwen3_next.py:403-405 at 0.10.2); later releases are refused (LINEAR_MIXER_PROFILE_READ_BEFORE)
        return 0
    if ms.kind == "short_conv":
        # ``ShortConv.forward_cuda`` "V1 profile run" (short_conv.py:131-143 at 0.10.2): ``in_proj``'s B|C|x (3 x
        # conv_dim), ``(B * x).contiguous()`` and ``C * Bx`` (conv_dim each), ``out_proj``'s result (hidden) beside the
        # decoder layer's ``output = torch.empty_like(hidden_states)`` (lfm2.py:297, hidden)
        return 5 * ms.conv_dim + 2 * hidden
    return 2 * ms.intermediate_size + 2 * ms.conv_dim + ms.n_heads


@dataclass(frozen=True)
class HybridLayout:
    """The pages, block size and groups vLLM chooses for a hybrid model (module docstring)."""

    block_size: int  # the attention block, raised from the scenario's
    page: int  # one block of one layer: the attention page, and the padded state page
    state_page: int  # the mixers' state page before padding
    attention_layers: int
    mamba_layers: int
    group_size: int
    attention_groups: int
    mamba_groups: int
    first_is_mamba: bool  # the model's first cache layer is a mixer (the first group is a mixer group)

    @property
    def groups(self) -> int:
        return self.attention_groups + self.mamba_groups

    def blocks_per_request(self, max_len: int) -> int:
        """Blocks one request of ``max_len`` tokens takes in every group (``get_max_concurrency_for_kv_cache_config``:
        ``cdiv(max_len, block)`` per attention group, one per mixer group)."""
        return self.attention_groups * ceil_div(max_len, self.block_size) + self.mamba_groups

    def needed(self, max_len: int, rule: MambaHybridRule) -> int:
        """The bytes the start-up check asks for one request of ``max_len`` (``MambaHybridRule.needed``)."""
        attention = ceil_div(max_len, self.block_size)
        if rule.needed == "layers":
            return (self.attention_layers * attention + self.mamba_layers) * self.page
        if rule.needed == "first_group":
            return self.group_size * self.page * (1 if self.first_is_mamba else attention)
        return self.group_size * self.page * self.blocks_per_request(max_len)


def state_space_layout(ms: MambaSpec, dtype_bytes: int, max_len: int, ssm_bytes: int | None = None) -> HybridLayout:
    """The layout of a model whose every layer is a mixer (``mamba``, ``falcon_mamba``, ``mamba2``): every layer's
    ``MambaSpec`` is the same, so ``get_kv_cache_groups`` (vllm/v1/core/kv_cache_utils.py) makes one group of all
    layers (``is_kv_cache_spec_uniform``); the page is the state page, unpadded (``mamba_page_size_padded`` is set
    only beside attention); the block is ``mamba_block_size = max_model_len`` (``MambaModelConfig``, 0.12.0 on; the
    runner's ``block_size=max_model_len`` in 0.11.0), so a request takes one block.

    Worked example, Falcon-Mamba-7B in bf16 (64 layers, intermediate 8192, d_state 16, d_conv 4): state page
    3 x 8192 x 2 + 8192 x 16 x 2 = 49,152 + 262,144 = 311,296 B; one group of 64 layers; ``num_blocks = available //
    311,296 // 64``."""
    state = mamba_state_page_bytes(ms, dtype_bytes, ssm_bytes)
    n = len(ms.layers)
    return HybridLayout(block_size=max_len, page=state, state_page=state, attention_layers=0, mamba_layers=n,
                        group_size=n, attention_groups=0, mamba_groups=1, first_is_mamba=True)


def _block_size(rule: MambaHybridRule, asked: int, state_page: int, attention_per_token: int, align: int) -> int:
    if rule.block_rule == "align":
        a = max(align, asked)
        return a * ceil_div(state_page, a * attention_per_token)
    return max(asked, align * ceil_div(state_page, align * attention_per_token))


def hybrid_layout(ms: MambaSpec, attention_layers: int, attention_per_token: int, dtype_bytes: int, asked_block: int,
                  rule: MambaHybridRule, align: int = KERNEL_ALIGNMENT, ssm_bytes: int | None = None) -> HybridLayout:
    """The layout of ``attention_layers`` attention layers of ``attention_per_token`` bytes per token beside
    ``ms``'s mixers, for a scenario block size ``asked_block`` under ``rule`` (``ssm_bytes``: the SSM state's dtype
    bytes where it is not the model dtype's)."""
    state = mamba_state_page_bytes(ms, dtype_bytes, ssm_bytes)
    block = _block_size(rule, asked_block, state, attention_per_token, align)
    n_mamba = len(ms.layers)
    smallest, largest = min(attention_layers, n_mamba), max(attention_layers, n_mamba)
    size = largest if rule.group_ratio is not None and largest < smallest * rule.group_ratio else smallest
    return HybridLayout(block_size=block, page=block * attention_per_token, state_page=state,
                        attention_layers=attention_layers, mamba_layers=n_mamba, group_size=size,
                        attention_groups=ceil_div(attention_layers, size), mamba_groups=ceil_div(n_mamba, size),
                        # Zamba2's attention layers are registered before its decoder layers (module docstring)
                        first_is_mamba=0 in ms.layers and not ms.shared_attention_layers)
