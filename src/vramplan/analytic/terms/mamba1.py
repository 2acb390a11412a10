"""What a Mamba-1 mixer layer saves for its backward in training, tensor by tensor (bytes for one micro-batch).

Modelled: transformers 5.24's torch path of ``MambaMixer.forward`` (``models/mamba/modeling_mamba.py``) in training
without a cache, which is what runs without the ``mamba-ssm`` and ``causal-conv1d`` packages: ``mamba_inner_fn`` is
decorated with ``use_kernel_func_from_hub_with_fallback`` and its torch stand-in returns None (``# Only kernels can
use this shortcircuit, fallback to normal torch otherwise``), so the mixer runs ``causal_conv1d_fn``'s
``F.conv1d``, ``x_proj``, ``dt_proj`` and ``mamba_selective_scan``'s recurrent loop (``use_mambapy`` False by default;
the associative scan only under ``torch.compile``).  With mamba-ssm installed ``MambaInnerFn`` saves its inputs and
recomputes the rest (much less memory): not modelled, the report says so.

Notation: ``b`` sequences of ``s`` tokens, ``T = b s``; ``h`` the hidden size, ``I`` the inner width
(``expand h``), ``n`` the state size, ``r`` the time-step rank, ``k`` the convolution's taps; ``c`` the bytes of the
compute dtype (2 under autocast and bf16, 4 in fp32).  Saved tensors follow ``tools/autograd/derivatives.yaml``
(mm / bmm save both operands that need it, mul both, exp its result, silu and softplus their input; ``.float()``
and ``.to()`` save nothing).

* ``in_proj``'s input, ``T h c`` (autocast's half copy, or the norm's output);
* ``in_proj``'s output, ``T 2I c``: its second half, the gate ``z``, is a view that ``F.silu(z)`` saves (and without
  autocast the convolution's input is a view of the first half);
* the convolution's input under autocast: ``x.to(weight.dtype)`` (fp32) cast back by ``conv1d``: ``T I c``;
* the convolution's output, ``s + k - 1`` positions (``padding = k - 1``, sliced to ``s``; SiLU saves the slice):
  ``b I (s + k - 1) c``;
* ``x_proj``'s input: the SiLU output transposed to ``(b, s, I)``, copied by matmul's reshape when ``b > 1`` (for one
  sequence the reshape is a view): ``T I c``; the SiLU output itself (saved by ``x * D``): ``T I c``;
* ``x_proj``'s output (``time_step``, ``B`` and ``C`` are views; ``dt_proj.weight @ time_step^T`` and the loop's
  ``C[:, i]`` save them): ``T (r + 2n) c``;
* ``dt + dt_bias`` saved by softplus and softplus's output saved by the two discretizing products: ``2 T I c``, fp32
  under autocast (softplus runs in fp32 there): ``2 T I 4``;
* ``A = -exp(A_log.float())``: the exp's result and its negation (saved by ``A * dt``), ``2 I n 4``;
* ``discrete_A = exp(A dt)``, ``(b, I, s, n)`` fp32, saved by exp and by every step's ``discrete_A[:, :, i] *
  state``: ``4 T I n``; ``B.float()`` (``4 T n``, none when ``c`` is 4); ``discrete_B`` saved by ``discrete_B *
  x.float()``: ``4 T I n``; ``x.float()``: ``4 T I`` (none when ``c`` is 4: the SiLU output);
* the recurrent loop: every step saves the state it multiplies (the zero state in the compute dtype, then ``s - 1``
  fp32 states ``b I n 4``) and, for ``scan = state.to(c) @ C[:, i]``, the state's copy in the compute dtype (``s`` of
  them, ``b I n c``; in fp32 the state itself, so the last state once more): ``b I n (c (s + 1) + 4 (s - 1))``, or
  ``b I n 4 (s + 1)`` in fp32;
* ``D``'s fp32 copy under bf16 weights (``self.D.float()``, ``4 I``; the parameter itself otherwise);
* ``scan + x D``, fp32 (a half times an fp32 ``D``), saved by ``* silu(z)``: ``4 T I``; ``silu(z)``: ``T I c``;
* ``out_proj``'s input: the fp32 scan output transposed and cast, copied contiguous by matmul: ``T I c``.

Autocast's half copies of ``in_proj``, ``conv1d``, ``x_proj``, ``dt_proj`` and ``out_proj`` are the weight-cast terms'
(analytic/terms/casts.py), not the mixer's.  The sum equals the storages autograd's graph holds after a
``MambaMixer`` forward on the meta device at every shape ``tests/test_mamba1_train.py`` tries (bf16, fp32, bf16
autocast).

Worked example, state-spaces/mamba-130m-hf (h 768, I 1,536, n 16, r 48, k 4), bf16 autocast, one sequence of 1,024
tokens: discrete_A and discrete_B 2 x 4 x 1,024 x 1,536 x 16 = 201,326,592; the loop's states 1,536 x 16 x (2 x
1,025 + 4 x 1,023) = 150,945,792; the rest 49,193,984 (tests/test_mamba1_train.py): 401,466,368 B per layer, 24
layers 9.6 GB, about 392 KB per token and layer.
"""

