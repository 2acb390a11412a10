"""vLLM's MTP proposer (``--speculative-config '{"method": "mtp", ...}'``): the target's own multi-token-prediction
layers, by architecture and release (serve/vllm.py ``_mtp_draft``; docs/serving.md, "Options that change the budget").

Read in vLLM's source as shipped in the release wheels (0.9.0, 0.10.0, 0.11.0, 0.12.0, 0.15.1, 0.16.0, 0.17.0, 0.18.0,
0.21.0, 0.31.0, 0.33.0):

* the method.  ``SpeculativeConfig.__post_init__`` (``vllm/config/speculative.py``, 0.11.0 on) turns method ``mtp``
  with no model into the target itself (``self.model = self.target_model_config.model``, the quantization aligned to
  the target's) and ``hf_config_override`` rewrites the draft's config (``deepseek_v3`` -> ``deepseek_mtp``,
  ``Glm4MoeForCausalLM`` -> ``glm4_moe_mtp``, ``n_predict = num_nextn_predict_layers``).  0.9.0 and 0.10.0
  (``vllm/config.py``) know the method only as ``deepseek_mtp``: releases before ``MTP_METHOD_FROM`` are refused.
  ``num_speculative_tokens`` above ``n_predict`` must be a multiple of it (0.17.0 ``speculative.py`` lines 538-550,
  "must be divisible by n_predict"); the layers are then run again (``spec_step_idx % num_mtp_layers``), nothing
  more is allocated.
* the layers.  ``DeepSeekMultiTokenPredictor`` (``model_executor/models/deepseek_mtp.py``) builds one
  ``DeepSeekMultiTokenPredictorLayer`` per MTP layer, indexed from ``num_hidden_layers`` on: ``enorm``, ``hnorm``
  (RMSNorm h), ``eh_proj`` (``nn.Linear(2h, h)``, replicated, unquantized), ``shared_head`` (RMSNorm h and a
  ``ParallelLMHead(vocab, h)``) and ``mtp_block`` (``DeepseekV2DecoderLayer`` at that index: MLA attention and,
  past ``first_k_dense_replace``, the MoE), and one ``VocabParallelEmbedding(vocab, h)``.  ``glm4_moe_mtp.py`` is
  the same with ``Glm4MoeDecoderLayer``.  Each MTP layer's attention is a KV layer of the block pool.
* what stays.  ``EagleProposer.load_model`` (``v1/spec_decode/eagle.py``; ``llm_base_proposer.py`` from 0.20.0)
  replaces the MTP embedding by the target's (0.11.0: equal shapes; 0.12.0 on: "Detected MTP model. Sharing target
  model embedding weights", pp 1 only) and from ``MTP_HEAD_SHARED_FROM`` each layer's ``shared_head.head`` by the
  target's LM head (``del sh.head``; "Shared target model lm_head with MTP shared_head.head").  Before it the
  heads stay: 0.11.0-0.15.1 set ``self.model.lm_head``, which the MTP model does not read (``compute_logits`` uses
  ``shared_head.head``).  The replaced copies are freed before "Model loading took" is measured
  (``DeviceMemoryProfiler`` -> ``get_current_memory_usage``: ``torch.cuda.empty_cache()``).
* Model Runner V2.  vLLM runs it by default from 0.22.0 for the models and options of
  ``facts/vllm_releases.py`` ``MODEL_RUNNER_RULES`` (``config/vllm.py`` ``use_v2_model_runner``; every model it
  supports from 0.29.0, MTP among its speculative methods from 0.22.0).  Its loader shares
  the embedding and every ``shared_head.head`` alike (0.33.0 ``v1/worker/gpu/spec_decode/eagle/utils.py``
  ``maybe_share_target_embed``, ``load_eagle_model``: "MTP layers route logits through layer.shared_head.head");
  its MTP speculator's profile run and buffers (``v1/worker/gpu/spec_decode/mtp``) were not read: those of the V1
  runner's ``EagleProposer`` are assumed, as for the other methods.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.facts.vllm_releases import Release

MTP_METHOD_FROM: Release = (0, 11, 0)  # method "mtp" (0.11.0 vllm/config/speculative.py SpeculativeMethod)
MTP_HEAD_SHARED_FROM: Release = (0, 16, 0)  # shared_head.head replaced by the target's (0.16.0 eagle.py)


@dataclass(frozen=True)
class VllmMtpArch:
    """A target architecture whose MTP layers vLLM builds as enorm/hnorm/eh_proj/shared_head around one decoder
    layer shaped like the target's (``serve/sglang_options.py`` ``mtp_layer_bytes``)."""

    architecture: str  # config.json ``architectures[0]``
    draft: str  # the MTP model vLLM builds (hf_config_override's ``architectures``)
    source: str


VLLM_MTP_ARCHS: tuple[VllmMtpArch, ...] = (
    VllmMtpArch("DeepseekV3ForCausalLM", "DeepSeekMTPModel",
                "0.17.0 vllm/config/speculative.py:207-213 (deepseek_v3 -> deepseek_mtp, n_predict); "
                "model_executor/models/deepseek_mtp.py DeepSeekMultiTokenPredictorLayer (DeepseekV2DecoderLayer)"),
    VllmMtpArch("Glm4MoeForCausalLM", "Glm4MoeMTPModel",
                "0.17.0 vllm/config/speculative.py:233-240 (Glm4MoeForCausalLM -> glm4_moe_mtp, n_predict); "
                "model_executor/models/glm4_moe_mtp.py Glm4MoeMultiTokenPredictorLayer (Glm4MoeDecoderLayer)"),
)


def mtp_arch(architecture: str) -> VllmMtpArch | None:
    return next((a for a in VLLM_MTP_ARCHS if a.architecture == architecture), None)
