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

**Gated DeltaNet layers (``MambaSpec.kind`` "gated_deltanet": ``qwen3_next``, transformers 5.24
``modeling_qwen3_next.py``).**  The same ``LinearAttentionLayer`` keeps per layer and sequence the convolution state
``conv_dim x linear_conv_kernel_dim`` (``conv_dim = 2 key_dim + value_dim``: ``update_conv_state`` with
``conv_kernel_size=self.conv_kernel_size``) in the dtype of ``in_proj_qkvz``'s output, the compute dtype, and the
recurrent state ``linear_num_value_heads x linear_key_head_dim x linear_value_head_dim`` in fp32:
``torch_chunk_gated_delta_rule`` casts query, key, value, beta and the decay to fp32 and its ``last_recurrent_state``
(``torch.zeros(recurrent_state_shape, dtype=new_values.dtype)``, then updated in fp32) is what
``update_recurrent_state`` initializes the cache's tensor from.  Worked example, Qwen3-Next-80B-A3B's shape (16 key
heads and 32 value heads of 128; kernel 4; 36 linear-attention layers), bf16: conv_dim = 2 x 2,048 + 4,096 = 8,192;
conv state 8,192 x 4 x 2 B = 65,536 B; recurrent state 32 x 128 x 128 x 4 B = 2,097,152 B; per sequence 36 x
2,162,688 = 77,856,768 B, whatever its length.  (With the ``fla`` package installed, or hub kernels asked for,
``use_kernel_func_from_hub_with_fallback`` runs fla's ``chunk_gated_delta_rule`` instead; its state is the same
shape, its temporaries are other.)

**Short-convolution blocks (``MambaSpec.kind`` "short_conv": ``lfm2``, ``modeling_lfm2.py`` 5.24).**  Per layer and
sequence only the convolution state ``hidden x conv_L_cache`` of ``B * x`` (``Lfm2ShortConv.forward``:
``update_conv_state`` with ``conv_kernel_size=self.conv_kernel_size``), in the compute dtype; no recurrent state.
LFM2-1.2B's shape (hidden 2,048, ``conv_L_cache`` 3, 10 convolution blocks), bf16: 2,048 x 3 x 2 B = 12,288 B per
layer, 122,880 B per sequence.

Prefill (``Lfm2ShortConv.forward``, transformers' torch ``causal_conv1d_fn``: the ``causal-conv1d`` package and hub
kernels are not used unless installed or asked for; generate's all-ones mask makes ``create_recurrent_attention_mask``
return None, so no masked copy).  With ``b`` sequences of ``p`` tokens, ``h`` channels, ``k = conv_L_cache`` and the
compute dtype's ``c`` bytes, the block holds at once its input (the residual, ``b p h``) and ``operator_norm``'s output
(``b p h``), ``in_proj``'s output ``BCx`` (``3 b p h``; B, C and x are views of it, alive to the block's end), the
convolution's padded output (``b h (p + k - 1)``; ``B * x`` is freed once the convolution returns, the cache keeping a
copy of its last ``k`` columns), ``y = C * conv`` and its contiguous transpose (``b p h`` each) and then ``out_proj``'s
output in ``y``'s place: ``b c h (8 p + k - 1)``, this block's running-layer term.  Decode
(``causal_conv1d_update``): ``BCx`` (``3 h``), ``B * x`` (``h``), the state and the token concatenated (``(k + 1) h``)
and the convolution's output (``2 h``), then ``y``, its copy and ``out_proj``'s output: ``b c h (k + 7)`` at most.
Both agree with the traced engine (``tests/test_families_lfm2.py``).

**RWKV-4 blocks (``MambaSpec.kind`` "rwkv4": ``rwkv``, ``modeling_rwkv.py`` 5.24).**  ``RwkvModel.forward`` with
``use_cache`` makes ``state``: five tensors of ``batch x hidden x layers``, the first two (each layer's last
feed-forward and attention input, the token shift) in ``inputs_embeds``' dtype, the compute dtype, the other three
(the wkv numerator, denominator and running maximum) in fp32: ``h (2 c + 12)`` bytes per layer and sequence, written as
a "convolution" state of ``h x 2`` and an "SSM" state of ``h x 1 x 3`` (``spec/families/rwkv.py`` ``state_spec``).
RWKV-4-169M's shape (hidden 768, 12 layers), bf16: 768 x 16 = 12,288 B per layer, 147,456 B per sequence.

