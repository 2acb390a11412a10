"""Memory at one instant, by declared part and sub-part; the declared keys and phases.

Every byte the analytic engine reports sits under a ``Key``: a part of the report's breakdown
(``report.BREAKDOWN_KEYS``) and a sub-part, declared once here with what it means and its flags.
``Moment.add`` accepts only a declared key, so a sub-part cannot be spelled two ways (the cuBLAS
workspace once had four spellings, and ``measure`` matched only one of them), and a reader of
``breakdown_detail`` can look every row up in ``KEYS``.  A key's ``label`` is what the report shows;
a few labels are patterns filled per scenario (the optimizer's name, vLLM's block count), declared
with ``templated=True``.

Phases are declared the same way (``PHASES``): a moment's phase is the report's ``peak_phase``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramplan.report import BREAKDOWN_KEYS

__all__ = ["KEYS", "PHASES", "Key", "Moment", "Phase", "cuda_only_labels", "key_for"]


@dataclass(frozen=True)
class Key:
    """One row of ``breakdown_detail``: its part, its label and what it is.

    ``cuda_only``: the memory exists only on a CUDA device (``measure`` on a CPU removes it from the
    prediction it compares with).  ``templated``: ``label`` is a ``str.format`` pattern whose fields
    ``Moment.add`` fills.
    """

    part: str
    label: str
    text: str
    cuda_only: bool = False
    templated: bool = False

    def __post_init__(self) -> None:
        if self.part not in BREAKDOWN_KEYS:
            raise ValueError(f"part {self.part!r} is not one of {BREAKDOWN_KEYS}")
        if self.cuda_only and self.templated:
            raise ValueError("a CUDA-only key has a fixed label, so that measure can find it")

    def name(self, **fields: Any) -> str:
        """The label shown in the report (a templated key's pattern filled with ``fields``)."""
        return self.label.format(**fields) if self.templated else self.label


@dataclass(frozen=True)
class Phase:
    name: str
    text: str


def _k(part: str, label: str, text: str, **flags: bool) -> Key:
    return Key(part, label, text, **flags)


class K:
    """The declared keys, by attribute (``K.PARAMETERS``)."""

    # weights
    PARAMETERS = _k("weights", "parameters", "the model's parameters resident on this GPU (its shard)")
    GATHERED_ROOT = _k("weights", "all-gathered (ZeRO-3/FSDP root)",
                       "the FSDP root unit (embeddings, head) kept unsharded for the whole step")
    GATHERED = _k("weights", "all-gathered (ZeRO-3/FSDP)", "full parameters of the units gathered at this moment")
    DS_RETAINED = _k("weights", "kept gathered for reuse (ZeRO-3)",
                     "DeepSpeed ZeRO-3: layers whose parameters are reused within stage3_max_reuse_distance, not released")
    DS_PERSISTENT = _k("weights", "persistent parameters (ZeRO-3)",
                       "DeepSpeed ZeRO-3: parameters under stage3_param_persistence_threshold, gathered for the whole run")
    ROTARY_CACHE = _k("weights", "rotary cos/sin cache", "vLLM's rotary embedding cos/sin cache")
    HF_ROPE_BUFFERS = _k("weights", "rotary cos/sin buffers (older transformers)",
                         "transformers' per-attention-layer cos/sin tables of max_position_embeddings positions, "
                         "registered at construction by the releases of Traits.rope_cache_in (analytic/hf_buffers.py)")
    HF_CAUSAL_MASK = _k("weights", "causal-mask buffer (transformers 4.38)",
                        "the max_position_embeddings^2 bool causal_mask buffer of Llama's and Gemma's model in "
                        "transformers 4.38 (analytic/hf_buffers.py)")
    LORA_SLOTS = _k("weights", "LoRA slots", "vLLM's preallocated LoRA adapter slots (max_loras x max_lora_rank)")
    PROPOSER_WEIGHTS = _k("weights", "speculative proposer",
                          "the draft model's or EAGLE head's weights (and its own rotary cache) beside the target")
    # gradients, optimizer, master
    GRADIENTS = _k("gradients", "parameter gradients", "gradients of the trainable parameters alive at this moment")
    DDP_BUCKETS = _k("gradients", "DDP buckets", "DDP's flat gradient buckets, allocated when the model is wrapped")
    DS_REDUCE_BUCKETS = _k("gradients", "DeepSpeed reduce buckets",
                           "DeepSpeed ZeRO's contiguous gradient buckets (reduce_bucket_size) and offload staging buffer")
    OPTIMIZER_STATES = _k("optimizer_states", "{optimizer}", "the optimizer's state tensors", templated=True)
    MASTER = _k("master_weights", "fp32 master", "fp32 copies of half-precision trainable parameters")
    # activations
    SAVED = _k("activations", "saved by layers", "tensors the forward saved for the backward, alive at this moment")
    INPUTS_EMBEDS = _k("activations", "inputs_embeds (kept by the decoder's forward)",
                       "the embedding output, kept by the decoder's forward during prefill")
    ROPE = _k("activations", "RoPE cos/sin", "the rotary embedding's cos/sin for the prompt")
    TRAIN_CACHE = _k("kv_cache", "cache of the training forward (use_cache)",
                     "the DynamicCache transformers builds in a training forward with use_cache on and no gradient "
                     "checkpointing: every layer's keys and values, copied from 4.56 (analytic/terms/saved.py)")
    KV_REPEATED = _k("temporaries", "K/V repeated for SDPA (transformers < 4.54)",
                     "one layer's keys and values repeated to every query head before SDPA (repeat_kv) over the "
                     "cache, in the releases before enable_gqa (analytic/attention.py sdpa_repeats_kv)")
    RELEASE_MASK = _k("activations", "4-D causal mask (transformers 4.38)",
                      "transformers 4.38's (batch, 1, P, P) mask from the causal_mask buffer, P = "
                      "max_position_embeddings, in the embeddings' dtype (eager and SDPA attention)")
    RUNNING_LAYER = _k("activations", "running layer", "the largest layer's live tensors during prefill")
    PER_LAYER_INPUTS = _k("activations", "per-layer inputs (kept by the decoder's forward)",
                          "Gemma 3n's per-layer inputs [batch, prompt, layers, hidden_size_per_layer_input], kept "
                          "through the prefill's layers")
    ALTUP_EXPANSION = _k("activations", "AltUp projections (kept by the decoder's forward)",
                         "Gemma 3n's altup_num_inputs - 1 projected copies of the embeddings (and the last raw "
                         "projection), bound until the prefill's layer loop ends")
    SLIDING_MASK = _k("activations", "sliding-window mask (SDPA)",
                      "the sliding layers' boolean [1, 1, prompt, prompt] mask SDPA receives once the prompt reaches "
                      "the window, kept through the prefill's layers")
    FINAL_HIDDEN = _k("activations", "final hidden states", "the last layer's output before the LM head")
    VISION_TOWER = _k("activations", "vision tower",
                      "a vision-language model's vision tower running its largest layer over the prompt's images")
    PROFILE_SAMPLER = _k("activations", "profile peak (sampler)", "vLLM's profile run peak, reached by the sampler")
    PROFILE_FORWARD = _k("activations", "profile peak (forward)", "vLLM's profile run peak, reached by the forward")
    IMAGE_INPUTS = _k("activations", "pixel values and cross-attention mask (generate's inputs)",
                      "a cross-attention model's fp32 pixel values and int64 cross-attention mask, kept by generate")
    VISION_STATES = _k("activations", "vision output and projected states",
                       "a cross-attention model's vision output and projector output, kept through the prompt's forward")
    CROSS_MASK = _k("activations", "cross-attention mask",
                    "a cross-attention model's [b, 1, p, L] mask over the image positions (or its preparation)")
    ENCODER_KEPT = _k("activations", "encoder embeddings (kept by the encoder's forward)",
                      "an encoder-decoder model's encoder stack: its embedding output (BART: and its positions; T5: "
                      "the relative position bias) kept through the stack's layers")
    ENCODER_LAYER = _k("activations", "encoder running layer",
                       "an encoder-decoder model's largest encoder layer's live tensors over the source tokens")
    ENCODER_INPUT = _k("activations", "input features (generate's input)",
                       "a speech encoder's log-mel input_features, held by the caller, and generate's "
                       "segment copy of them, for the whole call")
    ENCODER_OUTPUT = _k("activations", "encoder output (kept by generate)",
                        "an encoder-decoder model's encoder output, kept in generate's model_kwargs for the whole call")
    DECODER_STEP = _k("activations", "decoder layer (one token per sequence)",
                      "an encoder-decoder model's decoder embeddings and running layer at a one-token step")
    # KV cache
    KV_PROMPT = _k("kv_cache", "prompt", "the prompt's keys and values")
    KV_ALL = _k("kv_cache", "all tokens", "keys and values of every token so far")
    KV_LEGACY = _k("kv_cache", "previous step's cache (legacy tuple)",
                   "the previous decode step's tuple cache, still held by generate (transformers < 4.42)")
    KV_BLOCKS = _k("kv_cache", "{blocks:,} blocks of {block_size} tokens", "vLLM's KV-cache blocks",
                   templated=True)
    KV_CROSS = _k("kv_cache", "cross-attention keys and values (images)",
                  "the cross-attention layers' keys and values of the images' vision positions, written at prefill")
    KV_CROSS_ENCODER = _k("kv_cache", "cross-attention keys and values (encoder output)",
                          "an encoder-decoder model's decoder layers' keys and values of the encoder output, written "
                          "once at the first decoder step (EncoderDecoderCache.cross_attention_cache)")
    SSM_STATE = _k("kv_cache", "mixer state (convolution and recurrent)",
                   "a state-space or hybrid model's mixer layers' fixed-size state per sequence (Mamba/Mamba2 "
                   "convolution and SSM state, Gated DeltaNet, short convolution or RWKV state; transformers' "
                   "LinearAttentionLayer)")
    REQ_TO_TOKEN = _k("kv_cache", "request-to-token table",
                      "SGLang's ReqToTokenPool: max_num_reqs rows (one more before 0.4.7) x (context_len + 4) int32 slot "
                      "indices (wider rows with speculative decoding from 0.5.1; serve/sglang_requests.py)")
    DRAFT_KV = _k("kv_cache", "speculative draft KV pool",
                  "SGLang's draft worker's own KV pool (EAGLE head, MTP layer or draft model), as many tokens as the "
                  "target's")
    # temporaries
    CASTS = _k("temporaries", "autocast weight copies", "half-precision copies autocast makes of fp32 weights")
    FLOAT8_CASTS = _k("temporaries", "float8 casts (torchao)",
                      "a converted linear's float8 casts and operand copies in its backward (torchao float8 training)")
    MX_CASTS = _k("temporaries", "MXFP8 casts (torchao)",
                  "a converted linear's MX casts and scale layouts in its backward (torchao MXFP8 training)")
    FLOAT8_SCALES = _k("weights", "float8 weight scales (torchao)",
                       "one fp32 scale per converted weight, precomputed after the optimizer step")
    LOSS_FORWARD = _k("temporaries", "logits and loss", "logits and the loss's tensors at the forward's end")
    LOSS_BACKWARD = _k("temporaries", "logits and loss gradients", "the loss's gradients at the backward's start")
    LAYER_FORWARD = _k("temporaries", "layer forward", "one layer's forward temporaries (a stage without the head)")
    LAYER_BACKWARD = _k("temporaries", "layer backward", "one layer's backward temporaries")
    UNSHARDED_GRADS = _k("temporaries", "unsharded gradients before reduce-scatter",
                         "a layer's full gradients before ZeRO/FSDP reduce-scatters them")
    REDUCE_SCATTER_INPUT = _k("temporaries", "FSDP2 reduce-scatter input (reduce dtype)",
                              "a unit's full gradients copied into FSDP2's reduce-scatter buffer in the reduce "
                              "dtype, kept until the next unit's reduce")
    TIED_EMBEDDING = _k("temporaries", "tied embedding gradient contributions",
                        "the two gradient contributions of a tied embedding, summed at the embedding's backward")
    OPTIMIZER_STEP = _k("temporaries", "optimizer step", "temporaries of optimizer.step()")
    ZERO_STEP_COPIES = _k("temporaries", "ZeRO gradient norm and flattening",
                          "DeepSpeed ZeRO's step before the optimizer runs: the fp64 copy of each gradient for "
                          "the norm, then the flattened gradient partition beside its fp32 copy")
    ZERO_OFFLOAD_NORM = _k("temporaries", "ZeRO-Offload gradient norm copy",
                           "DeepSpeed ZeRO-1/2 with the optimizer offloaded: the fp64 copy of a gradient for its norm, "
                           "made on the GPU when its bucket is reduced in the backward")
    ZERO3_OFFLOAD_GRAD = _k("temporaries", "ZeRO-3 offload gradient copies",
                            "DeepSpeed ZeRO-3 with the optimizer offloaded: a gradient partition's GPU copy and its "
                            "fp32 conversion, made on the GPU when its bucket is reduced in the backward")
    PROMPT_LOGITS = _k("temporaries", "logits of every prompt position",
                       "prefill logits for every prompt position (older transformers, Lit-GPT)")
    PROMPT_LOGITS_FP32 = _k("temporaries", "logits of every prompt position and their fp32 copy",
                            "prefill logits for every prompt position and their fp32 upcast")
    LOGITS_SAMPLING = _k("temporaries", "logits and sampling", "all-position logits and sampling (Lit-GPT)")
    LAST_LOGITS = _k("temporaries", "last-token logits and sampling", "the last position's logits and sampling")
    BEAM_STATE = _k("temporaries", "beam search sequences and indices",
                    "beam search's token and beam-index buffers (running, finished, top-k candidates and their merge)")
    ENCODER_OUTPUT_EXPAND = _k("activations", "encoder output repeated for the beams",
                               "beam search: the encoder output and its copy repeated num_beams times, together")
    DEQUANT = _k("temporaries", "dequantized weight", "one quantized weight dequantized for its matmul")
    CACHE_GROWTH = _k("temporaries", "cache growth (torch.cat of one layer)",
                      "one layer's keys (then values), old and new together, while the cache grows (a sliding "
                      "layer: its keys and values)")
    CROSS_LAYER_DECODE = _k("temporaries", "cross-attention layer (decode)",
                            "a cross-attention layer's cached keys and values repeated to every head at a decode step")
    CROSS_KV_WRITE = _k("temporaries", "cross-attention keys and values being cached (one layer)",
                        "an encoder-decoder model's k and v projections of the encoder output beside their cached "
                        "copies, in the last decoder layer of the first step")
    MIXER_STATE_UPDATE = _k("temporaries", "mixer state update (one layer)",
                            "a state-space or hybrid model's single-token state update in one mixer layer at decode")
    PREV_PROMPT_LOGITS = _k("temporaries", "prompt logits (previous step's outputs)",
                            "the prefill's logits, kept through the first decode step (transformers < 4.42)")
    # the job's phases around the step (analytic/lifecycle)
    LOAD_STAGING = _k("temporaries", "load staging copy",
                      "from_pretrained: the tensor being loaded in its checkpoint or load dtype, before it is "
                      "quantized or cast")
    PREPARE_CAST = _k("temporaries", "k-bit preparation fp32 cast",
                      "prepare_model_for_kbit_training: the fp32 copy of the parameter being cast, beside its half original")
    EVAL_FORWARD = _k("temporaries", "evaluation forward (no grad)",
                      "the largest tensors of one evaluation forward under torch.no_grad (logits, loss, MLP)")
    EVAL_LOGITS = _k("temporaries", "evaluation logits kept",
                     "logits of every evaluation batch kept on the GPU by the evaluation loop")
    EVAL_CACHE = _k("kv_cache", "evaluation forward cache (use_cache)",
                    "the DynamicCache a transformers model builds in an evaluation forward with use_cache on: every "
                    "layer's keys and values of the evaluation batch, until the output is dropped")
    EVAL_GENERATION = _k("kv_cache", "validation generation cache",
                         "the KV cache of the sample generated after validation (Lit-GPT generate_example)")
    SAVE_GATHERED = _k("weights", "gathered for checkpoint save",
                       "full parameters gathered on this GPU while the checkpoint's state dict is built")
    SAVE_OPTIM_GATHERED = _k("optimizer_states", "gathered for checkpoint save",
                             "the full optimizer state dict gathered on this GPU while the checkpoint is built")
    # RL post-training (train.objective: grpo; analytic/grpo.py, serve/rollout.py)
    REFERENCE_WEIGHTS = _k("weights", "reference model",
                           "the frozen reference model's parameters (a separate copy, loaded like the policy)")
    ROLLOUT_WEIGHTS = _k("weights", "rollout engine (vLLM) weights",
                         "the colocated vLLM engine's copy of the policy's weights")
    ROLLOUT_KV = _k("kv_cache", "rollout engine (vLLM) KV cache",
                    "the colocated vLLM engine's KV-cache blocks, sized by its gpu_memory_utilization")
    ROLLOUT_ACTIVATIONS = _k("activations", "rollout engine (vLLM) forward and sampler peak",
                             "the colocated vLLM engine's profiled forward/sampler peak, reached while it generates")
    SCORING_FORWARD = _k("temporaries", "scoring forward (no grad)",
                         "GRPO's old and reference log-probabilities: one no-grad forward of a micro-batch of "
                         "completions (logits over the completion, or one MLP)")
    ROLLOUT_OTHER = _k("other", "rollout engine (vLLM) CUDA graphs and non-torch",
                       "the colocated vLLM engine's captured CUDA graphs and non-torch memory (kept while it sleeps)")
    GENERATE_KV = _k("kv_cache", "rollout generate (Hugging Face) KV cache",
                     "the policy's KV cache while Hugging Face generate samples the completions in the trainer")
    GENERATE_TENSORS = _k("temporaries", "rollout generate (Hugging Face) forward and sampling",
                          "the running layer or the last-token logits and sampling of the policy's generate call")
    GENERATE_CASTS = _k("temporaries", "rollout generate autocast weight copies",
                        "half copies autocast caches of the policy's fp32 trainable weights during a generate forward")
    # PPO (train.objective: ppo; analytic/ppo.py, analytic/lifecycle/ppo.py)
    VALUE_WEIGHTS = _k("weights", "value model", "PPO's value model parameters (trained with the policy)")
    REWARD_WEIGHTS = _k("weights", "reward model", "PPO's frozen reward model parameters")
    VALUE_GRADIENTS = _k("gradients", "value model", "gradients of PPO's value model")
    VALUE_OPTIMIZER = _k("optimizer_states", "value model", "the optimizer's states of PPO's value model")
    VALUE_MASTER = _k("master_weights", "value model", "fp32 copies of PPO's value model parameters")
    VALUE_ACTIVATIONS = _k("activations", "value model (saved)",
                           "what PPO's value model forward saved for the backward (never checkpointed)")
    PPO_SCORES = _k("temporaries", "generate scores (PPO)",
                    "PPO's fp32 generate scores of the whole rollout batch, kept until the next rollout replaces them")
    PPO_CARRIED = _k("temporaries", "previous micro-batch's outputs (PPO)",
                     "PPO's previous micro-batch's logits, hidden states and softmax, deleted only after the mini-batch")
    PPO_BUFFERS = _k("temporaries", "rollout buffers (PPO)",
                     "PPO's per-token rollout tensors: query-responses, log-probs, values, rewards, advantages")
    # verl's hybrid engine (framework: verl; analytic/verl.py)
    STATE_DICT_SHARDS = _k("weights", "state dict shard copies (weight sync)",
                           "verl: the clones of the actor's fp32 shards SHARDED_STATE_DICT makes for the weight sync")
    SYNC_PARAMETER = _k("temporaries", "full parameter gathered (weight sync)",
                        "verl: one parameter gathered whole in fp32 (full_tensor) for vLLM's load_weights; OpenRLHF: "
                        "the largest parameter gathered (ZeRO-3) and cloned (CUDA IPC) in bf16")
    STATE_DICT_UNSHARDED = _k("temporaries", "units unsharded for the state dict (weight sync)",
                              "verl: SHARDED_STATE_DICT's fp32 unsharded root unit, with a layer unit or a clone")
    # OpenRLHF (framework: openrlhf; analytic/openrlhf.py)
    CRITIC_WEIGHTS = _k("weights", "critic", "OpenRLHF's critic (value model) parameters on this GPU (its shard)")
    CRITIC_GRADIENTS = _k("gradients", "critic", "the critic's gradients and DeepSpeed reduce buckets (OpenRLHF)")
    CRITIC_OPTIMIZER = _k("optimizer_states", "critic", "the critic's AdamW states (OpenRLHF)")
    CRITIC_MASTER = _k("master_weights", "critic", "the critic's fp32 master parameters (OpenRLHF)")
    CRITIC_ACTIVATIONS = _k("activations", "critic (saved)", "what the critic's forward saved for its backward "
                            "(OpenRLHF)")
    CRITIC_FORWARD = _k("temporaries", "critic or reward forward (no grad)",
                        "OpenRLHF: one no-grad forward of the critic or the reward model (no logits: a value head)")
    OUTPUT_LOGITS_HELD = _k("temporaries", "output logits held (OpenRLHF)",
                            "OpenRLHF: Actor.forward's fp32 logits, held by training_step's output through the "
                            "backward and the optimizer step")
    # other
    CUBLAS = _k("other", "cuBLAS workspaces",
                "cuBLAS workspaces, one per handle (analytic/overhead.py); allocated through the caching "
                "allocator on CUDA, absent on a CPU", cuda_only=True)
    CUDA_GRAPHS = _k("other", "CUDA graphs", "memory of vLLM's captured CUDA graphs")
    MIXER_BUFFERS = _k("other", "lightning attention decay buffers",
                       "MiniMax's lightning attention layers' registered decay factors (slope_rate, query_decay, "
                       "key_decay, diagonal_decay) in the model's dtype (analytic/ssm_state.py)")
    PROPOSER_BUFFERS = _k("other", "speculative proposer buffers",
                          "the proposer's persistent input buffers, sized by max_num_batched_tokens")
    # llama.cpp (serve/llamacpp.py)
    GGUF_WEIGHTS = _k("weights", "GGUF tensors on the GPU ({layers} layers offloaded)",
                      "llama.cpp's GPU model buffer: the GGUF tensors of the offloaded layers (and the output)",
                      templated=True)
    LLAMACPP_KV = _k("kv_cache", "llama.cpp KV cache ({cells:,} cells, K {type_k}, V {type_v})",
                     "llama.cpp's KV buffer on the GPU: every offloaded layer's K and V for n_ctx cells",
                     templated=True)
    COMPUTE_BUFFER = _k("temporaries", "ggml compute buffer",
                        "llama.cpp's compute buffer: the peak of the ggml graph for one n_ubatch micro-batch "
                        "as ggml-alloc places it")
    # AutoAWQ's fused inference (framework: autoawq; analytic/autoawq.py)
    AWQ_ROPE_TABLES = _k("weights", "fused RoPE tables (AutoAWQ)",
                         "every fused attention's own freqs_cis parameter: [2 x max_seq_len, head_dim / 2] complex64")
    AWQ_WINDOW_CACHE = _k("kv_cache", "fused window cache (AutoAWQ)",
                          "AutoAWQ's WindowedCache: every layer's fp16 K and V for max_seq_len positions, "
                          "preallocated at load")
    INPUT_IDS = _k("activations", "input ids (int64)", "the caller's int64 token ids on the GPU")
    AWQ_QKV_COPIES = _k("weights", "unfused q/k/v kept while fusing (AutoAWQ)",
                        "the original q/k/v linears, held by the old decoder layers until fuse_transformer ends")
    AWQ_HF_ROTARY = _k("weights", "unfused layers' rotary caches (AutoAWQ)",
                       "transformers' per-attention cos/sin caches of the layers being fused, on the GPU until "
                       "fuse_transformer ends (AutoAWQ 0.1.7+)")
    AWQ_HF_CAUSAL_MASK = _k("weights", "unfused model's causal-mask buffer (AutoAWQ)",
                            "transformers 4.38's LlamaModel causal_mask buffer, on the GPU until fuse_transformer ends")
    AWQ_FUSE_BUILD = _k("temporaries", "last layer being fused (AutoAWQ)",
                        "the last layer's fp32 cache tensor before .half(), or its fused linear's zero buffers")
    WARMUP_MATMUL = _k("temporaries", "warm-up matmul (benchmark)",
                       "AutoAWQ examples/benchmark.py warmup: a 4096 x 4096 fp32 tensor and torch.mm's output")
    CACHE_ROLL = _k("temporaries", "window roll (torch.roll of one layer)",
                    "AutoAWQ's roll_kv_n_steps: one layer's K (or V) rolled into a new tensor beside the old")
    PREV_STEP_LOGITS = _k("temporaries", "previous step's logits (kept by the caller)",
                          "the previous forward's logits, still bound by the caller during the next forward")


KEYS: tuple[Key, ...] = tuple(v for v in vars(K).values() if isinstance(v, Key))

PHASES: tuple[Phase, ...] = (
    Phase("forward", "the training step's forward pass, up to the loss"),
    Phase("backward", "the training step's backward pass"),
    Phase("optimizer", "optimizer.step()"),
    Phase("encoder", "an encoder-decoder model's encoder forward in generate, before the first decoder step"),
    Phase("prefill", "generate's first forward, over the prompt"),
    Phase("decode", "generate's decode steps"),
    Phase("decode (first step)", "generate's first decode step, while the prefill's outputs are still held"),
    Phase("serve", "vLLM at steady state after start-up"),
    Phase("load", "loading the model onto the GPU (from_pretrained, quantize-on-load, casts after load)"),
    Phase("peft preparation", "prepare_model_for_kbit_training's fp32 casts"),
    Phase("first step", "the first training step: optimizer states created at its optimizer.step()"),
    Phase("evaluation", "evaluation inside training (no-grad forwards, kept logits, generation)"),
    Phase("checkpoint save", "building the checkpoint's state dict"),
    Phase("rollout", "RL post-training: the colocated engine generating the completions, between two steps"),
    Phase("scoring", "RL post-training: no-grad forwards for the old and reference log-probabilities"),
    Phase("weight sync", "RL post-training (verl, OpenRLHF): the actor's weights copied into the woken rollout engine"),
    Phase("reference scoring", "RL post-training (verl, OpenRLHF): the reference model's no-grad log-probability "
          "forwards"),
    Phase("reward scoring", "RL post-training (OpenRLHF): the reward model's no-grad forwards"),
    Phase("critic scoring", "RL post-training (OpenRLHF PPO): the critic's no-grad value forwards"),
    Phase("critic training step", "RL post-training (OpenRLHF PPO): the critic's DeepSpeed update"),
    Phase("warm-up", "a benchmark's warm-up matmul after loading (AutoAWQ examples/benchmark.py)"),
)
_PHASE_NAMES = frozenset(p.name for p in PHASES)
_BY_LABEL = {(k.part, k.label): k for k in KEYS}


def key_for(part: str, label: str) -> Key | None:
    """The declared key of a (part, label) row, or None; templated keys match only their pattern."""
    return _BY_LABEL.get((part, label))


def cuda_only_labels() -> tuple[tuple[str, str], ...]:
    """(part, label) of every CUDA-only key: the rows a CPU measurement cannot see."""
    return tuple((k.part, k.label) for k in KEYS if k.cuda_only)


@dataclass
class Moment:
    """Memory content at one instant, by part -> sub-part label -> bytes; filled through declared keys."""

    phase: str
    parts: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.phase and self.phase not in _PHASE_NAMES:
            raise ValueError(f"undeclared phase {self.phase!r}: declare it in analytic/moment.py PHASES")

    def add(self, key: Key, nbytes: int, **fields: Any) -> Moment:
        """Add ``nbytes`` under ``key`` (zero adds nothing)."""
        if not isinstance(key, Key):
            raise TypeError(f"Moment.add takes a declared Key (analytic/moment.py K), not {key!r}")
        if nbytes:
            d = self.parts.setdefault(key.part, {})
            label = key.name(**fields)
            d[label] = d.get(label, 0) + int(nbytes)
        return self

    def set(self, key: Key, nbytes: int, **fields: Any) -> Moment:
        """Replace the bytes under ``key``."""
        self.parts.setdefault(key.part, {})[key.name(**fields)] = int(nbytes)
        return self

    def get(self, key: Key, **fields: Any) -> int:
        return self.parts.get(key.part, {}).get(key.name(**fields), 0)

    def copy(self, phase: str) -> Moment:
        return Moment(phase, {k: dict(v) for k, v in self.parts.items()})

    def without(self, *keys: Key) -> Moment:
        """A copy with the rows of ``keys`` dropped (a templated key's whole part: the optimizer's states)."""
        out = self.copy(self.phase)
        for key in keys:
            if key.templated:
                out.parts.pop(key.part, None)
            else:
                out.parts.get(key.part, {}).pop(key.name(), None)
        return out

    @property
    def total(self) -> int:
        return sum(map(sum, map(dict.values, self.parts.values())))
