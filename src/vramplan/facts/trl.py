"""How TRL's DPOTrainer and GRPOTrainer compute their log-probabilities, by release, as data.

One row per release where the rule changed; each row holds from its ``first`` release until the next row's.
Every row was read from TRL's source as shipped in the release's wheel on PyPI (``pip download trl==X
--no-deps``): 1.9.0, 1.10.0, 1.11.0, 1.12.0, 1.13.0, 1.14.0, 1.15.0 and 1.16.0 (``READ_AT``).  DPO and GRPO
changed at the same two releases, so one table serves both.  ``analytic/dpo.py`` and ``analytic/grpo.py`` read
the row of ``software.trl`` (``log_prob_row``); a release after the last one read takes the last row and the
report says so.  GRPOTrainer before 1.9.0 (0.14.0-1.8.0 read: ``GRPO_EARLY_READ_AT``) has its own rows
(``GRPO_EARLY_ROWS``: 0.15.0 on modelled, 0.14.x refused) and GRPOConfig's defaults by release (``GRPO_BETA_ROWS``,
``GRADIENT_CHECKPOINTING_ROWS``, ``COMPLETION_DEFAULT_ROWS``, ``GRPO_COLOCATE_FIRST``); DPO before 1.9.0 is refused.

The paths (``LogProbPath``):

* ``logits``: the model's forward returns the ``(batch, seq_len, vocab)`` logits and TRL's
  ``selective_log_softmax`` (``trl/trainer/utils.py``, torch: one ``log_softmax`` per sequence with half logits,
  ``logsumexp`` with fp32 ones) takes the log-probabilities; GRPO's entropies by ``entropy_from_logits`` in chunks
  of 128 rows (``DPOTrainer._compute_loss``; ``GRPOTrainer._get_per_token_logps_and_entropies``).
* ``triton-logits``: the same logits, then TRL's Triton kernel ``_fused_logprob_entropy``
  (``trl/kernels/logprob_entropy.py``) on CUDA, called by ``selective_log_softmax`` and
  ``selective_log_softmax_and_entropy``; it keeps the logits for the backward.  Not modelled for DPO and GRPO:
  refused with the nearest modelled release.
* ``fused-head``: ``DPOTrainer.__init__`` / ``GRPOTrainer.__init__`` patch the model with ``add_fused_lm_head``
  (``trl/trainer/utils.py``) and every forward runs ``model(..., labels=labels, fused_lm_head=True)``: TRL's
  ``ChunkedLogProbFunction`` (``trl/kernels/chunked_logprob.py``) projects the labelled positions' hidden states
  in tiles of 4,096 tokens x 32,768 vocabulary columns and never makes the logits (analytic/fused_head.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CHUNKED_NLL_CAST_FROM",
    "COMPLETION_DEFAULT_ROWS",
    "DEFAULT_TRL_RELEASE",
    "GRADIENT_CHECKPOINTING_ROWS",
    "GRPO_BETA",
    "GRPO_BETA_ROWS",
    "GRPO_COLOCATE_FIRST",
    "GRPO_EARLY_READ_AT",
    "GRPO_EARLY_ROWS",
    "GRPO_NUM_GENERATIONS",
    "LOG_PROB_ROWS",
    "PPO_RELEASE",
    "PPO_RESPONSE_LENGTH",
    "PPO_ROWS",
    "READ_AT",
    "RLOO_BETA",
    "RLOO_MAX_COMPLETION",
    "RLOO_NUM_GENERATIONS",
    "SFT_LOSS_ROWS",
    "SFT_READ_AT",
    "SFT_USE_CACHE_OFF_SINCE",
    "TRL_GC_NO_CACHE",
    "GrpoEarlyRow",
    "LogProbPath",
    "LogProbRow",
    "PpoRow",
    "SftLossRow",
    "gradient_checkpointing_default",
    "grpo_beta_default",
    "grpo_completion_default",
    "grpo_early_row",
    "log_prob_row",
    "ppo_row",
    "release_text",
    "sft_loss_row",
]

LogProbPath = Literal["logits", "triton-logits", "fused-head"]


@dataclass(frozen=True)
class LogProbRow:
    """From ``first`` until the next row's release, DPO's and GRPO's log-probabilities take ``path``."""

    first: tuple[int, int, int]
    path: LogProbPath
    modelled: bool
    sources: str


