"""A transformers module built on the meta device from a config mapping: the oracle the family adapters'
parameter counts are checked against (no weights, no network)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest


def meta_module(cfg: dict[str, Any], auto: str = "AutoModelForImageTextToText") -> Any:
    """``transformers.<auto>.from_config(AutoConfig.for_model(**cfg))`` on the meta device; skips without torch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.for_model(**cfg)
        with torch.device("meta"):
            return getattr(transformers, auto).from_config(config)


def meta_causal_lm_count(cfg: dict[str, Any]) -> int:
    """Parameters of transformers' ``AutoModelForCausalLM`` for ``cfg`` built on the meta device; skips without torch."""
    module = meta_module(cfg, auto="AutoModelForCausalLM")
    return sum(p.numel() for p in module.parameters())


def _bf16_module(cfg: dict[str, Any]) -> Any:
    """transformers' ``AutoModelForCausalLM`` for ``cfg`` with random weights (seed 0) in bf16 on the CPU; skips
    without torch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        module = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    return module.to(torch.bfloat16)


def bf16_prefill(cfg: dict[str, Any], batch: int, tokens: int) -> tuple[Any, Any]:
    """(the module, its output) after a real bf16 prefill of ``batch`` x ``tokens`` random ids on the CPU through
    transformers' ``AutoModelForCausalLM`` for ``cfg``; skips without torch."""
    import torch

    module = _bf16_module(cfg)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        out = module(torch.randint(0, int(cfg["vocab_size"]), (batch, tokens)), use_cache=True)
    return module, out


def prefill_state_bytes(cfg: dict[str, Any], batch: int, tokens: int) -> int:
    """Bytes of the convolution and recurrent states in transformers' own cache after a real bf16 prefill of
    ``batch`` x ``tokens`` random ids on the CPU; skips without torch."""
    torch = pytest.importorskip("torch")
    cache = bf16_prefill(cfg, batch, tokens)[1].past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (*getattr(layer, "conv_states", {}).values(), *getattr(layer, "recurrent_states", {}).values())
               if isinstance(t, torch.Tensor))


def category_bytes(events: Any, category: str) -> int:
    """Bytes a trace's events allocate (positive events) in ``category``."""
    return sum(e.nbytes for e in events if e.nbytes > 0 and e.category == category)


def tower_totals(module: Any, language_model: str = "model.language_model.", only: str = "model.") -> dict[str, int]:
    """Parameters of the module outside its language model, summed per name with the layer indices dropped
    (``vision_tower.encoder.layers.self_attn.q_proj.weight``): the tower and projector rows the adapters list.
    ``only`` keeps the names under that prefix, ``language_model`` drops those under it."""
    out: dict[str, int] = {}
    for name, p in module.named_parameters():
        if name.startswith(only) and not name.startswith(language_model):
            key = ".".join(x for x in name.removeprefix("model.").split(".") if not x.isdigit())
            out[key] = out.get(key, 0) + p.numel()
    return out


