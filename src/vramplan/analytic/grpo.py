"""GRPO post-training (``train.objective: grpo``): TRL's ``GRPOTrainer`` as of TRL v1.9.0, the policy side.

Read in TRL v1.9.0 (tag ``v1.9.0``, commit 35def3ee): ``trl/trainer/grpo_config.py`` ``GRPOConfig``,
``trl/trainer/grpo_trainer.py`` ``GRPOTrainer``, ``trl/trainer/utils.py`` ``selective_log_softmax`` and
``entropy_from_logits``, ``trl/generation/vllm_generation.py`` ``VLLMGeneration``.  What this module gives:

* the policy step's scenario (``policy_scenario``): sequences of ``max_prompt_len + max_completion_len``
  tokens (prompt and completion concatenated, ``prompt_completion_ids``); ``train.micro_batch_size`` is
  ``per_device_train_batch_size``, counted in completions; gradient checkpointing on unless the scenario
  says otherwise (``GRPOConfig``: "``gradient_checkpointing``: Defaults to ``True``");
* the reference model (``reference_kind``): ``GRPOTrainer.__init__`` loads none when ``beta == 0.0``
  (TRL's default since 0.19), uses the policy with its adapters disabled under PEFT (no second copy), and
  otherwise loads a second copy with the policy's ``model_init_kwargs`` (``create_model_from_path``): the
  same dtype as the policy's parameters (fp32 unless ``dtype`` is given);
* the loss's tensors (``grpo_loss_tensors``): ``_compute_loss`` calls ``_get_per_token_logps_and_entropies``
  with ``logits_to_keep = completion length``, so the head runs on the last ``C + 1`` positions only;
* what the estimate refuses (``grpo_problems``).

The rollout engine's memory (vLLM, colocated) is ``serve/rollout.py``; ``engine.py`` composes both.

By TRL release (``software.trl``, facts/trl.py ``LOG_PROB_ROWS``): up to v1.13 as above; v1.14 (TRL's Triton
log-prob kernel over the logits) refused; from v1.15.0 the fused LM head (``add_fused_lm_head``,
analytic/fused_head.py; ``grpo_fused_loss_tensors``).  Unset: v1.9.0.  Before v1.9.0 (facts/trl.py
``GRPO_EARLY_ROWS``, docs/rl.md "GRPO before v1.9.0"): v1.0-v1.8 as v1.9; v0.15.0-v0.29.x the logits with
their differences (``grpo_loss_tensors``, ``quotient_copy``) and GRPOConfig's defaults of the release; v0.14.x and
a colocated vLLM engine before v0.18.0 refused (``_early_problems``).
"""

from __future__ import annotations

from typing import Literal

from vramplan.analytic.fused_head import fused_loss_tensors
from vramplan.analytic.logits import KernelLossTensors
from vramplan.errors import Problem
from vramplan.facts.trl import (
    DEFAULT_TRL_RELEASE,
    GRPO_COLOCATE_FIRST,
    GRPO_EARLY_ROWS,
    GRPO_OLD_LOGPS_ALWAYS,
    GRPO_REFERENCE_IN_STEP,
    GRPO_SLEEP_LEVEL_ROWS,
    LOG_PROB_ROWS,
    READ_AT,
    GrpoEarlyRow,
    grpo_early_row,
    log_prob_row,
    release_text,
)
from vramplan.spec import defaults
from vramplan.spec.fields import changed_fields
from vramplan.spec.scenario import Scenario

__all__ = ["ENTROPY_CHUNK_ROWS", "TRL_RELEASE", "checkpointing_notes", "completion_len", "grpo_assumptions",
           "grpo_fused_loss_tensors", "grpo_loss_tensors", "grpo_problems", "policy_scenario", "quotient_copy",
           "reference_kind", "release_notes", "release_problems", "scores_nothing", "sequence_len",
           "trainer_problems", "trl_release", "uses_fused_head"]