Prefill (transformers' torch path: ``rwkv_linear_attention`` runs ``rwkv_linear_attention_cpu`` whenever the hub
kernel is not loaded, which needs the ``kernels`` package and ninja, or the tensors are not on CUDA).  With ``b``
sequences of ``p`` tokens, ``h`` channels (``attention_hidden_size`` = ``h``: other values are refused), ``I`` =
``intermediate_size`` and ``c`` bytes of the compute dtype (``u = b p c`` a tensor of one width), the block holds
beside its input (bound to the model's ``hidden_states``):

* attention (``RwkvSelfAttention``): ``ln1``'s output, the token-shifted copy (``time_shift``) and the three mixed
  inputs with the two products of the third mix (``extract_key_value``), or after the projections key, value,
  receptance, ``sigmoid``'s input and output: ``8 h u`` at most with the input; at the end, key, value, receptance,
  the wkv output, ``receptance * rwkv`` and ``output``'s result: ``8 h u`` again;
* inside the wkv loop (``rwkv_linear_attention_cpu``), beside the input, ``ln1``'s output, key, value, receptance and
  the output buffer (``6 h u``), ``-exp(time_decay)`` (``h c``) and per step ``b h``-wide fp32 tensors: the previous
  step's ``current_key`` (a ``.float()`` copy unless ``c`` is 4), ``max_for_output``, ``e1``, ``e2``, ``numerator``,
  ``denominator``, ``max_state``, ``num_state`` and ``den_state`` (9), and at the ``num_state`` update the next
  ``max_for_state`` and its two products and their sum (4): ``b h (52 or 48)`` bytes;
* feed-forward (``RwkvFeedForward``), with the block's input, the attention's output (bound to ``attention`` until the
  block returns), the residual sum and ``ln2``'s output (``4 h u``): the shifted copy and the mixed key and
  receptance inputs (``3 h u``) with, at ``torch.square(torch.relu(self.key(key)))``, the ReLU's output and its square
  (``2 I u``; the projection's output is freed once the ReLU returns): ``(7 h + 2 I) u``; later the square (``I``),
  ``value``'s output and ``receptance``'s projection and ``sigmoid`` beside the shifted copy and the mixed receptance
  input: ``(9 h + I) u``; the larger (``(7 h + 2 I) u`` for RWKV-4's ``I = 4 h``) is the block's peak whenever ``p``
  is more than a few tokens.

Decode (one token, ``state`` given: the shift reads the state, no copy) holds, for one sequence, ``h``-wide tensors
only: the wkv step's input, ``ln1``'s output, key, value, receptance and the output (``6 c``) with up to 10 fp32 step
tensors (``40``, ``36`` when ``c`` is 4) and ``-exp(time_decay)``, or the feed-forward's ``8 h + I`` in ``c``: the
larger.  With ``b > 1`` sequences the step broadcasts: ``extract_key_value`` reads the shift state as a 2-D
``state[1][:, :, layer]`` (``b x h``), and ``hidden * time_mix_key + shifted * (1 - time_mix_key)`` of a ``(b, 1, h)``
and a ``(1, b, h)`` tensor is ``(b, b, h)``: the wkv loop runs ``b`` positions, the block's output and every later block
are ``b`` positions wide (the logits too, of which generate reads the last row; seen on transformers 5.24's CPU module,
a 3-sequence step returning ``(3, 3, vocab)`` logits).  The step's block is then counted as a prefill block of ``b``
positions, the larger of the two.

**RecurrentGemma's RG-LRU blocks (``MambaSpec.kind`` "rg_lru": ``recurrent_gemma``, ``modeling_recurrent_gemma.py``
5.24).**  The state is on the modules, not in the cache: ``RecurrentGemmaRecurrentBlock.forward`` (lines 432-451)
makes, with ``use_cache``, ``conv1d_state`` and ``rg_lru.recurrent_states`` for the batch when they are unset or of
another batch (``_setup_cache``, lines 463-466, does the same when the model's forward gets no cache).  After the
prefill ``conv1d_state`` is ``F.pad(x_branch, (conv1d_width - seq_len - 1, 0))`` (line 445): the last ``w - 1`` columns
of ``linear_x``'s output, ``L x (w - 1)`` in the compute dtype (``L`` = ``lru_width``, ``w`` = ``conv1d_width``), and
``recurrent_states`` the scan's last fp32 state, ``L`` (line 441, ``acc_dtype`` float32 of ``_rnn_scan``):
``L ((w - 1) c + 4)`` bytes per block and sequence.  recurrentgemma-2b's shape (L 2,560, w 4, 18 recurrent blocks),
bf16: 2,560 x (3 x 2 + 4) = 25,600 B a block, 460,800 B per sequence.  Its 8 local attention blocks keep keys and
values in the ``DynamicCache``'s ``DynamicSlidingWindowLayer`` (the config's ``layer_types`` names them
"sliding_attention", ``attention_window_size`` the window; analytic/kv_cache.py): 2 x 1 KV head x 256 x 2 B = 1,024 B
a block and token up to the window, 8,192 B per token for the 8.

A decode step (lines 447-451) concatenates ``conv1d_state`` with the token (``L x w``), multiplies it by the kernel
(``L x w``) and keeps ``conv_state[:, :, 1:]``, a view: from the first decode step on every block's ``conv1d_state``
holds ``L x w`` elements, ``b L c`` more per block than after the prefill; with the step's ``L``-wide tensors (the two
branches, the RG-LRU's gates and products, at most 14 in the compute dtype and 3 fp32 vectors) and the layer's input
and normalized input: ``b (c (2 h + (2 w + 14) L) + 12 L)`` for the running block, plus ``b L c`` per recurrent block.

Prefill: with ``b`` sequences of ``p`` tokens (``u = b p c``), the running block holds the decoder layer's input and
normalized input (``2 h u``: ``RecurrentGemmaDecoderLayer.forward`` binds ``raw_activations`` and
``inputs_normalized``), ``y_branch`` (``L u``) and ``conv_1d``'s output of ``p + w - 1`` columns (``padding = w - 1``,
sliced ``[..., :seq_len]`` as a view: ``b L (p + w - 1) c``); ``linear_x``'s output is freed once the slice rebinds
``x_branch``.  ``RecurrentGemmaRglru.forward`` (lines 301-339) then makes, each ``L u``: the reshaped input (a copy:
the transposed slice is not contiguous), the recurrent gate's ``baddbmm`` output ``res`` (the input gate's is freed
when ``res`` is rebound), ``input_gate``, ``recurrent_gate`` (its ``exp``), ``log_recurrent_gate``, ``a_square``,
``gated_inputs``, ``multiplier`` and ``normalized_x`` (9); ``_rnn_scan`` (lines 342-389) adds ``recurrent_gate * ~reset``
and ``contextualized_states`` (2): ``(2 h + 12 L) u + b L (p + w - 1) c``, with the loop's fp32 step vectors (the
state, the gate's fp32 copy, their product and the sum: ``16 b L``).  The block's branches after the RG-LRU
(``x_branch * y_branch``, ``linear_out``) and the MLP (``RecurrentGemmaMlp``, with four hidden-sized tensors kept:
``Traits.hidden_kept_through_mlp``) are smaller at RecurrentGemma's widths; the MLP's term is the attention layers'
(analytic/inference.py ``prefill_layer_bytes``), the larger of the two is the running layer.

