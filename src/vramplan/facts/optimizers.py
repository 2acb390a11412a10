"""Optimizers as data: one frozen record per ``train.optimizer`` value.

Each row says what the optimizer keeps (its state tensors, their dtypes and block scales, the
small-tensor rule), which step temporaries it makes (a strategy *name*; the strategies are code in
``analytic/optimizer.py``), where its states live (torch's caching allocator or CUDA managed
memory), and how every other part of vramplan names or builds it: the Hugging Face Trainer's
``optim`` string, the class ``vramplan measure`` constructs, how the traced engine emulates it, and
whether the planner searches it.  The engine (``analytic/optimizer.py``), the planner's lower bound
(``plan/bound.py``), the step-time traffic (``plan/steptime/memory_bound.py``), the exporters, the
traced engine (``trace/optim.py``), ``measure/build.py`` and the scenario schema read these rows;
adding an optimizer whose step temporaries follow a known strategy is one row
(``docs/checklists/optimizer.md``).

States (bytes per trainable parameter; ``p`` = the bytes of the parameter the optimizer updates,
fp32 when the framework keeps fp32 masters, since torch optimizers allocate ``zeros_like(param)``):

=====================  ==================================================  =========================
optimizer              state                                               source
=====================  ==================================================  =========================
adamw, adamw-fused     exp_avg + exp_avg_sq: 2p                            torch.optim.AdamW
paged-adamw            2p, in CUDA managed memory (not torch's allocator)  bitsandbytes PagedAdamW
adamw-8bit             2 x uint8 + one fp32 absmax per 256: 2 + 8/256;     bitsandbytes AdamW8bit,
                       tensors under 4096 elements keep fp32 states (8 B)  arXiv 2110.02861 sec. 2
paged-adamw-8bit       as adamw-8bit, in managed memory                    bitsandbytes
adafactor              row + column second moments for matrices            transformers Adafactor,
                       (n + m fp32 elements), full for vectors             arXiv 1804.04235
sgd                    none                                                torch.optim.SGD
sgd-momentum           momentum_buffer: p                                  torch.optim.SGD
lion                   exp_avg: p                                          arXiv 2302.06675
muon                   hidden 2-D matrices: momentum_buffer p; the rest     torch.optim.Muon (2.13),
                       (embeddings, head, norms, biases): AdamW 2p          KellerJordan/Muon
galore-adamw           hidden matrices: 2 x r x max(out, in) moments + an   galore_torch GaLoreAdamW,
                       r x min(out, in) projection (r = 128); the rest 2p   arXiv 2403.03507
apollo                 as galore-adamw with r = 1 (APOLLO-Mini), random     apollo_torch APOLLOAdamW,
                       projection; the rest 2p                              arXiv 2412.05270
adam-mini              m: fp32 for every parameter; v: fp32 for the         zyushun/Adam-mini
                       embeddings and head, one scalar per block elsewhere  (Adam_mini.step)
adamw-8bit-torchao     2 x uint8 + one fp32 scale per 256: 2 + 8/256        torchao AdamW8bit
adamw-4bit             2 x 4-bit + one fp32 scale per 128: 1 + 8/128        torchao AdamW4bit
adamw-fp8              2 x fp8 e4m3 + one fp32 scale per 256: 2 + 8/256     torchao AdamWFp8
                       (torchao: tensors under 4096 values keep p)
schedule-free-adamw    z + exp_avg_sq: 2p (no first moment)                 schedulefree AdamWScheduleFree
came                   exp_avg fp32 + factored second moments and           came_pytorch CAME,
                       factored confidence (residual) rows and columns      arXiv 2307.02047
=====================  ==================================================  =========================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.facts import row_named
from vramplan.units import DTYPE_BITS

__all__ = [
    "BNB_BLOCK", "BNB_MIN_8BIT_SIZE", "OPTIMIZERS", "BlockScale", "Construct", "OptimizerFacts", "ParamSubset",
    "PlannerUse", "SmallTensorRule", "StateTensor", "StepTemporary", "SubsetLayout", "TraceEmulation",
    "hbm_bytes_per_param", "optimizer_facts", "optimizer_names", "planner_optimizers", "runs_as",
]

# bitsandbytes' blockwise 8-bit optimizer states: one fp32 absmax per block of 256 values
# (``Optimizer2State`` with ``block_wise=True``; the engines have always used 256).
BNB_BLOCK = 256
# bitsandbytes keeps 32-bit states for tensors with fewer values (``Optimizer8bit``'s
# ``min_8bit_size=4096``; torchao's low-bit AdamW follows it, ``torchao/optim/adam.py``).
BNB_MIN_8BIT_SIZE = 4096

StepTemporary = Literal["none", "foreach_sqrt_decay_group", "per_tensor_sign_update", "adafactor_stepwise",
                        "newton_schulz_matrix", "low_rank_projection", "adam_mini_stepwise", "came_stepwise"]
"""How the step's temporaries are sized (``analytic/optimizer.py`` ``STEP_TEMPORARIES``):