TRL_RELEASE = "1.9.0"
# trl/trainer/utils.py entropy_from_logits(logits, chunk_size=128): rows of the flattened logits per chunk
ENTROPY_CHUNK_ROWS = 128

RefKind = Literal["none", "shared", "separate"]


def completion_len(s: Scenario) -> int:
    """The longest completion: ``rl.rollout.max_completion_len``, its null the trainer's default at ``software.trl``
    (GRPOConfig's 256 at v1.9.0, 512 from v1.10.0; RLOOConfig's 512: spec/defaults.py)."""
    return defaults.completion_len(s)


def sequence_len(s: Scenario) -> int:
    """Tokens of one policy sequence: the prompt (left-padded to the longest) and the completion."""
    return s.rl.rollout.max_prompt_len + completion_len(s)


def policy_scenario(s: Scenario) -> Scenario:
    """The training step TRL runs: ``seq_len`` = prompt + completion, with the trainer's defaults (checkpointing on,
    the completion length of the release) where the scenario's fields are null (spec/defaults.py)."""
    s = defaults.with_trainer_defaults(s)
    return s.model_copy(update={"train": s.train.model_copy(update={"seq_len": sequence_len(s)})})


def reference_kind(s: Scenario) -> RefKind:
    """TRL's rule (``GRPOTrainer.__init__``), or the scenario's ``rl.reference_model`` when given."""
    if s.rl.reference_model is not None:
        return s.rl.reference_model
    if defaults.beta(s) == 0.0:
        return "none"
    return "shared" if s.train.peft is not None else "separate"


def _reference_problems(s: Scenario, method: str) -> list[Problem]:
    ref, beta, peft = s.rl.reference_model, defaults.beta(s), s.train.peft is not None
    if ref is None:
        return []
    trl = "none" if beta == 0.0 else "shared" if peft else "separate"
    if ref == trl:
        return []
    why = {"none": "with beta 0 TRL loads no reference model",
           "shared": "under PEFT TRL computes the reference with the adapters disabled",
           "separate": "without PEFT and with beta != 0 TRL loads a second copy of the model"}[trl]
    return [Problem("rl.reference_model", f"is {ref!r}, but {why} ({method}Trainer.__init__, TRL v{trl_release(s)})",
                    f"set rl.reference_model: {trl} or leave it out")]


def trl_release(s: Scenario) -> str:
    """The TRL release DPO's and GRPO's estimate follows: ``software.trl``, or ``DEFAULT_TRL_RELEASE`` (v1.9.0, the
    release these modules were read at first; facts/trl.py says why)."""
    v = s.software.trl_version
    if v is None:
        # RLOOTrainer is read at v1.16.0 only (analytic/rloo.py)
        return "1.16.0" if s.train.objective == "rloo" else DEFAULT_TRL_RELEASE
    return release_text(v)


def uses_fused_head(s: Scenario) -> bool:
    """Whether the step's log-probabilities come from TRL's fused LM head (analytic/fused_head.py): KTO (v1.16.0)
    and RLOO (v1.16.0) always; DPO and GRPO from v1.15.0 (facts/trl.py ``LOG_PROB_ROWS``)."""
    if s.train.objective in ("kto", "rloo"):
        return True
    if s.train.objective not in ("dpo", "grpo"):
        return False
    row = log_prob_row(s.software.trl_version)
    return row is not None and row.path == "fused-head"


def quotient_copy(s: Scenario) -> bool:
    """Whether GRPO's log-probabilities divide the logits by the temperature out of place (TRL v0.16.0-v0.29.x:
    ``logits = logits / self.temperature``, facts/trl.py ``GRPO_EARLY_ROWS``)."""
    row = grpo_early_row(s.software.trl_version) if s.train.objective == "grpo" else None
    return row is not None and row.temperature_copy


