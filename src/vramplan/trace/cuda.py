"""The CUDA behaviour layer: make a meta-device (or CPU) step allocate what a CUDA step would.

On a CPU-only build the traced code takes CPU paths that allocate differently from a GPU.
This layer puts back the CUDA behaviour that changes memory, without fake CUDA tensors:

* **autocast**: CUDA autocast only touches CUDA tensors, so it does nothing on meta tensors.
  We register Python kernels for PyTorch's CUDA autocast op lists
  (``ATen/autocast_mode.h``: lower-precision, fp32, fp32-with-dtype and promote lists) on a
  dispatch key no backend uses here (``AutocastPrivateUse1``) and include that key in the
  thread-local dispatch set while tracing.  The kernels cast as ``cached_cast`` does,
  including the weight cache (fp32 leaf tensors that require grad are cast once per
  autocast region and the copy is kept until the region ends).
* **softmax / log_softmax** with ``dtype=float32`` on fp16 input run ``_softmax(half_to_float)``
  on CUDA (no fp32 copy of the input), a CUDA-only branch of ``SoftMax.cpp``.
* **dropout**: CUDA takes ``native_dropout`` (a 1-byte bool mask); other devices keep a mask
  of the input's dtype (``Dropout.cpp``, ``is_fused_kernel_acceptable``).
* **scaled_dot_product_attention**: the backend is chosen as ``sdp_utils.cpp`` would on the
  scenario's GPU (cuDNN, flash, memory-efficient or math, by dtype, head size, mask, dropout,
  layout and compute capability) and the chosen kernel's tensors are allocated: flash saves
  the output and an fp32 logsumexp ``[b, h, s]`` and its backward allocates dq/dk/dv, an fp32
  ``dq_accum`` and ``softmax_d`` (flash-attention 2 ``mha_bwd``); the math path materialises
  the ``s x s`` scores in fp32 (``_scaled_dot_product_attention_math`` upcasts half inputs).
* **device capability**: ``torch.cuda.get_device_capability`` answers with the scenario GPU's
  (MoE code picks grouped GEMMs from it), and transformers' grouped-GEMM check follows the
  CUDA rule.
* **fused optimizers**: the meta device is accepted where CUDA is (``fused=True``).
* **torch.autocast** regions that library code opens on the traced tensors' device
  (``torch.autocast(device_type=W.device.type, enabled=False)`` in peft's LoRA over a fused
  MoE expert parameter, ``lora/layer.py`` ``_LoraFactorsProxy``) open the emulated CUDA
  autocast region instead: on a GPU the device type is ``cuda``, so the region enables or
  disables CUDA autocast; for ``meta`` torch has no autocast state at all and refuses it.

Sources: pytorch/pytorch ``aten/src/ATen/autocast_mode.{h,cpp}``,
``aten/src/ATen/native/transformers/{attention.cpp,cuda/sdp_utils.cpp}``,
``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``, ``aten/src/ATen/native/Dropout.cpp``.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, cast

import torch
from torch._C import DispatchKey, DispatchKeySet

__all__ = ["CudaSpec", "SdpaChoice", "autocast", "cuda_behaviour", "sdpa_choices", "select_sdpa_backend"]

KEY = DispatchKey.__members__["AutocastPrivateUse1"]
KEY_NAME = "AutocastPrivateUse1"


@dataclass(frozen=True)
class CudaSpec:
    """What the emulated CUDA device is: compute capability and library behaviour."""

    capability: tuple[int, int] = (9, 0)
    cudnn_sdpa_preferred: bool = False  # torch prefers cuDNN SDPA on sm90/sm100 with cuDNN > 9.15
    cudnn_d256: bool = False
    # PyTorch's memory-efficient kernel takes grouped K/V (enable_gqa) from 2.14 (its SDPA docstring; 2.13's
    # says GQA runs on flash and math only): before, such a call falls to math (analytic/attention.py)
    efficient_gqa: bool = False


@dataclass
class SdpaChoice:
    backend: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class _State:
    active: int = 0
    spec: CudaSpec = field(default_factory=CudaSpec)
    autocast_dtype: torch.dtype | None = None
    autocast_depth: int = 0
    suspended: int = 0
    cache: dict[int, tuple[Any, torch.Tensor]] = field(default_factory=dict)
    devices: tuple[str, ...] = ("meta", "cpu")
    choices: list[SdpaChoice] = field(default_factory=list)
    real_values: bool = True

    def autocast_on(self) -> bool:
        return self.autocast_dtype is not None and self.suspended == 0


_S = _State()
_Library: Any = torch.library.Library


def _apply(fn: Any, *args: Any) -> torch.Tensor:
    """``torch.autograd.Function.apply`` (untyped in torch) with a typed result."""
    return cast(torch.Tensor, fn.apply(*args))
_LIBS: list[torch.library.Library] = []
# (enter, exit) callbacks around a checkpointed function (the module scope keeps its stack right
# when a recomputation stops early by raising out of the layer's forward)
CHECKPOINT_SCOPES: list[tuple[Callable[[], int], Callable[[int], None]]] = []


def sdpa_choices() -> list[SdpaChoice]:
    """The SDPA backends chosen in the last trace (one per call)."""
    return list(_S.choices)


def _exclude() -> Any:
    return torch._C._ExcludeDispatchKeyGuard(DispatchKeySet(KEY))


@contextlib.contextmanager
def _suspend() -> Iterator[None]:
    _S.suspended += 1
    try:
        yield
    finally:
        _S.suspended -= 1


# --------------------------------------------------------------------------------------
# autocast casts (autocast_mode.cpp ``cached_cast``)
# --------------------------------------------------------------------------------------
def _eligible(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type in _S.devices)


def _cached_cast(to: torch.dtype, t: Any) -> Any:
    if isinstance(t, (list, tuple)):
        return type(t)(_cached_cast(to, x) for x in t)
    if not _eligible(t) or t.dtype == to:
        return t
    lower = _S.autocast_dtype
    can_cache = (to == lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
                 and t._base is None)
    if can_cache:
        hit = _S.cache.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        cast = t.to(to)
        _S.cache[id(t)] = (weakref.ref(t), cast)
        return cast
    return t.to(to)


def _promote_type(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.dtype:
    assert _S.autocast_dtype is not None
    current = _S.autocast_dtype
    for a in [*args, *kwargs.values()]:
        items = a if isinstance(a, (list, tuple)) else [a]
        for t in items:
            if _eligible(t) and t.dtype == torch.float32:
                current = torch.float32
    return current


def _make_cast_kernel(op: Any, policy: str) -> Callable[..., Any]:
    dtype_pos = None
    if policy == "set_opt_dtype":
        for i, a in enumerate(op._schema.arguments):
            if a.name == "dtype":
                dtype_pos = (i, a.kwarg_only)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if _S.autocast_on():
            assert _S.autocast_dtype is not None
            if policy == "lower":
                to = _S.autocast_dtype
                args = tuple(_cached_cast(to, a) for a in args)
                kwargs = {k: _cached_cast(to, v) for k, v in kwargs.items()}
            elif policy == "fp32":
                args = tuple(_cached_cast(torch.float32, a) for a in args)
                kwargs = {k: _cached_cast(torch.float32, v) for k, v in kwargs.items()}
            elif policy == "promote":
                to = _promote_type(args, kwargs)
                args = tuple(_cached_cast(to, a) for a in args)
                kwargs = {k: _cached_cast(to, v) for k, v in kwargs.items()}
            elif policy == "set_opt_dtype" and args and _eligible(args[0]) and dtype_pos is not None:
                i, kwonly = dtype_pos
                if kwonly or len(args) <= i:
                    if kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                elif args[i] is None:
                    args = (*args[:i], torch.float32, *args[i + 1:])
        with _exclude():
            return op(*args, **kwargs)

    return kernel


_LOWER = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
]
_FP32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
]
_SET_OPT_DTYPE = [
    "prod", "prod.dim_int", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm",
    "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
]
_PROMOTE = ["addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "tensordot", "scatter_add"]


def _overload(name: str) -> Any:
    packet, _, ov = name.partition(".")
    p = getattr(torch.ops.aten, packet, None)
    if p is None:
        return None
    return getattr(p, ov or "default", None)


# --------------------------------------------------------------------------------------
# CUDA-only branches of composite ops
# --------------------------------------------------------------------------------------
def _softmax_kernel(log: bool) -> Callable[..., Any]:
    inner = torch.ops.aten._log_softmax.default if log else torch.ops.aten._softmax.default
    outer = torch.ops.aten.log_softmax.int if log else torch.ops.aten.softmax.int

    def kernel(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        if _S.autocast_on() and _eligible(x) and dtype is None:
            dtype = torch.float32
        if x.device.type == "meta" and x.dtype == torch.float16 and dtype == torch.float32:
            # SoftMax.cpp: CUDA half input with dtype=float -> _softmax(half_to_float=True), no copy
            return cast(torch.Tensor, inner(x, dim, True))
        with _exclude():
            return cast(torch.Tensor, outer(x, dim, dtype))

    return kernel


def _dropout_kernel(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    if train and 0 < p < 1 and x.numel() > 0:
        return cast(torch.Tensor, torch.ops.aten.native_dropout.default(x, p, True)[0])
    with _exclude():
        return cast(torch.Tensor, torch.ops.aten.dropout.default(x, p, train))


# --------------------------------------------------------------------------------------
# SDPA backend selection (sdp_utils.cpp, select_sdp_backend)
# --------------------------------------------------------------------------------------
def _sm(cap: tuple[int, int], lo: tuple[int, int], hi: tuple[int, int]) -> bool:
    return lo <= cap <= hi


def _heads_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> bool:
    if q.shape[0] != k.shape[0] or q.shape[0] != v.shape[0]:
        return False
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if hq == hk == hv:
        return True
    return enable_gqa and hk == hv and hq % hk == 0


def select_sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                        dropout_p: float, is_causal: bool, enable_gqa: bool, spec: CudaSpec) -> str:
    """The backend ``select_sdp_backend`` picks on a GPU of ``spec.capability`` (torch 2.13; grouped K/V on the
    memory-efficient kernel only with ``spec.efficient_gqa``, torch 2.14)."""
    cap = spec.capability
    half = q.dtype in (torch.float16, torch.bfloat16)
    low_precision_ok = (q.dtype in (torch.float16, torch.bfloat16)) if cap >= (8, 0) else q.dtype == torch.float16
    dense_4d = q.dim() == 4 and k.dim() == 4 and v.dim() == 4
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    requires_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    nonzero = all(int(t.shape[-2]) > 0 for t in (q, k, v))
    stride_ok = all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (q, k, v))

    def can_flash() -> bool:
        if not dense_4d or mask is not None:
            return False
        if not (dq == dk == dv and dq <= 256):
            return False
        if not _sm(cap, (8, 0), (12, 1)):
            return False
        if requires_grad and (_sm(cap, (8, 6), (8, 9)) or _sm(cap, (12, 0), (12, 1))) and not (
                dq <= 192 or (dropout_p == 0 and dq > 224)):
            return False
        if is_causal and q.shape[-2] != k.shape[-2]:
            return False
        if not low_precision_ok:
            return False
        return _heads_ok(q, k, v, enable_gqa) and nonzero and stride_ok

    def can_efficient() -> bool:
        if not dense_4d or not _sm(cap, (5, 0), (12, 1)):
            return False
        if q.shape[1] != k.shape[1] and not spec.efficient_gqa:
            return False
        use_tc = cap[0] >= 8 or (cap[0] >= 7 and half)
        align = 4 if cap[0] >= 8 else 1
        if use_tc:
            align = max(align, 128 // (16 if half else 32))
        if not (dq == dk and dq % align == 0 and dv % align == 0 and dq > 0 and dv > 0):
            return False
        allowed = (torch.float16, torch.float32, torch.bfloat16) if cap >= (8, 0) else (torch.float16, torch.float32)
        if q.dtype not in allowed:
            return False
        return _heads_ok(q, k, v, enable_gqa) and nonzero and stride_ok

    def can_cudnn() -> bool:
        if not dense_4d or not _sm(cap, (8, 0), (12, 1)) or not low_precision_ok:
            return False
        if dropout_p * 16.0 != math.floor(dropout_p * 16.0):
            return False
        limit = 256 if (spec.cudnn_d256 and cap[0] in (9, 10)) else 128
        if not (dq <= limit and dv <= limit and dq % 8 == 0 and dv % 8 == 0) or k.shape[-2] == 1:
            return False
        _, h, s_q, d = q.shape
        s_k = k.shape[-2]

        def bshd(t: torch.Tensor, s: int, heads: int) -> bool:
            return t.stride(0) == s * heads * d and t.stride(1) == d and t.stride(2) == heads * d and t.stride(3) == 1

        layout = bshd(q, s_q, h) and bshd(k, s_k, k.shape[1]) and bshd(v, s_k, v.shape[1])
        return layout and (q.shape[1] % k.shape[1] == 0)

    order = ["cudnn", "flash", "efficient", "math"] if (
        spec.cudnn_sdpa_preferred and cap[0] in (9, 10)) else ["flash", "efficient", "math", "cudnn"]
    for b in order:
        if b == "cudnn" and can_cudnn():
            return "cudnn"
        if b == "flash" and can_flash():
            return "flash"
        if b == "efficient" and can_efficient():
            return "efficient"
        if b == "math":
            return "math"
    return "math"


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


def _zero_like_values(*ts: torch.Tensor) -> None:
    for t in ts:
        if t.device.type != "meta":
            t.zero_()


def _kernel_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused attention kernel's backward: dq, dk, dv (in the kernel's [b, s, h, d] layout), with
    its workspace made and freed while they are alive."""
    b, h, s, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    dq = q.new_empty((b, s, h, d)).transpose(1, 2)
    dk = k.new_empty((b, sk, hk, k.shape[-1])).transpose(1, 2)
    dv = v.new_empty((b, sk, v.shape[1], v.shape[-1])).transpose(1, 2)
    work: list[torch.Tensor] = []
    if backend in ("flash", "flash_attn"):
        # flash_api.cpp mha_bwd: softmax_d [b, h, s_rounded] and dq_accum [b, s_rounded, h, d_rounded], fp32
        s_r = _round(s, 128)
        d_r = _round(d, 32) if d <= 192 else 256
        work.append(q.new_empty((b, h, s_r), dtype=torch.float32))
        work.append(q.new_empty((b, s_r, h, d_r), dtype=torch.float32))
    elif backend == "efficient":
        # mem-efficient backward: delta [b, h, s] fp32 and an fp32 grad-q accumulator
        work.append(q.new_empty((b, h, _round(s, 32)), dtype=torch.float32))
        if q.dtype != torch.float32:
            work.append(q.new_empty((b, s, h, d), dtype=torch.float32))
    if hk != h:
        # grouped-query attention: gradients of the expanded K/V heads, then summed per group
        work.append(k.new_empty((b, sk, h, k.shape[-1])))
        work.append(v.new_empty((b, sk, h, v.shape[-1])))
    del work
    _zero_like_values(dq, dk, dv)
    return dq, dk, dv


