"""Run one training step (or one inference pass) of the scenario under the tracker.

The step is the steady-state one: optimizer states exist before it starts (they are created
by the first ``step()``), gradients exist from the start when gradient accumulation carries
them from earlier micro-batches, and they are set to None after the optimizer step (the
Trainer's ``zero_grad(set_to_none=True)``).  Categories are given as memory is used:

* ``weights``, ``optimizer_states``, ``master_weights``: tracked before the step starts;
* forward: what the forward leaves alive for the backward is ``activations``; what it frees
  before the backward, and the logits and the loss, are ``temporaries``;
* backward: ``temporaries``, except a checkpointed layer's recomputation (``activations``) and
  the tensors that become ``param.grad`` (``gradients``, relabelled for their whole life);
* the cuBLAS workspaces (one per handle: the forward thread and the autograd thread, both alive from
  the step's start, the latter made in the previous step's backward) are ``other``, sized by
  analytic/overhead.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vramplan.analytic.attention import MEM_EFFICIENT_GQA_TORCH, sdpa_repeats_kv
from vramplan.analytic.inference import GenerateCall, hf_buffer_terms
from vramplan.analytic.logits import LossRelease, family_loss_release
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.terms.resident import hf_buffers_of
from vramplan.analytic.terms.saved import copying_training_cache
from vramplan.facts.optimizers import runs_as
from vramplan.spec.gpu import cuda_capability
from vramplan.spec.load import Resolved
from vramplan.spec.vision import packed_attention
from vramplan.trace import cuda
from vramplan.trace.build import Built, build_model, trace_policy
from vramplan.trace.fsdp import FsdpWorld, module_getter
from vramplan.trace.fsdp import labelled as fsdp_labelled
from vramplan.trace.optim import OptimizerSetup, init_states, make_optimizer
from vramplan.trace.tensor import TpWorld
from vramplan.trace.tensor import labelled as tp_labelled
from vramplan.trace.tracker import Tracker, TrackEvent, local_tensor

__all__ = ["StepTrace", "cuda_spec", "trace_inference", "trace_train"]


@dataclass
class StepTrace:
    events: list[TrackEvent]
    marks: list[tuple[int, str]]
    managed_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    sdpa: list[cuda.SdpaChoice] = field(default_factory=list)
    raw_peak_bytes: int = 0
    per_rank: bool = False  # traced as one rank of a sharded run (FSDP2): parallel.py adds nothing
    tensor_parallel: int = 1  # traced as one rank of a tensor-parallel group of this size (trace/tensor.py)
    frozen: frozenset[str] = frozenset()  # names of the parameters that take no gradient (PEFT's base)


def cuda_spec(r: Resolved) -> cuda.CudaSpec:
    major, minor = cuda_capability(r.gpu.compute_capability) or (9, 0)
    torch_v = r.scenario.software.torch_version
    return cuda.CudaSpec(capability=(major, minor), efficient_gqa=torch_v is not None and torch_v >= MEM_EFFICIENT_GQA_TORCH)


class Scope:
    """Names the module that allocates: forward hooks, and autograd nodes claimed per module."""

    def __init__(self, model: torch.nn.Module, tracker: Tracker, phase: list[str]) -> None:
        self.names = {id(m): n or "model" for n, m in model.named_modules()}
        self.stack: list[str] = []
        self.tracker = tracker
        self.phase = phase
        self.node_module: dict[Any, str] = {}
        self.start_seq: list[int] = []
        self.head_ids: set[int] = set()
        self.saved_category = "temporaries"
        self.handles: list[Any] = []

    def where(self) -> str:
        if self.stack:
            return self.stack[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            return self.node_module.get(node, "") or f"backward:{node.name()}"
        return ""

    def install(self) -> None:
        from torch.nn.modules import module as module_mod

        self.handles.append(module_mod.register_module_forward_pre_hook(self._pre))
        self.handles.append(module_mod.register_module_forward_hook(self._post))
        self.tracker.where = self.where
        cuda.CHECKPOINT_SCOPES.append((self._enter, self._leave))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.tracker.where = None
        if (self._enter, self._leave) in cuda.CHECKPOINT_SCOPES:
            cuda.CHECKPOINT_SCOPES.remove((self._enter, self._leave))

    def _enter(self) -> int:
        return len(self.stack)

    def _leave(self, depth: int) -> None:
        """A checkpointed function ended (or its recomputation stopped early): unwind to ``depth``."""
        if len(self.stack) > depth:
            recomputing = self.phase[0] == "backward" and depth == 0
            del self.stack[depth:]
            del self.start_seq[depth:]
            if recomputing:
                self.tracker._category = self.saved_category

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is None:
            return
        if not self.stack and self.phase[0] == "backward":
            # a module running forward inside the backward: a checkpointed layer's recomputation
            self.saved_category = self.tracker._category
            self.tracker._category = "activations"
        self.stack.append(name)
        self.start_seq.append(torch._C._autograd._get_sequence_nr())

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.names.get(id(module))
        if name is None or not self.stack:
            return
        self.stack.pop()
        start = self.start_seq.pop()
        if not self.stack and self.phase[0] == "backward":
            self.tracker._category = self.saved_category
        if torch.is_grad_enabled() and self.phase[0] == "forward":
            # (a recomputation's nodes never run backward: claiming them would keep their tensors alive)
            self._claim(output, name, start)
        if id(module) in self.head_ids and self.phase[0] == "forward":
            # after the LM head comes the loss: its tensors are temporaries
            self.tracker._category = "temporaries"
            for t in _tensors(output):
                self.tracker.relabel(t, "temporaries", "logits")

    def _claim(self, output: Any, name: str, start: int) -> None:
        todo = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or node in self.node_module:
                continue
            try:
                seq = node._sequence_nr()
            except (AttributeError, RuntimeError):
                continue
            if seq < start:
                continue
            self.node_module[node] = name
            todo.extend(fn for fn, _ in node.next_functions if fn is not None)


def _tensors(x: Any) -> Iterator[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)
    elif hasattr(x, "to_tuple"):
        for y in x.to_tuple():
            yield from _tensors(y)


@contextlib.contextmanager
def _maybe_autocast_patch() -> Iterator[None]:
    """transformers' ``maybe_autocast(device_type, enabled=False)`` (RoPE) as it behaves on CUDA."""
    import sys

    from transformers.utils import generic

    original = generic.maybe_autocast

    def maybe_autocast(device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                       cache_enabled: bool | None = None) -> Any:
        current = cuda.autocast_state()
        if not enabled:
            return cuda.autocast(None) if current is not None else contextlib.nullcontext()
        if current is not None or dtype is not None:
            return cuda.autocast(dtype or current)
        return contextlib.nullcontext()

    from transformers import masking_utils

    find_packed = masking_utils.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids: torch.Tensor) -> Any:
        # sequences are unpacked and full length: run the check's ops, answer "not packed" (the
        # final ``.all()`` reads values a meta tensor does not have)
        if position_ids.device.type != "meta":
            return find_packed(position_ids)
        first = position_ids[:, :1] - 1
        diff = torch.diff(position_ids, prepend=first, dim=-1)
        packed = (diff != 1).cumsum(-1)
        (packed[:, -1] == 0).all()
        return None

    all_of = masking_utils.fast_all

    def fast_all(tensor: Any) -> Any:
        # a padding mask of full-length sequences (BartDecoder.forward's torch.ones(batch, seq) when no mask is
        # given) is all ones: run the op, answer True (``bool()`` of a meta tensor has no value)
        if tensor.device.type != "meta":
            return all_of(tensor)
        all_of(tensor)
        return True

    patched: list[tuple[Any, str, Any]] = []
    for name, mod in list(sys.modules.items()):
        if name.startswith("transformers") and getattr(mod, "maybe_autocast", None) is original:
            patched.append((mod, "maybe_autocast", original))
            mod.maybe_autocast = maybe_autocast  # type: ignore[attr-defined]
    patched.append((masking_utils, "find_packed_sequence_indices", find_packed))
    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices
    patched.append((masking_utils, "fast_all", all_of))
    masking_utils.fast_all = fast_all
    try:
        yield
    finally:
        for mod, attr, value in patched:
            setattr(mod, attr, value)


