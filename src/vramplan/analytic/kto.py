"""KTO post-training (``train.objective: kto``): TRL's ``KTOTrainer`` as of TRL v1.16.0.

Read in TRL v1.16.0 (the PyPI wheel ``trl-1.16.0``): ``trl/trainer/kto_config.py`` ``KTOConfig``;
``trl/trainer/kto_trainer.py`` ``DataCollatorForUnpairedPreference``, ``KTOTrainer.__init__``, ``_prepare_dataset``,
``_compute_kl_logps`` and ``_compute_loss``; ``trl/trainer/utils.py`` ``add_fused_lm_head``; ``trl/kernels/
chunked_logprob.py`` ``ChunkedLogProbFunction``.  What this module gives:

* the policy step's scenario (``policy_scenario``): ``train.micro_batch_size`` is TRL's ``per_device_train_batch_size``
  counted in *examples* (each a prompt and one completion labelled desirable or not: unpaired, nothing doubled),
  each padded to the longest of the batch and cut at ``max_length`` (``train.seq_len``; KTOConfig's default 1,024);
  gradient checkpointing on unless the scenario says otherwise (``KTOConfig``: "``gradient_checkpointing``: Defaults
  to ``True``");
* the reference model (``reference_kind``): ``KTOTrainer.__init__`` with ``ref_model=None`` keeps none under PEFT
  (the reference log-probs come from the policy with its adapters disabled, ``use_adapter(model, None)``) and
  otherwise, after ``super().__init__`` put the policy on the GPU, loads a second copy with the policy's
  ``model_init_kwargs`` and dtype (``create_model_from_path``), prepared with ``evaluation_mode=True``;
* the loss's tensors (``kto_loss_tensors``): every forward runs TRL's fused LM head (``fused_lm_head=True``), which
  never makes the ``(batch, seq_len, vocab)`` logits;
* what the estimate refuses (``kto_problems``).

The KL batch: ``_prepare_dataset`` pairs each prompt with its neighbour's completion within each batch of
``per_device_train_batch_size`` (``add_kl_completion_ids``), and ``_compute_loss`` runs the policy on it under
``no_grad`` before its own forward (``_compute_kl_logps``: nothing of it outlives that forward but ``b`` sums), then,
after the policy's forward with gradients, the reference on the KL batch and on the batch, both under ``no_grad``.

``rl.precompute_ref_log_probs`` true is refused, as for DPO: the estimate is TRL's default, the reference forwards
inside each step (stated in the report).
"""

from __future__ import annotations

from vramplan.analytic.dpo import offline_reference_problems, reference_kind, reference_problems
from vramplan.analytic.fused_head import (
    FUSED_TOKEN_ROWS,
    FUSED_VOCAB_COLUMNS,
    fused_forward_bytes,
    fused_loss_tensors,
)
from vramplan.analytic.grpo import checkpointing_notes, trainer_problems
from vramplan.analytic.logits import KernelLossTensors
from vramplan.errors import Problem
from vramplan.spec.defaults import with_trainer_defaults
from vramplan.spec.scenario import Scenario

__all__ = ["FUSED_TOKEN_ROWS", "FUSED_VOCAB_COLUMNS", "KTO_TRL_RELEASE", "kto_assumptions", "kto_loss_tensors",
           "kto_problems", "policy_scenario"]

KTO_TRL_RELEASE = "1.16.0"


def policy_scenario(s: Scenario) -> Scenario:
    """The step TRL runs: ``micro_batch_size`` examples of ``seq_len`` tokens (unpaired: no doubling), checkpointing on
    by KTOConfig's default where the scenario's is null (spec/defaults.py)."""
    return with_trainer_defaults(s)


def _setup_problems(s: Scenario) -> list[Problem]:
    """Combinations KTOTrainer runs but this estimate does not model (or refuses itself), each with what to change."""
    t = s.train
    out = trainer_problems(s, "KTO", "the reference model's shards (prepare_deepspeed / prepare_fsdp) and the fused "
                           "head's full_tensor gather of the LM head")

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if t.micro_batch_size < 2:
        # KTOTrainer.__init__: "Actual (not effective) batch size must be > 1 ..." (the KL term needs a neighbour)
        no("train.micro_batch_size", f"KTOTrainer (TRL v{KTO_TRL_RELEASE}) refuses per_device_train_batch_size <= 1 "
           "with the KL term (loss_type kto)", "set train.micro_batch_size: 2 or more")
    if t.loss != "standard":
        no("train.loss", f"{t.loss} under KTO: TRL patches the model with its own fused LM head and refuses Liger's "
           "fused_linear_cross_entropy (KTOTrainer.__init__)", "use train.loss: standard")
    if t.packing:
        no("train.packing", f"KTOTrainer (TRL v{KTO_TRL_RELEASE}) has no padding_free: it pads every example",
           "set train.packing: false")
    return out + offline_reference_problems(s, "KTO", "examples",
                                            f"KTOTrainer._precompute_ref_logps, TRL v{KTO_TRL_RELEASE}")