class _FusedAttention(torch.autograd.Function):
    """Memory of a fused SDPA kernel (flash, memory-efficient or cuDNN) on CUDA.

    Forward: output in [b, s, h, d] layout (returned as a [b, h, s, d] view) and an fp32
    logsumexp, both saved with q, k, v.  Backward: dq, dk, dv, plus the kernel's fp32
    workspaces, which are released before the gradients are returned.  Values are not
    computed (zeros on real tensors): the layer exists to reproduce allocations.
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
        b, h, s, _ = q.shape
        dv = v.shape[-1]
        out = q.new_empty((b, s, h, dv)).transpose(1, 2)
        if backend == "efficient":
            lse = q.new_empty((b, h, _round(s, 32)), dtype=torch.float32)
        else:
            lse = q.new_empty((b, h, s), dtype=torch.float32)
        _zero_like_values(out, lse)
        ctx.backend = backend
        saved = [q, k, v, out, lse]
        if backend == "flash_attn":
            # flash-attention 2 (mha_fwd) keeps its philox state as a 2 x int64 device tensor
            saved.append(q.new_empty((2,), dtype=torch.int64))
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v = ctx.saved_tensors[:3]
        dq, dk, dv = _kernel_backward(q, k, v, ctx.backend)
        return dq, dk, dv, None


def _math_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float,
               is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` op by op, with CUDA's dropout (attention.cpp)."""
    origin = q.dtype
    q = q.float() if q.dtype in (torch.float16, torch.bfloat16) else q
    k = k.float() if k.dtype in (torch.float16, torch.bfloat16) else k
    v = v.float() if v.dtype in (torch.float16, torch.bfloat16) else v
    sc = (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    factor = math.sqrt(abs(sc))
    qs = q * (-factor if sc < 0 else factor)
    if is_causal:
        ell, s = qs.shape[-2], k.shape[-2]
        bool_mask = torch.ones((ell, s), dtype=torch.bool, device=q.device).tril()
        mask = _bool_to_additive(bool_mask, qs.dtype)
        del bool_mask
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    attn = torch.matmul(qs, k.transpose(-2, -1) * factor)
    if mask is not None:
        attn.add_(mask)
    attn = torch.ops.aten._safe_softmax.default(attn, -1)
    if dropout_p > 0.0:
        attn = torch.nn.functional.dropout(attn, dropout_p, True)
    out = torch.matmul(attn, v).to(origin)
    attn.to(origin)  # the op also returns the weights in the input dtype; SDPA drops them
    return out


def _bool_to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """attention.cpp ``convert_boolean_attn_mask``: where(mask, 0, -inf) in the query dtype."""
    return torch.where(mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=dtype, device=mask.device))


