"""GGUF files: a bounded, pure-Python reader of the header, and the tensors of a catalog model in a quant mix.

**The file** (``ggml/docs/gguf.md``, GGUF v2/v3, little-endian): ``"GGUF"`` magic, ``uint32`` version,
``uint64`` tensor count, ``uint64`` metadata count; then the metadata, each a ``gguf_string`` key
(``uint64`` length + UTF-8 bytes), a ``uint32`` value type (0 uint8, 1 int8, 2 uint16, 3 int16,
4 uint32, 5 int32, 6 float32, 7 bool, 8 string, 9 array, 10 uint64, 11 int64, 12 float64) and the
value (an array is ``uint32`` element type, ``uint64`` count, the elements); then per tensor its name,
``uint32`` n_dims, ``uint64`` dims (``ne[0]`` first, the row length), ``uint32`` ggml type and
``uint64`` offset into the data section, which starts at the next multiple of ``general.alignment``
(default 32).  ``read_gguf`` reads only the header, never the tensor data; every count and length
is bounded and checked against the file's size, so a damaged or hostile file gives a ``ScenarioError``
naming what is wrong, never a traceback or an unbounded allocation.  Each tensor's bytes are
``ggml_nbytes`` (``facts.gguf.tensor_bytes``), exact for the file.

**Without a file** ``model_tensors`` lists the tensors llama.cpp's converter writes for a catalog model
(one GGUF tensor per parameter group and layer; the experts of a layer stacked in one 3-d tensor) and
gives each the type ``llama-quantize`` chooses for the file type (``facts.gguf.mix_type``).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from vramplan.errors import Problem, ScenarioError
from vramplan.facts.gguf import (
    FILE_TYPE_IDS,
    GGML_TYPE_IDS,
    GgmlType,
    MixContext,
    ggml_type,
    mix_type,
    tensor_bytes,
)
from vramplan.spec.model import ModelSpec, ParamGroup

__all__ = ["GgufFile", "GgufTensor", "model_tensors", "read_gguf"]

GGUF_MAGIC = b"GGUF"
MAX_TENSORS = 1_000_000
MAX_KV = 100_000
MAX_STRING = 64 * 2**20  # bytes of one string (a chat template is tens of KiB)
MAX_ARRAY = 50_000_000  # elements of one array (a vocabulary's merges are ~300k)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ALIGNMENT = 2**20

_SCALARS: dict[int, tuple[str, int]] = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
                                        5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
                                        12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 4096  # arrays up to this length are kept (per-layer head counts); longer ones only counted


@dataclass(frozen=True)
class GgufTensor:
    """One tensor: its name, shape (``ne[0]`` first), ggml type and bytes."""

    name: str
    shape: tuple[int, ...]
    type: GgmlType
    nbytes: int

    @property
    def layer(self) -> int | None:
        """The block (``blk.N.``) it belongs to; None for the input and output tensors."""
        m = re.match(r"blk\.(\d+)\.", self.name)
        return int(m.group(1)) if m else None


@dataclass
class GgufFile:
    """A GGUF header: metadata (arrays longer than 4096 kept as their length) and tensor infos."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: list[GgufTensor]
    array_lengths: dict[str, int] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """``<architecture>.<key>`` (``llama.block_count``)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def file_type(self) -> str | None:
        """The ``general.file_type`` name (Q4_K_M ...), None when absent or unknown."""
        ft = self.metadata.get("general.file_type")
        return FILE_TYPE_IDS[ft].name if isinstance(ft, int) and ft in FILE_TYPE_IDS else None


class _Reader:
    def __init__(self, f: BinaryIO, size: int, where: str) -> None:
        self.f, self.size, self.where = f, size, where

    def fail(self, what: str) -> ScenarioError:
        return ScenarioError([Problem("serve.gguf.file", f"{self.where}: {what}",
                                      "give a GGUF file (llama.cpp's format, version 2 or 3)")])

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise self.fail(f"truncated header (needed {n} bytes at offset {self.f.tell()})")
        b = self.f.read(n)
        if len(b) != n:
            raise self.fail("truncated header")
        return b

    def scalar(self, vtype: int) -> Any:
        fmt, n = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(n))[0]

    def u32(self) -> int:
        return int(self.scalar(4))

    def u64(self) -> int:
        return int(self.scalar(10))

    def string(self) -> str:
        n = self.u64()
        if n > MAX_STRING:
            raise self.fail(f"a string of {n} bytes (more than {MAX_STRING})")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("a string that is not UTF-8") from None

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            n = self.u64()
            if n > MAX_STRING:
                raise self.fail(f"a string of {n} bytes (more than {MAX_STRING})")
            self.take(n) if n < 4096 else self.seek_ahead(n)

    def seek_ahead(self, n: int) -> None:
        if self.f.tell() + n > self.size:
            raise self.fail("truncated header")
        self.f.seek(n, os.SEEK_CUR)

    def value(self, vtype: int, key: str, lengths: dict[str, int]) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise self.fail(f"metadata {key!r} has unknown value type {vtype}")
        etype, count = self.u32(), self.u64()
        if count > MAX_ARRAY:
            raise self.fail(f"metadata {key!r} is an array of {count} elements (more than {MAX_ARRAY})")
        lengths[key] = count
        if etype == _ARRAY:
            raise self.fail(f"metadata {key!r} nests arrays, which vramplan does not read")
        if count > _KEEP_ARRAY:
            if etype == _STRING:
                self.skip_strings(count)
            elif etype in _SCALARS:
                self.seek_ahead(count * _SCALARS[etype][1])
            else:
                raise self.fail(f"metadata {key!r} has unknown element type {etype}")
            return count
        return [self.value(etype, key, {}) for _ in range(count)]


def _tensor(rd: _Reader) -> tuple[GgufTensor, int]:
    name = rd.string()
    n_dims = rd.u32()
    if not 1 <= n_dims <= MAX_DIMS:
        raise rd.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    shape = tuple(rd.u64() for _ in range(n_dims))
    tid = rd.u32()
    offset = rd.u64()
    if tid not in GGML_TYPE_IDS:
        raise rd.fail(f"tensor {name!r} has ggml type {tid}, which vramplan does not know")
    t = GGML_TYPE_IDS[tid]
    numel = 1
    for d in shape:
        numel *= d
    if numel >= 2**62 or shape[0] % t.block:
        raise rd.fail(f"tensor {name!r} has shape {list(shape)}, impossible for type {t.name} "
                      f"(rows must be whole blocks of {t.block})")
    return GgufTensor(name, shape, t, tensor_bytes(t, shape)), offset


def _header(rd: _Reader) -> tuple[int, int, int]:
    if rd.take(4) != GGUF_MAGIC:
        raise rd.fail("not a GGUF file (the first 4 bytes are not 'GGUF')")
    version = rd.u32()
    if version not in (2, 3):
        raise rd.fail(f"GGUF version {version} (vramplan reads versions 2 and 3)")
    n_tensors, n_kv = rd.u64(), rd.u64()
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise rd.fail(f"{n_tensors} tensors and {n_kv} metadata entries (at most {MAX_TENSORS} and {MAX_KV})")
    return version, n_tensors, n_kv


def _read(f: BinaryIO, size: int, where: str) -> GgufFile:
    rd = _Reader(f, size, where)
    version, n_tensors, n_kv = _header(rd)
    meta: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = rd.string()
        meta[key] = rd.value(rd.u32(), key, lengths)
    tensors: list[GgufTensor] = []
    ends: list[int] = []
    for _ in range(n_tensors):
        t, offset = _tensor(rd)
        tensors.append(t)
        ends.append(offset + t.nbytes)
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or not 1 <= align <= MAX_ALIGNMENT:
        raise rd.fail(f"general.alignment {align!r} is not a power of two up to {MAX_ALIGNMENT}")
    data_start = -(-f.tell() // align) * align
    if ends and data_start + max(ends) > size:
        raise rd.fail(f"tensor data ends at byte {data_start + max(ends):,}, past the file's {size:,} bytes "
                      "(a truncated download, or a split file's first part: give a whole file)")
    return GgufFile(path=where, version=version, metadata=meta, tensors=tensors, array_lengths=lengths)


def read_gguf(path: str | Path) -> GgufFile:
    """Read a GGUF file's header (metadata and tensor infos); a bad file raises ``ScenarioError``."""
    p = Path(path)
    where = str(p)
    if not p.is_file():
        # a folder or a device (/dev/zero) exists but is no file to read a header from: say which
        what = ("is a folder" if p.is_dir() else "is a device or special file, not a regular file" if p.exists()
                else "no such file")
        message = f"no such file: {where}" if what == "no such file" else f"{where} {what}"
        raise ScenarioError([Problem("serve.gguf.file", message, "give the path of a .gguf file")])
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            return _read(f, size, where)
    except OSError as exc:
        raise ScenarioError([Problem("serve.gguf.file", f"cannot read {where}: {exc}", "")]) from None