def _inputs(r: Resolved, built: Built, device: str, batch: int, seq: int) -> torch.Tensor:
    vocab = int(getattr(built.config, "vocab_size", 2) or 2)
    if device == "meta":
        return torch.zeros((batch, seq), dtype=torch.long, device=device)
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.long).to(device)


def _features(built: Built, device: str, batch: int, mels: int, frames: int) -> torch.Tensor:
    """Dummy log-mel ``input_features`` for a speech encoder, in the model's parameter dtype."""
    dtype = next(built.model.parameters()).dtype
    if device == "meta":
        return torch.zeros((batch, mels, frames), dtype=dtype, device=device)
    g = torch.Generator().manual_seed(0)
    return torch.randn((batch, mels, frames), generator=g).to(device=device, dtype=dtype)


def trace_train(r: Resolved, device: str = "meta", built: Built | None = None,
                world: FsdpWorld | None = None, tensor: TpWorld | None = None) -> StepTrace:
    """Trace one steady-state training step on ``device`` (meta: no memory; cpu: a real step).

    With ``world`` (trace/fsdp.py) the model is wrapped by FSDP2's ``fully_shard`` on that fake
    process group and the step is rank 0's; with ``tensor`` (trace/tensor.py) the model is sharded
    by its tensor-parallel plan and the step is rank 0's of the tensor-parallel group.
    """
    s = r.scenario
    t = s.train
    fsdp2 = world is not None
    pol = trace_policy(r, fsdp2)
    built = built or build_model(r, device, "train", fsdp2)
    model = built.model
    if tensor is not None:
        model = tensor.parallelize(r, model)
    if world is not None:
        model = world.shard(r, model)
    framework = s.effective_framework
    spec = cuda_spec(r)
    if r.model.encoder_decoder is not None:
        # an encoder-decoder model: the encoder's source ids (source_len) and the decoder's labels (seq_len), from
        # which the model makes the decoder's inputs (T5ForConditionalGeneration._shift_right, BART's
        # shift_tokens_right: transformers 5.24)
        audio = r.model.encoder_decoder.audio
        if audio is not None:
            # a speech encoder (Whisper): the feature extractor's log-mel input_features, b x mel_bins x frames, in
            # the parameters' dtype (the residual stream's)
            ids = _features(built, device, t.micro_batch_size, audio.mel_bins, audio.input_frames)
            source_key = "input_features"
        else:
            ids = _inputs(r, built, device, t.micro_batch_size, t.source_len or t.seq_len)
        labels = _inputs(r, built, device, t.micro_batch_size, t.seq_len)
        # the decoder's inputs, made from the labels by the collator (transformers 5.24 data/data_collator.py
        # DataCollatorForSeq2Seq: model.prepare_decoder_input_ids_from_labels), so the config's
        # decoder_start_token_id is not needed here
        decoder_ids: torch.Tensor | None = torch.zeros_like(labels)
    else:
        decoder_ids = None
        ids = _inputs(r, built, device, t.micro_batch_size, t.seq_len)
        labels = ids.clone()
    if r.model.encoder_decoder is None or r.model.encoder_decoder.audio is None:
        source_key = "input_ids"
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in trainable]
    notes = list(built.notes)
    # an encoder-decoder model computes its loss in its own forward (T5ForConditionalGeneration.forward,
    # BartForConditionalGeneration.forward: CrossEntropyLoss on lm_logits), whatever the release
    release = family_loss_release(s.software.transformers_version, r.model.traits, framework,
                                  r.model.encoder_only or r.model.encoder_decoder is not None)
    if t.attention == "sdpa" and sdpa_repeats_kv(s, r.model):
        notes.append(f"not modelled: transformers {s.software.transformers}'s repeat_kv before SDPA (grouped K/V saved at "
                     "the query heads' width; the installed release passes enable_gqa: the analytic engine counts it)")
    if packed_attention(s, r.model) is not None:
        notes.append(f"not modelled: transformers {s.software.transformers}'s vision attention over all the "
                     "micro-batch's patches at once (facts/transformers.py QWEN_VL_PACKED_ATTENTION); the installed "
                     "release attends within each image: the analytic engine counts it")
    if release != "padded":
        notes.append(f"loss as transformers {s.software.transformers} computes it ({release}): its code run on the "
                     "installed transformers' logits (trace/step.py _release_loss, analytic/logits.py)")

    masters: list[torch.Tensor] = []
    opt_model: torch.nn.Module = model
    override = None
    # FSDP2: the optimizer holds each parameter's local shard (the same storage).  DTensor runs an
    # elementwise optimizer on Shard(0) operands as the same ops on the local shards, with no
    # communication; calling them directly skips DTensor's sharding propagation (seconds per step)
    # Tensor parallel (trace/tensor.py): sharded linears are DTensors, norms plain replicated tensors; the
    # optimizer and the gradient clipping run on the local tensors in the same way
    tensor_parallel = tensor is not None and not fsdp2
    local = fsdp2 or tensor_parallel
    local_params: list[torch.nn.Parameter] = [torch.nn.Parameter(local_tensor(p)) for p in params] if local else []
    wrap = dict(zip(map(id, params), local_params, strict=True)) if local else {}
    if pol.master_fp32:
        # DeepSpeed: the optimizer updates fp32 masters of the (half) parameters
        masters = [local_tensor(p).detach().float().requires_grad_(True) for p in params]
        override = [(n, torch.nn.Parameter(m)) for (n, _), m in zip(trainable, masters, strict=True)]
        masters = [p for _, p in override]
        if s.parallel.fsdp == "none" and framework != "torchtitan":
            notes.append("DeepSpeed: fp32 master weights and the optimizer step on them (fused Adam, in place)")
    fsdp = s.parallel.fsdp != "none" or framework == "torchtitan"
    # DeepSpeed (fp32 masters, no FSDP) runs its own optimizer where the row names one (FusedAdam, in place)
    kind = runs_as(t.optimizer, "deepspeed") if pol.master_fp32 and not fsdp else t.optimizer
    in_bwd = t.optimizer_in_backward
    setup: OptimizerSetup = OptimizerSetup(None) if in_bwd else make_optimizer(
        kind, opt_model, override, (lambda p: wrap[id(p)]) if local and override is None else None)
    # torchtune's optimizer_in_bwd: one optimizer per parameter (spec/load.py refuses it with sharding or masters)
    per_param = [make_optimizer(kind, opt_model, [(n, p)]) for n, p in trainable] if in_bwd else []
    devices = (device,)
    tracker = Tracker(devices=devices)
    phase = ["setup"]
    scope = Scope(model, tracker, phase)
    out_emb = module_getter(model, "get_output_embeddings")
    if out_emb is not None:
        scope.head_ids.add(id(out_emb))
    ws_bytes = cublas_workspace_bytes(r.gpu, handles=1)
    managed = 0

    fsdp_ctx = fsdp_labelled(tracker) if fsdp2 else contextlib.nullcontext()
    tp_ctx = tp_labelled(tracker) if tensor is not None else contextlib.nullcontext()
    with cuda.cuda_behaviour(spec, devices=devices), _maybe_autocast_patch(), fsdp_ctx, tp_ctx:
        with tracker.paused():
            init_states(setup, list(masters) or list(local_params) or list(params))
            for one, p in zip(per_param, params if in_bwd else [], strict=True):
                init_states(one, [p])
        for one in (setup, *per_param):
            for name, st in one.state_tensors():
                if st.device.type == device and one.managed:
                    managed += st.untyped_storage().nbytes()
        with tracker:
            scope.install()
            try:
                for n, p in model.named_parameters():
                    tracker.track(p, "weights", n)
                tracker.track(built.quant_tensors, "weights", "quantization state")
                for n, b in model.named_buffers():
                    tracker.track(b, "other", n)
                _older_release_buffers(tracker, r, *hf_buffers_of(r), notes)
                for m in masters:
                    tracker.track(m, "master_weights", "fp32 master")
                for one in (setup, *per_param):
                    if not one.managed:
                        for name, st in one.state_tensors():
                            if name.endswith(".step") and st.dim() == 0 and kind != "adamw-fused":
                                continue  # AdamW's step counters stay on the host unless fused/capturable
                            tracker.track(st, "optimizer_states", name)
                hooks = [p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    _step_in_backward(one, n, tracker))
                         for one, (n, p) in zip(per_param, trainable if in_bwd else [], strict=True)]
                tracker.track([ids, labels] + ([decoder_ids] if decoder_ids is not None else []), "other",
                              "input ids and labels")
                if t.grad_accum_steps > 1:
                    for n, p in trainable:
                        p.grad = torch.zeros_like(p)
                        tracker.track(p.grad, "gradients", n)
                tracker.synthetic(ws_bytes, "other", "cuBLAS workspace (forward)")
                # the steady step: the autograd device thread's workspace exists from the previous step's
                # backward.  PyTorch keeps one per (handle, stream) in CublasHandlePool.cpp's static
                # ``cublas_handle_stream_to_workspace`` map until ``torch._C._cuda_clearCublasWorkspaces()``, and
                # the autograd engine's device threads (engine.cpp ``start_device_threads``) and the handles
                # they reserve (DeviceThreadHandles.h) live as long as the process; a peak in the forward (the
                # loss of transformers <= 4.30, no upcast) holds both, as analytic/terms/resident.py counts
                tracker.synthetic(ws_bytes, "other", "cuBLAS workspace (autograd thread)")
                phase[0] = "forward"
                tracker.mark("forward")
                with tracker.category("activations"):
                    loss = _forward_loss(model, ids, labels, pol.autocast_dtype, framework, tracker, scope, release,
                                         decoder_ids, source_key, _train_cache(r))
                _classify_forward(tracker)
                phase[0] = "backward"
                tracker.mark("backward")
                with tracker.category("temporaries"):
                    backward: Any = loss.backward
                    backward()
                del loss
                scope.node_module.clear()
                for n, p in trainable:
                    if p.grad is not None:
                        tracker.relabel(p.grad, "gradients", n)
                phase[0] = "optimizer"
                tracker.mark("optimizer")
                with tracker.category("temporaries"):
                    if framework in ("hf-trainer", "accelerate") and params:
                        if tensor_parallel:
                            # (torch's clip_grad_norm_ refuses a mix of DTensors and tensors; the local norms
                            # are what it computes, plus a scalar all-reduce)
                            _local_grads(local_params, params)
                            torch.nn.utils.clip_grad_norm_(local_params, 1.0)
                        else:
                            torch.nn.utils.clip_grad_norm_(params, 1.0)
                    if setup.optimizer is not None:
                        if masters:
                            # DeepSpeed converts the half gradients into an fp32 buffer for the step
                            for m, p in zip(masters, params, strict=True):
                                m.grad = _local_grad(p).float() if p.grad is not None else None
                        elif local_params:
                            _local_grads(local_params, params)
                        setup.optimizer.step()
                        if masters:
                            for m, p in zip(masters, params, strict=True):
                                local_tensor(p).data.copy_(m.data)
                                m.grad = None
                        for lp in local_params:
                            lp.grad = None
                    model.zero_grad(set_to_none=True)
                tracker.mark("end")
                for h in hooks:
                    h.remove()
            finally:
                scope.remove()
    if in_bwd:
        notes.append("optimizer in the backward: one optimizer per parameter, stepped by its post-accumulate-grad "
                     "hook, then its gradient set to None (torchtune register_optim_in_bwd_hooks)")
    if world is not None:
        notes.extend(world.notes)
    if tensor is not None:
        notes.extend(tensor.notes)
    frozen = frozenset(n for n, p in model.named_parameters() if not p.requires_grad)
    return StepTrace(list(tracker.events), list(tracker.marks), managed, notes, cuda.sdpa_choices(),
                     tracker.peak_bytes, per_rank=fsdp2, frozen=frozen,
                     tensor_parallel=tensor.tp if tensor is not None else 1)


