"""SGLang's speculative decoding and DP attention at start-up, by release, read in the wheels' source.

**Speculative decoding** (``--speculative-algorithm``).  The scheduler builds the target worker first: it loads
the target's weights, profiles ``max_total_num_tokens`` from the memory left and allocates its pool; only then
does the draft worker (``speculative/eagle_worker.py`` ``EAGLEWorker.__init__``, ``is_draft_worker=True``) load
its weights and allocate its own KV pool, from the memory left outside ``mem_fraction_static`` (sgl-project/sglang
issue #6875 describes the consequence).  What the target pool holds changed four times
(``model_executor/model_runner.py`` ``init_memory_pool``, later ``model_runner_kv_cache_mixin.py`` and
``pool_configurator.py``); see ``SPEC_RULES``:

* 0.4.3: the target keeps the profiled tokens; the draft pool is ``draft_runner_cache_size = tokens +
  max_num_reqs x speculative_num_steps + 100`` tokens.
* 0.4.5 to 0.5.6: both pools share their indices and hold ``tokens + max_num_reqs x (steps x topk +
  num_draft_tokens) + 100`` tokens ("We are sharing the `token_to_kv_pool` ... give a headroom for it"): the
  target's pool grows past the profiled budget by that headroom.
* 0.5.7 to 0.5.13: the headroom is gone; both pools hold the profiled tokens.
* 0.5.14 on: the draft's KV is sized inside the budget: the cell grows to ``int(cell x (1 + draft_layers /
  layers))`` (``pool_configurator.py``: "scale cell_size to account for draft model KV cache", assuming the
  draft's per-layer KV size equals the target's); only the draft's weights stay outside.

The draft's layers are its config's ``num_nextn_predict_layers`` (MTP) or its decoder layers
(``profile_max_num_token``: ``getattr(hf_config, "num_nextn_predict_layers", num_effective_layers)``).  EAGLE,
EAGLE-3 and NEXTN (MTP) run the EAGLE worker (``server_args.py``: "NEXTN shares the same implementation of
EAGLE"); a separate draft model is STANDALONE (0.5.3 on); n-gram (NGRAM, 0.5.3 on) loads nothing on the GPU.
Every EAGLE-family method, STANDALONE and NGRAM default ``max_running_requests`` to 48 (0.4.5 on), which sizes
the request table and the headroom.  The default fraction keeps more out for the draft (``server_args.py``:
+2 GiB at 0.4.8-0.5.9, +4 GiB for the EAGLE family and +6 GiB for STANDALONE at 0.5.10-0.5.13, none from 0.5.14).

**DP attention** (``--enable-dp-attention --dp-size N``): attention runs at ``tp / dp`` ranks per group
(``layers/dp_attention.py`` ``compute_dp_attention_world_info``), so a GQA cell counts ``kv_heads // (tp / dp)``
heads (``get_num_kv_heads(get_attention_tp_size())``; an MLA cell is the same latent at any tp) and each rank holds
``dp / tp`` of the attention weights; each DP group runs its own scheduler and pool.  The placement of the other
weights is model code: it is read here for DeepSeek's ``models/deepseek_v2.py`` (``DP_RULES``, its NEXTN draft
``NEXTN_DP_RULES``) and Qwen's ``models/qwen2_moe.py`` / ``qwen3_moe.py`` (``QWEN_MOE_DP_RULES``); other models are
refused (``models/llama.py``, for one, splits its attention over every tp rank).  With speculative decoding, DeepSeek's
MTP draft is modelled; SGLang refuses STANDALONE and NGRAM with DP attention; an EAGLE head (llama.py's layer) is
refused here.

**Topk and draft tokens** (``TOPK_RULES``): ``--speculative-eagle-topk`` enters the 0.4.5-0.5.6 headroom
(``steps x topk + num_draft_tokens`` per request) and ``--speculative-num-draft-tokens`` widens the request table
(0.5.1 on, ``serve/sglang_requests.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.analytic.layout import rank_params
from vramplan.analytic.weights import weights_bytes
from vramplan.errors import Problem, ScenarioError
from vramplan.spec.model import ModelSpec
from vramplan.units import GiB

__all__ = [
    "DP_ATTENTION_ARCHS",
    "DP_FAMILIES",
    "DP_RULES",
    "NEXTN_DP_RULES",
    "QWEN_MOE_DP_RULES",
    "SGLANG_ALGORITHM",
    "SPEC_RULES",
    "TOPK_RULES",
    "DpFamily",
    "DpRule",
    "DraftShape",
    "DraftSizing",
    "NextnDpRule",
    "SpecRule",
    "TopkRule",
    "dp_attention_problems",
    "dp_family",
    "dp_rule_for",
    "draft_shape",
    "headroom_tokens",
    "model_draft",
    "mtp_draft",
    "mtp_layer_bytes",
    "nextn_dp_rule_for",
    "spec_rule_for",
]

SpecPool = Literal["draft_headroom", "shared_headroom", "shared", "cell_scaled"]
# scenario method -> SGLang's --speculative-algorithm
SGLANG_ALGORITHM = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "draft": "STANDALONE", "ngram": "NGRAM"}


def _v(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


@dataclass(frozen=True)
class SpecRule:
    """How one range of SGLang releases sizes the pools under speculative decoding, with its source.

    ``methods``: the scenario methods the release has; ``pool``: the rule of the module docstring;
    ``running_default``: ``max_running_requests`` when not given (None: the pool formula's);
    ``reserve_mib``: MiB the default fraction keeps out, by algorithm family (``eagle``: EAGLE, EAGLE3, NEXTN;
    ``standalone``; ``ngram``), read where the release's fraction rule reads it."""

    release: str
    methods: tuple[str, ...]
    pool: SpecPool
    running_default: int | None
    reserve_mib: tuple[tuple[str, int], ...]
    sources: tuple[str, ...]
    prefill_unchunked: bool = False  # EAGLE sets chunked_prefill_size = -1 and disables the radix cache

    def reserve_for(self, method: str) -> int:
        family = {"draft": "standalone", "ngram": "ngram"}.get(method, "eagle")
        return dict(self.reserve_mib).get(family, 0)


SPEC_RULES: tuple[SpecRule, ...] = (
    SpecRule(
        release="0.4.3", methods=("eagle",), pool="draft_headroom", running_default=None,
        reserve_mib=(("eagle", 2048),), prefill_unchunked=True,
        sources=(("0.4.3 wheel, model_executor/model_runner.py init_memory_pool: the target keeps its profiled "
                  "max_total_num_tokens; the draft worker's pool is draft_runner_cache_size = max_total_num_tokens + "
                  "max_num_reqs * speculative_num_steps + 100; server_args.py: --speculative-algorithm choices "
                  "['EAGLE'], and with EAGLE chunked_prefill_size = -1, disable_radix_cache = True ('The radix "
                  "cache, chunked prefill, and overlap scheduler are disabled because of using eagle speculative "
                  "decoding.'); 0.4.1 has no speculative decoding; 0.4.4 was not read and follows this row"),),
    ),
    SpecRule(
        release="0.4.5", methods=("eagle", "eagle3", "mtp"), pool="shared_headroom", running_default=48,
        reserve_mib=(("eagle", 2048),),
        sources=(("0.4.5, 0.4.6 and 0.4.8 wheels, model_runner.py init_memory_pool: draft_runner_cache_size = "
                  "max_total_num_tokens + max_num_reqs * speculative_num_steps * speculative_eagle_topk + max_num_reqs "
                  "* speculative_num_draft_tokens + 100, and the target's max_total_num_tokens is set to it ('Target "
                  "worker and draft worker shares the same indices for the token_to_kv_pool'); server_args.py: "
                  "choices EAGLE, EAGLE3, NEXTN (NEXTN becomes EAGLE), max_running_requests = 48 when not given; "
                  "0.4.8's reserved_mem += 2 * 1024 with speculative decoding ('draft model and larger cuda graph "
                  "buffers')"),),
    ),
    SpecRule(
        release="0.5.3", methods=("eagle", "eagle3", "mtp", "draft", "ngram"), pool="shared_headroom",
        running_default=48, reserve_mib=(("eagle", 2048), ("standalone", 6144)),
        sources=(("0.5.3, 0.5.5 and 0.5.6 wheels: the 0.4.5 pool rule, for EAGLE-family and STANDALONE "
                  "(spec_algorithm.is_eagle() or is_standalone()); server_args.py choices add STANDALONE and NGRAM, "
                  "both defaulting max_running_requests to 48; _handle_gpu_memory_settings adds, after the 10 GiB "
                  "floor, 6 * 1024 MiB for STANDALONE ('standalone draft model and cuda graphs'), 2 * 1024 for the "
                  "others but NGRAM ('eagle draft models and cuda graphs'); 0.4.9 to 0.5.2 were not read for "
                  "STANDALONE and NGRAM and follow the 0.4.5 row"),),
    ),
    SpecRule(
        release="0.5.7", methods=("eagle", "eagle3", "mtp", "draft", "ngram"), pool="shared", running_default=48,
        reserve_mib=(("eagle", 2048), ("standalone", 6144)),
        sources=(("0.5.7 wheel, model_executor/model_runner_kv_cache_mixin.py init_memory_pool: "
                  "draft_runner_cache_size = max_total_num_tokens (no headroom); 0.5.8 and 0.5.9 server_args.py keep "
                  "2 * 1024 MiB for the EAGLE family"),),
    ),
    SpecRule(
        release="0.5.10", methods=("eagle", "eagle3", "mtp", "draft", "ngram"), pool="shared", running_default=48,
        reserve_mib=(("eagle", 4096), ("standalone", 6144)),
        sources=(("0.5.10 to 0.5.13 wheels, server_args.py _handle_gpu_memory_settings: reserved_mem += 4 * 1024 "
                  "for the EAGLE family after the floor; model_runner_kv_cache_mixin.py: the draft worker reuses "
                  "the target's memory_pool_config (same max_total_num_tokens)"),),
    ),
    SpecRule(
        release="0.5.14", methods=("eagle", "eagle3", "mtp", "draft", "ngram"), pool="cell_scaled",
        running_default=48, reserve_mib=(),
        sources=(("0.5.14 wheel, model_executor/pool_configurator.py: for EAGLE/STANDALONE the target's cell_size "
                  "= int(cell_size * (1 + eagle_draft_num_layers / num_layers)), eagle_draft_num_layers being the "
                  "draft config's num_nextn_predict_layers or else max(num_hidden_layers, num_attention_layers) "
                  "(model_runner.py); the speculative reserve leaves _handle_gpu_memory_settings; "
                  "arg_groups/speculative_hook.py keeps max_running_requests = 48; 0.5.23's pool_configurator.py "
                  "adds int(cell * draft_layers / layers) to the cell, the same integer"),),
    ),
)


def spec_rule_for(release: tuple[int, int, int], method: str) -> SpecRule:
    """The speculative rule of ``release``; refuses a release before the first read and a method it lacks."""
    rows = [s for s in SPEC_RULES if _v(s.release) <= release]
    if not rows:
        raise ScenarioError([Problem("serve.speculative", "SGLang before 0.4.3 was not read for speculative "
                                     "decoding (0.4.1 has none)", "use serve.sglang_version >= 0.4.3")])
    rule = rows[-1]
    if method not in rule.methods:
        first = next(s.release for s in SPEC_RULES if method in s.methods)
        raise ScenarioError([Problem("serve.speculative.method", f"SGLang's --speculative-algorithm "
                                     f"{SGLANG_ALGORITHM[method]} is not in the releases read before {first}",
                                     f"use serve.sglang_version >= {first}, or method "
                                     + " / ".join(rule.methods))])
    return rule


def headroom_tokens(rule: SpecRule, max_num_reqs: int, steps: int, topk: int, draft_tokens: int) -> int:
    """Tokens the shared pool adds past the profiled budget (``shared_headroom``) or the draft pool adds
    (``draft_headroom``).  0.4.5 with 48 requests, 3 steps, topk 1, 4 draft tokens: 48 x (3 + 4) + 100 = 436."""
    if rule.pool == "shared_headroom":
        return max_num_reqs * (steps * topk + draft_tokens) + 100
    if rule.pool == "draft_headroom":
        return max_num_reqs * steps + 100
    return 0


@dataclass(frozen=True)
class TopkRule:
    """What one range of releases does with ``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens``
    (``server_args.py``, later ``arg_groups/speculative_hook.py``).

    ``paged``: topk > 1 with page_size > 1 is set back to topk 1 (``to_one``), accepted, or ``raises`` a
    ValueError unless ``--attention-backend`` is one of ``backends``; ``forced``: at topk 1 the draft tokens are
    set to steps + 1 ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when
    speculative_eagle_topk == 1")."""

    release: str
    paged: Literal["to_one", "accepted", "raises"]
    backends: tuple[str, ...]
    forced: bool
    sources: tuple[str, ...]


TOPK_RULES: tuple[TopkRule, ...] = (
    TopkRule(release="0.4.5", paged="to_one", backends=(), forced=False,
             sources=(("0.4.5 wheel, server_args.py:353-355: 'if self.page_size > 1 and self.speculative_eagle_topk > "
                       "1: self.speculative_eagle_topk = 1' ('speculative_eagle_topk is changed to 1 when page_size "
                       "> 1'); the draft tokens are kept as given"),)),
    TopkRule(release="0.4.6", paged="to_one", backends=(), forced=True,
             sources=(("0.4.6 wheel, server_args.py:342 (topk to 1 with pages) and :350-355 (num_draft_tokens = "
                       "steps + 1 at topk 1); the same in 0.4.7 (:458, :466) and 0.4.8 (:487, :494)"),)),
    TopkRule(release="0.4.9", paged="accepted", backends=(), forced=True,
             sources=(("0.4.9 wheel, server_args.py:503-510: the topk-1 adjustment only, no page check; the same in "
                       "0.4.10 (:533) and 0.5.1 (:671)"),)),
    TopkRule(release="0.5.2", paged="raises", backends=("flashinfer",), forced=True,
             sources=(("0.5.2 wheel, server_args.py:784-791: ValueError('speculative_eagle_topk > 1 with page_size > 1 "
                       "is unstable and produces incorrect results for paged attention backends. This combination "
                       "is only supported for the 'flashinfer' backend.') unless attention_backend == 'flashinfer'; "
                       "the same in 0.5.3 (:1119)"),)),
    TopkRule(release="0.5.6", paged="raises", backends=("flashinfer", "fa3"), forced=True,
             sources=(("0.5.6 wheel, server_args.py:1755: attention_backend not in ['flashinfer', 'fa3'] raises; the "
                       "same in 0.5.7 (:2084), 0.5.9 (:2455), 0.5.10 (:3083-3090) and 0.5.12 (:3840); 0.5.4 and 0.5.5 "
                       "were not read and follow the 0.5.2 row"),)),
    TopkRule(release="0.5.13", paged="raises", backends=("flashinfer", "fa3", "triton"), forced=True,
             sources=(("0.5.13 wheel, arg_groups/speculative_hook.py:376-383: _PAGE_TREE_SPEC_BACKENDS = ('flashinfer', "
                       "'fa3', 'triton'); the same in 0.5.14 (:395) and 0.5.23 (:1274)"),)),
)


@dataclass(frozen=True)
class DraftShape:
    """``--speculative-eagle-topk`` and ``--speculative-num-draft-tokens`` as the release runs them, and a note
    where it changed what was given ("" if nothing)."""

    topk: int
    draft_tokens: int
    note: str = ""


def draft_shape(release: tuple[int, int, int], method: str, steps: int, topk: int, draft_tokens: int | None,
                page: int) -> DraftShape:
    """The topk and draft tokens of ``method`` at ``release`` (``TOPK_RULES``); refuses what SGLang refuses and
    what was not read.  NGRAM takes its breadth from ``--speculative-ngram-max-bfs-breadth`` and 12 draft tokens
    by default (server_args.py 0.5.3: speculative_ngram_max_match_window_size = 12; 0.5.10: 12)."""
    if method == "ngram":
        if topk != 1:
            raise ScenarioError([Problem("serve.speculative.eagle_topk", "SGLang's NGRAM sets the topk to "
                                         "--speculative-ngram-max-bfs-breadth: --speculative-eagle-topk is not read",
                                         "remove serve.speculative.eagle_topk (ngram)")])
        return DraftShape(1, draft_tokens or 12)
    rows = [t for t in TOPK_RULES if _v(t.release) <= release]
    if not rows:
        if topk != 1 or draft_tokens is not None:
            raise ScenarioError([Problem("serve.speculative.eagle_topk" if topk != 1 else
                                         "serve.speculative.num_draft_tokens",
                                         "SGLang 0.4.3-0.4.4 was not read for the topk and draft tokens (its draft "
                                         "pool adds max_num_reqs x steps + 100 whatever they are)",
                                         "use serve.sglang_version >= 0.4.5, or topk 1 and no num_draft_tokens")])
        return DraftShape(1, steps + 1)
    rule, note = rows[-1], ""
    if topk > 1 and page > 1:
        if rule.paged == "to_one":
            topk, note = 1, (f"--speculative-eagle-topk set to 1 because page_size > 1 (SGLang {rule.release} "
                             "server_args.py)")
        elif rule.paged == "raises":
            raise ScenarioError([Problem("serve.speculative.eagle_topk", "SGLang raises 'speculative_eagle_topk > 1 "
                                         "with page_size > 1' unless --attention-backend is one of "
                                         f"{', '.join(rule.backends)} (server_args.py, {rule.release} on); the "
                                         "attention backend is not an input here",
                                         "use eagle_topk 1, or serve.page_size 1")])
    if topk > 1 and draft_tokens is None:
        raise ScenarioError([Problem("serve.speculative.num_draft_tokens", "with eagle_topk > 1 SGLang needs "
                                     "--speculative-num-draft-tokens (its automatic choice applies only when no "
                                     "steps are given)", "give serve.speculative.num_draft_tokens, e.g. "
                                     f"{steps * topk + 1} (steps x topk + 1, every drafted token)")])
    if topk == 1 and (draft_tokens is None or rule.forced):
        if draft_tokens is not None and draft_tokens != steps + 1:
            adjusted = (f"--speculative-num-draft-tokens {draft_tokens} adjusted to steps + 1 = {steps + 1} at topk 1 "
                        f"(SGLang {rule.release} server_args.py)")
            note = f"{note}; {adjusted}" if note else adjusted
        return DraftShape(1, steps + 1, note)
    return DraftShape(topk, draft_tokens or steps + 1, note)


@dataclass(frozen=True)
class DpRule:
    """How one range of releases places DeepSeek's weights under DP attention (``models/deepseek_v2.py``).

    ``dp_is_tp``: ``--enable-dp-attention`` sets ``dp_size = tp_size`` (0.4.1-0.4.3); ``chunk_divisor``: ``dp``
    (chunked_prefill_size // dp_size) or 2; ``embed``/``lm_head``: ``replicated``, ``tp`` (vocabulary split over
    all ranks) or ``attn_tp`` (over the attention group)."""

    release: str
    dp_is_tp: bool
    chunk_by_dp: bool
    embed: Literal["replicated", "attn_tp", "tp"]
    lm_head: Literal["replicated", "attn_tp", "tp"]
    sources: tuple[str, ...]


DP_RULES: tuple[DpRule, ...] = (
    DpRule(release="0.4.1", dp_is_tp=True, chunk_by_dp=False, embed="replicated", lm_head="replicated",
           sources=(("0.4.1 and 0.4.3 wheels: server_args.py 'if self.enable_dp_attention: self.dp_size = "
                     "self.tp_size; self.chunked_prefill_size = self.chunked_prefill_size // 2'; models/deepseek_v2.py:"
                     " the attention projections ReplicatedLinear, VocabParallelEmbedding(enable_tp=not "
                     "enable_dp_attention), lm_head ReplicatedLinear (0.4.2 and 0.4.4 were not read)"),)),
    DpRule(release="0.4.5", dp_is_tp=False, chunk_by_dp=True, embed="replicated", lm_head="tp",
           sources=(("0.4.5 to 0.5.7 wheels: server_args.py asserts dp_size > 1 and tp_size % dp_size == 0, "
                     "chunked_prefill_size //= dp_size; deepseek_v2.py: attention at get_attention_tp_size() = tp / "
                     "dp, embedding enable_tp=not is_dp_attention_enabled() (replicated), lm_head ParallelLMHead over "
                     "the tensor-parallel group (enable_dp_lm_head off by default)"),)),
    DpRule(release="0.5.8", dp_is_tp=False, chunk_by_dp=True, embed="attn_tp", lm_head="tp",
           sources=(("0.5.8 to 0.5.12 wheels, deepseek_v2.py: VocabParallelEmbedding(use_attn_tp_group="
                     "is_dp_attention_enabled()): the embedding split over the attention group; 0.5.13 to 0.5.23: "
                     "**get_embedding_tp_kwargs() (layers/vocab_parallel_embedding.py), the same layout unless "
                     "SGLANG_ENABLE_EMBED_REPLICATION is set (assumed not)"),)),
)


# Qwen2-MoE and Qwen3-MoE (models/qwen2_moe.py, models/qwen3_moe.py; Qwen3MoeModel is a Qwen2MoeModel, its
# embedding the same): attention over the attention group from 0.4.7, the MoE and LM head as without DP attention
QWEN_MOE_DP_RULES: tuple[DpRule, ...] = (
    DpRule(release="0.4.7", dp_is_tp=False, chunk_by_dp=True, embed="replicated", lm_head="tp",
           sources=(("0.4.7 wheel: models/qwen2_moe.py:211 and qwen3_moe.py:362 attn_tp_size = get_attention_tp_size() "
                     "(heads and KV heads split over the attention group); qwen2_moe.py:403 VocabParallelEmbedding("
                     "enable_tp=not enable_dp_attention) (replicated); :499 and qwen3_moe.py:686 ParallelLMHead("
                     "use_attn_tp_group=enable_dp_lm_head) (over tp); 0.4.6 splits no attention over the group; the "
                     "same in 0.4.8 to 0.5.8 (qwen2_moe.py:570 at 0.5.8)"),)),
    DpRule(release="0.5.9", dp_is_tp=False, chunk_by_dp=True, embed="attn_tp", lm_head="tp",
           sources=(("0.5.9 wheel, models/qwen2_moe.py:574 VocabParallelEmbedding(use_attn_tp_group="
                     "is_dp_attention_enabled()); the same in 0.5.10, 0.5.14 (:832; attention at get_parallel()."
                     "attn_tp_size, qwen3_moe.py:461) and 0.5.23 (:1115, qwen3_moe.py:502)"),)),
)


@dataclass(frozen=True)
class DpFamily:
    """Models whose placement under DP attention was read: their architectures, rule table and name; ``mla``: the
    table holds for the MLA variant only."""

    name: str
    archs: tuple[str, ...]
    rules: tuple[DpRule, ...]
    mla: bool


DP_FAMILIES: tuple[DpFamily, ...] = (
    DpFamily("DeepSeek-V2/V3", ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"), DP_RULES, True),
    DpFamily("Qwen2-MoE/Qwen3-MoE", ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"), QWEN_MOE_DP_RULES, False),
)


def dp_family(archs: list[str]) -> DpFamily | None:
    return next((f for f in DP_FAMILIES if any(a in f.archs for a in archs)), None)


def dp_rule_for(release: tuple[int, int, int], archs: list[str] | None = None) -> DpRule:
    """The DP attention rule of ``release`` for the family of ``archs`` (DeepSeek's when none is recognised:
    ``dp_attention_problems`` refuses an unread family)."""
    family = dp_family(archs or []) or DP_FAMILIES[0]
    rows = [d for d in family.rules if _v(d.release) <= release]
    if not rows:
        first = family.rules[0].release
        given = ".".join(str(x) for x in release)
        raise ScenarioError([Problem("serve.dp_attention", f"SGLang {given} is before {first}, the first release read "
                                     f"for DP attention on {family.name}" + (" (0.4.6 splits no Qwen-MoE attention over the attention "
                                                            "group)" if family is not DP_FAMILIES[0] else ""),
                                     f"use serve.sglang_version >= {first}")])
    return rows[-1]


@dataclass(frozen=True)
class NextnDpRule:
    """How one range of releases places DeepSeek's NEXTN (MTP) draft under DP attention (``models/deepseek_nextn.py``):
    its decoder layer is the target's (``DeepseekV2DecoderLayer``: attention over the attention group), its
    ``embed_tokens`` follows the target's embedding (``DP_RULES``), and its ``shared_head.head`` is ``head``:
    ``replicated`` (``ReplicatedLinear``) or ``tp`` (``ParallelLMHead`` over the tensor-parallel group,
    ``enable_dp_lm_head`` off)."""

    release: str
    head: Literal["replicated", "tp"]
    sources: tuple[str, ...]


NEXTN_DP_RULES: tuple[NextnDpRule, ...] = (
    NextnDpRule(release="0.4.5", head="replicated",
                sources=(("0.4.5 wheel, models/deepseek_nextn.py:67 VocabParallelEmbedding(enable_tp=not "
                          "enable_dp_attention) and :135-141 'if global_server_args_dict[\"enable_dp_attention\"]: "
                          "self.lm_head = ReplicatedLinear(hidden_size, vocab_size)'; the same in 0.4.6 (:151) and "
                          "0.4.7 (:132)"),)),
    NextnDpRule(release="0.4.8", head="tp",
                sources=(("0.4.8 wheel, models/deepseek_nextn.py:141-146 ParallelLMHead(vocab_size, hidden_size, "
                          "use_attn_tp_group=enable_dp_lm_head) only; the same in 0.5.3 (:150), 0.5.7 (:220), 0.5.10, "
                          "0.5.14 (:310, embedding **get_embedding_tp_kwargs()) and 0.5.23 (:294)"),)),
)


def nextn_dp_rule_for(release: tuple[int, int, int]) -> NextnDpRule | None:
    rows = [n for n in NEXTN_DP_RULES if _v(n.release) <= release]
    return rows[-1] if rows else None


# architectures whose placement under DP attention was read (DP_FAMILIES)
DP_ATTENTION_ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")


def dp_attention_problems(m: ModelSpec, archs: list[str], tp: int, dp: int, rule: DpRule,
                          method: str | None, release: tuple[int, int, int] = (0, 5, 3)) -> list[Problem]:
    """Why DP attention at ``dp`` cannot be answered for this model and tp (SGLang's own asserts, and what is not
    modelled)."""
    out: list[Problem] = []
    family = dp_family(archs)
    if family is None or (family.mla and m.mla is None):
        out.append(Problem("serve.dp_attention", "DP attention is modelled for "
                           + " and ".join(f.name for f in DP_FAMILIES) + " only: where SGLang places the other "
                           "models' attention, embedding and head under it was not read (models/llama.py, for one, "
                           "splits its attention over all tp ranks)",
                           "remove serve.dp_attention (or use a DeepSeek-V2/V3 or Qwen-MoE model)"))
    elif m.mla is None and not tp % dp and m.num_kv_heads < tp // dp:
        out.append(Problem("serve.dp_attention", f"attention groups of {tp // dp} ranks over {m.num_kv_heads} KV heads "
                           "replicate KV heads inside the group, not modelled under DP attention",
                           f"choose serve.dp_attention >= {tp // m.num_kv_heads if m.num_kv_heads else tp}"))
    if tp % dp or dp > tp:
        out.append(Problem("serve.dp_attention", f"SGLang asserts tp_size % dp_size == 0 (tp {tp}, dp {dp})",
                           "choose serve.dp_attention dividing parallel.tp"))
    elif rule.dp_is_tp and dp != tp:
        out.append(Problem("serve.dp_attention", f"SGLang {rule.release} to 0.4.4 set dp_size = tp_size with "
                           f"--enable-dp-attention (tp {tp}, dp {dp})",
                           f"use serve.dp_attention {tp}, or serve.sglang_version >= 0.4.5"))
    if method == "draft":
        out.append(Problem("serve.dp_attention", "SGLang: 'Currently standalone speculative decoding does not "
                           "support dp attention.' (server_args.py, 0.5.3 on)", "remove one of the two"))
    elif method == "ngram":
        out.append(Problem("serve.dp_attention", "SGLang: 'Currently ngram speculative decoding does not support dp "
                           "attention.' (server_args.py:1160 at 0.5.3; arg_groups/speculative_hook.py:1370 at 0.5.23)",
                           "remove one of the two"))
    elif method in ("eagle", "eagle3"):
        out.append(Problem("serve.dp_attention", "an EAGLE head under DP attention is not modelled: its decoder layer "
                           "is llama.py's, whose attention is not split over the attention group (models/llama.py reads "
                           "no get_attention_tp_size at 0.5.10), so where its weights and KV sit was not established",
                           "use method mtp (DeepSeek's NEXTN layers, modelled), or remove serve.dp_attention"))
    elif method == "mtp" and nextn_dp_rule_for(release) is None:
        out.append(Problem("serve.dp_attention", "MTP (NEXTN) with DP attention was not read before SGLang 0.4.5",
                           "use serve.sglang_version >= 0.4.5"))
    return out


@dataclass(frozen=True)
class DraftSizing:
    """The draft worker as SGLang builds it on one rank.

    ``layers``: the draft's KV layers (0: unknown or none); ``cell_bytes``: bytes per token of its own pool
    (0: unknown or none); ``resident_bytes``: its weights once started (an MTP layer or EAGLE head shares the
    target's embedding and LM head, ``set_embed_and_head``); ``load_bytes``: what it holds when loaded, its own
    embedding and head copies included (freed after ``set_embed_and_head``, after the target's pool is sized:
    sgl-project/sglang issue #36452); ``note``: where the figures came from."""

    layers: int
    cell_bytes: int
    resident_bytes: int
    load_bytes: int
    note: str


def mtp_layer_bytes(m: ModelSpec, tp: int, ep: int, expert_tp: int, dense_bytes: int, quant: str) -> int:
    """One multi-token-prediction layer on one rank, as SGLang's NEXTN draft (``models/deepseek_nextn.py``) and
    vLLM's MTP proposer (``model_executor/models/deepseek_mtp.py`` / ``glm4_moe_mtp.py``
    ``*MultiTokenPredictorLayer``) build it: a decoder layer shaped like the target's last (its MoE included,
    stored as the target's, ``quant``), ``eh_proj`` (nn.Linear 2h -> h, replicated, in the model dtype) and three
    RMSNorms (``enorm``, ``hnorm`` and the shared head's ``norm``); without the embedding and head copies (their
    fate differs by engine and release).  ``expert_tp``: the ranks a routed expert is split over (``moe_split``)."""
    rp = rank_params(m, tp, m.num_layers, ep, m.num_layers - 1, None, expert_tp=expert_tp)
    layer = weights_bytes(rp, dense_bytes, quant) - rp.outside_layers * dense_bytes
    h = m.hidden_size
    return layer + (2 * h * h + 3 * h) * dense_bytes


def mtp_draft(m: ModelSpec, nextn: int, tp: int, ep: int, dense_bytes: int, quant: str, target_cell_per_layer: int,
              embed_split: int, head_split: int | None = None) -> DraftSizing:
    """DeepSeek's NEXTN draft (``models/deepseek_nextn.py``): ``nextn`` decoder layers shaped like the target's
    last, ``eh_proj`` (nn.Linear 2h -> h, replicated), ``enorm``, ``hnorm`` and the shared head's norm, and its own
    ``embed_tokens`` and ``shared_head.head`` (vocab x h each, split over ``embed_split`` and ``head_split`` ranks
    -- the latter ``embed_split`` when None --, in the model dtype) until ``set_embed_and_head`` replaces them.
    Under DP attention ``m`` is the model as placed there (its attention over the attention group).  With --ep-size
    ``ep`` each expert is split over tp / ep ranks (moe_tp_size, serve/vllm.py ``moe_split``)."""
    h = m.hidden_size
    resident = nextn * mtp_layer_bytes(m, tp, ep, max(1, tp // ep), dense_bytes, quant)
    head_split = embed_split if head_split is None else head_split
    copies = (-(-m.vocab_size // embed_split) + -(-m.vocab_size // head_split)) * h * dense_bytes
    return DraftSizing(nextn, target_cell_per_layer * nextn, resident, resident + copies,
                       (f"MTP draft: {nextn} NEXTN layer(s) shaped like the target's last decoder layer, eh_proj and "
                        f"norms ({resident / GiB:.2f} GiB); its own embedding and head copies "
                        f"({copies / GiB:.2f} GiB) until set_embed_and_head shares the target's"))


def model_draft(draft: ModelSpec, tp: int, dense_bytes: int, kv_elem_bytes: int, method: str) -> DraftSizing:
    """A draft model or EAGLE head read from its config: all its parameters at the model dtype (unquantized), its
    decoder layers for the KV pool (the draft worker's cell: ``kv_heads // tp x head_dim x layers x 2 x elem``).
    An EAGLE head shares the target's embedding and head once started (``set_embed_and_head``); an EAGLE-3 head
    shares the embedding only and keeps its own LM head (``speculative/eagle_worker.py``: "most cases EAGLE3 models
    don't share lm_head", ``set_embed``; a config with ``load_lm_head_from_target`` shares both, not read here); a
    STANDALONE draft keeps its own."""
    rp = rank_params(draft, tp, 1, 1, 0, None)
    load = weights_bytes(rp, dense_bytes, "none")
    shared = 0
    if method != "draft":
        roles = ("embedding",) if method == "eagle3" else ("embedding", "lm_head")
        shared = sum(-(-p.numel // tp) * p.count for p in draft.params if p.role in roles)
    if draft.mla is not None:
        cell = (draft.mla.kv_lora_rank + draft.mla.qk_rope_head_dim) * draft.num_layers * kv_elem_bytes
    else:
        cell = max(1, draft.num_kv_heads // tp) * draft.head_dim * draft.num_layers * 2 * kv_elem_bytes
    resident = load - shared * dense_bytes
    return DraftSizing(draft.num_layers, cell, resident, load,
                       f"draft {draft.name}: {draft.num_layers} layer(s), {resident / GiB:.2f} GiB of weights once "
                       f"started ({load / GiB:.2f} GiB as loaded), unquantized")