def scores_nothing(s: Scenario) -> bool:
    """Whether GRPO's scoring runs no forward: before TRL v0.23.0 with beta 0 (no reference) the old log-probabilities
    are computed only when num_iterations > 1 or the generation batch spans more than one optimizer step, neither of
    which the scenario can say (GRPOConfig's defaults assumed: facts/trl.py ``GRPO_OLD_LOGPS_ALWAYS``)."""
    row = grpo_early_row(s.software.trl_version) if s.train.objective == "grpo" else None
    return row is not None and row.first < GRPO_OLD_LOGPS_ALWAYS and defaults.beta(s) == 0.0


def release_notes(s: Scenario, method: str) -> list[str]:
    """The report's line for a ``software.trl`` newer than every release read (facts/trl.py ``READ_AT``): the last
    row's path is assumed to hold; none otherwise."""
    v = s.software.trl_version
    last = READ_AT[-1]
    if v is None or (*v, 0, 0, 0)[:3] <= tuple(int(x) for x in last.split(".")):
        return []
    note = (f"{method}: TRL v{release_text(v)} is newer than the last release read (v{last}); its log-prob path is "
            f"assumed to be v{last}'s (facts/trl.py)")
    return [note]


def release_problems(s: Scenario, method: str, fixed: str | None = None) -> list[Problem]:
    """``software.trl`` this estimate cannot follow for ``method``'s trainer: for DPO and GRPO a release before the
    first row read or one whose row is not modelled (facts/trl.py); for a trainer read at one release only
    (``fixed``: KTO's and ORPO's v1.16.0) any other release line."""
    v = s.software.trl_version
    if v is None:
        return []
    given = release_text(v)
    if fixed is not None:
        if v[:2] == tuple(int(x) for x in fixed.split("."))[:2]:
            return []
        return [Problem("software.trl", f"is {given}, but {method}Trainer is modelled at TRL v{fixed} only",
                        f"set software.trl: {fixed} or leave it out")]
    early = grpo_early_row(v) if method == "GRPO" else None
    if early is not None:
        return _early_problems(s, given, early)
    row = log_prob_row(v)
    if row is None:
        return [Problem("software.trl", f"is {given}, but {method}Trainer is modelled from TRL v{READ_AT[0]} on "
                        "(earlier releases not read)",
                        f"set software.trl: {READ_AT[0]} or later")]
    if not row.modelled:
        later = next(r for r in LOG_PROB_ROWS if r.first > row.first)
        return [Problem("software.trl", f"is {given}, whose {method}Trainer takes its log-probabilities with TRL's "
                        f"Triton kernel over the logits ({row.sources}), which is not modelled",
                        f"set software.trl: {release_text(later.first)} (the fused LM head) or 1.13.0 (the logits)")]
    return []


def _early_problems(s: Scenario, given: str, row: GrpoEarlyRow) -> list[Problem]:
    """``software.trl`` before v1.9.0 under GRPO (facts/trl.py ``GRPO_EARLY_ROWS``): a release not modelled, a
    reference forward inside the step (v0.18.x with beta != 0), or the colocated vLLM engine before GRPOConfig had
    ``vllm_mode`` (v0.18.0)."""
    first = release_text(GRPO_EARLY_ROWS[1].first)
    if not row.modelled:
        return [Problem("software.trl", f"is {given}, but GRPOTrainer is modelled from TRL v{first} on; before it "
                        f"({row.sources}) the step differs and is not modelled",
                        f"set software.trl: {first} or later")]
    v = (*(s.software.trl_version or ()), 0, 0, 0)[:3]
    out: list[Problem] = []
    if GRPO_REFERENCE_IN_STEP[0] <= v < GRPO_REFERENCE_IN_STEP[1] and defaults.beta(s) != 0.0:
        out.append(Problem("rl.beta", f"is {defaults.beta(s)} (GRPOConfig's default 0.04 before v0.19.0), and TRL "
                           f"v{given}'s GRPOTrainer runs the reference's forward inside _compute_loss, over the policy's "
                           "graph (facts/trl.py GRPO_REFERENCE_IN_STEP), which is not modelled",
                           "set rl.beta: 0, or software.trl: 0.17.0 or 0.19.0 (the reference scored before the step)"))
    colocated = defaults.rollout_engine(s) == "vllm" and s.rl.rollout.colocate
    level = [lv for first, lv in GRPO_SLEEP_LEVEL_ROWS if first <= v][-1]
    if colocated and s.rl.rollout.sleep_mode and s.rl.rollout.sleep_mode != level:
        what = (f"asks for level {level} (llm.sleep(level={level}))" if level else "has no vllm_enable_sleep_mode "
                "(from v0.23.0)")
        out.append(Problem("rl.rollout.sleep_mode", f"is {s.rl.rollout.sleep_mode}, but TRL v{given}'s GRPOTrainer "
                           f"{what}: facts/trl.py GRPO_SLEEP_LEVEL_ROWS", f"set rl.rollout.sleep_mode: {level}"))
    if colocated and v < GRPO_COLOCATE_FIRST:
        out.append(Problem("rl.rollout.colocate", f"is true, but TRL v{given}'s GRPOTrainer has no colocated vLLM "
                           "engine (GRPOConfig.vllm_mode from v0.18.0; before it vLLM runs on vllm_device, the next "
                           "GPU, or cuda:0 shared by a single process, not modelled, or as a server: facts/trl.py "
                           "GRPO_COLOCATE_FIRST)",
                           "set rl.rollout.colocate: false, or software.trl: 0.18.0 or later"))
    return out