**MiniMax's lightning attention (``MambaSpec.kind`` "lightning": ``minimax``, ``modeling_minimax.py`` 5.24).**  The
model's forward makes its own ``MiniMaxCache`` (lines 652-657; any other cache class is refused): a ``DynamicCache``
for the softmax layers' keys and values and a list ``linear_cache`` that ``set_linear_cache`` fills (line 271) with each
lightning layer's ``attn_weights_inter``, ``[batch, heads, head_dim, head_dim]`` in ``value_states``' dtype (the zeros
of lines 204-211, then ``attn_weights_inter * block_decay + next_attn_weights_inter``; the decay buffers are built in
the model's dtype): ``H D^2 c`` bytes per layer and sequence.  A shape of MiniMax-Text-01's size (64 heads of 128, 70
lightning layers of 80), bf16: 64 x 128 x 128 x 2 = 2,097,152 B a layer, 146,800,640 B per sequence, beside the 10
softmax layers' 2 x 8 x 128 x 2 x 10 = 40,960 B a token.

Prefill (``MiniMaxLightningAttention.forward``, lines 177-273, ``B`` = ``block_size``, ``q = H D``, ``u = b p c``):
the decoder layer holds its input (bound to the model loop's ``hidden_states``) and the normalized input
(``residual``): ``2 h u``; the layer holds ``qkv_states`` (``act_fn`` of ``qkv_proj``'s output, ``3 q u``; query, key
and value are views of it) to its end, and at the peak the largest of:

* ``act_fn``'s input and output: ``6 q u``;
* the block loop (``B'`` = ``min(B, p)``): the list of the blocks' outputs (up to ``q u``) and, per block, at the
  state's update (``attn_weights_inter * block_decay + next_attn_weights_inter``) the old state, its decayed copy,
  the next block's ``K^T V`` and the new state beside the block's scores and its intra and inter outputs
  (``4 D^2 + B'^2 + 3 B' D`` a head and sequence, the state itself counted with the cache's), or at the intra-block
  product the previous block's ``K^T V`` and outputs beside the scores, their decayed copy and the value's contiguous
  copy that ``matmul`` makes of the strided split (``2 D^2 + 2 B'^2 + 4 B' D``): ``4 q u + b H c max(3 D^2 + B'^2 +
  3 B' D, D^2 + 2 B'^2 + 4 B' D)``;
* after the loop its last block's locals stay bound to the layer's end (``attn_weights_intra``, the intra, inter and
  summed outputs and ``next_attn_weights_inter``: ``b H c (B_l^2 + 4 B_l D + D^2)``, ``B_l`` the last block's size)
  beside ``torch.cat`` of the list and the reshape of its transpose (a copy): ``5 q u``; the RMSNorm ``norm`` over
  ``q`` (its input ``q u``, the fp32 copy and the normalized fp32 product, ``8 b p q`` for a half input, ``5 q u`` in
  fp32 where the copy is the input): ``4 q u + 8 b p q``; ``sigmoid(output_gate(hidden_states)) * attn_output``:
  ``6 q u``.

Against the traced engine on a lightning-heavy tester (hidden 256, 8 heads of 64, block 64; tests/
test_families_minimax.py) the analytic figure is 0.1-1.0% above (single-block prompts the most).

The layer also registers its decay factors as buffers in the model's dtype (lines 143-149, ``decay_factors``):
``slope_rate`` ``[H, 1, 1]``, ``query_decay`` and ``key_decay`` ``[H, B, 1]`` and ``diagonal_decay`` ``[1, H, B, B]``:
``H (1 + 2 B + B^2) c`` bytes a layer (``mixer_buffer_bytes``), 8,454,272 B at 64 heads and ``B`` 256 in bf16,
591,799,040 B for 70 layers.

A decode step (lines 233-245, one token): the cache's state, ``ratio * attn_weights_inter``, the token's ``K^T V``
and their sum (``3 b H D^2 c`` beyond the state, which the cache holds until ``set_linear_cache`` replaces it), with
the layer's ``b (2 h + 6 q) c`` at most.

The Gated DeltaNet's prefill and decode temporaries are not modelled (``mixer_prefill_bytes`` and
``mixer_decode_bytes`` refuse them; the analytic engine refuses their generate: spec/checks.py
``linear_mixer_analytic_problems``).
Gated DeltaNet prefill (``Qwen3NextGatedDeltaNet.forward`` on transformers' torch fallbacks: ``causal_conv1d_fn`` and
``torch_chunk_gated_delta_rule``, as without the ``fla`` and ``causal-conv1d`` packages and ``use_kernels=True``;
generate's all-ones mask makes ``create_recurrent_attention_mask`` return None).  With ``b`` sequences of ``p`` tokens
padded to ``P = ceil(p / l) l`` (``l`` = 64, the rule's default ``chunk_size``), ``nk`` key heads and ``nv`` value
heads of ``dk`` and ``dv`` (``K = nk dk``, ``V = nv dv``, ``C = 2 K + V``) and the compute dtype's ``c`` bytes:

* held by the layer through the rule, in the compute dtype, per token: the decoder layer's residual and normalized
  input (``2 h``), ``in_proj_qkvz``'s output (``2 K + 2 V``, bound until the forward returns; ``z`` is a view of it) and
  ``in_proj_ba``'s (``2 nv``), where ``nv > nk`` the copies ``fix_query_key_value_ordering``'s reshapes make of ``z``,
  ``b`` and ``a`` (``V + 2 nv``; its value copy and the query and key copies of ``reshape(b, p, -1)`` die when the
  split of the convolution rebinds them), the activated convolution (``C``; query, key and value are views of it;
  the concatenated input and the padded ``F.conv1d`` output are gone by then) and ``beta`` (``nv``); in fp32 the decay
  ``g`` (``nv``);
* in the rule, fp32 elements per sequence and value head: the padded query, key and value (``P (2 dk + dv)``; the
  head-repeated and unpadded copies are rebound away), beta, decay and their cumulative sum (``3 P``), ``k_beta`` and
  ``v_beta`` (``P (dk + dv)``), the pairwise decays and the UT system (``2 P l``): ``first = P (3 dk + 2 dv + 3 + 2 l)``,
  with the intra-chunk ``query @ key^T`` and its product beside it (``first + 2 P l``, the peak where ``l`` outweighs
  the head dims); then ``base = first + P (l + 2 dk + 2 dv) + dk dv`` (the intra-chunk attention, the decayed
  ``k_beta``, ``new_values``, ``k_cumdecay``, the zero state and ``core_attn_out``), at the decayed key's product
  ``base + P (dk + 1)`` (its exponent and the new key beside the old), in the chunk loop ``base + P / l + max(4 l dv,
  2 l dv + 3 dk dv)`` (the last ``v_new`` and inter-chunk read stay bound, beside one chunk's product and sum, or the
  state's decayed copy, update and sum), and at the return ``base + P / l + 2 l dv + P dv``: ``core_attn_out`` is
  ``zeros_like`` of ``solve_triangular``'s output, whose matrices are column-major, so its reshape to
  ``(b, nv, P, dv)`` is a copy beside the old one (the compute-dtype output ``b p V c`` comes once the old one is
  freed); the bool ``strictly_upper_mask`` (``l^2`` bytes) throughout;
* after the rule, its output (``b p V c``) and ``Qwen3NextRMSNormGated``'s fp32 copies (``c + 8`` bytes an element at
  most), smaller than the rule's.

The running layer is the held tensors plus the largest of those moments.  Worked example, Qwen3-Next-80B-A3B's shape
(h 2,048, 16 key and 32 value heads of 128: K 2,048, V 4,096, C 8,192), bf16, 1 sequence of 1,000 tokens (P 1,024, 16
chunks): held 1,000 x (2 x (4,096 + 4,096 + 8,192 + 64 + 4,160 + 8,192 + 32) + 4 x 32) = 57,792,000 B; first 1,024 x
771 = 789,504; base 789,504 + 1,024 x 576 + 16,384 = 1,395,712; the return's 1,395,712 + 16 + 16,384 + 131,072 =
1,543,184 elements, the largest (the decayed key's 1,527,808, the loop's 1,461,264, the intra-chunk product's
920,576), x 32 heads x 4 B = 197,527,552, with the mask 197,531,648; the layer 255,323,648 B.

Gated DeltaNet decode (``causal_conv1d_update``, ``torch_recurrent_gated_delta_rule``): the held tensors above for one
token; in fp32 the decay ``g``, the rule's query and key repeated to every value head, value, beta, decay and output
(``nv + 2 nv dk + 2 V + 2 nv``); and, at ``last_recurrent_state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)``, three
state-sized fp32 tensors beside the cache's (``initial_state.to(value)`` returns the cache's own tensor; its decayed
copy, the outer product and the sum; ``update_recurrent_state`` then copies the sum into the cache).  80B's shape, bf16:
2 x 28,832 + 4 x 16,480 + 12 x 524,288 = 6,415,040 B per sequence.  Both agree with the traced engine
(``tests/test_families_qwen3_next.py``).
"""

from __future__ import annotations

from vramplan.facts.transformers import mamba2_scan_broadcasts
from vramplan.spec.model import MambaSpec, ModelSpec
from vramplan.spec.scenario import Scenario
from vramplan.units import ceil_div

__all__ = [
    "broadcast_product_bytes",
    "lightning_decode_bytes",
    "lightning_prefill_bytes",
    "mixer_buffer_bytes",
    "mixer_decode_bytes",
    "mixer_prefill_bytes",
    "rg_lru_decode_bytes",
    "rg_lru_prefill_bytes",
    "rwkv_block_decode_bytes",
    "rwkv_block_prefill_bytes",
    "split_product_excess_bytes",
    "ssm_state_bytes",
    "ssm_state_layer_bytes",
    "ssm_state_note",
]

FP32_BYTES = 4


def ssm_state_layer_bytes(m: ModelSpec, c: int) -> tuple[int, int]:
    """One mixer layer's (convolution state, SSM state) bytes per sequence in transformers' cache; (0, 0) when
    ``m`` has no mixers.  ``c``: bytes of the compute dtype (the convolution state's dtype)."""
    ms = m.mamba
    if ms is None:
        return 0, 0
    if ms.kind == "lightning":
        # MiniMaxCache.linear_cache: heads x head_dim x head_dim in the compute dtype, no convolution (module docstring)
        return 0, ms.ssm_state_elements * c
    if ms.kind == "rg_lru":
        # conv1d_state after the prefill: the last conv1d_width - 1 columns (module docstring)
        return ms.conv_dim * (ms.conv_kernel - 1) * c, ms.ssm_state_elements * FP32_BYTES
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
    _scan_modelled(ms)
    if ms.kind == "mamba1":
        return _mamba1_prefill_bytes(ms, batch, prompt, c)
    if ms.kind == "short_conv":
        return batch * c * ms.intermediate_size * (8 * prompt + ms.conv_kernel - 1)
    if ms.kind == "rwkv4":
        return rwkv_block_prefill_bytes(m, batch, prompt, c)
    if ms.kind == "rg_lru":
        return rg_lru_prefill_bytes(m, batch, prompt, c)
    if ms.kind == "lightning":
        return lightning_prefill_bytes(m, batch, prompt, c)
    if ms.kind == "gated_deltanet":
        return _gated_deltanet_prefill_bytes(m, batch, prompt, c)
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


def split_product_excess_bytes(s: Scenario, m: ModelSpec) -> int:
    """Cached bytes beyond the reserved estimate that a Mamba2 scan of transformers before 5.18 can leave: one
    largest broadcast product (``broadcast_product_bytes``), the bound ``PerGpu.reserved_excess_high_bytes``.

    The caching allocator serves a request from the smallest cached free block that holds it and splits that block
    (c10/cuda/CUDACachingAllocator.cpp ``get_free_block``, ``should_split``; no ``max_split_size`` by default).  Once
    a layer's product is freed, its segment is the only large free block, so the scan's later tensors (the sums,
    the chunk states, the mixer's output) are carved from it; one that outlives the layer keeps the segment from
    merging back whole, and the next layer's product of the same size needs a segment of its own.  Whether that
    happens depends on the order of the tensors' sizes, which the reserved estimate does not replay for this scan:
    the point estimate keeps the reused segment, the high bound adds one product.  Seen on an H100 (torch 2.11,
    transformers 5.17, Mamba-Codestral-7B, 2 x 1,024-token prompts, benchmarks/gpu/h100-2026-11-27e): the second
    layer's 32 GiB request failed with 14.58 GiB allocated and 32.20 GiB cached; a synthetic Bamba at the same
    shape (benchmarks/gpu/h100-2026-11-27d) reused its segment (reserved 1% above allocated).  Training (the
    backward's products) follows the same rule.  0 for other models, releases and tasks."""
    ms = m.mamba
    if ms is None or ms.kind != "mamba2" or not mamba2_scan_broadcasts(s.software.transformers_version):
        return 0
    if s.task == "train":
        return broadcast_product_bytes(ms, s.train.micro_batch_size, s.train.seq_len)
    if s.task == "inference":
        return broadcast_product_bytes(ms, s.inference.batch_size * s.inference.num_beams, s.inference.prompt_len)
    return 0


def _mamba1_prefill_bytes(ms: MambaSpec, batch: int, prompt: int, c: int) -> int:
    """A Mamba-1 mixer's live tensors at the end of ``mamba_selective_scan`` (module docstring)."""
    inter, n, r = ms.intermediate_size, ms.state_size, ms.time_step_rank
    scan = 3 * inter * n * FP32_BYTES + inter * (FP32_BYTES + 12 + 2 * c)
    held = c * (4 * inter + 2 * n + (0 if ms.bc_dt_norms else r))
    return batch * prompt * (scan + held)


def _wkv_step_bytes(c: int, prefill: bool) -> int:
    """Bytes per ``b h`` element of the wkv loop's fp32 step tensors at their peak (module docstring): 13 in a prefill
    step (the previous step's 9 and the ``num_state`` update's 4), 10 in the one decode step; one fewer where the
    compute dtype is fp32 (``current_key.float()`` is then no copy)."""
    return FP32_BYTES * ((13 if prefill else 10) - (1 if c == FP32_BYTES else 0))


def rwkv_block_prefill_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """An RWKV-4 block's live tensors at its peak during the prefill, its input included (module docstring)."""
    h, inter = m.hidden_size, m.intermediate_size
    u = batch * prompt * c
    loop = 6 * h * u + h * c + batch * h * _wkv_step_bytes(c, prefill=True)
    return max(8 * h * u, loop, (7 * h + 2 * inter) * u, (9 * h + inter) * u)


def rwkv_block_decode_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """An RWKV-4 block's live tensors at its peak in a decode step (module docstring): with more than one sequence,
    the step's broadcast makes it a block of ``batch`` positions (``rwkv_block_prefill_bytes`` at ``batch`` tokens)."""
    h, inter = m.hidden_size, m.intermediate_size
    one = max(batch * h * (6 * c + _wkv_step_bytes(c, prefill=False)) + h * c, batch * c * (8 * h + inter))
    return max(one, rwkv_block_prefill_bytes(m, batch, batch, c)) if batch > 1 else one


def rg_lru_prefill_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """A RecurrentGemma recurrent block's live tensors at its prefill's peak, in ``_rnn_scan``, the decoder layer's
    input and normalized input included (module docstring)."""
    ms = m.mamba
    assert ms is not None
    lru, w = ms.intermediate_size, ms.conv_kernel
    return (batch * c * ((2 * m.hidden_size + 12 * lru) * prompt + lru * (prompt + w - 1))
            + batch * lru * 4 * FP32_BYTES)


def rg_lru_decode_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """A RecurrentGemma recurrent block's decode step at its peak, and the column every block's ``conv1d_state``
    view gains from the first decode step on (module docstring)."""
    ms = m.mamba
    assert ms is not None
    lru, w = ms.intermediate_size, ms.conv_kernel
    step = batch * (c * (2 * m.hidden_size + (2 * w + 14) * lru) + 3 * FP32_BYTES * lru)
    return step + len(ms.layers) * batch * lru * c


def lightning_prefill_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """A MiniMax lightning attention layer's live tensors at its prefill's peak beyond its state, the decoder layer's
    input and normalized input included (module docstring)."""
    ms = m.mamba
    assert ms is not None
    heads, d, blk = ms.n_heads, ms.head_dim, ms.chunk_size
    q, u, first = heads * d, batch * prompt * c, min(blk, prompt)
    last = prompt - (ceil_div(prompt, blk) - 1) * blk
    per_block = max(3 * d * d + first * first + 3 * first * d, d * d + 2 * first * first + 4 * first * d)
    loop = 4 * q * u + batch * heads * c * per_block
    left = batch * heads * c * (last * last + 4 * last * d + d * d)
    norm = 5 * q * u if c == FP32_BYTES else 4 * q * u + 2 * FP32_BYTES * batch * prompt * q
    return 2 * m.hidden_size * u + max(6 * q * u, loop, max(norm, 6 * q * u) + left)


def mixer_buffer_bytes(m: ModelSpec, c: int) -> int:
    """The lightning attention layers' registered decay buffers (module docstring): per layer ``slope_rate``
    (``H``), ``query_decay`` and ``key_decay`` (``H x B`` each) and ``diagonal_decay`` (``H x B x B``) in the model's
    dtype; 0 for the other kinds, whose buffers are not counted."""
    ms = m.mamba
    if ms is None or ms.kind != "lightning":
        return 0
    blk = ms.chunk_size
    return len(ms.layers) * ms.n_heads * (1 + 2 * blk + blk * blk) * c


def lightning_decode_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """A MiniMax lightning attention layer's decode step beyond its state (module docstring)."""
    ms = m.mamba
    assert ms is not None
    return batch * c * (3 * ms.ssm_state_elements + 2 * m.hidden_size + 6 * ms.n_heads * ms.head_dim)


_KIND_NAMES = {"mamba2": "Mamba2", "mamba1": "Mamba", "gated_deltanet": "Gated DeltaNet",
               "short_conv": "short-convolution", "rwkv4": "RWKV-4", "rg_lru": "RG-LRU",
               "lightning": "lightning attention"}


def _scan_modelled(ms: MambaSpec) -> None:
    """Refuse the prefill and decode terms of the mixer kinds whose temporaries are not modelled (module docstring);
    every kind's are."""
    if ms.kind not in _KIND_NAMES:
        raise ValueError(f"the prefill and decode temporaries of {ms.kind} layers are not modelled")


def _gated_deltanet_held_elements(m: ModelSpec) -> int:
    """Compute-dtype elements per token that a Gated DeltaNet layer holds from its convolution to its end (module
    docstring): the residual and normalized input, ``in_proj_qkvz``'s and ``in_proj_ba``'s outputs, the reordered
    ``z``, ``b`` and ``a`` where value heads share key heads (their reshapes copy), the activated convolution and
    ``beta``."""
    ms = m.mamba
    assert ms is not None
    nv, key_dim, value_dim = ms.n_heads, ms.key_heads * ms.state_size, ms.n_heads * ms.head_dim
    shared = value_dim + 2 * nv if nv > ms.key_heads else 0
    return 2 * m.hidden_size + 2 * key_dim + 2 * value_dim + 2 * nv + ms.conv_dim + nv + shared


def _gated_deltanet_prefill_bytes(m: ModelSpec, batch: int, prompt: int, c: int) -> int:
    """A Gated DeltaNet layer's live tensors at its prefill's peak, inside ``torch_chunk_gated_delta_rule`` (module
    docstring)."""
    ms = m.mamba
    assert ms is not None
    nv, dk, dv, chunk = ms.n_heads, ms.state_size, ms.head_dim, ms.chunk_size
    padded = ceil_div(prompt, chunk) * chunk
    # fp32 elements per sequence and value head (module docstring): the padded query, key, value, beta, decay, their
    # cumulative sum, k_beta, v_beta and the pairwise decays and UT system, ``P (3 dk + 2 dv + 3 + 2 l)``; at the
    # intra-chunk product its matmul and product beside them (2 P l); from the scan's setup on (``base``) the
    # intra-chunk attention, the decayed k_beta, new_values, k_cumdecay, the zero state and output
    first = padded * (3 * dk + 2 * dv + 3 + 2 * chunk)
    base = first + padded * (chunk + 2 * dk + 2 * dv) + dk * dv
    rebind = padded * (dk + 1)  # the decayed key's exponent and product beside the old key
    chunks = padded // chunk  # chunk_decay
    loop = chunks + max(4 * chunk * dv, 2 * chunk * dv + 3 * dk * dv)  # one chunk's products, or the state's update
    mask = chunk * chunk  # strictly_upper_mask, bool, once
    scan = batch * nv * FP32_BYTES * max(first + 2 * padded * chunk, base + rebind, base + loop) + mask
    # the output reshaped at the return: a copy (new_values, and so zeros_like's output, have column-major matrices,
    # solve_triangular's layout), beside the old one, the last chunk's v_new and inter-chunk read
    end = batch * nv * FP32_BYTES * (base + chunks + 2 * chunk * dv + padded * dv) + mask
    # after the scan: its output and the gated norm's fp32 copies (c + 8 bytes an element at most)
    norm = batch * prompt * nv * dv * (2 * c + 8)
    held = batch * prompt * (c * _gated_deltanet_held_elements(m) + FP32_BYTES * nv)
    return held + max(scan, end, norm)


def _gated_deltanet_decode_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """One Gated DeltaNet layer's decode step at its peak, ``torch_recurrent_gated_delta_rule``'s state update (module
    docstring)."""
    ms = m.mamba
    assert ms is not None
    nv, dk, value_dim = ms.n_heads, ms.state_size, ms.n_heads * ms.head_dim
    # fp32: the decay g; the rule's query, key (repeated to the value heads), value, beta, decay and output
    fp32 = nv + 2 * nv * dk + 2 * value_dim + 2 * nv
    return batch * (c * _gated_deltanet_held_elements(m) + FP32_BYTES * (fp32 + 3 * ms.ssm_state_elements))


def ssm_state_note(m: ModelSpec, c: int) -> str | None:
    """What a KV-cache table leaves out for a hybrid model: its mixers' state per sequence (None without mixers)."""
    if m.mamba is None:
        return None
    kind = _KIND_NAMES[m.mamba.kind]
    where = ("beside the KV cache of the same layers" if m.mamba.parallel_attention
             else f"beside the KV cache of the {len(m.mamba.shared_attention_layers)} that run a shared block"
             if m.mamba.shared_attention_layers else "no KV cache there")
    state = ("convolution and SSM state" if m.mamba.ssm_state_elements and m.mamba.conv_dim else
             "recurrent state" if m.mamba.ssm_state_elements else "convolution state")
    return (f"plus {ssm_state_bytes(m, 1, c):,} B per sequence of {kind} {state} in "
            f"{len(m.mamba.layers)} mixer layers ({where}), whatever the sequence length")


def mixer_decode_bytes(m: ModelSpec, batch: int, c: int) -> int:
    """One mixer layer's single-token state update at its peak (module docstring); 0 without mixers."""
    if m.mamba is None:
        return 0
    _scan_modelled(m.mamba)
    if m.mamba.kind == "short_conv":
        return batch * c * m.mamba.intermediate_size * (m.mamba.conv_kernel + 7)
    if m.mamba.kind == "rwkv4":
        return rwkv_block_decode_bytes(m, batch, c)
    if m.mamba.kind == "rg_lru":
        return rg_lru_decode_bytes(m, batch, c)
    if m.mamba.kind == "lightning":
        return lightning_decode_bytes(m, batch, c)
    if m.mamba.kind == "gated_deltanet":
        return _gated_deltanet_decode_bytes(m, batch, c)
    if m.mamba.kind == "mamba1":
        return batch * m.mamba.ssm_state_elements * 5 * FP32_BYTES
    return batch * m.mamba.ssm_state_elements * (3 * FP32_BYTES + 2 * c)
