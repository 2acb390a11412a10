"""Shared state of one planning run: the model and GPU resolved once, and cheap scenario copies.

``vramplan.catalog.resolve.resolve`` validates a scenario document and looks its names up; doing that
for every candidate would cost more than the estimate itself.  The planner resolves one base
scenario, then derives each candidate's ``Scenario`` by laying the setup's ``Train`` and ``Parallel``
deltas on it (``TrainSetup.apply``: ``model_copy(update=...)``), which skips
pydantic validation.  That is safe because the candidates are built only from the literal values
the scenario schema allows, and the cross-checks ``resolve`` runs (tp divides the heads and splits
the KV heads evenly, pp <= layers, num_gpus divisible by tp*pp, offload only with ZeRO/FSDP,
parameter offload only at ZeRO-3, QLoRA with 4-bit weights) hold by construction in
``space.py``.  The setups a plan returns are re-validated through ``resolve`` from their
documents before they are reported (``PlanContext.verify``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vramplan.analytic.layout import LoraTargets, lora_targets, rank_params
from vramplan.analytic.precision import PrecisionPolicy, policy
from vramplan.catalog.resolve import resolve
from vramplan.engine import ReservedModel, StepWalks, estimate, train_step_floor_bytes, train_step_walks
from vramplan.errors import Problem, ScenarioError
from vramplan.plan.bound import PER_BATCH, static_lower_bound_bytes
from vramplan.plan.fit import usable_bytes
from vramplan.plan.setup import ServeSetup, TrainSetup
from vramplan.plan.steptime import ModelFacts, PerfAssumptions, StepTime, model_facts, train_step_time
from vramplan.report import Report
from vramplan.spec.gpu import GpuSpec
from vramplan.spec.load import Resolved, checkpoint_quantization_for, fsdp_upcast_for
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario, Train

__all__ = ["PlanContext", "make_context", "micro_batch_key"]


@dataclass
class PlanContext:
    model_ref: str | dict[str, Any]
    model: ModelSpec
    gpu: GpuSpec
    facts: ModelFacts
    assumptions: PerfAssumptions
    margin: float
    base: Scenario
    _pols: dict[tuple[str, str, str], PrecisionPolicy] = field(default_factory=dict)
    _trainable: dict[tuple[str | None, str], int] = field(default_factory=dict)
    _bounds: dict[tuple[object, ...], int] = field(default_factory=dict)
    _serve_weights: dict[tuple[object, ...], int] = field(default_factory=dict)
    _kv_tokens: dict[tuple[object, ...], int] = field(default_factory=dict)
    _kv_sequence: dict[tuple[object, ...], int | None] = field(default_factory=dict)
    _verified: dict[ServeSetup, tuple[Report | None, Report]] = field(default_factory=dict)
    _floors: dict[TrainSetup, int | None] = field(default_factory=dict)
    # the step term records of the last setup whose step floor fits (the walk estimates it next)
    _walks: tuple[TrainSetup, StepWalks] | None = None
    _compute: dict[tuple[object, ...], tuple[float, float, float, float, int]] = field(default_factory=dict)
    # a ``Train`` record's fields outside ``PER_BATCH``, by the record's identity (the record is kept beside them):
    # the setups share their records (plan/setup.py ``_train``)
    _static_fields: dict[int, tuple[Train, tuple[tuple[str, str], ...]]] = field(default_factory=dict)

    @property
    def usable(self) -> int:
        return usable_bytes(self.gpu.total_memory_bytes, self.margin)

    # ---- scenarios -------------------------------------------------------
    def scenario(self, s: TrainSetup) -> Scenario:
        """The base scenario with the setup laid on it (``TrainSetup.apply``: one ``model_copy(update=...)``)."""
        return s.apply(self.base)

    def serve_scenario(self, s: ServeSetup) -> Scenario:
        b = self.base
        serve = b.serve.model_copy(update={
            "max_model_len": s.max_model_len, "gpu_memory_utilization": s.gpu_memory_utilization,
            "block_size": s.block_size, "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens, "kv_cache_dtype": s.kv_cache_dtype,
            "dtype": s.dtype, "quantization": s.quantization})
        par = b.parallel.model_copy(update={"tp": s.tp, "pp": s.pp})
        hw = b.hardware.model_copy(update={"num_gpus": s.tp * s.pp, "gpus_per_node": s.gpus_per_node})
        return b.model_copy(update={"task": "serve", "framework": "vllm", "serve": serve, "parallel": par,
                                    "hardware": hw})

    def document(self, s: TrainSetup | ServeSetup) -> dict[str, Any]:
        """The setup's scenario mapping, with the job's ``software`` releases a training setup was estimated with
        (``software.torchtitan``, which the torchtitan export also reads)."""
        doc = s.to_document(self.model_ref, self.gpu.name)
        software = self.base.software.model_dump(exclude_unset=True)
        if software and isinstance(s, TrainSetup):
            doc["software"] = software
        return doc

    # ---- cached facts ------------------------------------------------------
    def policy(self, s: TrainSetup) -> PrecisionPolicy:
        key = (s.precision, s.framework, s.fsdp)
        pol = self._pols.get(key)
        if pol is None:
            pol = policy(self.scenario(s))
            self._pols[key] = pol
        return pol

    def _targets(self, s: TrainSetup) -> LoraTargets:
        """Where the adapters go, as the analytic engine resolves them (QLoRA keeps per-expert adapters)."""
        return lora_targets(s.train.peft, self.model, self.base.software.fused_moe_experts,
                            s.quantization if s.peft else "none")

    def trainable(self, s: TrainSetup) -> int:
        """Parameters the optimizer updates: all of them, or the adapters under PEFT."""
        key = (s.peft, s.quantization)
        got = self._trainable.get(key)
        if got is None:
            got = (rank_params(self.model, 1, 1, 1, 0, s.train.peft, self._targets(s)).lora if s.peft
                   else self.model.num_parameters)
            self._trainable[key] = got
        return got

    # ---- evaluation ---------------------------------------------------------
    def step_time(self, s: TrainSetup) -> StepTime:
        lora = self.trainable(s) if s.peft else 0
        return train_step_time(s, self.facts, self.gpu, self.assumptions, self.policy(s), self.trainable(s), lora,
                               self._compute)

    def lower_bound(self, s: TrainSetup) -> int:
        """The engine's static terms on the setup's scenario, with the CUDA context and NCCL buffers
        (plan/bound.py): never above the estimate's ``device_used_bytes``.

        Static terms are resident whatever the batch (``analytic.terms.STATIC_TERMS``), so setups that
        differ only in the fields of ``PER_BATCH`` share one bound, computed once
        (``tests/test_plan_bound.py`` checks that those fields leave the static terms unchanged)."""
        key = (s.framework, s.num_gpus, s.gpus_per_node, s.parallel,
               other_train_fields(s.train, PER_BATCH, self._static_fields))
        got = self._bounds.get(key)
        if got is None:
            got = self._bounds[key] = static_lower_bound_bytes(Resolved(self.scenario(s), self.model, self.gpu))
        return got

    def serve_weights_floor(self, s: ServeSetup) -> int:
        """The parameters vLLM loads on one rank in their stored format (``serve.vllm.serve_weights_bytes``): the
        report's ``weights`` holds them and adds only what is kept beside them (MLA's absorbed copies, adapters, a
        draft model), so this is never above it, while no weights are offloaded to the CPU (``cpu_offload_gb``,
        which the planner never sets).  One value per (tp, pp, dtype, weights format)."""
        key = (s.tp, s.pp, s.dtype, s.quantization)
        got = self._serve_weights.get(key)
        if got is None:
            from vramplan.serve.vllm import serve_weights_bytes

            got = self._serve_weights[key] = serve_weights_bytes(self._resolved(s))[0]
        return got

    def kv_bytes_per_token(self, s: ServeSetup) -> int:
        """One token's K and V over every layer on one rank (what a decode step reads per token of context)."""
        key = (s.tp, s.dtype, s.kv_cache_dtype)
        got = self._kv_tokens.get(key)
        if got is None:
            from vramplan.analytic.kv_cache import kv_elem_bytes, layer_kv_bytes_per_token

            elem = kv_elem_bytes(s.kv_cache_dtype, 2 if s.dtype != "fp32" else 4)
            got = self._kv_tokens[key] = self.model.num_layers * layer_kv_bytes_per_token(self.model, elem, s.tp,
                                                                                          s.kv_cache_dtype)
        return got

    def serve_cannot_fit(self, s: ServeSetup) -> bool:
        """Whether ``s`` provably holds no KV cache for ``max_num_seqs`` requests of ``max_model_len``, so that its
        estimate cannot say it fits (``fit.band_fits``), from two bounds: vLLM's KV pool is at most
        ``gpu_memory_utilization`` x the device's memory less the weights (``serve_weights_floor``; the profile's
        activations, the graphs and the context come off it too), and a request of ``max_model_len`` tokens needs at
        least ``max_model_len`` x the bytes per token of every attention layer's cache (whole blocks: never fewer).
        The second bound is used only for models whose every attention layer caches every token (no sliding
        window), where it is plain; the first holds for any model."""
        budget = int(self.gpu.device_total_bytes * s.gpu_memory_utilization) - self.serve_weights_floor(s)
        if budget <= 0:
            return True
        key = (s.tp, s.dtype, s.kv_cache_dtype, s.max_model_len)
        if key not in self._kv_sequence:
            from vramplan.analytic.kv_cache import kv_spec

            spec = kv_spec(self.model, s.kv_cache_dtype, 2 if s.dtype != "fp32" else 4, s.tp)
            self._kv_sequence[key] = None if spec.has_sliding else s.max_model_len * spec.bytes_per_token
        per_request = self._kv_sequence[key]
        return per_request is not None and budget < s.max_num_seqs * per_request

    def _resolved(self, s: TrainSetup | ServeSetup) -> Resolved:
        """The setup's scenario as ``resolve`` would finish it (without re-validating the whole document)."""
        scn = self.scenario(s) if isinstance(s, TrainSetup) else self.serve_scenario(s)
        # a pre-quantized checkpoint decides the weights' format, as in ``resolve``
        scn, notes, problems = checkpoint_quantization_for(scn, self.model)
        scn, upcast = fsdp_upcast_for(scn)  # accelerate's FSDP upcast of half weights, as in ``resolve``
        notes += upcast
        if problems:
            raise ScenarioError(problems)
        return Resolved(scn, self.model, self.gpu, tuple(notes))

    def estimate(self, s: TrainSetup | ServeSetup, reserved: ReservedModel = "replay") -> Report:
        """The analytic estimate; ``reserved="packed"`` is the fast screen (reserved never above the replay's).
        A training setup whose step floor was computed (and fits) reuses that floor's step term records
        (``engine.train_step_walks``: the engine would make the same from the same scenario)."""
        walks = self._walks[1] if self._walks is not None and self._walks[0] == s else None
        return estimate(self._resolved(s), reserved=reserved, walks=walks)

    def step_floor(self, s: TrainSetup) -> int | None:
        """The steady step's lower bound of the estimate's device-used bytes (``engine.train_step_floor_bytes``;
        None for a job the plain step does not answer), computed once per setup.  The step's term records of the
        last floor computed within the usable memory are kept for that setup's estimates, which the walk makes next
        (those above it are not estimated); one setup's only, so the search holds one step's records at a time (a
        setup whose records were replaced is estimated from its scenario, with the same result)."""
        if s not in self._floors:
            r = self._resolved(s)
            walks = train_step_walks(r)
            floor = None if walks is None else train_step_floor_bytes(r, walks)
            if walks is not None and floor is not None and floor <= self.usable:
                self._walks = (s, walks)
            self._floors[s] = floor
        return self._floors[s]

    def verify(self, s: TrainSetup | ServeSetup, report: Report | None = None) -> Report:
        """The setup's document through full validation (what ``vramplan estimate`` does).

        When the validated scenario equals the one the search estimated (``report``), that estimate
        stands (the engine is a pure function of the scenario, model and GPU); otherwise it is redone.
        """
        if isinstance(s, ServeSetup) and (done := self._verified.get(s)) is not None and done[0] is report:
            return done[1]  # the search validated it already (``_walk_serve``), and ``_ranked`` asks again
        r = resolve(self.document(s))
        mine = self.scenario(s) if isinstance(s, TrainSetup) else self.serve_scenario(s)
        if report is not None and r.scenario == mine and (r.model is self.model or r.model == self.model) \
                and r.gpu == self.gpu:
            got = report
        else:
            got = estimate(r)
        if isinstance(s, ServeSetup):
            self._verified[s] = (report, got)
        return got

    def with_gpu(self, gpu: GpuSpec) -> PlanContext:
        hw = self.base.hardware.model_copy(update={"gpu": gpu.name})
        return PlanContext(self.model_ref, self.model, gpu, self.facts, self.assumptions, self.margin,
                           self.base.model_copy(update={"hardware": hw}))