def _sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                 dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
                 enable_gqa: bool = False) -> torch.Tensor:
    if _S.autocast_on():
        assert _S.autocast_dtype is not None
        to = _S.autocast_dtype
        q, k, v = _cached_cast(to, q), _cached_cast(to, k), _cached_cast(to, v)
        attn_mask = _cached_cast(to, attn_mask)
    with _suspend():
        backend = select_sdpa_backend(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa, _S.spec)
        _S.choices.append(SdpaChoice(backend, tuple(q.shape), str(q.dtype).replace("torch.", "")))
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = _bool_to_additive(attn_mask, q.dtype)
        if backend == "math":
            return _math_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if backend == "flash" and q.shape[-1] % 8:
            pad = 8 - q.shape[-1] % 8
            og = v.shape[-1]
            qp, kp, vp = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
            out = _apply(_FusedAttention, qp, kp, vp, backend)
            return out[..., :og]
        if attn_mask is not None:
            # efficient attention reads the bias [b, h, s, s] (expanded, 16-aligned): keep it alive
            out = _apply(_BiasedAttention, q, k, v, attn_mask, backend)
            return out
        return _apply(_FusedAttention, q, k, v, backend)


class _BiasedAttention(torch.autograd.Function):
    """Memory-efficient attention with an additive mask: as ``_FusedAttention``, saving the mask."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                backend: str) -> torch.Tensor:
        b, h, s, _ = q.shape
        out = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
        lse = q.new_empty((b, h, _round(s, 32)), dtype=torch.float32)
        _zero_like_values(out, lse)
        ctx.save_for_backward(q, k, v, out, lse, bias)
        ctx.backend = backend
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, _out, _lse, _bias = ctx.saved_tensors
        dq, dk, dv = _kernel_backward(q, k, v, "efficient")
        return dq, dk, dv, None, None


class _GroupedMM(torch.autograd.Function):
    """``_grouped_mm`` for inputs the meta kernel refuses (it accepts bf16 only, as the fast
    CUDA path; CUDA falls back to a per-group loop for other dtypes, with the same outputs).

    Gradients follow derivatives.yaml: ``grad @ mat2^T`` grouped for ``self`` and
    ``self^T @ grad`` grouped for ``mat2``.
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
        out = a.new_empty((a.shape[0], b.shape[-1]))
        _zero_like_values(out)
        ctx.save_for_backward(a if b.requires_grad else None, b if a.requires_grad else None, offs)
        ctx.b_shape, ctx.b_stride = tuple(b.shape), tuple(b.stride())
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b, _offs = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[1] and a is not None:
            # the gradient is produced in mat2's own layout (a transposed view of the parameter)
            gb = torch.empty_strided(ctx.b_shape, ctx.b_stride, dtype=grad.dtype, device=grad.device)
            _zero_like_values(gb)
        if ctx.needs_input_grad[0] and b is not None:
            ga = grad.new_empty((grad.shape[0], b.shape[-2]))
            _zero_like_values(ga)
        return ga, gb, None