# parameter-group module -> GGUF tensor name part (llama.cpp gguf-py/gguf/tensor_mapping.py)
_MODULE_NAMES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output", "qkv_proj": "attn_qkv",
    "query_key_value": "attn_qkv", "Wqkv": "attn_qkv", "c_attn": "attn_qkv", "dense": "attn_output",
    "out_proj": "attn_output", "c_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down", "gate_up_proj": "ffn_up",
    "w1": "ffn_gate", "w3": "ffn_up", "w2": "ffn_down", "fc1": "ffn_up", "fc2": "ffn_down",
    "dense_h_to_4h": "ffn_up", "dense_4h_to_h": "ffn_down", "c_fc": "ffn_up", "gate": "ffn_gate_inp",
    "router": "ffn_gate_inp",
}


def _gguf_name(p: ParamGroup) -> str:
    """A parameter group's GGUF category: token_embd, output, attn_*, ffn_* (``_exps`` for routed experts)."""
    if p.role == "embedding":
        return "token_embd"
    if p.role == "lm_head":
        return "output"
    base = _MODULE_NAMES.get(p.module, p.module)
    if p.role == "expert":
        return base + "_exps"
    if "shared" in p.name and base.startswith("ffn_"):
        return base + "_shexp"
    return base


def _group_tensors(p: ParamGroup, m: ModelSpec, ftype: str, ctx: MixContext) -> Iterator[GgufTensor]:
    cat = _gguf_name(p)
    layers = p.layer_span or (None,)
    per_layer = p.count // max(1, len(p.layer_span)) if p.layer_span else p.count
    if p.role in ("embedding", "lm_head"):
        shape: tuple[int, ...] = (m.hidden_size, p.numel // m.hidden_size)
    elif p.in_features and p.out_features:
        shape = (p.in_features, p.out_features) + ((per_layer,) if per_layer > 1 else ())
    else:
        shape = (p.numel * per_layer,)
    quantized = len(shape) >= 2 and p.role not in ("norm", "bias", "router")
    for il in layers:
        tname = ggml_type(mix_type(ftype, cat, il or 0, ctx, shape[0]) if quantized else "F32")
        yield GgufTensor(f"blk.{il}.{cat}.weight" if il is not None else f"{cat}.weight", shape, tname,
                         tensor_bytes(tname, shape))


def model_tensors(m: ModelSpec, ftype: str) -> list[GgufTensor]:
    """The tensors of ``m`` as ``llama-quantize <ftype>`` writes them (module docstring)."""
    ctx = MixContext(n_layer=m.num_layers, n_gqa=max(1, m.num_attention_heads // max(1, m.num_kv_heads)),
                     n_expert=m.moe.num_experts if m.moe else 0, tied_embeddings=m.tie_word_embeddings)
    out: list[GgufTensor] = []
    for p in m.params:
        if p.role == "lm_head" and m.tie_word_embeddings:
            continue
        out.extend(_group_tensors(p, m, ftype, ctx))
    return out