def has_speed_figures(g: GpuSpec) -> bool:
    """Whether the planner can rank setups on ``g``: a memory bandwidth and at least one dense FLOP/s figure
    (catalog rows that state only memory, e.g. GPUs without a checked datasheet, cannot be planned on)."""
    return bool(g.hbm_bytes_per_s) and any(g.dense_flops_per_s.values())


def make_context(model: str | dict[str, Any], gpu: str, margin: float, assumptions: PerfAssumptions,
                 task: str, job_keys: dict[str, Any] | None = None) -> PlanContext:
    """Resolve the model and GPU once (with the estimator's own checks and suggestions).

    ``job_keys``: the job's own section (``{"train": {"seq_len": ...}}``), so that the checks see the job's length
    and not the schema's default (an encoder-decoder decoder with 448 learned positions was refused at 2,048)."""
    if not 0.0 <= margin < 0.9:
        raise ScenarioError([Problem("--margin", f"{margin} is outside [0, 0.9)",
                                     "give the fraction of capacity to keep free, e.g. 0.1")])
    if not 0.0 < assumptions.mfu <= 1.0:
        raise ScenarioError([Problem("--mfu", f"{assumptions.mfu} is outside (0, 1]", "e.g. 0.4")])
    if min(assumptions.inter_node_bytes_per_s, assumptions.host_memory_bytes_per_s) <= 0:
        raise ScenarioError([Problem("--inter-node-gbps", "bandwidths must be positive", "e.g. 25 (GB/s per GPU)")])
    doc = {"model": model, "task": task, "hardware": {"gpu": gpu, "num_gpus": 1}, **(job_keys or {})}
    try:
        r = resolve(doc)
    except ScenarioError as exc:
        wheres = {p.where for p in exc.problems}
        if task != "train" or not wheres <= {"train.precision", "train.peft"}:
            raise
        # a model whose training the schema's defaults refuse: the default precision (bf16-mixed) for a parallel
        # hybrid under autocast (spec/checks.py ``_parallel_hybrid_problems``), full fine-tuning for a model that
        # holds modules no step runs (Qwen3-Omni's talker, ``held_module_problems``).  The context reads only the
        # model and the GPU, and every searched setup sets its own precision and PEFT method (the estimator refuses
        # the setups it does not model, and the plan's notes count them)
        train = doc.get("train")
        fixed = {**(train if isinstance(train, dict) else {})}
        if "train.precision" in wheres:
            fixed["precision"] = "fp32"
        if "train.peft" in wheres:
            fixed["peft"] = {"method": "lora"}
        r = resolve({**doc, "train": fixed})
    g = r.gpu
    if not has_speed_figures(g):
        raise ScenarioError([Problem("--gpu", f"{g.name} has no speed figures in the GPU catalog",
                                     "planning ranks setups by speed; pick a catalog GPU (see `vramplan gpus`)")])
    return PlanContext(model, r.model, g, model_facts(r.model), assumptions, margin, r.scenario)