LOG_PROB_ROWS: tuple[LogProbRow, ...] = (
    LogProbRow((1, 9, 0), "logits", True,
               "trl 1.9.0-1.13.0 dpo_trainer.py DPOTrainer._compute_loss (outputs = model(**model_kwargs); "
               "selective_log_softmax(shift_logits, shift_labels)); grpo_trainer.py "
               "_get_per_token_logps_and_entropies (logits_to_keep, selective_log_softmax, entropy_from_logits)"),
    LogProbRow((1, 14, 0), "triton-logits", False,
               "trl 1.14.0 utils.py selective_log_softmax (_fused_logprob_entropy when "
               "_supports_trl_loss_kernel); kernels/logprob_entropy.py; grpo_trainer.py "
               "selective_log_softmax_and_entropy"),
    LogProbRow((1, 15, 0), "fused-head", True,
               "trl 1.15.0-1.16.0 dpo_trainer.py DPOTrainer.__init__ (add_fused_lm_head(..., outputs=('log_probs', "
               "'entropy', 'mean_logits', 'is_top1'))) and _compute_loss (fused_lm_head=True); grpo_trainer.py "
               "GRPOTrainer.__init__ (outputs=('log_probs', 'entropy')) and _get_per_token_logps_and_entropies; "
               "kernels/chunked_logprob.py ChunkedLogProbFunction"),
)

# GRPOConfig.max_completion_length's default by release (trl/trainer/grpo_config.py): 256 at 1.9.0, 512 from 1.10.0
# (read in every wheel of READ_AT); each holds from its release until the next row's
# (GRPOConfig before 1.9.0: 256 in every wheel of GRPO_EARLY_READ_AT, e.g. trl 0.15.2 grpo_config.py:149, 0.19.1, 1.8.0)
COMPLETION_DEFAULT_ROWS: tuple[tuple[tuple[int, int, int], int], ...] = (
    ((0, 15, 0), 256), ((1, 10, 0), 512))

# _BaseConfig.gradient_checkpointing's default by release (trl/trainer/base_config.py: ``default=True``, "Enable
# gradient checkpointing to trade compute for memory"): DPOConfig, GRPOConfig, KTOConfig, RLOOConfig and
# trl.experimental.orpo's ORPOConfig subclass _BaseConfig and none overrides the field; read in every wheel of READ_AT
# Before 1.9.0 only GRPOTrainer is modelled (GRPO_EARLY_ROWS), so the earlier rows are GRPOConfig's: up to 0.21.x it
# declares no gradient_checkpointing and inherits transformers' TrainingArguments default (False); 0.22.0 overrides
# it (trl 0.22.2 grpo_config.py:247 ``gradient_checkpointing: bool = field(default=True``; 0.28.0 grpo_config.py:328);
# from 0.29.0 GRPOConfig subclasses BaseConfig (trl 0.29.0 base_config.py:61, default=True)
GRADIENT_CHECKPOINTING_ROWS: tuple[tuple[tuple[int, int, int], bool], ...] = (
    ((0, 15, 0), False), ((0, 22, 0), True), ((1, 9, 0), True))