* ``none``: in place (fused AdamW, bitsandbytes kernels, SGD);
* ``foreach_sqrt_decay_group``: torch's ``_multi_tensor_adamw`` allocates ``_foreach_sqrt(exp_avg_sqs)``,
  one second-moment-sized tensor per parameter of a group, alive together; the largest group is the
  Trainer's weight-decay group;
* ``per_tensor_sign_update``: ``exp_avg.clone().mul_(b1).add(grad).sign_()`` per parameter (Lion):
  two first-moment-sized tensors of the largest parameter;
* ``adafactor_stepwise``: transformers' ``Adafactor.step``, one parameter at a time in fp32
  (``analytic/optimizer.py`` ``adafactor_step_bytes``);
* ``newton_schulz_matrix``: torch.optim.Muon's Nesterov update and bf16 Newton-Schulz iteration of one
  hidden matrix at a time (``muon_step_bytes``);
* ``low_rank_projection``: GaLore's / APOLLO's AdamW, one parameter at a time: the low-rank update and
  its full-size projection back (and GaLore's fp32 SVD of the gradient) (``low_rank_step_bytes``);
* ``adam_mini_stepwise``: Adam-mini's fp32 gradient copy and update of one parameter at a time;
* ``came_stepwise``: CAME's fp32 update and instability of one parameter at a time (``came_step_bytes``).
"""

TraceEmulation = Literal["construct", "lion_reference", "bnb_state_layout", "state_layout", "muon_split"]
"""How the traced engine (``trace/optim.py``) gets the optimizer on the meta device: ``construct``
builds the record's class; ``lion_reference`` runs lion-pytorch's update; ``bnb_state_layout``
allocates the row's states as bitsandbytes does (its CUDA kernels cannot run on meta tensors);
``state_layout`` allocates the row's states (block scales, small tensors, the subset's low-rank
moments and projections, factored rows and columns) for a library that is not installed or cannot run
on meta tensors, with no step temporaries; ``muon_split`` builds ``torch.optim.Muon`` over the hidden
matrices and fused ``torch.optim.AdamW`` over the rest."""

ParamSubset = Literal["hidden_matrices", "embedding_head"]
"""Which parameters a row's ``subset`` layout covers: ``hidden_matrices``, the decoder's 2-D linear
weights (attention and MLP projections, experts; not the embeddings, the LM head, norms or biases:
Muon's, GaLore's and APOLLO's targets); ``embedding_head``, the input embeddings and the untied LM head
(Adam-mini's ``embd_names``)."""

PlannerUse = Literal["full", "peft"]
"""Searched by the planner for full fine-tuning with the Hugging Face Trainer (``full``) and for
LoRA/QLoRA (``peft``), in table order (``plan/space.py``)."""


@dataclass(frozen=True, kw_only=True)
class BlockScale:
    """One scale per ``block`` consecutive values of a quantized state (blockwise quantization)."""

    key: str  # the scale's name in ``optimizer.state[p]``
    dtype: str  # a ``units.DTYPE_BITS`` name
    block: int  # values per scale


@dataclass(frozen=True, kw_only=True)
class StateTensor:
    """One state tensor per parameter (``optimizer.state[p][name]``)."""

    name: str
    dtype: str | None = None  # a DTYPE_BITS name; None: the updated parameter's dtype (``zeros_like(p)``)
    scale: BlockScale | None = None
    factored: bool = False  # Adafactor: a matrix keeps a row or column vector instead (n + m values)
    matrices_only: bool = False  # factored state that vectors do not keep (CAME's confidence rows and columns)

    def bits_per_element(self, param_bytes: int) -> int:
        """Bits of one stored value (the scales aside); 4-bit states are packed two per byte."""
        return 8 * param_bytes if self.dtype is None else DTYPE_BITS[self.dtype]

    def bytes_per_element(self, param_bytes: int) -> int:
        """Whole bytes of one stored value (the scales aside; 0 for a 4-bit state)."""
        return self.bits_per_element(param_bytes) // 8

    def bytes(self, numel: int, param_bytes: int) -> int:
        """Bytes of this state for a tensor of ``numel`` values, block scales included."""
        out = -(-numel * self.bits_per_element(param_bytes) // 8)
        if self.scale is not None:
            out += DTYPE_BITS[self.scale.dtype] // 8 * -(-numel // self.scale.block)
        return out

    def average_bytes(self, param_bytes: int) -> float:
        """Bytes per value of a large tensor, the block scales spread over their blocks."""
        out = self.bits_per_element(param_bytes) / 8
        if self.scale is not None:
            out += DTYPE_BITS[self.scale.dtype] / 8 / self.scale.block
        return out


@dataclass(frozen=True, kw_only=True)
class SmallTensorRule:
    """Tensors below ``below_elements`` values keep every state in ``dtype`` (no quantization, no scales)."""

    below_elements: int
    dtype: str | None  # None: the updated parameter's dtype (torchao's ``torch.zeros_like(p)``)


@dataclass(frozen=True, kw_only=True)
class SubsetLayout:
    """Another state layout for one subset of the trainable parameters (``params``); every other
    trainable parameter keeps the row's ``states``.

    ``rank`` 0: ``states`` per element of each tensor of the subset (Muon's momentum).  ``rank`` r > 0
    (GaLore, APOLLO): the gradient of an ``out x in`` matrix is projected to ``r x max(out, in)``, the
    ``states`` are sized on that projection, and a ``r x min(out, in)`` projection matrix in the
    gradient's dtype is kept per matrix (``GaLoreProjector.ortho_matrix``); ``projection`` says how it
    is made (``svd`` of the fp32 gradient every ``update_proj_gap`` steps, or ``random``)."""

    params: ParamSubset
    states: tuple[StateTensor, ...]
    rank: int = 0
    projection: Literal["none", "svd", "random"] = "none"


@dataclass(frozen=True, kw_only=True)
class Construct:
    """The real optimizer ``vramplan measure`` builds (and the traced engine, for ``construct`` rows):
    ``path`` imported, called as ``cls(param_groups, lr=lr, **kwargs)``."""

    path: str  # "torch.optim.AdamW"
    kwargs: tuple[tuple[str, bool | float], ...] = ()
    needs_cuda: bool = False  # bitsandbytes' optimizers run their update on CUDA only
    note_off_cuda: str | None = None  # said when measured on the CPU

    @property
    def package(self) -> str:
        """The top-level package to import (for the "needs X" check)."""
        return self.path.split(".")[0]


@dataclass(frozen=True, kw_only=True)
class OptimizerFacts:
    """Everything vramplan knows about one optimizer; every consumer reads this record."""

    name: str  # the scenario's ``train.optimizer`` value
    summary: str  # one line, for help texts and docs
    states: tuple[StateTensor, ...] = ()
    small_tensors: SmallTensorRule | None = None
    step_temporary: StepTemporary = "none"
    managed_memory: bool = False  # states in CUDA managed memory (bitsandbytes paged optimizers)
    hf_trainer_optim: str | None = None  # ``TrainingArguments(optim=...)``; None: not exportable
    construct: Construct | None = None  # None: nothing to build ("none")
    trace: TraceEmulation = "construct"
    deepspeed_runs_as: str | None = None  # the row DeepSpeed's engine actually runs for this name
    deepspeed_type: str | None = None  # DeepSpeed config ``optimizer.type``; None: not exportable to DeepSpeed
    torchtitan: tuple[str, str] | None = None  # torchtitan ``[optimizer]`` (name, implementation)
    planner: tuple[PlannerUse, ...] = ()
    sources: tuple[str, ...] = ()
    subset: SubsetLayout | None = None  # another layout for a subset of the parameters (Muon, GaLore, Adam-mini)
    hf_optim_args: str | None = None  # ``TrainingArguments(optim_args=...)`` the row's layout assumes
    hf_optim_target_modules: tuple[str, ...] = ()  # ``TrainingArguments(optim_target_modules=...)`` (GaLore)

    @property
    def factored(self) -> bool:
        """Adafactor-style factored states (sized from the tensor shapes, not the parameter count)."""
        return any(st.factored for st in self.states)

    def state_bytes_per_param(self, param_bytes: int) -> float:
        """Average state bytes per trainable parameter of a large tensor (0 for factored states); a
        hidden matrix's for rows whose subset layout covers them (0 for a low-rank subset)."""
        if self.subset is not None and self.subset.params == "hidden_matrices":
            if self.subset.rank:
                return 0.0
            return sum(st.average_bytes(param_bytes) for st in self.subset.states)
        if self.factored:
            return sum(st.average_bytes(param_bytes) for st in self.states if not st.factored)
        return sum(st.average_bytes(param_bytes) for st in self.states)

    def state_lower_bytes_per_param(self, param_bytes: int) -> int:
        """A lower bound of the state bytes per parameter for any tensor size: the stored values
        only (no scales, no small-tensor upcast); 0 for factored states (``plan/bound.py``)."""
        full = sum(st.bytes_per_element(param_bytes) for st in self.states if not st.factored)
        if self.subset is None:
            return full
        sub = 0 if self.subset.rank else sum(st.bytes_per_element(param_bytes) for st in self.subset.states)
        return min(full, sub)


_ADAMW_SRC = "torch.optim.AdamW (torch/optim/adamw.py); arXiv 1711.05101"
_BNB_SRC = "bitsandbytes.optim (optimizer.py: Optimizer2State.init_state); arXiv 2110.02861 sec. 2"
_FOREACH_NOTE = ("optimizer: AdamW with foreach=True, the CUDA default, so the CPU run has the GPU's step "
                 "temporaries")


def _adam_states() -> tuple[StateTensor, ...]:
    return (StateTensor(name="exp_avg"), StateTensor(name="exp_avg_sq"))


def _bnb8_states() -> tuple[StateTensor, ...]:
    return tuple(StateTensor(name=f"state{i}", dtype="uint8",
                             scale=BlockScale(key=f"absmax{i}", dtype="fp32", block=BNB_BLOCK)) for i in (1, 2))


_BNB_SMALL = SmallTensorRule(below_elements=BNB_MIN_8BIT_SIZE, dtype="fp32")
# torchao's low-bit AdamW (torchao/optim/adam.py, _AdamBase._new_buffer): tensors of at least 4096 values
# (and a multiple of the block size) get the quantized subclass, smaller ones ``torch.zeros_like(p)``
_TORCHAO_SMALL = SmallTensorRule(below_elements=BNB_MIN_8BIT_SIZE, dtype=None)
_TORCHAO_SRC = ("pytorch/ao torchao/optim/adam.py: _AdamBase._new_buffer, single_param_adam (commit 0372e5ff); "
                "torchao/optim/subclass_{}.py: OptimState{}.zeros")
# The Trainer's GaLore and APOLLO target the attention and MLP linears (transformers' docs examples,
# optim_target_modules=["attn", "mlp"]; GaLore's torchrun_main.py uses the same two names)
_LOW_RANK_TARGETS = ("attn", "mlp")


def _torchao_states(dtype: str, block: int) -> tuple[StateTensor, ...]:
    # exp_avg (signed) and exp_avg_sq (unsigned) are each ``codes`` plus one fp32 ``scale`` per block
    # (``torch.zeros(n // block_size)``, the default dtype); 4-bit codes are packed two per uint8
    return tuple(StateTensor(name=n, dtype=dtype, scale=BlockScale(key=f"{n}.scale", dtype="fp32", block=block))
                 for n in ("exp_avg", "exp_avg_sq"))

OPTIMIZERS: tuple[OptimizerFacts, ...] = (
    OptimizerFacts(
        name="adamw", summary="torch AdamW, foreach implementation (CUDA default)",
        states=_adam_states(), step_temporary="foreach_sqrt_decay_group", hf_trainer_optim="adamw_torch",
        construct=Construct(path="torch.optim.AdamW", kwargs=(("foreach", True),), note_off_cuda=_FOREACH_NOTE),
        # DeepSpeed's engine runs its FusedAdam (in place) for the Trainer's AdamW
        deepspeed_runs_as="adamw-fused", deepspeed_type="AdamW",
        sources=(_ADAMW_SRC, "torch/optim/optimizer.py: _default_to_fused_or_foreach"),
    ),
    OptimizerFacts(
        name="adamw-fused", summary="torch AdamW, fused=True (in place)",
        states=_adam_states(), hf_trainer_optim="adamw_torch_fused",
        construct=Construct(path="torch.optim.AdamW", kwargs=(("fused", True),)),
        torchtitan=("AdamW", "fused"), planner=("full", "peft"), sources=(_ADAMW_SRC,),
    ),
    OptimizerFacts(
        name="adamw-8bit", summary="bitsandbytes AdamW8bit (blockwise 8-bit states)",
        states=_bnb8_states(), small_tensors=_BNB_SMALL, hf_trainer_optim="adamw_bnb_8bit",
        construct=Construct(path="bitsandbytes.optim.AdamW8bit", needs_cuda=True), trace="bnb_state_layout",
        planner=("full", "peft"), sources=(_BNB_SRC,),
    ),
    OptimizerFacts(
        name="paged-adamw", summary="bitsandbytes PagedAdamW (fp32 states in CUDA managed memory)",
        # fp32 whatever the parameter dtype: bitsandbytes' Optimizer2State.init_state (optim/optimizer.py,
        # 0.43.1) sets dtype = torch.float32 for optim_bits=32 and allocates state1 and state2 with
        # get_state_buffer(p, dtype=torch.float32) (F.get_paged when paged): 8 B per parameter, also for
        # half parameters without fp32 masters (bf16-true)
        states=(StateTensor(name="state1", dtype="fp32"), StateTensor(name="state2", dtype="fp32")),
        managed_memory=True, hf_trainer_optim="paged_adamw_32bit",
        construct=Construct(path="bitsandbytes.optim.PagedAdamW", needs_cuda=True), trace="bnb_state_layout",
        planner=("full",), sources=(_BNB_SRC,),
    ),
    OptimizerFacts(
        name="paged-adamw-8bit", summary="bitsandbytes PagedAdamW8bit (8-bit states in managed memory)",
        states=_bnb8_states(), small_tensors=_BNB_SMALL, managed_memory=True, hf_trainer_optim="paged_adamw_8bit",
        construct=Construct(path="bitsandbytes.optim.PagedAdamW8bit", needs_cuda=True), trace="bnb_state_layout",
        planner=("full", "peft"), sources=(_BNB_SRC,),
    ),
    OptimizerFacts(
        name="adafactor", summary="transformers Adafactor (factored second moments, no momentum)",
        # grad.float(): the states are fp32 whatever the parameter dtype
        states=(StateTensor(name="exp_avg_sq_row", dtype="fp32", factored=True),
                StateTensor(name="exp_avg_sq_col", dtype="fp32", factored=True)),
        step_temporary="adafactor_stepwise", hf_trainer_optim="adafactor",
        construct=Construct(path="transformers.optimization.Adafactor",
                            kwargs=(("scale_parameter", False), ("relative_step", False), ("warmup_init", False))),
        sources=("transformers/optimization.py: Adafactor", "arXiv 1804.04235"),
    ),
    OptimizerFacts(
        name="sgd", summary="torch SGD (no state)", hf_trainer_optim="sgd",
        construct=Construct(path="torch.optim.SGD", kwargs=(("foreach", True),)),
        sources=("torch.optim.SGD",),
    ),
    OptimizerFacts(
        name="sgd-momentum", summary="torch SGD, momentum 0.9",
        states=(StateTensor(name="momentum_buffer"),),
        # the Trainer's "sgd" has no momentum argument: not exportable as a Trainer optim
        construct=Construct(path="torch.optim.SGD", kwargs=(("momentum", 0.9), ("foreach", True))),
        sources=("torch.optim.SGD",),
    ),
    OptimizerFacts(
        name="lion", summary="Lion (one momentum; bitsandbytes Lion when measured)",
        states=(StateTensor(name="exp_avg"),), step_temporary="per_tensor_sign_update",
        hf_trainer_optim="lion_32bit",
        construct=Construct(path="bitsandbytes.optim.Lion", needs_cuda=True), trace="lion_reference",
        sources=("arXiv 2302.06675", "lion-pytorch (lion_pytorch.py: update_fn)"),
    ),
    OptimizerFacts(
        name="muon", summary="Muon for the hidden matrices (torch.optim.Muon), fused AdamW for the rest",
        # the rest (embeddings, LM head, norms, biases): AdamW's two moments, fused (in place)
        states=_adam_states(),
        # torch.optim.Muon._init_group: state["momentum_buffer"] = torch.zeros_like(p.grad), 2-D parameters only
        subset=SubsetLayout(params="hidden_matrices", states=(StateTensor(name="momentum_buffer"),)),
        step_temporary="newton_schulz_matrix",
        # the Trainer (transformers 5.24 OptimizerNames) and torchtitan's [optimizer] name no Muon
        construct=Construct(path="torch.optim.Muon"), trace="muon_split",
        sources=(("torch/optim/_muon.py (torch 2.13): Muon._init_group, _single_tensor_muon, "
                  "_zeropower_via_newtonschulz"),
                 "KellerJordan/Muon muon.py: MuonWithAuxAdam (Muon for hidden matrices, Adam for the rest)"),
    ),
    OptimizerFacts(
        name="galore-adamw", summary="GaLore AdamW, rank 128 on the attention and MLP matrices (SVD projection)",
        # GaLoreAdamW.step: parameters outside the GaLore group keep exp_avg + exp_avg_sq = zeros_like(grad)
        states=_adam_states(),
        # project(): low_rank_grad = grad @ P.T (r x max(out, in)); exp_avg/exp_avg_sq = zeros_like(low_rank_grad);
        # P = Vh[:r] or U[:, :r] of the fp32 SVD, cast back to the gradient's dtype
        subset=SubsetLayout(params="hidden_matrices", states=_adam_states(), rank=128, projection="svd"),
        step_temporary="low_rank_projection", hf_trainer_optim="galore_adamw",
        hf_optim_args="rank=128,update_proj_gap=200,scale=0.25,proj_type=std",
        hf_optim_target_modules=_LOW_RANK_TARGETS,
        construct=Construct(path="galore_torch.GaLoreAdamW"), trace="state_layout",
        sources=(("jiaweizzhao/GaLore galore_torch/adamw.py: AdamW.step; galore_projector.py: GaLoreProjector."
                  "project, project_back, get_orthogonal_matrix (commit 1317b5f7)"),
                 ("transformers 5.24 trainer_optimizer.py: _get_galore_optimizer (rank 128, update_proj_gap 200, "
                  "scale 0.25, proj_type std), _setup_low_rank_optimizer (non-target parameters first)"),
                 "arXiv 2403.03507"),
    ),
    OptimizerFacts(
        name="apollo", summary="APOLLO-Mini AdamW: rank 1, tensor-wise scaling, random projection",
        states=_adam_states(),
        # APOLLOAdamW.step: the moments on the projected gradient, as GaLore's, with r = 1 (APOLLO-Mini)
        subset=SubsetLayout(params="hidden_matrices", states=_adam_states(), rank=1, projection="random"),
        step_temporary="low_rank_projection", hf_trainer_optim="apollo_adamw",
        hf_optim_args="proj=random,rank=1,scale=128,scale_type=tensor,update_proj_gap=200",
        hf_optim_target_modules=_LOW_RANK_TARGETS,
        construct=Construct(path="apollo_torch.APOLLOAdamW"), trace="state_layout",
        sources=("zhuhanqing/APOLLO apollo_torch/apollo.py: AdamW.step (fork yao-matrix/APOLLO, commit c0043eae)",
                 "scripts/pretrain_c4/llama_1b_apollo_mini.sh: rank 1, scale_type tensor, scale 128",
                 "arXiv 2412.05270"),
    ),
    OptimizerFacts(
        name="adam-mini", summary="Adam-mini: one second moment per block, AdamW for the embeddings and head",
        # Adam_mini.step: state["m"] = zeros_like(p, dtype=float32) for every parameter; "vmean" is one
        # fp32 value per head (q, k) or per tensor (the rest): not counted (an assumption line)
        states=(StateTensor(name="m", dtype="fp32"),),
        subset=SubsetLayout(params="embedding_head",
                            states=(StateTensor(name="m", dtype="fp32"), StateTensor(name="v", dtype="fp32"))),
        step_temporary="adam_mini_stepwise",
        construct=Construct(path="adam_mini.Adam_mini"), trace="state_layout",
        sources=("zyushun/Adam-mini adam_mini/adam_mini.py: Adam_mini.step (commit 11ee3058)", "arXiv 2406.16793"),
    ),
    OptimizerFacts(
        name="adamw-8bit-torchao", summary="torchao AdamW8bit (blockwise 8-bit states, block 256)",
        states=_torchao_states("uint8", 256), small_tensors=_TORCHAO_SMALL, hf_trainer_optim="adamw_torch_8bit",
        construct=Construct(path="torchao.optim.AdamW8bit"), trace="state_layout",
        sources=(_TORCHAO_SRC.format("8bit", "8bit"), "arXiv 2110.02861"),
    ),
    OptimizerFacts(
        name="adamw-4bit", summary="torchao AdamW4bit (blockwise 4-bit states, block 128)",
        states=_torchao_states("int4", 128), small_tensors=_TORCHAO_SMALL, hf_trainer_optim="adamw_torch_4bit",
        construct=Construct(path="torchao.optim.AdamW4bit"), trace="state_layout",
        sources=(_TORCHAO_SRC.format("4bit", "4bit"), "arXiv 2309.01507"),
    ),
    OptimizerFacts(
        name="adamw-fp8", summary="torchao AdamWFp8 (float8_e4m3fn states, one scale per 256)",
        # the Trainer (transformers 5.24 OptimizerNames) has no torchao fp8 AdamW: not exportable
        states=_torchao_states("fp8", 256), small_tensors=_TORCHAO_SMALL,
        construct=Construct(path="torchao.optim.AdamWFp8"), trace="state_layout",
        sources=(_TORCHAO_SRC.format("fp8", "Fp8"),),
    ),
    OptimizerFacts(
        name="schedule-free-adamw", summary="schedule-free AdamW (z and second moment, no first moment)",
        # AdamWScheduleFree.step: state["z"] = torch.clone(p.data), state["exp_avg_sq"] = zeros_like(p.data);
        # foreach=True (the default): denom = torch._foreach_sqrt(exp_avg_sq) over the group
        states=(StateTensor(name="z"), StateTensor(name="exp_avg_sq")),
        step_temporary="foreach_sqrt_decay_group", hf_trainer_optim="schedule_free_adamw",
        construct=Construct(path="schedulefree.AdamWScheduleFree"), trace="state_layout",
        sources=(("facebookresearch/schedule_free schedulefree/adamw_schedulefree.py: AdamWScheduleFree.step "
                  "(commit 00835729)"), "arXiv 2405.15682"),
    ),
    OptimizerFacts(
        name="came", summary="CAME (factored second moments and confidence, fp32 first moment)",
        # CAME.step: grad.float(); exp_avg = zeros_like(grad); matrices: exp_avg_sq_row/col and
        # exp_avg_res_row/col; vectors: exp_avg_sq = zeros_like(grad).  All fp32.
        states=(StateTensor(name="exp_avg", dtype="fp32"),
                StateTensor(name="exp_avg_sq_row", dtype="fp32", factored=True),
                StateTensor(name="exp_avg_sq_col", dtype="fp32", factored=True),
                StateTensor(name="exp_avg_res_row", dtype="fp32", factored=True, matrices_only=True),
                StateTensor(name="exp_avg_res_col", dtype="fp32", factored=True, matrices_only=True)),
        step_temporary="came_stepwise",
        construct=Construct(path="came_pytorch.CAME"), trace="state_layout",
        sources=("yangluo7/CAME came_pytorch/CAME.py: CAME.step (commit b368dc01)", "arXiv 2307.02047"),
    ),
    OptimizerFacts(name="none", summary="no optimizer (forward and backward only)"),
)


def optimizer_names() -> tuple[str, ...]:
    """The allowed ``train.optimizer`` values, in table order (read at call time)."""
    return tuple(f.name for f in OPTIMIZERS)


def optimizer_facts(name: str) -> OptimizerFacts:
    """The row for ``name``; KeyError names the known optimizers."""
    return row_named(OPTIMIZERS, name, "optimizer")


def runs_as(name: str, framework: str) -> str:
    """The row that really runs: DeepSpeed replaces the Trainer's AdamW by its own FusedAdam."""
    f = optimizer_facts(name)
    return f.deepspeed_runs_as if framework == "deepspeed" and f.deepspeed_runs_as else name


def planner_optimizers(use: PlannerUse) -> tuple[str, ...]:
    """The optimizers the planner searches for ``use``, in table order."""
    return tuple(f.name for f in OPTIMIZERS if use in f.planner)


def hbm_bytes_per_param(name: str, param_bytes: int, grad_bytes: int, master_bytes: int) -> float:
    """HBM bytes one optimizer step moves per trainable parameter held on the GPU (a fused update).

    Read the parameter, the gradient and every state (block scales included); write the parameter
    and every state.  States have the optimizer's parameter dtype (fp32 masters when
    ``master_bytes``).  AdamW with fp32 parameters and gradients (HF autocast): 4 + 4 + 8 read, 4 + 8
    written = 28 B; pure bf16: 7 x 2 = 14 B.  With fp32 masters (DeepSpeed, half parameters) the
    half gradient is upcast to an fp32 copy first (read g, write 4), the fp32 update runs on the
    master (AdamW: 28 B) and the half copy of the new parameter is written (p): 2 + 4 + 28 + 2 = 36 B.
    8-bit AdamW (bitsandbytes blockwise, arXiv 2110.02861): 4 + 4 read, 4 written, 1-byte states
    read and written (2 x 2) with one fp32 absmax per 256 each (2 x 2 x 4 / 256): 16.0625 B.

    >>> hbm_bytes_per_param("adamw-fused", 4, 4, 0), hbm_bytes_per_param("adamw", 2, 2, 4)
    (28.0, 36.0)
    >>> hbm_bytes_per_param("adamw-8bit", 4, 4, 0)
    16.0625
    """
    f = optimizer_facts(name)
    if f.construct is None:
        return 0.0
    if master_bytes:
        states = 2 * f.state_bytes_per_param(4)
        return float(grad_bytes + 4) + (2 * 4 + 4 + states) + param_bytes
    return 2.0 * param_bytes + grad_bytes + 2 * f.state_bytes_per_param(param_bytes)