def _grouped_mm_kernel(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None,
                       bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    if a.device.type == "meta" and (a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16) and bias is None \
            and out_dtype is None and a.dim() == 2 and b.dim() == 3:
        return _apply(_GroupedMM, a, b, offs)
    with _exclude():
        return cast(torch.Tensor, torch.ops.aten._grouped_mm.default(a, b, offs, bias, out_dtype))


# --------------------------------------------------------------------------------------
# registration and the context managers
# --------------------------------------------------------------------------------------
def _register() -> None:
    if _LIBS:
        return
    fallback = _Library("_", "IMPL")  # noqa: TOR901
    fallback.fallback(torch.library.fallthrough_kernel, KEY_NAME)
    lib = _Library("aten", "IMPL")  # noqa: TOR901
    for names, policy in ((_LOWER, "lower"), (_FP32, "fp32"), (_SET_OPT_DTYPE, "set_opt_dtype"),
                          (_PROMOTE, "promote")):
        for name in names:
            op = _overload(name)
            if op is None:
                continue
            lib.impl(name, _make_cast_kernel(op, policy), KEY_NAME)
    lib.impl("softmax.int", _softmax_kernel(False), KEY_NAME)
    lib.impl("log_softmax.int", _softmax_kernel(True), KEY_NAME)
    lib.impl("dropout", _dropout_kernel, KEY_NAME)
    lib.impl("scaled_dot_product_attention", _sdpa_kernel, KEY_NAME)
    lib.impl("_grouped_mm", _grouped_mm_kernel, KEY_NAME)
    _LIBS.extend([fallback, lib])


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None, cache_enabled: bool = True) -> Iterator[None]:
    """CUDA autocast for traced tensors (``torch.autocast('cuda', dtype)``); None: disabled region."""
    old = _S.autocast_dtype
    _S.autocast_dtype = dtype
    _S.autocast_depth += 1
    old_flags = _set_torch_flags(dtype)
    try:
        yield
    finally:
        _S.autocast_depth -= 1
        _S.autocast_dtype = old
        _restore_torch_flags(old_flags)
        if _S.autocast_depth == 0:
            _S.cache.clear()  # torch.autocast.__exit__: clear_autocast_cache at the outermost exit