def trainer_problems(s: Scenario, method: str, sharded: str, parallel_also: str = "") -> list[Problem]:
    """What TRL's trainers (``GRPOTrainer``, ``DPOTrainer``: subclasses of the HF Trainer) share and this estimate
    does not model: another framework, sharded parameters (``sharded`` says what sharding would add) and tensor,
    pipeline or context parallelism; each refused with what to change."""
    par = s.parallel
    out: list[Problem] = []
    if s.effective_framework not in ("hf-trainer", "accelerate", "deepspeed"):
        out.append(Problem("framework", f"{method} runs on TRL's {method}Trainer (the HF Trainer), not "
                           f"{s.effective_framework}", "use framework: hf-trainer (or deepspeed for ZeRO-1/2)"))
    if par.zero_stage == 3 or par.fsdp not in ("none", "no_shard"):
        out.append(Problem("parallel", f"sharded parameters (ZeRO-3, FSDP) under {method} are not modelled: {sharded}",
                           "use ZeRO-1/2 or DDP"))
    if par.tp > 1 or par.pp > 1 or par.cp > 1:
        out.append(Problem("parallel", f"tensor, pipeline or context parallelism under {method}{parallel_also} is "
                           "not modelled", "use data parallelism only (tp = pp = cp = 1)"))
    # KTOTrainer and ORPOTrainer were read at v1.16.0 only (analytic/kto.py, analytic/orpo.py)
    return out + release_problems(s, method, None if method in ("DPO", "GRPO") else "1.16.0")


