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

4. **Tensor parallelism**: each rank keeps its share of the state (``MambaStateShapeCalculator``'s ``tp_world_size``:
   heads and convolution channels over tp, with Mamba2's extra groups, ``extra_groups_for_head_shards``) beside one
   rank's KV heads (at least one), and its share of the mixers' weights (``mixer_weights_tp_delta``).

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

from vramplan.analytic.layout import count_on_rank, split_on_rank
from vramplan.facts.vllm_releases import MIXER_TP_SHARDED, SHARED_BLOCK_TP_SHARDED_LISTS, MambaHybridRule
from vramplan.spec.model import MambaSpec, ModelSpec
from vramplan.units import ceil_div

__all__ = [
    "MIXER_NAMES",
    "HybridLayout",
    "extra_groups_for_head_shards",
    "hybrid_layout",
    "mamba_state_page_bytes",
    "mixer_name",
    "mixer_profile_width",
    "mixer_tp_problem",
    "mixer_weights_tp_delta",
    "state_space_layout",
]

KERNEL_ALIGNMENT = 16  # FlashAttention / FlashInfer: block sizes in multiples of 16 (``MultipleOf(16)``)


# the mixers' kinds (``MambaSpec.kind``) as reports name them
MIXER_NAMES = {"mamba2": "Mamba2", "mamba1": "Mamba", "gated_deltanet": "Gated DeltaNet linear-attention",
               "short_conv": "gated short-convolution", "rwkv4": "RWKV-4 time-mixing"}


def mixer_name(kind: str) -> str:
    """The name of a mixer kind (``MambaSpec.kind``) in reports."""
    return MIXER_NAMES.get(kind, kind)


def extra_groups_for_head_shards(n_groups: int, tp: int) -> int:
    """Groups vLLM adds so that every rank's heads keep their B and C group
    (``MambaStateShapeCalculator.extra_groups_for_head_shards``, vllm/model_executor/layers/mamba/mamba_utils.py:154-164
    at 0.11.0, the same from 0.10.2 to 0.24.0): 0 where tp divides ``n_groups``, else ``tp - n_groups`` (the one group
    copied to every rank: ``MambaMixer2`` asserts ``n_groups % tp == 0 or n_groups == 1``, mamba_mixer2.py:259)."""
    return 0 if n_groups == 0 or n_groups % tp == 0 else tp - n_groups


def mixer_tp_problem(ms: MambaSpec, tp: int) -> str:
    """Why vLLM cannot shard ``ms``'s mixers over ``tp`` ranks ("" where it can): ``divide`` asserts an exact split of
    the heads and channels (vllm/distributed/utils.py ``ensure_divisibility``), ``MambaMixer2`` one group or a multiple
    of tp groups, Gated DeltaNet splits its key and value heads (qwen3_next.py:285 ``divide(num_v_heads, tp_size)``,
    ``fix_query_key_value_ordering``: ``num_k_heads // tp_size``)."""
    if tp == 1:
        return ""
    if ms.kind == "mamba2" and ms.n_groups % tp and ms.n_groups != 1:
        return f"its {ms.n_groups} groups are neither 1 nor a multiple of tp {tp} (MambaMixer2's assertion)"
    heads = {"mamba2": ("heads", ms.n_heads), "mamba1": ("channels (intermediate size)", ms.intermediate_size),
             "gated_deltanet": ("value heads", ms.n_heads), "short_conv": ("channels (conv_dim)", ms.conv_dim)}
    what, n = heads.get(ms.kind, ("heads", ms.n_heads))
    if ms.kind == "gated_deltanet" and ms.key_heads % tp:
        return f"its {ms.key_heads} key heads do not split over tp {tp}"
    if n % tp or _rank_conv_dim(ms, tp) * tp != ms.conv_dim + 2 * extra_groups_for_head_shards(ms.n_groups, tp) * \
            ms.state_size:
        return f"its {n} {what} or its convolution's channels do not split over tp {tp} (vLLM's divide)"
    return ""


def shared_block_tp_problem(m: ModelSpec, tp: int) -> str:
    """Why vLLM cannot shard Zamba2's shared blocks' adapters over ``tp`` ranks ("" where it can): ``Zamba2LoRA.A`` is
    a ColumnParallelLinear of the adapter's rank, whose ``divide`` asserts an exact split."""
    ranks = {p.out_features for p in m.params
             if SHARED_BLOCK_TP_SHARDED_LISTS & set(p.name.split(".")) and p.name.endswith(".0.weight")}
    uneven = sorted(r for r in ranks if r % tp)
    return f"its adapters' rank {uneven[0]} does not split over tp {tp} (Zamba2LoRA's ColumnParallelLinear)" if uneven \
        else ""


def _rank_conv_dim(ms: MambaSpec, tp: int) -> int:
    """One rank's convolution channels: ``conv_dim`` with the extra groups, over tp (``mamba2_state_shape``:
    ``divide(intermediate + 2 (n_groups + extra) state, tp)``; the other kinds' ``divide(conv_dim, tp)``)."""
    return (ms.conv_dim + 2 * extra_groups_for_head_shards(ms.n_groups, tp) * ms.state_size) // tp


def mamba_state_page_bytes(ms: MambaSpec, dtype_bytes: int, ssm_bytes: int | None = None, tp: int = 1) -> int:
    """One mixer layer's state for one request on one of ``tp`` ranks, unpadded: ``(d_conv - 1) x conv_dim / tp``
    elements in the model dtype (``conv_dim`` with the extra groups: ``extra_groups_for_head_shards``) and ``n_heads /
    tp x head_dim x d_state`` in ``ssm_bytes`` (None: the model dtype too).  ``MambaStateShapeCalculator``
    (mamba_utils.py:97-186 at 0.11.0, the same rules from 0.10.2 to 0.24.0): Mamba-1 ``divide(intermediate, tp)``
    channels, Mamba2 ``divide(conv_dim, tp)`` and ``divide(num_heads, tp)``, Gated DeltaNet ``divide(conv_dim, tp)`` and
    ``divide(num_v_heads, tp)``, short convolution ``divide(conv_dim, tp)``; ``mixer_tp_problem`` refuses an uneven
    split."""
    ssm = dtype_bytes if ssm_bytes is None else ssm_bytes
    return (ms.conv_kernel - 1) * _rank_conv_dim(ms, tp) * dtype_bytes + ms.ssm_state_elements // tp * ssm


def mixer_weights_tp_delta(m: ModelSpec, tp: int, layers: tuple[int, ...]) -> int:
    """Elements one of ``tp`` ranks holds in its mixers beyond the dense split (``rank_params``, which keeps the tensors
    transformers' mixers hold whole on every rank and splits the column-parallel projections' rows): negative where
    vLLM shards a tensor the model's parameters keep whole (``facts/vllm_releases.py`` ``MIXER_TP_SHARDED``), positive
    for Mamba2's extra groups, copied to every rank with their heads (``in_proj`` and ``conv1d``: ``divide(intermediate +
    conv_dim + 2 extra state + num_heads, tp)`` and ``divide(conv_dim + 2 extra state, tp)`` rows, mamba_mixer2.py:
    319-331 at 0.11.0).  ``layers``: the decoder layers on this rank's pipeline stage.

    Bamba-9B's mixer (h 4096, intermediate 8192, 1 group of state 128, 128 heads, d_conv 4, conv bias) at tp 2: one
    extra group, conv_dim 8448 -> 8704; in_proj 4096 x (8192 + 8704 + 128) / 2 = 34,865,152 against the dense split's
    4096 x 16,768 / 2 = 34,340,864 (+524,288); conv1d weight 8704 x 4 / 2 = 17,408 against 8448 x 4 = 33,792 (-16,384),
    its bias 4352 against 8448 (-4096); A_log, D, dt_bias 64 each against 128 (-192); norm 4096 against 8192 (-4096):
    +499,520 elements per mixer layer."""
    ms = m.mamba
    if ms is None or tp == 1:
        return 0
    sharded = MIXER_TP_SHARDED.get(ms.kind, frozenset())
    extra = extra_groups_for_head_shards(ms.n_groups, tp) if ms.kind == "mamba2" else 0
    mixer_layers, held = set(ms.layers), set(layers)
    delta = 0
    for p in m.params:
        path = p.name.removesuffix(".weight").removesuffix(".bias").split(".")
        # a mixer's own tensor: in the mixer layers only, under the mixer's module (``layers.mamba.norm``, not the
        # decoder layer's ``layers.norm``)
        if not p.layer_span or not set(p.layer_span) <= mixer_layers or len(path) < 3:
            continue
        n = count_on_rank(p, held, 1)
        if not n:
            continue
        dense = split_on_rank(p, tp, 1)
        if ms.shared_attention_layers and SHARED_BLOCK_TP_SHARDED_LISTS & set(path):
            delta += (p.numel // tp - dense) * n  # Zamba2's adapters (facts/vllm_releases.py)
        elif extra and p.module in ("in_proj", "conv1d"):
            rows = ms.intermediate_size + ms.conv_dim + ms.n_heads if p.module == "in_proj" else ms.conv_dim
            delta += (p.numel // rows * (rows + 2 * extra * ms.state_size) // tp - dense) * n
        elif p.module in sharded:
            delta += (p.numel // tp - dense) * n
    return delta


def mixer_profile_width(ms: MambaSpec, hidden: int = 0, tp: int = 1) -> int:
    """Elements per token alive in a mixer layer of one of ``tp`` ranks during the profile run (no attention
    metadata: the mixer skips the scan).  The projections are column-parallel, so every width but the hidden size's
    is one rank's (the ``torch.split`` sizes ``intermediate_size // tp_size``, ``conv_dim // tp_size``, ``num_heads //
    tp_size``, mamba_mixer2.py:515-536 at 0.11.0); ``out_proj`` is row-parallel and returns the whole hidden size.

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
        return 3 * (ms.intermediate_size // tp) + 2 * hidden
    if ms.kind == "gated_deltanet":
        # 0.10.2-0.11.x: ``gdn_attention``'s ``_forward`` returns at "V1 profile run" before ``in_proj``
        # (qwen3_next.py:403-405 at 0.10.2); later releases are refused (LINEAR_MIXER_PROFILE_READ_BEFORE)
        return 0
    if ms.kind == "short_conv":
        # ``ShortConv.forward_cuda`` "V1 profile run" (short_conv.py:131-143 at 0.10.2): ``in_proj``'s B|C|x (3 x
        # conv_dim), ``(B * x).contiguous()`` and ``C * Bx`` (conv_dim each), ``out_proj``'s result (hidden) beside the
        # decoder layer's ``output = torch.empty_like(hidden_states)`` (lfm2.py:297, hidden)
        return 5 * _rank_conv_dim(ms, tp) + 2 * hidden
    return 2 * (ms.intermediate_size // tp) + 2 * _rank_conv_dim(ms, tp) + ms.n_heads // tp


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


def state_space_layout(ms: MambaSpec, dtype_bytes: int, max_len: int, ssm_bytes: int | None = None,
                       tp: int = 1) -> HybridLayout:
    """The layout of a model whose every layer is a mixer (``mamba``, ``falcon_mamba``, ``mamba2``): every layer's
    ``MambaSpec`` is the same, so ``get_kv_cache_groups`` (vllm/v1/core/kv_cache_utils.py) makes one group of all
    layers (``is_kv_cache_spec_uniform``); the page is the state page, unpadded (``mamba_page_size_padded`` is set
    only beside attention); the block is ``mamba_block_size = max_model_len`` (``MambaModelConfig``, 0.12.0 on; the
    runner's ``block_size=max_model_len`` in 0.11.0), so a request takes one block.

    Worked example, Falcon-Mamba-7B in bf16 (64 layers, intermediate 8192, d_state 16, d_conv 4): state page
    3 x 8192 x 2 + 8192 x 16 x 2 = 49,152 + 262,144 = 311,296 B; one group of 64 layers; ``num_blocks = available //
    311,296 // 64``.  ``tp``: one rank's state page (``mamba_state_page_bytes``)."""
    state = mamba_state_page_bytes(ms, dtype_bytes, ssm_bytes, tp)
    n = len(ms.layers)
    return HybridLayout(block_size=max_len, page=state, state_page=state, attention_layers=0, mamba_layers=n,
                        group_size=n, attention_groups=0, mamba_groups=1, first_is_mamba=True)


def _block_size(rule: MambaHybridRule, asked: int, state_page: int, attention_per_token: int, align: int) -> int:
    if rule.block_rule == "align":
        a = max(align, asked)
        return a * ceil_div(state_page, a * attention_per_token)
    return max(asked, align * ceil_div(state_page, align * attention_per_token))


def hybrid_layout(ms: MambaSpec, attention_layers: int, attention_per_token: int, dtype_bytes: int, asked_block: int,
                  rule: MambaHybridRule, align: int = KERNEL_ALIGNMENT, ssm_bytes: int | None = None,
                  tp: int = 1) -> HybridLayout:
    """The layout of ``attention_layers`` attention layers of ``attention_per_token`` bytes per token beside
    ``ms``'s mixers, for a scenario block size ``asked_block`` under ``rule`` (``ssm_bytes``: the SSM state's dtype
    bytes where it is not the model dtype's); ``tp``: one rank's state page, beside ``attention_per_token`` of one
    rank's KV heads (``AttentionSpec`` per rank: ``num_kv_heads // tp``, at least one)."""
    state = mamba_state_page_bytes(ms, dtype_bytes, ssm_bytes, tp)
    block = _block_size(rule, asked_block, state, attention_per_token, align)
    n_mamba = len(ms.layers)
    smallest, largest = min(attention_layers, n_mamba), max(attention_layers, n_mamba)
    size = largest if rule.group_ratio is not None and largest < smallest * rule.group_ratio else smallest
    return HybridLayout(block_size=block, page=block * attention_per_token, state_page=state,
                        attention_layers=attention_layers, mamba_layers=n_mamba, group_size=size,
                        attention_groups=ceil_div(attention_layers, size), mamba_groups=ceil_div(n_mamba, size),
                        # Zamba2's attention layers are registered before its decoder layers (module docstring)
                        first_is_mamba=0 in ms.layers and not ms.shared_attention_layers)