def _set_torch_flags(dtype: torch.dtype | None) -> tuple[bool, torch.dtype]:
    """Make ``torch.is_autocast_enabled()`` answer as on the GPU (peft and transformers ask it)."""
    old = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    torch.set_autocast_enabled("cuda", dtype is not None)
    if dtype is not None:
        torch.set_autocast_dtype("cuda", dtype)
    return old


def _restore_torch_flags(old: tuple[bool, torch.dtype]) -> None:
    torch.set_autocast_enabled("cuda", old[0])
    torch.set_autocast_dtype("cuda", old[1])


def autocast_state() -> torch.dtype | None:
    return _S.autocast_dtype


@contextlib.contextmanager
def restore_autocast(dtype: torch.dtype | None) -> Iterator[None]:
    """Re-enter the autocast state captured in the forward (checkpoint recomputation).

    torch.utils.checkpoint re-enters ``torch.autocast`` for the recomputation; leaving it (outside
    any other autocast region, as in the backward) clears the cast cache, so the recomputed
    layer's cast weights live only as long as its saved tensors need them.
    """
    if dtype is None:
        yield
        return
    with autocast(dtype):
        yield


_TorchAutocast: Any = torch.amp.autocast_mode.autocast


class _EmulatedAutocast(_TorchAutocast):  # type: ignore[misc]
    """``torch.autocast`` while tracing: a region on the traced device (or on ``cuda``) is a region
    of the emulated CUDA autocast, as ``torch.autocast('cuda', ...)`` would be on the GPU; any other
    device type gets torch's own.

    On CUDA, ``enabled=False`` turns CUDA autocast off inside; ``enabled=True`` turns it on with
    ``dtype``, or the current CUDA autocast dtype when none is given (``autocast_mode.py``
    ``torch.get_autocast_dtype``).  Leaving the outermost region clears the weight cache, as
    ``cuda.autocast`` does.
    """

    def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        self._emulated = _S.active > 0 and (device_type == "cuda" or device_type in _S.devices)
        if not self._emulated:
            super().__init__(device_type, dtype, enabled, cache_enabled)
            return
        self.device = device_type
        self._enabled = enabled
        self._requested = dtype
        self._open: list[contextlib.AbstractContextManager[None]] = []

    def __enter__(self) -> None:
        if not self._emulated:
            super().__enter__()
            return
        dtype = (self._requested or torch.get_autocast_dtype("cuda")) if self._enabled else None
        ctx = autocast(dtype)
        ctx.__enter__()
        self._open.append(ctx)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._emulated:
            super().__exit__(exc_type, exc, tb)
            return
        self._open.pop().__exit__(exc_type, exc, tb)


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """flash-attention 2's ``flash_attn_func`` on [b, s, h, d] tensors (pads head dims to a multiple of 8)."""
    og = q.shape[-1]
    if og % 8:
        pad = 8 - og % 8
        q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
    _S.choices.append(SdpaChoice("flash_attn", tuple(q.shape), str(q.dtype).replace("torch.", "")))
    out = _apply(_FusedAttention, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "flash_attn")
    out = out.transpose(1, 2)
    return out[..., :og] if og % 8 else out


