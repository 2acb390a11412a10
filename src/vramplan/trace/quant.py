"""bitsandbytes-quantized linear layers, storage-exact, without bitsandbytes' CUDA kernels.

``QuantLinear`` holds the tensors bitsandbytes keeps for a quantized weight and allocates
what its forward and backward allocate; values are not computed (zeros on real tensors).

4-bit (``Linear4bit``/``Params4bit``, bitsandbytes ``functional.quantize_4bit``):

* payload: ``uint8`` of shape ``[ceil(n / 2), 1]`` (two 4-bit codes per byte);
* ``absmax``: one fp32 per block of 64 weights;
* ``code``: the 16-entry fp32 NF4/FP4 map, one per layer;
* double quantization (``compress_statistics``): ``absmax`` becomes ``uint8`` per block, quantized
  in blocks of 256 with one fp32 ``absmax`` per 256 blocks, an fp32 ``offset`` scalar and the
  shared 256-entry fp32 dynamic map.

Forward (``MatMul4Bit``, multi-token input): the input is cast to the compute dtype (which the
layer's first fp32 or bf16 input replaces, ``Linear4bit.set_compute_type``), the weight is
dequantized into a temporary ``[out, in]`` in its original dtype (with double quantization the
fp32 absmax is dequantized first), the matmul runs, the temporary is freed; only the packed
weight is kept for the backward, which dequantizes again.  The output is cast back to the
input's dtype (``Linear4bit.forward`` returns ``out.to(inp_dtype)``).

8-bit (``Linear8bitLt``, LLM.int8 with threshold 6): ``int8`` weight ``[out, in]`` and an fp32
row scale ``SCB``; the forward quantizes the fp16 input row-wise (``int8`` copy and fp32 row
scales) and saves the input for the backward, which dequantizes the weight.  (Approximate:
the outlier columns are not sized.)

MoE experts (``QuantExperts``): transformers 5 holds a MoE layer's routed experts as two fused 3-D
parameters (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``; e.g. ``MixtralExperts``,
modeling_mixtral.py:56-92).  Its bitsandbytes integration converts only ``nn.Linear``/``Conv1D``
modules (integrations/bitsandbytes.py:189, quantizers/quantizer_bnb_4bit.py:87), so those
parameters would stay in the load dtype (bitsandbytes issue #1849); its one MoE exception turns
Llama 4's fused experts back into a list of per-expert MLPs before quantizing
(quantizers/base.py:381-412).  transformers 4.x, which QLoRA MoE runs were made with, held every
expert as an MLP of ``nn.Linear`` (``MixtralBlockSparseTop2MLP`` w1/w3/w2,
``Qwen3MoeMLP``/``DeepseekV3MLP`` gate/up/down_proj) and ``replace_with_bnb_linear`` turned each
into a ``Linear4bit``.  The trace does the same: the fused experts become E per-expert MLPs of
``QuantLinear`` (one payload, absmax and state per projection and expert), run by the per-expert
loop of the eager experts forward, so each projection dequantizes its own ``[out, in]``
temporary in the forward and again in the backward.  Experts stored transposed, interleaved or
with biases (gpt-oss) were fused parameters in transformers 4.x too, were never converted by
bitsandbytes, and are left as they are.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from vramplan.facts.quantization import quant_format

__all__ = ["EXPERTS_NOTE", "QuantExperts", "QuantLinear", "quantize_linears"]

EXPERTS_NOTE = ("MoE experts stored as per-expert bitsandbytes linears and run one expert at a time, as "
                "transformers 4.x loaded them; transformers 5 with stock bitsandbytes leaves its fused experts "
                "unquantized (bitsandbytes issue #1849) and peft then casts them to fp32")



def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class QuantLinear(torch.nn.Linear):
    """A linear layer whose weight is stored as bitsandbytes stores it."""

    def __init__(self, in_features: int, out_features: int, bias: bool, fmt: str, compute_dtype: torch.dtype,
                 weight_dtype: torch.dtype, device: str, shared: dict[str, torch.Tensor]) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.fmt = fmt
        facts = quant_format(fmt)  # payload, block sizes, double quantization: facts/quantization.py
        self.int8 = facts.dequant == "int8_matmul"
        self.double_quant = facts.double_quant
        self.saves_input = False  # bitsandbytes < 0.43.2 kept the input (see quantize_linears)
        self.compute_dtype = compute_dtype
        self.compute_type_is_set = False
        self.weight_dtype = weight_dtype
        n = in_features * out_features
        blocks = facts.scales.count(n, out_features)
        if self.int8:
            w = torch.zeros((out_features, in_features), dtype=torch.int8, device=device)
            self.weight = torch.nn.Parameter(w, requires_grad=False)
            self.scb = torch.zeros(out_features, dtype=torch.float32, device=device)
            self.state: list[torch.Tensor] = [self.scb]
        else:
            w = torch.zeros((_ceil(n, 2), 1), dtype=torch.uint8, device=device)
            self.weight = torch.nn.Parameter(w, requires_grad=False)
            code = torch.zeros(16, dtype=torch.float32, device=device)
            second = facts.scales.second_level
            if second is not None:
                absmax = torch.zeros(blocks, dtype=torch.uint8, device=device)
                absmax2 = torch.zeros(second.count(blocks, 0), dtype=torch.float32, device=device)
                offset = torch.zeros((), dtype=torch.float32, device=device)
                if "dynamic" not in shared:
                    shared["dynamic"] = torch.zeros(256, dtype=torch.float32, device=device)
                self.state = [absmax, code, absmax2, offset, shared["dynamic"]]
            else:
                absmax = torch.zeros(blocks, dtype=torch.float32, device=device)
                self.state = [absmax, code]
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=weight_dtype, device=device),
                                           requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def dequantize(self) -> torch.Tensor:
        """The dequantized weight ``[out, in]`` (a temporary), as ``dequantize_4bit`` allocates it."""
        if self.double_quant:
            absmax = self.state[0]
            fp32_absmax = torch.empty(absmax.shape, dtype=torch.float32, device=absmax.device)
            fp32_absmax += self.state[3]
            w = torch.empty((self.out_features, self.in_features), dtype=self.weight_dtype, device=absmax.device)
            del fp32_absmax
        elif self.int8:
            w = self.weight.to(self.compute_dtype)
            scale = self.scb.unsqueeze(1).mul(1.0 / 127.0)
            w.mul_(scale)
            return w
        else:
            w = torch.empty((self.out_features, self.in_features), dtype=self.weight_dtype,
                            device=self.weight.device)
        if w.device.type != "meta":
            w.zero_()
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8:
            return _apply(_MatMul8bit, x, self)
        inp_dtype = x.dtype
        if not self.compute_type_is_set:
            # Linear4bit.set_compute_type (bitsandbytes >= 0.41.0): an fp32 or bf16 input's dtype becomes the
            # compute dtype on the first call, so such inputs are not cast (fp32 hidden states after
            # prepare_model_for_kbit_training stay fp32 into MatMul4Bit, which dequantizes to fp32)
            if x.dtype in (torch.float32, torch.bfloat16):
                self.compute_dtype = x.dtype
            self.compute_type_is_set = True
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        if x.numel() == x.shape[-1] and not torch.is_grad_enabled():
            # single-token inference: gemv_4bit reads the packed weight directly
            out = x.new_empty((*x.shape[:-1], self.out_features))
            if out.device.type != "meta":
                out.zero_()
            if bias is not None:
                out = out + bias
        else:
            out = _apply(_MatMul4Bit, x, self, bias)
        return out.to(inp_dtype)


def _apply(fn: Any, *args: Any) -> torch.Tensor:
    return cast(torch.Tensor, fn.apply(*args))


class _MatMul4Bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, layer: QuantLinear, bias: torch.Tensor | None) -> torch.Tensor:
        w = layer.dequantize().to(a.dtype)
        out = torch.nn.functional.linear(a, w, bias)
        del w
        if layer.saves_input and ctx.needs_input_grad[0]:
            # bitsandbytes < 0.43.2 kept A, unused by its backward (``ctx.tensors = (A, B)``).  bitsandbytes held it
            # as a ctx attribute, which the engine does not release after the node runs; saved here through
            # save_for_backward, because the trace's non-reentrant checkpointing only drops saved tensors (an
            # attribute would keep every layer's input through the forward), so the trace releases it one node
            # earlier than bitsandbytes did (analytic/activations.py ``_kbit_inputs``)
            ctx.save_for_backward(a)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor | None]:
        grad_a = None
        if ctx.needs_input_grad[0]:
            w = ctx.layer.dequantize().to(grad.dtype)
            grad_a = torch.matmul(grad, w)
            del w
        grad_bias = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_a, None, grad_bias


class _MatMul8bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, layer: QuantLinear) -> torch.Tensor:
        a16 = a.to(torch.float16)
        ca = torch.empty(a16.shape, dtype=torch.int8, device=a.device)
        sca = torch.empty(a16.shape[:-1], dtype=torch.float32, device=a.device)
        acc = torch.empty((*a16.shape[:-1], layer.out_features), dtype=torch.int32, device=a.device)
        out = torch.empty((*a.shape[:-1], layer.out_features), dtype=a.dtype, device=a.device)
        del ca, sca, acc, a16
        if out.device.type != "meta":
            out.zero_()
        if layer.bias is not None:
            out = out + layer.bias.to(out.dtype)
        ctx.layer = layer
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(a)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        layer = ctx.layer
        w = layer.weight.to(grad.dtype)
        w.mul_(layer.scb.unsqueeze(1).mul(1.0 / 127.0))
        grad_a = torch.matmul(grad, w)
        return grad_a, None


class _ExpertMLP(torch.nn.Module):
    """One routed expert as transformers 4.x held it: gate, up and down projections (bias-free)."""

    def __init__(self, hidden: int, inter: int, act_fn: torch.nn.Module, make: Any) -> None:
        super().__init__()
        self.gate_proj: QuantLinear = make(hidden, inter)
        self.up_proj: QuantLinear = make(hidden, inter)
        self.down_proj: QuantLinear = make(inter, hidden)
        self.act_fn = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # MixtralBlockSparseTop2MLP.forward (transformers 4.x): w2(act(w1(x)) * w3(x))
        return cast(torch.Tensor, self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))


class QuantExperts(torch.nn.ModuleList):
    """Fused experts turned back into E per-expert MLPs of ``QuantLinear`` (see the module docstring).

    The forward is the eager experts loop of transformers (``MixtralExperts.forward``,
    modeling_mixtral.py:68-92; the same code in Qwen3MoE and DeepSeek-V3): the routing mask as an
    int64 one-hot ``[E + 1, top_k, T]``, then per expert the gathered tokens, the MLP, the
    multiplication by the routing weights and an ``index_add_`` into the output.  Which tokens an
    expert receives depends on the router's values, which the meta device does not have: the
    ``T * top_k`` assignments are spread evenly over the experts (the first ``T * top_k mod E``
    experts take one more), the balanced routing the analytic engine assumes too.
    """

    def __init__(self, experts: torch.nn.Module, fmt: str, compute_dtype: torch.dtype, device: str,
                 shared: dict[str, torch.Tensor]) -> None:
        gate_up = cast(torch.Tensor, experts.gate_up_proj)
        num_experts, two_inter, hidden = (int(d) for d in gate_up.shape)
        dtype = gate_up.dtype
        act_fn = cast(torch.nn.Module, experts.act_fn)

        def make(fin: int, fout: int) -> QuantLinear:
            return QuantLinear(fin, fout, False, fmt, compute_dtype, dtype, device, shared)

        super().__init__([_ExpertMLP(hidden, two_inter // 2, act_fn, make) for _ in range(num_experts)])
        self.num_experts = num_experts

    def projections(self) -> list[QuantLinear]:
        """Every expert's gate, up and down projection, in that order."""
        out: list[QuantLinear] = []
        for mlp in self:
            assert isinstance(mlp, _ExpertMLP)
            out.extend((mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        return out

    def state(self) -> list[torch.Tensor]:
        return [t for proj in self.projections() for t in proj.state]

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        final = torch.zeros_like(hidden_states)
        tokens, top_k = (int(d) for d in top_k_index.shape)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
        per, extra = divmod(tokens * top_k, self.num_experts)
        start = 0
        for e, mlp in enumerate(self):
            n = per + (1 if e < extra else 0)
            if n == 0:
                continue
            with torch.no_grad():
                # torch.where(mask[e]) returns (top_k position, token index), one int64 each per assignment
                slot = torch.arange(start, start + n, device=hidden_states.device)
                top_k_pos, token_idx = slot // tokens, slot % tokens
                del slot
            start += n
            current = hidden_states[token_idx]
            out = mlp(current)
            out = out * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
        del mask
        return final


def _fused_experts(module: torch.nn.Module) -> bool:
    """transformers' fused experts with the concatenated, untransposed, bias-free layout
    (``@use_experts_implementation`` defaults: integrations/moe.py:582-590)."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gate_up, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter)
            and gate_up.dim() == 3 and down.dim() == 3 and hasattr(module, "act_fn")
            and not getattr(module, "is_transposed", False) and getattr(module, "is_concatenated", True)
            and not getattr(module, "has_bias", False) and getattr(module, "has_gate", True)
            and int(gate_up.shape[1]) == 2 * int(down.shape[2]) and int(gate_up.shape[2]) == int(down.shape[1]))


def quantize_linears(model: torch.nn.Module, fmt: str, compute_dtype: torch.dtype, device: str,
                     saves_input: bool = False) -> list[torch.Tensor]:
    """Replace every linear layer but the LM head by a ``QuantLinear``, and fused MoE experts by
    ``QuantExperts``; return their state tensors.

    transformers' bitsandbytes integration skips the output embedding (``lm_head``) and converts
    ``nn.Linear`` (and GPT-2's ``Conv1D``) modules; MoE experts are converted as transformers 4.x
    held them.  ``saves_input``: bitsandbytes < 0.43.2, whose ``MatMul4Bit`` kept each 4-bit
    linear's input for the backward (``ctx.tensors = (A, B)``; bitsandbytes#1270 removed it).
    """
    from transformers.pytorch_utils import Conv1D

    getter: Any = getattr(model, "get_output_embeddings", None)
    out_emb = getter() if getter is not None else None
    shared: dict[str, torch.Tensor] = {}
    state: list[torch.Tensor] = []
    seen: set[int] = set()

    def keep(tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                state.append(t)

    for _name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if child is out_emb or child_name == "lm_head":
                continue
            if _fused_experts(child):
                qe = QuantExperts(child, fmt, compute_dtype, device, shared)
                setattr(parent, child_name, qe)
                keep(qe.state())
                continue
            if isinstance(child, torch.nn.Linear) and not isinstance(child, QuantLinear):
                fin, fout, dtype = child.in_features, child.out_features, child.weight.dtype
            elif isinstance(child, Conv1D):
                fin, fout, dtype = child.weight.shape[0], child.weight.shape[1], child.weight.dtype
            else:
                continue
            q = QuantLinear(fin, fout, child.bias is not None, fmt, compute_dtype, dtype, device, shared)
            q.saves_input = saves_input and not q.int8
            setattr(parent, child_name, q)
            keep(q.state)
    _assign_is_quantized(model)
    return state


def _assign_is_quantized(model: torch.nn.Module) -> None:
    """What transformers' quantizers do after loading (5.24 ``quantizers/base.py`` ``_assign_is_quantized``): every
    ``PreTrainedModel``'s config gets ``_is_quantized``, which Jamba's and FalconMamba's mixers read to run
    ``dt_proj`` as a module (``dt_proj(time_step) - dt_proj.bias``) instead of multiplying its (packed) weight."""
    from transformers.modeling_utils import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            module.config._is_quantized = True