def _setup_problems(s: Scenario, method: str) -> list[Problem]:
    """Combinations GRPO (or RLOO: ``method``) runs but this estimate does not model, each refused with what to
    change."""
    t, ro = s.train, s.rl.rollout
    out: list[Problem] = []

    def no(where: str, what: str, fix: str) -> None:
        out.append(Problem(where, what, fix))

    if s.rl.precompute_ref_log_probs:
        no("rl.precompute_ref_log_probs", f"is a DPO setting (DPOConfig); {method}Trainer has none",
           "set rl.precompute_ref_log_probs: false")
    engine = defaults.rollout_engine(s)
    if engine == "hf-generate":
        out += _hf_generate_problems(s)
    out += trainer_problems(s, method, "the reference model's shards and the gather of the full weights for each "
                            "vLLM weight sync", " (and vllm_tensor_parallel_size)")
    if t.loss != "standard":
        no("train.loss", f"{t.loss} under {method} is not modelled (TRL's use_liger_kernel runs Liger's "
           "LigerFusedLinearGRPOLoss, another kernel)" if method == "GRPO" else f"{t.loss} under {method} is not "
           "modelled (RLOOTrainer patches its own fused LM head and refuses Liger's fused_linear_cross_entropy)",
           "use train.loss: standard")
    if t.packing:
        no("train.packing", f"{method} pads prompts and completions; packing is not modelled",
           "set train.packing: false")
    if s.lifecycle.evaluation:
        no("lifecycle.evaluation", f"{method}'s evaluation (generation through the rollout engine) is not modelled",
           "set lifecycle.evaluation: false")
    if engine == "vllm" and ro.colocate and t.quantization != "none":
        no("train.quantization", "a colocated vLLM engine over a bitsandbytes policy (vLLM's in-flight "
           "bitsandbytes loading) is not modelled", "use rl.rollout.colocate: false or an unquantized base")
    # a value, not the key's presence: the schema's default (what a dumped scenario carries) is not a setting; the
    # policy scenario (what the report echoes) holds the sequence's own length
    if changed_fields(t, ("seq_len",)) and t.seq_len != sequence_len(s):
        no("train.seq_len", f"is {t.seq_len}, but a {method} sequence is rl.rollout.max_prompt_len + "
           f"max_completion_len = {sequence_len(s)} tokens", "leave train.seq_len out")
    batch = t.micro_batch_size * s.data_parallel_degree * t.grad_accum_steps
    generations = defaults.num_generations(s)
    if batch % generations:
        # GRPOConfig.__post_init__: generation_batch_size = per_device_train_batch_size x num_processes x
        # steps_per_generation (gradient_accumulation_steps by default) must be divisible by num_generations
        no("rl.rollout.num_generations", f"the generation batch (micro_batch_size x data-parallel ranks x "
           f"grad_accum_steps = {batch}) is not divisible by num_generations = {generations} "
           f"({method}Config.__post_init__, TRL v{trl_release(s)})", "make the batch a multiple of num_generations")
    return out


# the rollout keys only the vLLM engine reads (serve/rollout.py)
_VLLM_ROLLOUT_KEYS = ("colocate", "gpu_memory_utilization", "sleep_mode", "vllm_version")


def _hf_generate_problems(s: Scenario) -> list[Problem]:
    """What the hf-generate rollout (analytic/lifecycle/hf_rollout.py) does not model."""
    out: list[Problem] = []
    # keys given away from their defaults (a dumped scenario holds every key at its default)
    vllm_keys = changed_fields(s.rl.rollout, _VLLM_ROLLOUT_KEYS)
    if vllm_keys:
        shown = ", ".join(f"rl.rollout.{k}" for k in vllm_keys)
        out.append(Problem("rl.rollout", f"{shown} set, but only the vLLM engine reads them (hf-generate runs "
                           "model.generate in the trainer)", "remove them or use rl.rollout.engine: vllm"))
    if s.train.quantization != "none":
        out.append(Problem("train.quantization", "generate over a bitsandbytes policy inside the trainer is not "
                           "modelled", "use an unquantized base, or rl.rollout.engine: vllm with colocate: false"))
    if s.train.precision in ("fp32", "fp8-mixed"):
        out.append(Problem("train.precision", f"a {s.train.precision} generate inside the trainer is not modelled "
                           "(the inference engine runs bf16 or fp16)", "use bf16-mixed or fp16-mixed"))
    return out


def grpo_problems(s: Scenario, method: str = "GRPO") -> list[Problem]:
    """Why ``s`` (a training scenario with a post-training objective) cannot be estimated; empty: it can.
    ``method``: GRPO, or RLOO (analytic/rloo.py, on the scenario with RLOOConfig's defaults filled in)."""
    return _setup_problems(s, method) + _reference_problems(s, method)


