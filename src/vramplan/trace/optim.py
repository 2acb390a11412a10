"""The optimizer of a traced step: the real torch optimizers with CUDA's defaults, and the state
layouts of the ones torch does not ship.  Which one is the optimizer's row in ``facts/optimizers.py``
(``trace``: build the row's class, run Lion's reference update, or lay out bitsandbytes' states from
the row's ``states`` and small-tensor rule).

* ``adamw``: ``torch.optim.AdamW(foreach=True)``, the CUDA default (``_default_to_fused_or_foreach``):
  ``_foreach_sqrt`` of ``exp_avg_sq`` is one state-sized temporary per parameter group.
* ``adamw-fused``: ``torch.optim.AdamW(fused=True)``, in place (state ``step`` tensors on device).
* ``sgd`` / ``sgd-momentum``: ``torch.optim.SGD(foreach=True)``.
* ``adafactor``: transformers' ``Adafactor`` (``scale_parameter=False, relative_step=False``, as the
  Trainer's ``optim="adafactor"``).
* ``lion``: the reference update of lion-pytorch (arXiv 2302.06675): ``exp_avg.clone().mul_(b1)
  .add(grad, alpha=1 - b1).sign_()`` per parameter.
* ``muon``: ``torch.optim.Muon`` over the hidden 2-D matrices, fused ``torch.optim.AdamW`` over the
  embeddings, LM head, norms and biases (``MuonSplit``).
* ``galore-adamw``, ``apollo``, ``adam-mini``, torchao's ``adamw-8bit-torchao`` / ``adamw-4bit`` /
  ``adamw-fp8``, ``schedule-free-adamw``, ``came``: their libraries are not installed beside vramplan
  (or, torchao, compile the update): the row's state layout is allocated (``RowStateLayout``) and the
  step's temporaries are not run.
* ``adamw-8bit`` / ``paged-*``: bitsandbytes ``Optimizer2State`` layouts: ``uint8`` ``state1``/``state2``
  with an fp32 ``absmax`` per 256-element block for tensors of at least 4096 elements (fp32
  states otherwise; fp32 states for the 32-bit paged AdamW); the update kernel works in place.
  Paged states live in CUDA managed memory, outside torch's allocator.

Parameter groups follow the Hugging Face Trainer (``get_decay_parameter_names``): biases and
norm weights in a no-decay group, everything else in the decay group.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vramplan.errors import Problem, ScenarioError
from vramplan.facts.optimizers import OptimizerFacts, StateTensor, optimizer_facts

__all__ = ["OptimizerSetup", "make_optimizer"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "uint8": torch.uint8,
           "int8": torch.int8, "fp8": torch.float8_e4m3fn}
_NO_DECAY = [re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")]


def _decays(name: str, module_is_layernorm: bool) -> bool:
    return not module_is_layernorm and not any(p.search(name.lower()) for p in _NO_DECAY)


def param_groups(model: torch.nn.Module) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """[decay, no_decay] trainable (name, parameter) lists, as the Hugging Face Trainer builds them."""
    layernorm_params: set[int] = set()
    for m in model.modules():
        if isinstance(m, torch.nn.LayerNorm):
            layernorm_params.update(id(p) for p in m.parameters(recurse=False))
    decay: list[tuple[str, torch.nn.Parameter]] = []
    no_decay: list[tuple[str, torch.nn.Parameter]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if _decays(name, id(p) in layernorm_params) else no_decay).append((name, p))
    return [decay, no_decay]


class Lion(torch.optim.Optimizer):
    """Lion (arXiv 2302.06675) as lion-pytorch implements its update."""

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.clone().mul_(b1).add(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-group["lr"])
                exp_avg.mul_(b2).add_(p.grad, alpha=1 - b2)


class BnbStateLayout(torch.optim.Optimizer):
    """bitsandbytes AdamW8bit/PagedAdamW(8bit) state layout, from the optimizer's row; the update is in
    place (no temporaries).

    Each of the row's states is allocated per parameter: a quantized state (with a block scale) as its
    dtype plus one scale per block, unless the tensor is below the small-tensor rule, which keeps the
    rule's dtype; an unquantized state in its dtype (the parameter's when the row gives none).
    """

    def __init__(self, params: Any, facts: OptimizerFacts) -> None:
        super().__init__(params, {"lr": 1e-4})
        self.facts = facts

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        small = self.facts.small_tensors
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if state:
                    continue
                quantized = small is None or p.numel() >= small.below_elements
                # bitsandbytes allocates state1, state2, then absmax1, absmax2 (Optimizer2State.init_state)
                for st in self.facts.states:
                    dtype = st.dtype
                    if st.scale is not None and not quantized and small is not None:
                        dtype = small.dtype
                    state[st.name] = torch.zeros_like(p, dtype=_DTYPES[dtype] if dtype else p.dtype)
                for st in self.facts.states:
                    if st.scale is not None and quantized:
                        blocks = -(-p.numel() // st.scale.block)
                        state[st.scale.key] = torch.zeros(blocks, dtype=_DTYPES[st.scale.dtype], device=p.device)
                state["step"] = torch.zeros((), dtype=torch.float32)


def param_subsets(model: torch.nn.Module) -> dict[str, str]:
    """parameter name -> "hidden_matrices", "embedding_head" or "rest" (``facts.optimizers.ParamSubset``):
    embeddings are ``nn.Embedding`` weights, the head a parameter named ``lm_head``, the hidden matrices
    every other parameter of two or more dimensions (Muon's and GaLore's targets)."""
    out: dict[str, str] = {}
    for mod_name, mod in model.named_modules():
        for name, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{name}" if mod_name else name
            if isinstance(mod, torch.nn.Embedding) or "lm_head" in full:
                out[full] = "embedding_head"
            elif p.dim() >= 2:
                out[full] = "hidden_matrices"
            else:
                out[full] = "rest"
    return out


def _zeros_state(p: torch.Tensor, st: StateTensor, quantized: bool, small_dtype: str | None) -> dict[str, torch.Tensor]:
    """One state of the row for ``p``: its stored values (4-bit values packed two per uint8, as torchao's
    ``OptimState4bit.codes``) and, when quantized, one scale per block."""
    if st.scale is None or not quantized:
        dtype = small_dtype if st.scale is not None else st.dtype
        return {st.name: torch.zeros_like(p, dtype=_DTYPES[dtype] if dtype else p.dtype)}
    n = p.numel()
    if st.dtype == "int4":
        codes = torch.zeros(n // 2, dtype=torch.uint8, device=p.device)
    else:
        codes = torch.zeros(n, dtype=_DTYPES[st.dtype or "fp32"], device=p.device)
    scale = torch.zeros(-(-n // st.scale.block), dtype=_DTYPES[st.scale.dtype], device=p.device)
    return {st.name: codes, st.scale.key: scale}


def _factored_states(p: torch.Tensor, states: tuple[StateTensor, ...]) -> dict[str, torch.Tensor]:
    """Adafactor-style pairs: a row and a column vector for a matrix; the full size for a vector (the
    pair's first state under its name without ``_row``), nothing for a matrices-only pair."""
    out: dict[str, torch.Tensor] = {}
    fac = [st for st in states if st.factored]
    for row, col in zip(fac[::2], fac[1::2], strict=True):
        dtype = _DTYPES[row.dtype] if row.dtype else p.dtype
        if p.dim() >= 2:
            out[row.name] = torch.zeros(p.shape[:-1], dtype=dtype, device=p.device)
            out[col.name] = torch.zeros(p.shape[:-2] + p.shape[-1:], dtype=dtype, device=p.device)
        elif not row.matrices_only:
            out[row.name.removesuffix("_row")] = torch.zeros_like(p, dtype=dtype)
    return out


class RowStateLayout(torch.optim.Optimizer):
    """A row's state layout for a library that is not installed or cannot run on meta tensors (torchao's
    compiled update, GaLore, APOLLO, Adam-mini, schedule-free, CAME): the row's ``states`` (block scales,
    the small-tensor rule, factored pairs) for every parameter outside its ``subset``, the subset's states
    for the parameters inside it (sized on the r x max(out, in) projected gradient, with an r x min(out, in)
    projection, for a low-rank subset).  The update itself and its temporaries are not run."""

    def __init__(self, params: Any, facts: OptimizerFacts, subsets: dict[int, str]) -> None:
        super().__init__(params, {"lr": 1e-4})
        self.facts = facts
        self.subsets = subsets

    def _low_rank(self, p: torch.Tensor, rank: int, states: tuple[StateTensor, ...]) -> dict[str, torch.Tensor]:
        # galore_projector.py project(): rows >= columns projects on the right (grad @ P.T: rows x r, P: r x
        # columns), else on the left (P.T @ grad: r x columns, P: rows x r)
        rows, cols = p.shape[0], p.shape[-1]
        r = min(rank, rows, cols)
        low, proj = ((rows, r), (r, cols)) if rows >= cols else ((r, cols), (rows, r))
        out = {st.name: torch.zeros(low, dtype=_DTYPES[st.dtype] if st.dtype else p.dtype, device=p.device)
               for st in states}
        out["ortho_matrix"] = torch.zeros(proj, dtype=p.dtype, device=p.device)
        return out

    def _layout(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        f, sub = self.facts, self.facts.subset
        if sub is not None and self.subsets.get(id(p)) == sub.params:
            if sub.rank:
                return self._low_rank(p, sub.rank, sub.states)
            return {st.name: torch.zeros_like(p, dtype=_DTYPES[st.dtype] if st.dtype else p.dtype)
                    for st in sub.states}
        out = _factored_states(p, f.states) if f.factored else {}
        small = f.small_tensors
        quantized = small is None or p.numel() >= small.below_elements
        for st in f.states:
            if not st.factored:
                out.update(_zeros_state(p, st, quantized, small.dtype if small else None))
        return out

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and not self.state[p]:
                    self.state[p].update(self._layout(p))


class MuonSplit(torch.optim.Optimizer):
    """``torch.optim.Muon`` over the hidden matrices and fused ``torch.optim.AdamW`` over every other
    parameter (KellerJordan/Muon's ``MuonWithAuxAdam`` split); stepped one after the other."""

    def __init__(self, params: Any, subsets: dict[int, str], lr: float) -> None:
        super().__init__(params, {"lr": lr})
        flat = [p for g in self.param_groups for p in g["params"]]
        hidden = [p for p in flat if subsets.get(id(p)) == "hidden_matrices"]
        if any(p.dim() != 2 for p in hidden):
            raise ScenarioError([Problem("train.optimizer", "muon: torch.optim.Muon takes 2-D matrices only; this "
                                         "model has hidden tensors of more dimensions (stacked experts)",
                                         "trace a dense model, or estimate with the analytic engine")])
        rest = [p for p in flat if subsets.get(id(p)) != "hidden_matrices"]
        parts: list[torch.optim.Optimizer] = []
        if hidden:
            parts.append(torch.optim.Muon(hidden, lr=lr))
        if rest:
            parts.append(torch.optim.AdamW(rest, lr=lr, fused=True))
        self.parts = parts

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for o in self.parts:
            o.step()
            self.state.update(o.state)


@dataclass
class OptimizerSetup:
    optimizer: torch.optim.Optimizer | None
    managed: bool = False  # states in CUDA managed memory (paged optimizers)
    names: dict[int, str] = field(default_factory=dict)  # id(param) -> name

    def state_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.optimizer is None:
            return
        for p, st in self.optimizer.state.items():
            name = self.names.get(id(p), "param")
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    yield f"{name}.{k}", v


def make_optimizer(kind: str, model: torch.nn.Module, params_override: list[tuple[str, torch.nn.Parameter]] | None = None,
                   wrap: Callable[[torch.nn.Parameter], torch.nn.Parameter] | None = None) -> OptimizerSetup:
    """The scenario's optimizer over the trainable parameters (or over ``params_override``);
    ``wrap`` maps each parameter to the one the optimizer holds (FSDP2: its local shard)."""
    if params_override is not None:
        groups = [params_override, []]
    else:
        groups = param_groups(model)
    if wrap is not None:
        groups = [[(n, wrap(p)) for n, p in g] for g in groups]
    names = {id(p): n for g in groups for n, p in g}
    pg = [{"params": [p for _, p in g], "weight_decay": 0.0} for g in groups if g]
    facts = optimizer_facts(kind)
    if facts.construct is None or not pg:
        return OptimizerSetup(None, names=names)
    lr = 1e-5
    opt: torch.optim.Optimizer
    if facts.trace == "bnb_state_layout":
        opt = BnbStateLayout(pg, facts)
    elif facts.trace in ("state_layout", "muon_split"):
        by_name = param_subsets(model)
        subsets = {id(p): by_name.get(n, "rest") for g in groups for n, p in g}
        if facts.trace == "state_layout":
            opt = RowStateLayout(pg, facts, subsets)
        else:
            opt = MuonSplit(pg, subsets, lr)
    elif facts.trace == "lion_reference":
        opt = Lion(pg, lr=lr)
    else:
        module, _, name = facts.construct.path.rpartition(".")
        factory: Any = getattr(importlib.import_module(module), name)
        opt = factory(pg, lr=lr, **dict(facts.construct.kwargs))
    return OptimizerSetup(opt, managed=facts.managed_memory, names=names)


def init_states(setup: OptimizerSetup, params: list[torch.Tensor]) -> None:
    """Run one step on zero gradients so that the states exist (the steady-state step has them)."""
    if setup.optimizer is None:
        return
    for p in params:
        p.grad = torch.zeros_like(p)
    setup.optimizer.step()
    setup.optimizer.zero_grad(set_to_none=True)