# GRPOConfig (v1.9.0 and later, trl/trainer/grpo_config.py): beta=0.0, num_generations=8 (num_generations=8 in every
# wheel of GRPO_EARLY_READ_AT too: trl 0.15.2 grpo_config.py:138)
GRPO_BETA = 0.0
GRPO_NUM_GENERATIONS = 8
# GRPOConfig.beta's default by release: 0.04 up to 0.18.x (trl 0.15.2, 0.16.1, 0.17.0 grpo_config.py:307, 0.18.2
# grpo_config.py:390), 0.0 from 0.19.0 (trl 0.19.1 grpo_config.py:412; GRPOTrainer.__init__ loads no reference
# model when beta == 0.0: grpo_trainer.py:566)
GRPO_BETA_ROWS: tuple[tuple[tuple[int, int, int], float], ...] = (((0, 15, 0), 0.04), ((0, 19, 0), GRPO_BETA))
# GRPOConfig.vllm_mode ("server" or "colocate": a vLLM engine inside the training process) first ships in 0.18
# (trl 0.18.2 grpo_config.py:332); before it vLLM runs on ``vllm_device`` (0.15.2 grpo_trainer.py:374-379: "auto" is
# the next GPU, cuda:0 shared when a single process trains) or, from 0.16.0, as a server (0.16.1 grpo_config.py:331,
# 0.17.0 :417-460: vllm_device deprecated, "start a vLLM server")
GRPO_COLOCATE_FIRST = (0, 18, 0)
# the releases whose GRPOTrainer._compute_loss runs the reference's no-grad forward inside the training step, after the
# policy's forward and over its graph (trl 0.18.0 and 0.18.1 grpo_trainer.py:1338-1343, 0.18.2 :1346-1351, ``if
# self.beta != 0.0``); every other modelled release does it in _prepare_inputs / _generate_and_score_completions (0.15.2
# :587, 0.17.0 :1014, 0.19.0 :1216, 0.19.1 :1224, 1.0.0 :1918).  Not modelled: refused when beta != 0
# the first release whose _generate_and_score_completions always computes the old log-probabilities with vLLM
# (trl 0.23.1 grpo_trainer.py:1369-1370 ``or (self.use_vllm and self.vllm_importance_sampling_correction)``, the
# latter default=True: grpo_config.py:601-602).  Before it the old ones are computed only when the samples can come
# from an earlier policy (0.16.1 :743 and 0.17.0 :1004 ``if self.num_iterations > 1``; 0.19.1 :1214 ``or
# steps_per_generation > gradient_accumulation_steps``; 0.20.0 :1619 and 0.22.2 :1331 ``gradient_accumulation_steps %
# (steps_per_generation x num_iterations) != 0``; 0.15.2 has none), never at GRPOConfig's defaults (num_iterations
# 1, steps_per_generation = gradient_accumulation_steps), and the reference ones only with beta != 0: with beta 0
# no scoring forward runs
GRPO_OLD_LOGPS_ALWAYS = (0, 23, 0)
# GRPOConfig.vllm_enable_sleep_mode first ships in 0.23 (trl 0.23.1 and 0.24.0 grpo_config.py:424); the sleep level
# GRPOTrainer asks for by release: 1 at 0.23-0.24 (0.23.1 grpo_trainer.py:542 and 0.24.0 :550 ``self.llm.sleep(
# level=1)``), 2 from 0.25 (0.25.1 :616 ``level=2``; 0.29.0 and 1.0.0 generation/vllm_generation.py:388 and :360)
GRPO_SLEEP_LEVEL_ROWS: tuple[tuple[tuple[int, int, int], int], ...] = (((0, 0, 0), 0), ((0, 23, 0), 1), ((0, 25, 0), 2))
GRPO_REFERENCE_IN_STEP: tuple[tuple[int, int, int], tuple[int, int, int]] = ((0, 18, 0), (0, 19, 0))
# RLOOConfig (v1.16.0, trl/trainer/rloo_config.py): beta=0.05, num_generations=2, max_completion_length=512
RLOO_BETA = 0.05
RLOO_NUM_GENERATIONS = 2
RLOO_MAX_COMPLETION = 512

# the releases whose wheels were read and found to follow the rows
READ_AT: tuple[str, ...] = ("1.9.0", "1.10.0", "1.11.0", "1.12.0", "1.13.0", "1.14.0", "1.15.0", "1.16.0")

# software.trl unset: DPO and GRPO as TRL v1.9.0, the release their modules were read at first and their reports
# have always stated; a newer default would move every DPO and GRPO estimate without the scenario saying so
DEFAULT_TRL_RELEASE = "1.9.0"