def grpo_loss_tensors(micro_batch: int, completion: int, vocab: int, logits_bytes: int,
                      early: GrpoEarlyRow | None = None) -> KernelLossTensors:
    """The GRPO loss's tensors for ``micro_batch`` completions of ``completion`` tokens (``vocab`` on this rank,
    the logits in ``logits_bytes`` per element), as (saved to the backward, forward extra, backward extra).

    TRL v1.9.0 ``_get_per_token_logps_and_entropies(..., logits_to_keep=C, compute_entropy=True)``:

    * the head on the last ``C + 1`` positions (transformers' ``logits_to_keep``): ``L = b (C + 1) V`` elements
      in the compute dtype (the head's output under autocast; no ``.float()`` without labels);
    * ``logits[:, :-1][:, -C:]`` and the in-place ``div_(temperature)`` make no copy;
    * ``selective_log_softmax``: with half logits, one ``F.log_softmax`` per sequence (``C V`` each), whose
      output autograd saves, so all ``b C V`` half elements are kept to the backward; with fp32 logits,
      ``torch.logsumexp`` per sequence, which saves its input: the logits themselves are kept;
    * ``entropy_from_logits`` under ``no_grad``: ``logits.reshape(-1, V)`` copies the non-contiguous slice when
      ``b > 1`` (``b C V``), then per chunk of 128 rows ``log_softmax``, ``exp`` and their product (3 x 128 V).

    The backward: the selected rows' gradients accumulate into one ``b C V`` tensor while a row's gradient of
    the same size arrives (``SelectBackward`` makes a full-size zero tensor per row), the slices' backward make
    the ``b (C + 1) V`` gradient of the logits, and one row's gather and log_softmax gradients (``2 C V``)
    live at once: counted as two full logits gradients and the row's two.

    Worked example at v1.9.0 (Qwen2.5-0.5B, V = 151,936, b = 8, C = 256, bf16): L = 8 x 257 x 151,936 x 2 =
    624,760,832 B; saved = 8 x 256 x 151,936 x 2 = 622,329,856 B; forward extra = L + 622,329,856 (copy) +
    3 x 128 x 151,936 x 2 = 1,363,777,536 B; backward extra = 2 L + 2 x 256 x 151,936 x 2 = 1,405,104,128 B.

    Before v1.0.0 (``early``, facts/trl.py ``GRPO_EARLY_ROWS``): v0.16.0-v0.29.x divide out of place (``logits =
    logits / self.temperature``): the quotient ``X = b C V`` (contiguous) is made while the head's ``L`` is live, then
    ``L`` is dropped (the slices' and the division's backward save no tensor); ``selective_log_softmax`` runs on
    ``X`` (half: saves its ``b C V`` outputs; fp32: ``logsumexp`` saves ``X``).  The forward's peak is the larger of
    the division (``L + X``, nothing saved yet) and the end (``X``, what is saved, the entropy's temporaries: none
    before v0.20.0, one sequence's three ``C V`` at v0.20-v0.22, 3 x 128 V chunks of the contiguous ``X`` with no
    reshape copy from v0.23.0).  v0.15.x has no division and no entropy: the head's ``L`` stays, as at v1.9.0 less the
    entropies.  The backward is bounded as at v1.9.0 (the division's gradient, ``b C V``, arrives while the
    accumulated ``b C V`` one is live: two of them, within the two logits gradients counted).

    Worked example at v0.16.0 (the same Qwen2.5-0.5B, b = 8, C = 256, bf16): saved = 622,329,856 B as above;
    forward extra = max(L, X + 0) = 624,760,832 B; at v0.20.0 forward extra = max(L, X + 3 x 256 x 151,936 x 2 =
    622,329,856 + 233,373,696) = 855,703,552 B; at v0.23.0 max(L, X + 116,686,848) = 739,016,704 B.
    """
    b, c, v, e = micro_batch, completion, vocab, logits_bytes
    logits = b * (c + 1) * v * e
    if early is not None and early.first < (1, 0, 0):
        return _early_loss_tensors(b, c, v, e, early)
    rows = min(ENTROPY_CHUNK_ROWS, b * c)
    entropy = (b * c * v * e if b > 1 else 0) + 3 * rows * v * e
    if e < 4:
        saved, row_temp = b * c * v * e, 0
    else:
        saved, row_temp = logits, c * v * e  # logsumexp keeps the logits; one sequence's exp at a time
    forward_extra = (0 if e == 4 else logits) + entropy + row_temp
    return KernelLossTensors(saved=saved, forward_extra=forward_extra, backward_extra=2 * logits + 2 * c * v * e)