from __future__ import annotations

from vramplan.analytic.activations import SavedTensor
from vramplan.spec.model import MambaSpec

__all__ = ["mamba1_saved_tensors", "mamba1_scan_backward_per_token"]

FP32 = 4


def mamba1_saved_tensors(ms: MambaSpec, hidden: int, c: int, autocast: bool, batch: int, seq: int,
                         half_weights: bool) -> tuple[SavedTensor, ...]:
    """One Mamba-1 mixer layer's saved tensors for ``batch`` sequences of ``seq`` tokens (module docstring), in bytes;
    ``c``: bytes of the compute dtype; ``autocast``: mixed precision; ``half_weights``: the parameters are half
    (bf16-true / fp16-true), so ``D.float()`` is a copy."""
    t, inter, n, r, k = batch * seq, ms.intermediate_size, ms.state_size, ms.time_step_rank, ms.conv_kernel
    dt = FP32 if autocast else c
    half = c < FP32
    if ms.bc_dt_norms:
        # FalconMamba's weightless RMS norms on dt's input, B and C (module docstring): each saves its fp32 input
        # (``x.float()``: a copy of the x_proj output's slice in half, the slice itself in fp32) and its rsqrt, and
        # ``type_as`` makes the normalized copy the scan reads (in fp32 the product itself); in half, the normalized
        # B is not saved (the scan saves its fp32 copy, ``scan.B_fp32``)
        split = t * (r + 2 * n) * (FP32 if half else c)
        proj = ("mixer.bc_dt_norms", split + 3 * FP32 * t + (t * n * c if half else t * 2 * n * FP32))
        # the normalized time step, which ``dt_proj.weight @ time_step^T`` saves for the weight's gradient only
        dt_norm = ("mixer.dt_norm_output", t * r * c)
    else:
        proj = ("mixer.x_proj_output", t * (r + 2 * n) * c)
        dt_norm = ("mixer.dt_norm_output", 0)
    # Jamba's RMS norms on dt, B and C hold weights (JambaRMSNorm: ``self.weight * hidden_states.to(input_dtype)``):
    # the product's backward to a trained weight saves the normalized tensor it multiplies, [T, r + 2n] in the
    # compute dtype; the product takes the normalized copy's place as what the scan reads (the rows above)
    weights = ("mixer.bc_dt_norm_weights", t * (r + 2 * n) * c if ms.bc_dt_norm_params else 0)
    states = batch * inter * n * ((c * (seq + 1) + FP32 * (seq - 1)) if half else FP32 * (seq + 1))
    rows = [
        ("mixer.in_proj_input", t * hidden * c),
        ("mixer.in_proj_output", t * 2 * inter * c),
        ("mixer.conv_input", t * inter * c if autocast else 0),
        ("mixer.conv_output", batch * inter * (seq + k - 1) * c),
        ("mixer.x_proj_input", t * inter * c if batch > 1 else 0),
        ("mixer.silu_output", t * inter * c),
        proj,
        dt_norm,
        weights,
        ("scan.dt", 2 * t * inter * dt),
        ("scan.A", 2 * inter * n * FP32),
        ("scan.discrete_A", FP32 * t * inter * n),
        ("scan.B_fp32", FP32 * t * n if half else 0),
        ("scan.discrete_B", FP32 * t * inter * n),
        ("scan.x_fp32", FP32 * t * inter if half else 0),
        ("scan.states", states),
        ("scan.D", FP32 * inter if half_weights else 0),
        ("scan.output_D", FP32 * t * inter),
        ("gate.silu", t * inter * c),
        ("mixer.out_proj_input", t * inter * c),
    ]
    return tuple(SavedTensor(name, nbytes) for name, nbytes in rows if nbytes)


def mamba1_scan_backward_per_token(ms: MambaSpec | None) -> int:
    """Per token, what the recurrent loop's backward holds beside the saved tensors (0 but for a Mamba-1 mixer).

    Every step reads ``discrete_A[:, :, i]`` and ``deltaB_u[:, :, i]``; the backward of each such select
    (``select_backward``, ``derivatives.yaml``) allocates a zero tensor of the whole input, ``(b, I, s, n)`` fp32, and
    writes the step's gradient into its slice, and the autograd engine sums a tensor's gradients in an input buffer
    (the first kept, the next ones added into it).  So through the loop's backward the two buffers (the gradients of
    ``discrete_A`` and of ``deltaB_u``) and one step's select output are alive: ``3 x 4 I n`` bytes per token.
    Checked against the traced engine's step (tests/test_mamba1_train.py)."""
    if ms is None or ms.kind != "mamba1":
        return 0
    return 3 * FP32 * ms.intermediate_size * ms.state_size