def _step_in_backward(one: OptimizerSetup, name: str, tracker: Tracker) -> Any:
    """torchtune v0.3.0 ``training/memory.py`` ``register_optim_in_bwd_hooks``'s ``optim_step``: the parameter's
    own optimizer steps as soon as its gradient is accumulated, then ``zero_grad()`` sets the gradient to None."""

    def optim_step(p: torch.Tensor) -> None:
        if p.grad is not None:
            tracker.relabel(p.grad, "gradients", name)
        if one.optimizer is not None:
            with tracker.category("temporaries"):
                one.optimizer.step()
        p.grad = None

    return optim_step


def _local_grads(local_params: list[torch.nn.Parameter], params: list[torch.nn.Parameter]) -> None:
    """Each local parameter's gradient: the local tensor of its DTensor gradient, in the parameter's placement.

    A gradient DTensor can come out of the backward in another placement than its parameter's (the
    vocabulary-parallel embedding's gradient is replicated: DTensor's embedding backward has no strategy
    that gives the row shard, ``_ops/_embedding_ops.py``); the optimizer's ops on the DTensor redistribute
    it to the parameter's placement, which for a replicated gradient is a copy of this rank's slice
    (``Shard._replicate_to_shard`` clones it).
    """
    for lp, p in zip(local_params, params, strict=True):
        lp.grad = _local_grad(p) if p.grad is not None else None