def _early_loss_tensors(b: int, c: int, v: int, e: int, early: GrpoEarlyRow) -> KernelLossTensors:
    """``grpo_loss_tensors`` before v1.0.0 (its docstring)."""
    logits, quotient = b * (c + 1) * v * e, b * c * v * e
    entropy = {"none": 0, "per-sequence": 3 * c * v * e,
               "chunked": 3 * min(ENTROPY_CHUNK_ROWS, b * c) * v * e}[early.entropy]
    backward = 2 * logits + 2 * c * v * e
    if not early.temperature_copy:
        # v0.15.x: the logits stay live to the end; half: the per-sequence log_softmax outputs saved; fp32: logsumexp
        # keeps the logits and one sequence's exp lives at a time
        if e < 4:
            return KernelLossTensors(saved=quotient, forward_extra=logits + entropy, backward_extra=backward)
        return KernelLossTensors(saved=logits, forward_extra=entropy + c * v * e, backward_extra=backward)
    # the quotient X (b C V) is what is saved (half: as log_softmax outputs of its size; fp32: X itself for logsumexp)
    row_temp = c * v * e if e == 4 else 0
    end = (quotient if e < 4 else 0) + entropy + row_temp
    return KernelLossTensors(saved=quotient, forward_extra=max(logits, end), backward_extra=backward)


def grpo_fused_loss_tensors(micro_batch: int, prompt: int, completion: int, vocab: int, hidden: int,
                            hidden_bytes: int, compute_bytes: int, weight_bytes: int,
                            head_trainable: bool) -> KernelLossTensors:
    """The GRPO loss's tensors from TRL v1.15.0 (``software.trl``, facts/trl.py): ``_get_per_token_logps_and_entropies``
    masks every label but the completion's (``labels[:, :-logits_to_keep] = -100``) and calls ``model(...,
    labels=labels, fused_lm_head=True)``, the head ``GRPOTrainer.__init__`` added with ``outputs=("log_probs",
    "entropy")``: N = ``b C`` labelled positions through TRL's fused head (analytic/fused_head.py), its two fp32
    outputs scattered over the batch's ``b (P + C - 1)`` positions (8 bytes each); no reference inside the step (its
    forward is the scoring's, analytic/lifecycle/scoring.py).  ``hidden_bytes`` (x) is the final norm's output dtype,
    ``compute_bytes`` (c) the autocast dtype, ``weight_bytes`` (w) the LM head's.

    Worked example (Qwen2.5-0.5B: V = 151,936, H = 896; b = 8, P = 512, C = 256; bf16 autocast over fp32 weights:
    x = 4, c = 2, w = 4, trainable head): N = 2,048; saved = 2,048 x 896 x 4 + 16 x 2,048 = 7,340,032 + 32,768 =
    7,372,800 B; tiles = 2,048 x 32,768 x 2 + 32,768 x 896 x 2 + 2,048 x 896 x 2 = 134,217,728 + 58,720,256 +
    3,670,016 = 196,608,000 B; forward extra = max(28 x 2,048 + 196,608,000, 8 x 8 x 767) = 196,665,344 B; backward
    extra = 7,340,032 + 151,936 x 896 x 4 (544,538,624) + 196,608,000 = 748,486,656 B.
    """
    tokens, positions = micro_batch * completion, micro_batch * (prompt + completion - 1)
    return fused_loss_tensors(tokens, positions, 8, vocab, hidden, hidden_bytes, compute_bytes, weight_bytes,
                              head_trainable)