@dataclass(frozen=True)
class GrpoEarlyRow:
    """GRPOTrainer's log-probabilities before v1.9.0 (the logits path of ``LOG_PROB_ROWS``'s first row, with these
    differences), from ``first`` until the next row's release.

    ``temperature_copy``: ``logits = logits / self.temperature`` makes a new ``b C V`` tensor, the model's
    ``b (C + 1) V`` output dropped after it (v1.0.0 on: ``logits.div_``, in place); ``entropy``: what the training
    step's ``entropy_from_logits`` (under ``no_grad``) holds: none (no entropies), one sequence's ``log_softmax``,
    ``exp`` and product (``chunk_size=1`` over the batch: 3 C V), or chunks of 128 flattened rows (3 x 128 V, with
    ``reshape``'s copy of a non-contiguous slice, as at v1.9.0)."""

    first: tuple[int, int, int]
    modelled: bool
    temperature_copy: bool
    entropy: Literal["none", "per-sequence", "chunked"]
    sources: str


# Read in the wheels of GRPO_EARLY_READ_AT (pip download trl==X --no-deps); the line numbers are those wheels'.
# Every modelled row: per_device_train_batch_size counted in completions (RepeatRandomSampler / RepeatSampler, the
# global batch divisible by num_generations), logits_to_keep = C + 1, utils.py selective_log_softmax (the same code
# from 0.15.2 to 1.9.0: half logits one log_softmax per sequence, fp32 ones logsumexp), the old and reference
# log-probabilities as no-grad forwards of per_device_train_batch_size completions in _prepare_inputs /
# _generate_and_score_completions.
GRPO_EARLY_ROWS: tuple[GrpoEarlyRow, ...] = (
    GrpoEarlyRow((0, 0, 0), False, False, "none",
                 "trl 0.14.0 grpo_trainer.py:370-451 compute_loss: generates, then the reference's forward inside "
                 "compute_loss over the policy's live graph, per_device_train_batch_size counted in prompts (each "
                 "repeated num_generations times, :417), log_softmax per sequence without selective_log_softmax"),
    GrpoEarlyRow((0, 15, 0), True, False, "none",
                 "trl 0.15.2 grpo_trainer.py:478-487 _get_per_token_logps (logits_to_keep + 1, no temperature, "
                 "selective_log_softmax); :585-592 the reference under inference_mode in _prepare_inputs"),
    GrpoEarlyRow((0, 16, 0), True, True, "none",
                 "trl 0.16.1 grpo_trainer.py:598, 0.17.0 :832, 0.18.2 :862, 0.19.1 :872 "
                 "``logits = logits / self.temperature``"),
    GrpoEarlyRow((0, 20, 0), True, True, "per-sequence",
                 "trl 0.20.0 grpo_trainer.py:1119 (logits / temperature), :1126-1127 and :1832 (compute_entropy=True: "
                 "entropy_from_logits under no_grad), utils.py:1464-1489 entropy_from_logits(chunk_size=1); "
                 "0.22.2 grpo_trainer.py:820, utils.py:1476-1500"),
    GrpoEarlyRow((0, 23, 0), True, True, "chunked",
                 "trl 0.23.1 grpo_trainer.py:832, :840, utils.py:1480-1514 entropy_from_logits(chunk_size=128) over "
                 "logits.reshape(-1, V) (a view of the contiguous quotient); 0.25.1 :910, 0.29.0 :1078"),
    GrpoEarlyRow((1, 0, 0), True, False, "chunked",
                 "trl 1.0.0 grpo_trainer.py:1063-1075 (logits.div_(self.temperature), in place, as at 1.9.0); "
                 "1.1.0-1.8.0 the same"),
)

# the releases whose wheels were read for GRPO_EARLY_ROWS
GRPO_EARLY_READ_AT: tuple[str, ...] = ("0.14.0", "0.15.2", "0.16.1", "0.17.0", "0.18.0", "0.18.1", "0.18.2", "0.19.0",
                                       "0.19.1", "0.20.0", "0.21.0",
                                       "0.22.2", "0.23.1", "0.24.0", "0.25.1", "0.26.2", "0.27.0", "0.28.0", "0.29.0",
                                       "1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0", "1.6.0", "1.7.0", "1.8.0")


