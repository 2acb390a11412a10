"""What vLLM's MLA attention keeps on the GPU after loading the weights, by release (DeepSeek-V2/V3-style latent
attention), as data.

Read in the PyPI wheels of vLLM 0.7.0-0.10.2 (``vllm/attention/backends/mla/utils.py`` in 0.7.1-0.7.2, ``mla/common.py``
from 0.7.3; ``vllm/envs.py``).  ``MLACommonImpl.process_weights_after_loading`` runs inside ``get_model``, under the
``DeviceMemoryProfiler`` whose figure vLLM prints as "Loading model weights took" / "Model loading took", so what it
keeps counts among the weights.  The checkpoint's ``q_proj`` (or ``q_b_proj``), ``kv_b_proj`` and ``o_proj`` stay
(prefill still runs them).

* 0.7.0: no MLA backend, nothing kept.
* 0.7.1-0.7.3 (the V0 engine; vLLM's V1 had no MLA backend then): ``W_QR`` (``Rin x N r``, the activation dtype)
  always, and with ``VLLM_MLA_PERFORM_MATRIX_ABSORPTION`` (default "1", 0.7.1 envs.py:522-523) the absorbed
  ``W_Q_UK`` (``Rin x N L``) and ``W_UV_O`` (``N L x H``): fp8 (one byte, with fp32 scales) for an fp8 checkpoint, the
  activation dtype otherwise.  ``W_UK`` / ``W_UV`` are views of ``kv_b_proj``'s weight, free when it is unquantized;
  a quantized one is dequantized and the copy kept: fp32 in 0.7.1-0.7.2 (``scaled_dequantize`` defaults to float32),
  the activation dtype from 0.7.3.
* 0.8.0 on (V0 and V1; pull request vllm-project/vllm#14770 "MLA get rid of materialization"): no absorption, the env
  var gone; ``W_UV`` and ``W_UK_T`` are views of ``kv_b_proj``, and a quantized one's dequantized copy (the activation
  dtype) is kept.

``Rin`` is ``q_lora_rank`` (the query's low-rank input) or the hidden size H when the model has none; ``N`` the heads on
the rank, ``r`` ``qk_rope_head_dim``, ``L`` ``kv_lora_rank``, ``P`` ``qk_nope_head_dim``, ``V`` ``v_head_dim``.
"""

from __future__ import annotations

__all__ = ["ABSORB_FROM", "ABSORB_UNTIL", "KV_B_FP32_UNTIL", "SOURCES"]

# the first release with the MLA backend's absorbed matrices (0.7.1) and the first without them (0.8.0)
ABSORB_FROM = (0, 7, 1)
ABSORB_UNTIL = (0, 8, 0)
# the dequantized kv_b_proj copy is fp32 before this release (0.7.1-0.7.2), the activation dtype from it
KV_B_FP32_UNTIL = (0, 7, 3)
SOURCES = ("vllm 0.7.1 wheel vllm/attention/backends/mla/utils.py MLACommonImpl.process_weights_after_loading "
           "(W_QR, W_Q_UK, W_UV_O; envs.py:522-523 VLLM_MLA_PERFORM_MATRIX_ABSORPTION default 1); 0.7.3 mla/common.py; "
           "0.8.0 mla/common.py (W_UV, W_UK_T views; PR vllm-project/vllm#14770)")