def grpo_assumptions(s: Scenario, method: str = "GRPO") -> list[str]:
    """What the GRPO (or RLOO: ``method``) estimate takes as given, for the report."""
    ro, ref, fused = s.rl.rollout, reference_kind(s), uses_fused_head(s)
    how = ("log-probabilities and entropies by TRL's fused LM head over the completion's positions only "
           "(add_fused_lm_head, ChunkedLogProbFunction: tiles of 4,096 tokens x 32,768 vocabulary columns, no logits "
           "tensor)" if fused else "logits over the completion only (logits_to_keep), log-probabilities per sequence "
           "(selective_log_softmax), entropies under no_grad")
    scored = ("the fused head's gathered hidden states, statistics and tiles" if fused else
              "the logits over the completion and one sequence's log_softmax")
    early = grpo_early_row(s.software.trl_version) if method == "GRPO" else None
    if early is not None and early.first < (1, 0, 0):
        entropies = {"none": "no entropies", "per-sequence": "entropies under no_grad one sequence at a time",
                     "chunked": "entropies under no_grad in chunks of 128 rows"}[early.entropy]
        division = ("logits / temperature copied out of place (the completion's b C V quotient)"
                    if early.temperature_copy else "no temperature division")
        how = (f"logits over the completion only (logits_to_keep), {division}, log-probabilities per sequence "
               f"(selective_log_softmax), {entropies}")
        if early.temperature_copy:
            scored = "the logits over the completion and their quotient by the temperature"
    out = [
        (f"{method} (TRL v{trl_release(s)} {method}Trainer): the policy step on micro_batch_size = {s.train.micro_batch_size} "
         f"completions of {ro.max_prompt_len} prompt + {completion_len(s)} completion tokens; {how}"),
        {"none": f"{method} reference model: none (beta = 0: {method}Trainer loads none)",
         "shared": f"{method} reference model: the policy with its adapters disabled (PEFT): no second copy",
         "separate": f"{method} reference model: a second copy loaded like the policy (create_model_from_path with "
                     "model_init_kwargs), resident on every GPU"}[ref],
        (f"{method} scoring: the old and reference log-probabilities as no-grad forwards of micro_batch_size "
         f"completions ({scored}, or one MLP), over what "
         "stays between steps (analytic/lifecycle/scoring.py)"),
        f"{method} reward functions are assumed to run on the CPU (a reward model on the GPU is not modelled)",
        (f"{method}: every sequence at the longest prompt and completion (TRL pads both in the batch); the padding "
         "mask's few bytes and its attention kernel choice are not counted apart"),
    ]
    if s.train.peft is not None and ro.colocate:
        # VLLMGeneration.sync_weights merges the adapters into the base (peft merge_adapter), loads the merged
        # weights into the engine and unmerges them: one linear's delta at a time
        out.append(f"{method} weight sync under PEFT: merge_adapter's one-linear-at-a-time delta temporaries are not "
                   "counted (one linear's weight, small beside the rollout phase's engine)")
    out += release_notes(s, method)
    if scores_nothing(s):
        out.append(f"{method} scoring (TRL v{trl_release(s)}): no forward (beta 0: no reference; the old "
                   "log-probabilities only with num_iterations > 1 or steps_per_generation > gradient_accumulation_steps,"
                   " GRPOConfig's defaults 1 and equal assumed)")
    if early is not None and defaults.rollout_engine(s) == "hf-generate":
        out.append(f"{method}: the hf-generate rollout as read at TRL v1.9.0 (model.generate in the trainer) is "
                   f"assumed for v{trl_release(s)}")
    return out + checkpointing_notes(s, method)


def checkpointing_notes(s: Scenario, method: str) -> list[str]:
    """The report's line when the step checkpoints as TRL's trainer config does by default (a value: the same line
    whether the scenario left the key out or gave the default, so its dump reads the same)."""
    if defaults.checkpointing(s) != "full":
        return []
    return [f"{method}: gradient_checkpointing full ({method}Config's default gradient_checkpointing=True)"]