def grpo_early_row(version: tuple[int, ...] | None) -> GrpoEarlyRow | None:
    """GRPOTrainer's row before v1.9.0 (``GRPO_EARLY_ROWS``); None from v1.9.0 (``LOG_PROB_ROWS``) or unset."""
    if version is None:
        return None
    v = (*version, 0, 0, 0)[:3]
    if v >= LOG_PROB_ROWS[0].first:
        return None
    return [r for r in GRPO_EARLY_ROWS if r.first <= v][-1]


def grpo_beta_default(version: tuple[int, ...] | None) -> float:
    """``GRPOConfig.beta``'s default at ``version`` (None: ``DEFAULT_TRL_RELEASE``): ``GRPO_BETA_ROWS``."""
    v = (*(version or (1, 9, 0)), 0, 0, 0)[:3]
    rows = [b for first, b in GRPO_BETA_ROWS if first <= v]
    return rows[-1] if rows else GRPO_BETA_ROWS[0][1]


def release_text(version: tuple[int, ...]) -> str:
    """A release as text of three numbers: (1, 15) -> "1.15.0"."""
    return ".".join(str(x) for x in (*version, 0, 0, 0)[:3])


def log_prob_row(version: tuple[int, ...] | None) -> LogProbRow | None:
    """The row of ``version`` (None: ``DEFAULT_TRL_RELEASE``); None before the first row (not read)."""
    v = (*(version or (1, 9, 0)), 0, 0, 0)[:3]
    rows = [r for r in LOG_PROB_ROWS if r.first <= v]
    return rows[-1] if rows else None


def grpo_completion_default(version: tuple[int, ...] | None) -> int:
    """``GRPOConfig.max_completion_length``'s default at ``version`` (None: ``DEFAULT_TRL_RELEASE``; a release
    before the first row read takes the first row's, the estimate refusing it anyway)."""
    v = (*(version or (1, 9, 0)), 0, 0, 0)[:3]
    rows = [n for first, n in COMPLETION_DEFAULT_ROWS if first <= v]
    return rows[-1] if rows else COMPLETION_DEFAULT_ROWS[0][1]


def gradient_checkpointing_default(version: tuple[int, ...] | None) -> bool:
    """Whether TRL's trainer configs turn gradient checkpointing on by default at ``version`` (None:
    ``DEFAULT_TRL_RELEASE``; a release before the first row read takes the first row's, the estimate refusing it
    anyway): ``GRADIENT_CHECKPOINTING_ROWS``."""
    v = (*(version or (1, 9, 0)), 0, 0, 0)[:3]
    rows = [on for first, on in GRADIENT_CHECKPOINTING_ROWS if first <= v]
    return rows[-1] if rows else GRADIENT_CHECKPOINTING_ROWS[0][1]


@dataclass(frozen=True)
class PpoRow:
    """From ``first`` until the next row's release, TRL's PPO trainer is ``design``; ``modelled`` says whether the
    estimate follows it (``train.objective: ppo``)."""

    first: tuple[int, int, int]
    design: str
    modelled: bool
    sources: str


# TRL's PPO trainer by release, read in the wheels trl-0.11.4 and trl-1.12.0 (pip download trl==X --no-deps) and
# trl-1.13.0 (no trl/experimental/ppo: removed).  Only 1.12.x, the last release that ships it, is modelled.
PPO_ROWS: tuple[PpoRow, ...] = (
    PpoRow((0, 0, 0), "the legacy PPOTrainer (a value head on the policy, AutoModelForCausalLMWithValueHead; "
           "PPOConfig.batch_size 128, mini_batch_size 128, trainer.step()) beside PPOv2Trainer", False,
           "trl 0.11.4 trainer/ppo_trainer.py, ppo_config.py; trainer/ppov2_trainer.py (log_softmax over the whole "
           "vocabulary of the generate scores: all_logprob)"),
    PpoRow((0, 12, 0), "PPOTrainer (the former PPOv2Trainer): PolicyAndValueWrapper, reward and reference models, "
           "batch_generation with output_scores", False, "not read between 0.12.0 and 1.11.x"),
    PpoRow((1, 12, 0), "trl.experimental.ppo.PPOTrainer: PolicyAndValueWrapper, reward and reference models, "
           "batch_generation with output_scores, selective_log_softmax", True,
           "trl 1.12.0 experimental/ppo/ppo_trainer.py, ppo_config.py; experimental/utils.py get_reward, "
           "create_reference_model"),
    PpoRow((1, 13, 0), "removed (no trl/experimental/ppo)", False, "trl 1.13.0 wheel"),
)