def assert_equals_meta_module(spec: Any, cfg: dict[str, Any], **tower: str) -> None:
    """The adapter's model ``spec`` of ``cfg`` against transformers' module on the meta device: the parameter
    count, and the tower and projector rows name by name (``tower``: ``tower_totals``' prefixes)."""
    module = meta_module(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    theirs = tower_totals(module, **tower)
    assert spec.vision is not None
    assert {p.name: p.total for p in spec.params if p.name.startswith(spec.vision.param_prefixes)} == theirs


def generate_phase_peaks(model: Any, inputs: dict[str, Any], n: int, cross_write_bytes: int) -> tuple[int, int, int]:
    """An encoder-decoder model's ``generate(**inputs)`` of ``n`` tokens on the CPU, counted storage by storage
    (trace/tracker.py) beyond the weights, buffers and the caller's inputs: (the encoder's peak, the first decoder
    step's peak up to its last cross-attention write -- the last ``torch.cat`` of ``cross_write_bytes`` --, the peak
    of the decoder steps)."""
    torch = pytest.importorskip("torch")
    from vramplan.trace.tracker import Tracker

    encoder = model.get_encoder()
    with torch.no_grad(), Tracker() as tr:
        tr.track([*model.parameters(), *model.buffers(), *inputs.values()], "weights")
        base = tr.live_bytes
        encoder.register_forward_pre_hook(lambda *a: tr.mark("encoder"))
        encoder.register_forward_hook(lambda *a: tr.mark("decode"))
        model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    start = {name: i for i, name in tr.marks}
    live, peaks = 0, [0, 0, 0]
    writes = [i for i, e in enumerate(tr.events) if e.op == "aten.cat.default" and e.nbytes == cross_write_bytes]
    for i, e in enumerate(tr.events):
        live += e.nbytes
        if i >= start["decode"]:
            peaks[2] = max(peaks[2], live)
            if i <= writes[-1]:
                peaks[1] = max(peaks[1], live)
        elif i >= start["encoder"]:
            peaks[0] = max(peaks[0], live)
    return peaks[0] - base, peaks[1] - base, peaks[2] - base


def live_at_backward(st: Any) -> list[Any]:
    """The trace's allocation events still alive when the backward starts (``StepTrace.marks`` names the phase):
    what the forward saved for the backward, each event with its module, category and bytes."""
    start = next(seq for seq, phase in st.marks if phase == "backward")
    live: dict[int, Any] = {}
    for ev in st.events:
        if ev.seq >= start:
            break
        if ev.nbytes > 0:
            live[ev.storage_id] = ev
        else:
            live.pop(ev.storage_id, None)
    return list(live.values())


def tracked_peak(model: Any, inputs: dict[str, Any], first: Any, last: Any | None = None) -> int:
    """Peak bytes beyond the weights, buffers and inputs while ``first`` runs (from ``first``'s forward to the end
    of ``last``'s, ``last`` defaulting to ``first``), in one forward of ``model(**inputs, use_cache=True,
    logits_to_keep=1)`` under the traced engine's allocation tracker (trace/tracker.py); skips without torch."""
    torch = pytest.importorskip("torch")
    from vramplan.trace.tracker import Tracker

    with torch.no_grad(), Tracker() as tr:
        tr.track([*model.parameters(), *model.buffers(), *inputs.values()], "weights")
        base = tr.live_bytes
        first.register_forward_pre_hook(lambda *a: tr.mark("start"))
        (last if last is not None else first).register_forward_hook(lambda *a: tr.mark("end"))
        model(**inputs, use_cache=True, logits_to_keep=1)
    marks = {name: i for i, name in tr.marks}
    live, peak = 0, 0
    for i, e in enumerate(tr.events):
        live += e.nbytes
        if marks["start"] <= i < marks["end"]:
            peak = max(peak, live)
    return peak - base


def bf16_generate(cfg: dict[str, Any], batch: int, prompt: int, new: int) -> tuple[Any, Any]:
    """(the module, generate's output with ``return_dict_in_generate``) after a real bf16 greedy ``generate`` of
    ``batch`` x ``prompt`` random ids (1-127) and exactly ``new`` tokens on the CPU through transformers'
    ``AutoModelForCausalLM`` for ``cfg``; skips without torch."""
    import torch

    module = _bf16_module(cfg).eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ids = torch.randint(1, 128, (batch, prompt))
        out = module.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                              return_dict_in_generate=True)
    return module, out


def graph_saved_storages(out: Any, skip: set[int], drop: tuple[str, ...] = (), nonscalar: bool = False) -> dict[int, int]:
    """The storages autograd's graph behind ``out`` saves (``_saved_*`` attributes of every node), by storage id with
    their bytes; storages in ``skip`` (parameters, buffers: resident), attributes in ``drop`` and, with
    ``nonscalar``, 0-d tensors left out."""
    import torch

    saved: dict[int, int] = {}
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_") or attr in drop:
                continue
            value = getattr(node, attr)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor) and (t.dim() or not nonscalar) and id(t.untyped_storage()) not in skip:
                    saved[id(t.untyped_storage())] = t.untyped_storage().nbytes()
        stack.extend(n for n, _ in node.next_functions)
    return saved


def mixer_graph_saved(make: Any, config: dict[str, Any], mode: str, batch: int, seq: int, frozen: bool = False,
                      targets: tuple[str, ...] = (), nonscalar: bool = False) -> int:
    """Bytes of the storages autograd's graph saves after one forward of the mixer ``make(cfg, 0)`` built on the meta
    device from ``config`` (parameters and buffers excluded): ``mode`` "bf16" (bf16 weights), "fp32", or "mixed"
    (fp32 weights under bf16 autocast, as the traced engine emulates it); ``frozen``: no parameter requires grad
    (LoRA's base), with peft's LoRA (rank 4, no dropout, in the mixer's dtype) on ``targets``; ``nonscalar``: 0-d
    tensors left out (wrapped Python numbers, host memory on a GPU); skips without torch."""
    import contextlib

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vramplan.trace import cuda

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**config)
    weights = torch.bfloat16 if mode == "bf16" else torch.float32
    with torch.device("meta"):
        mixer = make(cfg, 0).to(weights)
        for p in mixer.parameters() if frozen else ():
            p.requires_grad_(False)
        if targets:
            peft = pytest.importorskip("peft")
            config_ = peft.LoraConfig(r=4, target_modules=list(targets), lora_dropout=0.0)
            mixer = peft.inject_adapter_in_model(config_, mixer).to(weights)
    mixer.train()
    held = {id(t.untyped_storage()) for t in [*mixer.parameters(), *mixer.buffers()]}
    x = torch.empty(batch, seq, cfg.hidden_size, device="meta", dtype=weights, requires_grad=True)
    with cuda.cuda_behaviour(cuda.CudaSpec()):
        region = cuda.autocast(torch.bfloat16) if mode == "mixed" else contextlib.nullcontext()
        with region, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = mixer(x)
    return sum(graph_saved_storages(out, held, nonscalar=nonscalar).values())