def _local_grad(p: torch.nn.Parameter) -> torch.Tensor:
    """The local tensor of ``p``'s gradient in ``p``'s placement (see ``_local_grads``)."""
    g: Any = p.grad
    placements = getattr(p, "placements", None)
    if placements is not None and getattr(g, "placements", placements) != placements:
        g = g.redistribute(placements=placements)
    return local_tensor(g)


def _older_release_buffers(tracker: Tracker, r: Resolved, rope: int, mask: int, notes: list[str]) -> None:
    """The buffers ``software.transformers`` registers at construction and the installed release does not
    (analytic/hf_buffers.py): each layer's rotary cos/sin tables, and 4.38's causal-mask buffer, as allocations."""
    if mask:
        notes.append(f"not modelled: transformers {r.scenario.software.transformers}'s 4-D mask at every forward and "
                     "its per-layer slices (the installed release's code runs; the analytic engine counts them)")
    layers, rows = r.model.num_layers, r.model.max_position_embeddings * r.model.head_dim
    per_layer = rope // layers
    # the tables' element size: inv_freq (head_dim / 2 elements) is below one table's rows, so the floor is exact
    table = rows * (per_layer // (2 * rows)) if rope else 0
    for i in range(layers if rope else 0):
        # cos and sin, then inv_freq, each a tensor of its own (the allocator rounds each to 512 B)
        for nbytes in (table, table, per_layer - 2 * table):
            tracker.synthetic(nbytes, "weights", "rotary cos/sin buffers (older transformers)", f"layers.{i}")
    if mask:
        tracker.synthetic(mask, "weights", "causal-mask buffer (transformers 4.38)")


def _release_loss(out: Any, labels: torch.Tensor, release: LossRelease) -> torch.Tensor:
    """The loss code of an older transformers release (analytic/logits.py), run on the installed release's
    logits: ``logits.float()`` (in the model's forward for 4.31-4.45 Llama-like families, whose output then
    holds the fp32 logits; inside ``ForCausalLMLoss`` for 4.46-4.48), the shifted contiguous copy and
    ``CrossEntropyLoss`` (``F.cross_entropy`` with mean reduction)."""
    logits = out.logits if release == "shifted_no_upcast" else out.logits.float()
    if release == "shifted_upcast_in_model":
        out["logits"] = logits
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    # ``logits`` stays bound until the loss returns, as in the release's code
    return torch.nn.functional.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def _train_cache(r: Resolved) -> bool:
    """Whether the training forward builds its cache as the analytic engine counts it (terms/saved.py
    ``training_cache_bytes``): use_cache on (the scenario's, else the config's), no gradient checkpointing, and a
    release that copies (4.56 on, or none named: the installed one does); an older release's references are not
    traced (the installed release would copy)."""
    return copying_training_cache(r.scenario, r.model)


def _forward_loss(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, autocast: torch.dtype | None,
                  framework: str, tracker: Tracker, scope: Scope, release: LossRelease = "padded",
                  decoder_ids: torch.Tensor | None = None, source_key: str = "input_ids",
                  use_cache: bool = False) -> torch.Tensor:
    ctx = cuda.autocast(autocast) if autocast is not None else contextlib.nullcontext()
    with ctx:
        if decoder_ids is not None:
            # the encoder's input: token ids, or a speech encoder's input_features
            out = model(**{source_key: ids}, decoder_input_ids=decoder_ids, labels=labels, use_cache=False)
        elif release == "padded":
            # use_cache: the DynamicCache a training forward builds (analytic/terms/saved.py training_cache_bytes)
            out = model(input_ids=ids, labels=labels, use_cache=use_cache)
        else:
            # the older release computed its loss inside the forward, so under the same autocast
            out = model(input_ids=ids, use_cache=False)
            out["loss"] = _release_loss(out, labels, release)
    with tracker.category("temporaries"):
        logits = getattr(out, "logits", None)
        # accelerate's convert_outputs_to_fp32 wraps the autocast forward: half outputs become fp32
        if autocast is not None and framework in ("hf-trainer", "accelerate") and isinstance(logits, torch.Tensor) \
                and logits.dtype in (torch.float16, torch.bfloat16):
            out["logits"] = logits.float()
        loss = out.loss
        del out, logits
    tracker.relabel(loss, "temporaries", "loss")
    return loss  # type: ignore[no-any-return]


def _classify_forward(tracker: Tracker) -> None:
    """Forward allocations freed before the backward are temporaries; the rest stay activations."""
    start = tracker.marks[-1][0]
    alloc: dict[int, int] = {}
    for ev in tracker.events[start:]:
        if ev.nbytes > 0 and ev.category == "activations":
            alloc[ev.storage_id] = ev.seq
        elif ev.nbytes < 0 and ev.storage_id in alloc:
            tracker.relabel_id(ev.storage_id, "temporaries")


def _cache_keyword(model: Any) -> str:
    """The forward's keyword for the cache: ``cache`` from transformers 5.2x (``past_key_values`` still works there
    with a FutureWarning, which would reach the user's terminal), ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def trace_inference(r: Resolved, device: str = "meta", built: Built | None = None,
                    tensor: TpWorld | None = None) -> StepTrace:
    """Trace ``generate``'s two peaks: the prefill and, from 2 new tokens on, the last decode step (greedy, DynamicCache).

    The prefill runs the prompt through the model (``logits_to_keep=1``) with an empty cache.  The
    decode step runs one token against a cache already holding ``prompt + new_tokens - 2`` tokens, each
    layer's storage as transformers leaves it (``_filled_cache``), which is the cache at the last step; the
    cache's ``torch.cat`` growth, the last-token logits and their fp32 copy are traced as they run.
    """
    s = r.scenario
    inf = s.inference
    if inf.kv_cache_dtype not in ("auto", inf.dtype):
        from vramplan.errors import Problem, ScenarioError

        raise ScenarioError([Problem("inference.kv_cache_dtype", "quantized KV caches are not traced",
                                     "use kv_cache_dtype: auto, or --engine analytic")])
    built = built or build_model(r, device, "inference")
    model = built.model
    tp = 1
    if tensor is not None:
        model = tensor.parallelize(r, model)
        tp = tensor.tp
    spec = cuda_spec(r)
    b, p, n = inf.batch_size, inf.prompt_len, inf.new_tokens
    devices = (device,)
    tracker = Tracker(devices=devices)
    phase = ["setup"]
    release_notes: list[str] = []
    scope = Scope(model, tracker, phase)
    ws_bytes = cublas_workspace_bytes(r.gpu, handles=1)
    tp_ctx = tp_labelled(tracker) if tensor is not None else contextlib.nullcontext()
    with cuda.cuda_behaviour(spec, devices=devices), _maybe_autocast_patch(), torch.no_grad(), tp_ctx, tracker:
        scope.install()
        try:
            for name, prm in model.named_parameters():
                tracker.track(prm, "weights", name)
            tracker.track(built.quant_tensors, "weights", "quantization state")
            for name, buf in model.named_buffers():
                tracker.track(buf, "other", name)
            _older_release_buffers(tracker, r, *hf_buffer_terms(GenerateCall.of(r)), release_notes)
            tracker.synthetic(ws_bytes, "other", "cuBLAS workspace")
            ids = _inputs(r, built, device, b, p)
            tracker.track(ids, "other", "input ids")
            phase[0] = "prefill"
            tracker.mark("prefill")
            cache = _new_cache(model, r.model.traits.cache_class)
            with tracker.category("activations"):
                out = model(input_ids=ids, **{_cache_keyword(model): cache}, use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                del out
                nxt = torch.argmax(logits, dim=-1)
                del logits
            for layer in getattr(cache, "layers", []):
                tracker.relabel([getattr(layer, "keys", None), getattr(layer, "values", None)], "kv_cache", "KV cache")
            tracker.relabel(list(getattr(cache, "linear_cache", [])), "kv_cache", "linear attention state")
            _relabel_module_state(model, tracker, r.model.traits.module_state)
            del cache
            # generate's first new token comes from the prefill: a decode step runs only from the second on
            # (the analytic engine has no decode moment below 2 new tokens either)
            if n > 1 and r.model.traits.state_argument:
                tracker.mark("decode-setup")
                state = _filled_state(model, tracker, b, device)
                phase[0] = "decode"
                tracker.mark("decode")
                with tracker.category("activations"):
                    out = model(input_ids=nxt[:, None], state=state, use_cache=True, logits_to_keep=1)
                    logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                    del out
                    nxt = torch.argmax(logits, dim=-1)
                    del logits
                del state
            elif n > 1:
                tracker.mark("decode-setup")
                # the last of generate's n - 1 decode steps runs against the p + n - 2 tokens the earlier steps left
                # and brings the cache to p + n - 1, as the analytic engine's last decode moment
                total = p + n - 2
                ids = torch.cat([ids, nxt[:, None].expand(b, n - 1)], dim=-1)
                cache = _filled_cache(model, tracker, b, total, device, tp,
                                      mixer_state=not r.model.traits.module_state,
                                      cache_class=r.model.traits.cache_class, prompt=p)
                phase[0] = "decode"
                tracker.mark("decode")
                with tracker.category("activations"):
                    pos = torch.full((b, 1), total, dtype=torch.long, device=device)
                    out = model(input_ids=nxt[:, None], **{_cache_keyword(model): cache}, use_cache=True, logits_to_keep=1,
                                position_ids=pos)
                    for layer in getattr(cache, "layers", []):
                        tracker.relabel([getattr(layer, "keys", None), getattr(layer, "values", None)], "kv_cache",
                                        "KV cache")
                    tracker.relabel(list(getattr(cache, "linear_cache", [])), "kv_cache", "linear attention state")
                    _relabel_module_state(model, tracker, r.model.traits.module_state)
                    logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                    del out
                    nxt = torch.argmax(logits, dim=-1)
                    ids = torch.cat([ids, nxt[:, None]], dim=-1)
                    del logits
                del cache
            tracker.mark("end")
        finally:
            scope.remove()
    notes = list(built.notes) + (tensor.notes if tensor is not None else []) + release_notes
    return StepTrace(list(tracker.events), list(tracker.marks), 0, notes, cuda.sdpa_choices(),
                     tracker.peak_bytes, tensor_parallel=tp)


def _filled_state(model: Any, tracker: Tracker, batch: int, device: str) -> list[torch.Tensor]:
    """A recurrent ``state`` argument as the prefill leaves it (``Traits.state_argument``): RwkvModel.forward's five
    ``batch x hidden_size x num_hidden_layers`` tensors, the first two in the embeddings' dtype, the others fp32
    (modeling_rwkv.py 5.24)."""
    config: Any = model.config
    shape = (batch, int(config.hidden_size), int(config.num_hidden_layers))
    dtype = model.get_input_embeddings().weight.dtype
    with tracker.category("kv_cache"):
        state = [torch.zeros(shape, dtype=dtype if i <= 1 else torch.float32, device=device) for i in range(5)]
    return state


def _relabel_module_state(model: torch.nn.Module, tracker: Tracker, names: tuple[str, ...]) -> None:
    """The recurrent state a model keeps on its modules (``Traits.module_state``: RecurrentGemma's ``conv1d_state``
    and ``recurrent_states``, made by the prefill) counted as the cache, as the cache layers' keys and values are."""
    if not names:
        return
    held = [getattr(mod, name, None) for mod in model.modules() for name in names]
    tracker.relabel([t for t in held if isinstance(t, torch.Tensor)], "kv_cache", "recurrent state")


def _new_cache(model: torch.nn.Module, cache_class: str) -> Any:
    """An empty cache for ``generate``: transformers' ``DynamicCache`` for the model's config, or the class of the
    model's own modeling module that its forward requires (``Traits.cache_class``: ``MiniMaxCache()``)."""
    if cache_class:
        import sys

        return getattr(sys.modules[type(model).__module__], cache_class)()
    from transformers import DynamicCache

    config: Any = model.config
    return DynamicCache(config=config)


def _filled_cache(model: torch.nn.Module, tracker: Tracker, batch: int, tokens: int, device: str,
                  tp: int = 1, mixer_state: bool = True, cache_class: str = "", prompt: int | None = None) -> Any:
    """A DynamicCache holding ``tokens`` tokens per layer as ``generate`` leaves it after a prefill of ``prompt``
    tokens (None: ``tokens``) and one decode step per further token, each layer's K/V storage as transformers
    keeps it (``_fill_kv``); under tensor parallelism each rank caches its own KV heads (the k/v projections are
    colwise).  ``mixer_state`` False: the mixer layers' state is on the modules (``Traits.module_state``), none is
    put in the cache."""
    config: Any = model.config
    cache = _new_cache(model, cache_class)
    shapes = _kv_shapes(model, tp)
    decoded = prompt is not None and tokens > prompt
    with tracker.category("kv_cache"):
        for i, (heads, kdim, vdim, dtype) in enumerate(shapes):
            if _layer_type(config, i) in NO_CACHE_TYPES or _reads_shared_cache(cache, i):
                continue
            if mixer_state and hasattr(cache, "set_linear_cache") and _is_mixer(config, i):
                _fill_linear_cache(cache, config, i, batch, dtype, device)
            elif mixer_state and (_is_mixer(config, i) or _layer_type(config, i) == HYBRID_TYPE):
                _fill_mixer_state(cache, config, i, batch, dtype, device)
            if _is_mixer(config, i):
                continue  # a mixer layer keeps no keys or values: none are made for it
            _fill_kv(cache, i, (batch, heads, kdim, vdim), dtype, device, tokens, decoded)
    return cache


def held_tokens(tokens: int, window: int | None, decoded: bool) -> tuple[int, int]:
    """(tokens of storage, tokens the cache's view shows) of one layer's keys (and values) holding ``tokens``
    tokens, ``window`` the layer's sliding window (None: full attention), ``decoded`` whether a decode step has
    run since the prefill.

    transformers 5.24 cache_utils.py: ``DynamicLayer.update`` (:136) keeps ``torch.cat([self.keys, key_states])``,
    every token; ``DynamicSlidingWindowLayer.update`` (:242-249) keeps ``full_key_states[:, :, -sliding_window + 1:,
    :]``, a view of the last window - 1 tokens that keeps the whole concatenation's storage alive.  After the
    prefill that storage is the prompt's; after a decode step it is the view of at most window - 1 tokens plus
    the new one: at most ``window`` tokens.  Window 8: a 20-token prefill holds (20, 7); 4 decode steps later
    (24 tokens) the storage is min(24, 8) = 8 tokens, the view 7.

    >>> held_tokens(24, None, True), held_tokens(20, 8, False), held_tokens(24, 8, True), held_tokens(5, 8, True)
    ((24, 24), (20, 7), (8, 7), (5, 5))
    """
    if window is None:
        return tokens, tokens
    shown = min(tokens, window - 1)
    return (min(tokens, window) if decoded else tokens), shown


def _fill_kv(cache: Any, index: int, dims: tuple[int, int, int, int], dtype: torch.dtype, device: str,
             tokens: int, decoded: bool) -> None:
    """One layer's keys and values of ``tokens`` tokens, allocated once at the size transformers' layer keeps
    (``held_tokens``).  A ``DynamicLayer`` (or a sliding one) is initialised by the cache's own ``update`` with
    no token, then given the tensors: filling it through ``update`` would ``torch.cat`` a copy of each while the
    filled tensor is alive (one layer's K/V twice, more than the decode step itself holds) and, for a sliding
    layer, keep the whole sequence's storage under its window's view.  Another cache's layer (``Traits.
    cache_class``) is filled through its ``update``."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    batch, heads, kdim, vdim = dims
    layers = getattr(cache, "layers", ())
    layer: Any = layers[index] if index < len(layers) else None
    direct = isinstance(layer, DynamicLayer) and type(layer).update in (DynamicLayer.update,
                                                                        DynamicSlidingWindowLayer.update)
    window = int(layer.sliding_window) if direct and getattr(layer, "is_sliding", False) else None
    held, shown = held_tokens(tokens, window, decoded) if direct else (tokens, tokens)
    k = torch.empty((batch, heads, held, kdim), dtype=dtype, device=device)
    v = torch.empty((batch, heads, held, vdim), dtype=dtype, device=device)
    if device != "meta":
        k.zero_()
        v.zero_()
    if not direct:
        cache.update(k, v, index)
        return
    cache.update(k[:, :, :0], v[:, :, :0], index)  # lazy initialisation, nothing cached
    layer.keys, layer.values = k[:, :, held - shown:], v[:, :, held - shown:]
    if window is not None:
        layer.cumulative_length = tokens


def _reads_shared_cache(cache: Any, index: int) -> bool:
    """A layer the cache holds nothing for because it reads another layer's K/V: transformers 5.24 cache_utils.py
    ``DummyLayer`` ("shared-cache layers that consume cache produced by other layers": Gemma 3n's last
    ``num_kv_shared_layers``, whose ``Gemma3nTextAttention`` never calls ``cache.update``)."""
    layers = getattr(cache, "layers", ())
    return index < len(layers) and type(layers[index]).__name__ == "DummyLayer"


# layers that keep nothing in the cache: transformers' DynamicCache makes them "dummy" layers (cache_utils.py
# get_layer_types_and_kwargs: "moe" or "mlp" layer types, Nemotron-H's MLP blocks)
NO_CACHE_TYPES = frozenset({"mlp", "moe"})
# a layer that keeps both a KV cache and a mixer state (Falcon-H1's ``layers_block_type``: "hybrid", transformers 5.24
# cache_utils.py ``LinearAttentionAndFullAttentionLayer``)
HYBRID_TYPE = "hybrid"


def _layer_type(config: Any, index: int) -> str:
    types: list[str] = list(getattr(config, "layer_types", None) or ())
    return types[index] if index < len(types) else ""


def _is_mixer(config: Any, index: int) -> bool:
    """A hybrid model's mixer layer (``layer_types`` "linear_attention", as ``BambaConfig`` and ``Qwen3NextConfig``
    name them, or "conv", LFM2's short-convolution blocks: cache_utils.py 5.24 makes both a ``LinearAttentionLayer``)."""
    return _layer_type(config, index) in ("linear_attention", "conv")


def _mixer_shape(config: Any) -> tuple[int, int, tuple[int, ...]]:
    """(convolution channels, d_conv, the SSM state's shape per sequence) under each family's config names: Bamba's and
    GraniteMoeHybrid's (``mamba_*``), Nemotron-H's (``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``,
    ``conv_kernel``, ``n_groups``; intermediate = heads x head_dim), Zamba2's (``n_mamba_heads``, ``mamba_headdim``,
    ``mamba_ngroups``), Mamba2's (``num_heads``, ``head_dim``,
    ``state_size``, ``conv_kernel``, ``n_groups``, intermediate = ``expand`` x hidden) and Mamba-1's (``MambaConfig``,
    ``FalconMambaConfig``: ``intermediate_size`` channels of ``state_size`` states, no heads or groups; ``JambaConfig``:
    ``mamba_expand x hidden_size`` channels of ``mamba_d_state``)."""
    if hasattr(config, "linear_num_value_heads"):
        # Qwen3-Next's Gated DeltaNet (Qwen3NextGatedDeltaNet: conv over 2 key_dim + value_dim channels; the chunked
        # rule's fp32 last_recurrent_state [batch, num_v_heads, k_head_dim, v_head_dim])
        nk, nv = int(config.linear_num_key_heads), int(config.linear_num_value_heads)
        dk, dv = int(config.linear_key_head_dim), int(config.linear_value_head_dim)
        return 2 * nk * dk + nv * dv, int(config.linear_conv_kernel_dim), (nv, dk, dv)
    if hasattr(config, "conv_L_cache"):
        # LFM2's short convolution (Lfm2ShortConv: B * x over hidden channels, conv_L_cache columns; no recurrent state)
        return int(config.hidden_size), int(config.conv_L_cache), ()
    if hasattr(config, "mamba_n_heads"):
        # Falcon-H1's mixer width is ``mamba_d_ssm`` where set (FalconH1Mixer.__init__)
        d_ssm = getattr(config, "mamba_d_ssm", None)
        inter = int(config.mamba_expand) * int(config.hidden_size) if d_ssm is None else int(d_ssm)
        heads, head_dim = int(config.mamba_n_heads), int(config.mamba_d_head)
        state, kernel, groups = int(config.mamba_d_state), int(config.mamba_d_conv), int(config.mamba_n_groups)
    elif hasattr(config, "n_mamba_heads"):
        # Zamba2's (Zamba2MambaMixer: mamba_expand x hidden channels in n_mamba_heads heads of mamba_headdim)
        heads, head_dim = int(config.n_mamba_heads), int(config.mamba_headdim)
        inter, state, kernel, groups = (int(config.mamba_expand) * int(config.hidden_size), int(config.mamba_d_state),
                                        int(config.mamba_d_conv), int(config.mamba_ngroups))
    elif hasattr(config, "mamba_num_heads"):
        heads, head_dim = int(config.mamba_num_heads), int(config.mamba_head_dim)
        inter, state, kernel, groups = (heads * head_dim, int(config.ssm_state_size), int(config.conv_kernel),
                                        int(config.n_groups))
    elif hasattr(config, "n_groups"):
        heads, head_dim = int(config.num_heads), int(config.head_dim)
        inter, state, kernel, groups = (int(config.expand) * int(config.hidden_size), int(config.state_size),
                                        int(config.conv_kernel), int(config.n_groups))
    elif hasattr(config, "mamba_dt_rank"):
        # Jamba's Mamba-1 mixer (JambaMambaMixer: mamba_expand x hidden channels of mamba_d_state states; the config's
        # intermediate_size is the MLP's)
        inter, state = int(config.mamba_expand) * int(config.hidden_size), int(config.mamba_d_state)
        return inter, int(config.mamba_d_conv), (inter, state)
    else:
        inter, state = int(config.intermediate_size), int(config.state_size)
        return inter, int(config.conv_kernel), (inter, state)
    return inter + 2 * groups * state, kernel, (heads, head_dim, state)


def _fill_linear_cache(cache: Any, config: Any, index: int, batch: int, dtype: torch.dtype, device: str) -> None:
    """A lightning attention layer's state as the prefill leaves it (``MiniMaxCache.set_linear_cache``,
    modeling_minimax.py 5.24): ``[batch, heads, head_dim, head_dim]`` in the value states' dtype, the model's."""
    heads = int(config.num_attention_heads)
    hd = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    state = torch.empty((batch, heads, hd, hd), dtype=dtype, device=device)
    if device != "meta":
        state.zero_()
    cache.set_linear_cache(index, state)
    del state


def _fill_mixer_state(cache: Any, config: Any, index: int, batch: int, dtype: torch.dtype, device: str) -> None:
    """A mixer layer's state as the prefill leaves it, through the cache's own ``update_conv_state`` and
    ``update_recurrent_state`` (transformers 5.24 ``LinearAttentionLayer``): the convolution state
    (batch, conv_dim, d_conv) in the model dtype and the fp32 SSM state (batch, heads, head_dim, d_state)
    that ``mamba2_chunk_scan`` (torch path) returns (``modeling_bamba.py``), or (batch, intermediate, d_state)
    that ``mamba_selective_scan`` returns (``modeling_mamba.py``)."""
    conv_dim, kernel, ssm_shape = _mixer_shape(config)
    conv = torch.empty((batch, conv_dim, kernel), dtype=dtype, device=device)
    if device != "meta":
        conv.zero_()
    cache.update_conv_state(conv, index, conv_kernel_size=kernel)
    del conv
    if not ssm_shape:
        return  # LFM2's short convolution keeps no recurrent state
    ssm = torch.empty((batch, *ssm_shape), dtype=torch.float32, device=device)
    if device != "meta":
        ssm.zero_()
    cache.update_recurrent_state(ssm, index)
    del ssm


def _kv_shapes(model: torch.nn.Module, tp: int = 1) -> list[tuple[int, int, int, torch.dtype]]:
    """(kv heads on this rank, key dim, value dim, dtype) of each attention layer."""
    cfg: Any = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n_layers = int(text.num_hidden_layers)
    if getattr(text, "num_attention_heads", None) is None:
        # a model without attention (Mamba2Config, MambaConfig): every layer is a mixer, nothing to cache as K/V
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        return [(0, 0, 0, dtype)] * n_layers
    heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    kdim = vdim = head_dim
    if getattr(text, "kv_lora_rank", None):  # MLA caches full per-head keys and values
        heads = int(text.num_attention_heads)
        kdim = int(text.qk_nope_head_dim) + int(text.qk_rope_head_dim)
        vdim = int(text.v_head_dim)
    if getattr(text, "multi_query", False) and not getattr(text, "new_decoder_architecture", False):
        heads = 1
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return [(heads // tp, kdim, vdim, dtype)] * n_layers