# the release PPO is modelled at; software.trl unset takes it
PPO_RELEASE = "1.12.0"
# trl/experimental/ppo/ppo_config.py PPOConfig (v1.12.0): response_length=53, the completion length PPO's rollout
# generates (rl.rollout.max_completion_len's default under train.objective: ppo)
PPO_RESPONSE_LENGTH = 53


def ppo_row(version: tuple[int, ...] | None) -> PpoRow:
    """The PPO row of ``version`` (None: ``PPO_RELEASE``)."""
    v = (*(version or (1, 12, 0)), 0, 0, 0)[:3]
    return [r for r in PPO_ROWS if r.first <= v][-1]


# ------------------------------------------------------------------------------------------------
# SFTTrainer.compute_loss by release: the vocabulary-sized tensors it adds to the model's loss, or the loss that
# replaces the logits
# ------------------------------------------------------------------------------------------------

SftLossPath = Literal["logits", "chunked-nll", "fused-head"]


@dataclass(frozen=True)
class SftLossRow:
    """From ``first`` until the next row's release, TRL's ``SFTTrainer.compute_loss`` (with its default ``loss_type``)
    takes ``path``:

    * ``logits``: the model's forward and loss as the HF Trainer's, then the token-accuracy (and entropy) metrics on
      ``outputs.logits`` before the backward: ``copies`` shifted copies ``outputs.logits[..., :-1, :].contiguous()``
      of ``b (s - 1) V`` elements in the logits' dtype alive together (a view, no copy, when b = 1: the slice of a
      one-sequence tensor is already contiguous), ``gather``: ``accelerator.gather_for_metrics`` of that copy (the
      world's copies on every rank), ``entropy_rows``: ``entropy_from_logits`` over one whole sequence at a time (its
      ``log_softmax``, ``exp`` and product: 3 s V elements), before the copy;
    * ``chunked-nll``: ``loss_type`` ``chunked_nll`` by default: the patched LM head projects the hidden states in
      chunks of 256 positions under non-reentrant checkpointing and returns ``logits=None`` (no full logits);
    * ``fused-head``: ``add_fused_lm_head(..., outputs=("log_probs", "entropy", "is_top1"))`` always, and
      ``model(**inputs, fused_lm_head=True)`` (analytic/fused_head.py): no logits."""

    first: tuple[int, int, int]
    path: SftLossPath
    copies: int
    gather: bool
    entropy_rows: bool
    sources: str