def micro_batch_key(s: TrainSetup, memo: _FieldsMemo | None = None) -> tuple[object, ...]:
    """Setups that differ only in the micro-batch split of the same global batch, with gradient accumulation on in all
    of them or in none: along such a set the step floor never falls as the micro-batch grows (every saved tensor
    and every per-batch temporary grows with the micro-batch's tokens; the micro-batches a pipeline keeps in flight,
    min(stages, accumulation) of them, hold min(stages x micro-batch, global batch) sequences; what accumulation itself
    adds is switched by ``grad_accum_steps > 1``, kept in the key).  So the floor of the smallest micro-batch of a key
    is a lower bound of every other's (``tests/test_plan_bound.py`` checks it over the planner's own candidates).
    ``memo``: the ``Train`` records' other fields by the record's identity (the record kept beside them), for a
    search's setups, which share their records (plan/setup.py ``_train``)."""
    t = s.train
    rest = other_train_fields(t, _SPLIT_FIELDS, memo)
    return (s.framework, s.num_gpus, s.gpus_per_node, s.parallel, s.peft, s.quantization, t.grad_accum_steps > 1, rest)


_SPLIT_FIELDS = frozenset({"micro_batch_size", "grad_accum_steps"})
_FieldsMemo = dict[int, tuple[Train, tuple[tuple[str, str], ...]]]


def other_train_fields(t: Train, excluded: frozenset[str], memo: _FieldsMemo | None = None
                       ) -> tuple[tuple[str, str], ...]:
    """``t``'s set fields outside ``excluded``, by value (repr: the adapter settings hold a list, which has no hash);
    ``memo``: by the record's identity, the record kept beside its fields (a search's setups share their records,
    plan/setup.py ``_train``), one memo per ``excluded``."""
    held = None if memo is None else memo.get(id(t))
    if held is None or held[0] is not t:
        held = (t, tuple(sorted((k, repr(getattr(t, k))) for k in t.model_fields_set - excluded)))
        if memo is not None:
            memo[id(t)] = held
    return held[1]