def kto_problems(s: Scenario) -> list[Problem]:
    """Why ``s`` (a training scenario with ``train.objective: kto``) cannot be estimated; empty: it can."""
    return _setup_problems(s) + reference_problems(s, "KTOTrainer", KTO_TRL_RELEASE)


def kto_loss_tensors(tokens: int, vocab: int, hidden: int, hidden_bytes: int, compute_bytes: int, weight_bytes: int,
                     head_trainable: bool, reference_layer: int = 0, reference_casts: int = 0) -> KernelLossTensors:
    """The KTO loss's tensors for ``tokens`` = N labelled positions (the step's ``b (s - 1)``), as (saved to the
    backward, forward extra, backward extra).  ``hidden_bytes`` is the final norm's output dtype (x), ``compute_bytes``
    the autocast dtype (c), ``weight_bytes`` the LM head's (w).

    TRL v1.16.0 ``add_fused_lm_head._fused_forward`` (``fused_lm_head=True``) then ``ChunkedLogProbFunction``:

    * ``hidden_states[mask]`` (the compact path on CUDA): a copy of the N labelled positions' hidden states, N H x,
      saved by ``ctx.save_for_backward(hidden, weight, bias, targets, log_z, entropy)`` with ``labels[mask]`` (int64,
      8 N), ``log_z`` and ``entropy`` (fp32, 4 N each); the head's weight is the parameter (no copy saved);
    * the outputs scattered back to the batch's shape (``new_zeros(mask.shape).masked_scatter``): ``log_probs``,
      ``entropy`` and ``mean_logits`` (KTO asks for the three), fp32: 12 N, alive in ``outputs`` until the loss
      returns;
    * the reference's no-grad forwards (the KL batch, then the batch) after the policy's, one at a time, each with
      the same fused head: its ``hidden_states[mask]`` (N H x), the seven fp32 statistics (28 N) and the tiles
      (``fused_head.fused_tiles``); or its layers' no-grad temporaries (``reference_layer``, as DPO's) when larger; with a
      separate fp32 copy under autocast, its layers' cached half weights (``reference_casts``; the fused head casts
      its chunks explicitly, so autocast caches no head copy);
    * backward (``ChunkedLogProbFunction.backward``): ``grad_hidden`` fp32 (N H 4), ``grad_weight`` fp32 (V H 4,
      a trainable head only), the tiles again, and ``grad_hidden.to(hidden.dtype)`` (N H x when x is not fp32).

    Worked example (Qwen2.5-0.5B: V = 151,936, H = 896; b = 4 examples of s = 512: N = 4 x 511 = 2,044; bf16
    autocast over fp32 weights, x = 4 (transformers' RMSNorm returns the residual's fp32), c = 2, w = 4, trainable
    head): saved = 2,044 x 896 x 4 + 16 x 2,044 = 7,325,696 + 32,704 = 7,358,400 B; tiles = 2,044 x 32,768 x 2 +
    32,768 x 896 x 2 + 2,044 x 896 x 2 = 133,955,584 + 58,720,256 + 3,662,848 = 196,338,688 B; forward extra =
    12 x 2,044 + 7,325,696 + 28 x 2,044 + 196,338,688 = 203,746,144 B; backward extra = 7,325,696 +
    151,936 x 896 x 4 (544,538,624) + 196,338,688 = 748,203,008 B (x = 4: no cast back).
    """
    reference = max(fused_forward_bytes(tokens, hidden, hidden_bytes, compute_bytes, weight_bytes),
                    reference_layer) + reference_casts
    # the three outputs (log_probs, entropy, mean_logits: fp32) over the N positions (analytic/fused_head.py)
    return fused_loss_tensors(tokens, tokens, 12, vocab, hidden, hidden_bytes, compute_bytes, weight_bytes,
                              head_trainable, reference)


def kto_assumptions(s: Scenario) -> list[str]:
    """What the KTO estimate takes as given, for the report."""
    t = s.train
    out = [
        (f"KTO (TRL v{KTO_TRL_RELEASE} KTOTrainer): micro_batch_size = {t.micro_batch_size} unpaired examples "
         f"(per_device_train_batch_size) of seq_len = {t.seq_len} tokens (KTOConfig.max_length; every example padded "
         "to it); TRL's fused LM head (add_fused_lm_head, ChunkedLogProbFunction: tiles of 4,096 tokens x 32,768 "
         "vocabulary columns, no logits tensor); every position after the first counted as a completion token (an "
         "upper bound: the prompt's positions are masked out of the head)"),
        {"shared": "KTO reference model: the policy with its adapters disabled (PEFT): no second copy",
         "separate": "KTO reference model: a second copy loaded like the policy (create_model_from_path with "
                     "model_init_kwargs and the policy's dtype), resident on every GPU, no gradients or optimizer "
                     "states"}[reference_kind(s)],
        ("KTO KL batch: each prompt with its neighbour's completion (add_kl_completion_ids), of seq_len tokens as "
         "well; the policy's no-grad forward on it before its own forward, the reference's on it and on the batch "
         "after, one at a time (precompute_ref_log_probs=False, TRL's default; loss_type kto)"),
    ]
    return out + checkpointing_notes(s, "KTO")