SFT_LOSS_ROWS: tuple[SftLossRow, ...] = (
    SftLossRow((0, 9, 0), "logits", 0, False, False,
               "trl v0.9.3-v0.14.0 trl/trainer/sft_trainer.py: no compute_loss override (the HF Trainer's)"),
    SftLossRow((0, 15, 0), "logits", 1, True, False,
               "trl v0.15.0 sft_trainer.py:444 shift_logits = outputs.logits[..., :-1, :].contiguous(); :448 "
               "shift_logits = self.accelerator.gather_for_metrics(shift_logits)"),
    SftLossRow((0, 15, 1), "logits", 1, False, False,
               "trl v0.15.1 sft_trainer.py:470 (the copy; only the token counts gathered, v0.15.2:495-496), the same "
               "line through v0.21.0:876"),
    SftLossRow((0, 22, 0), "logits", 1, False, True,
               "trl v0.22.0 sft_trainer.py:1048 entropy_from_logits(outputs.logits) under no_grad, utils.py:1476 "
               "chunk_size=1 split along dim 0 (one sequence at a time); :1080 the copy"),
    SftLossRow((0, 23, 0), "logits", 1, False, False,
               "trl v0.23.0 utils.py:1480 entropy_from_logits chunk_size=128 rows of a reshape(-1, V) view; "
               "sft_trainer.py:1154 the copy; the same pair through v1.2.0"),
    SftLossRow((1, 3, 0), "logits", 2, False, False,
               "trl v1.3.0 sft_trainer.py:1295 shift_logits = ...contiguous() for the entropy, still bound when :1349 "
               "makes the accuracy's copy (two alive; removed by huggingface/trl#5897); v1.4.0:1618/1676, "
               "v1.5.0:1624/1682"),
    SftLossRow((1, 6, 0), "logits", 1, False, False,
               "trl v1.6.0 sft_trainer.py:1668 shift_logits = outputs.logits[..., :-1, :] (a view), :1678 "
               "entropy_from_logits, whose utils.py:508 reshape(-1, V) copies it"),
    SftLossRow((1, 7, 0), "chunked-nll", 0, False, False,
               "trl v1.7.0 sft_config.py:334-336 loss_type None -> 'chunked_nll' unless use_liger_kernel; "
               "sft_trainer.py _CHUNKED_LM_HEAD_CHUNK_SIZE = 256, torch.utils.checkpoint per chunk (use_reentrant="
               "False), logits=None; the same through 1.14.0 (wheels)"),
    SftLossRow((1, 15, 0), "fused-head", 0, False, False,
               "trl 1.15.0 / 1.16.0 sft_trainer.py add_fused_lm_head(..., outputs=('log_probs', 'entropy', "
               "'is_top1')) unconditionally in __init__ (1.16.0:1144-1147), compute_loss model(**inputs, "
               "fused_lm_head=True) (1.16.0:1611)"),
)
# chunked_nll's matmul before this release: ``h.float() @ w.float().t()`` (an fp32 copy of the head per chunk; trl
# v1.9.0 sft_trainer.py:101, 1.11.0:103); from it ``(h @ w.to(h.dtype).t()).float()`` (1.13.0 sft_trainer.py:105)
CHUNKED_NLL_CAST_FROM = (1, 13, 0)
# the first release whose SFTTrainer.compute_loss passes ``inputs["use_cache"] = False`` to every forward it runs, the
# training step's and the evaluation's (``prediction_step`` calls ``compute_loss`` when the batch has labels): trl
# commit b08bc7f ("use_cache should be set in the forward pass", #3891, first tagged v0.22.0; v1.16.0
# sft_trainer.py compute_loss the same).  Before it the forward took the model config's ``use_cache``; 0.15-0.16
# only set it false at load for a model given by id with gradient_checkpointing (``model_init_kwargs["use_cache"] =
# False``, v0.15.0 sft_trainer.py:270-272; commented out from 0.17.0)
SFT_USE_CACHE_OFF_SINCE = (0, 22, 0)
# [first, end) of the releases whose SFTTrainer loads a model named by id with use_cache=False under gradient
# checkpointing (v0.15.0 sft_trainer.py:270-272; commented out in v0.17.0)
TRL_GC_NO_CACHE = ((0, 15, 0), (0, 17, 0))
# where SFT_LOSS_ROWS were read: the git tags v0.9.3-v1.9.0 of huggingface/trl, the PyPI wheels 1.10.0-1.16.0
SFT_READ_AT = "v0.9.3-v1.9.0 (git tags), 1.10.0-1.16.0 (PyPI wheels)"


def sft_loss_row(version: tuple[int, ...] | None) -> SftLossRow:
    """SFTTrainer's row at ``version`` (None: ``DEFAULT_TRL_RELEASE``); a release before v0.9 takes the first row
    (no ``compute_loss`` override either)."""
    v = (*(version or tuple(int(x) for x in DEFAULT_TRL_RELEASE.split("."))), 0, 0, 0)[:3]
    rows = [r for r in SFT_LOSS_ROWS if r.first <= v]
    return rows[-1] if rows else SFT_LOSS_ROWS[0]