@contextlib.contextmanager
def cuda_behaviour(spec: CudaSpec, devices: tuple[str, ...] = ("meta",)) -> Iterator[None]:
    """Route traced ops through the CUDA behaviour kernels while active."""
    _register()
    _S.active += 1
    old_spec, old_devices = _S.spec, _S.devices
    _S.spec, _S.devices = spec, devices
    _S.choices.clear()
    was_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(KEY)
    torch._C._dispatch_tls_set_dispatch_key_excluded(KEY, False)
    guard = torch._C._IncludeDispatchKeyGuard(KEY)
    patches = _patch_capability(spec)
    try:
        with guard:
            yield
    finally:
        for undo in reversed(patches):
            undo()
        torch._C._dispatch_tls_set_dispatch_key_excluded(KEY, was_excluded)
        _S.spec, _S.devices = old_spec, old_devices
        _S.active -= 1


def _patch_capability(spec: CudaSpec) -> list[Callable[[], None]]:
    undo: list[Callable[[], None]] = []

    def setattr_undo(obj: Any, name: str, value: Any) -> None:
        old = getattr(obj, name)
        setattr(obj, name, value)
        undo.append(lambda: setattr(obj, name, old))

    setattr_undo(torch.cuda, "get_device_capability", lambda device=None: spec.capability)
    for owner in (torch, torch.amp, torch.amp.autocast_mode):
        setattr_undo(owner, "autocast", _EmulatedAutocast)
    import torch.optim.optimizer as optimizer_mod
    import torch.utils._foreach_utils as foreach_utils

    base = foreach_utils._get_fused_kernels_supported_devices

    def fused_devices() -> list[str]:
        return [*base(), "meta"]

    setattr_undo(foreach_utils, "_get_fused_kernels_supported_devices", fused_devices)
    if hasattr(optimizer_mod, "_get_fused_kernels_supported_devices"):
        setattr_undo(optimizer_mod, "_get_fused_kernels_supported_devices", fused_devices)
    try:
        from transformers.integrations import moe as moe_mod
    except ImportError:  # pragma: no cover - transformers is part of the trace extra
        return undo
    if hasattr(moe_mod, "_can_use_grouped_mm"):
        original = moe_mod._can_use_grouped_mm

        def can_use_grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> bool:
            if weight.device.type == "meta":
                # the CUDA rule: torch.nn.functional.grouped_mm needs sm80 or newer
                return hasattr(torch.nn.functional, "grouped_mm") and spec.capability >= (8, 0)
            return bool(original(input, weight, offs))

        setattr_undo(moe_mod, "_can_use_grouped_mm", can_use_grouped_mm)
    return undo
