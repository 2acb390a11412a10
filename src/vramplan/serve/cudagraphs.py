"""The memory of vLLM's CUDA graphs, from the mechanism, with the band of what cannot be derived.

``graphs = pool + segments x bytes per segment`` (``facts/vllm_cudagraphs.py``):

* ``pool``: the one memory pool every graph is captured into holds the largest captured size's forward
  intermediates, the transient peak of a decode forward over that many tokens; the caller passes it
  (``serve/vllm.py`` ``forward_peak_bytes``, the same formula as the profile run's);
* ``segments``: the capture sizes the release builds from ``max_num_seqs`` and ``max_num_batched_tokens``,
  times the pieces of each graph (layers + 1), in the release's modes;
* bytes per segment: the driver's (``cudaGraphInstantiate``), not derivable; the band runs from the lowest to
  the highest figure that vLLM's printed logs imply (``SEGMENT_BYTES_LOW`` / ``_HIGH``), the point is their
  middle; a release that printed its own warning ("1~3 GiB") has a high end of at least that.

Llama-3.1-8B under vLLM 0.19 on an H100 (1024 sequences, 8192 tokens): 51 sizes up to 512; pool (4 x 4096 +
3 x 14,336) x 512 x 2 = 60,817,408 B; 3,366 segments; point 60,817,408 + 3,366 x 204,111 = 747,855,034 B
(0.70 GiB), band 593,769,652 to 901,940,416 B (0.55 to 0.84 GiB).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramplan.facts.vllm_cudagraphs import (
    SEGMENT_BYTES_HIGH,
    SEGMENT_BYTES_LOW,
    SEGMENT_BYTES_POINT,
    USER_MODES,
    CudagraphRule,
    GraphModes,
    capture_sizes,
    cudagraph_rule,
    graph_segments,
    user_capture_sizes,
)
from vramplan.units import GiB

__all__ = ["CudagraphEstimate", "cudagraph_estimate"]


@dataclass(frozen=True)
class CudagraphEstimate:
    """The captured graphs of one GPU: sizes, counts, the shared pool and the bytes with their band."""

    rule: CudagraphRule
    exact: bool  # the release's own source was read (else the nearest earlier rule)
    sizes: tuple[int, ...]
    graphs: int
    segments: int
    pool_bytes: int
    bytes: int
    low_bytes: int
    high_bytes: int
    modes: GraphModes  # the modes captured: the user's cudagraph_mode, else the release's
    user_sizes: bool = False  # the sizes come from serve.cudagraph_capture_sizes or max_cudagraph_capture_size

    @property
    def largest(self) -> int:
        return self.sizes[-1] if self.sizes else 0

    def describe(self) -> str:
        """The report's sentence: how the bytes were found, and what is assumed."""
        modes = {"full": "one whole-model graph per size (V0, decode only)",
                 "piecewise": "layers + 1 piecewise graphs per size",
                 "full_and_piecewise": ("layers + 1 piecewise graphs per size and a FULL decode graph per size up "
                                        "to max_num_seqs"),
                 "full_decode_only": "a FULL decode graph per size up to max_num_seqs, none for mixed batches",
                 }[self.modes]
        if self.modes != self.rule.modes:
            modes += ", serve.cudagraph_mode"
        if self.user_sizes:
            modes += ", the sizes serve.cudagraph_capture_sizes / max_cudagraph_capture_size give"
        statement = ("; the band's high end is vLLM's own warning, 'CUDA graphs can take additional 1~3 GiB "
                     "memory per GPU'" if self.rule.statement_bytes and self.high_bytes == self.rule.statement_bytes
                     else "")
        return (f"CUDA graphs: {len(self.sizes)} sizes up to {self.largest} ({modes}; "
                f"facts/vllm_cudagraphs.py rules of vLLM {'.'.join(map(str, self.rule.first))}), {self.graphs:,} "
                f"graphs in one pool of {self.pool_bytes / GiB:.2f} GiB (the largest size's forward "
                f"intermediates) + {self.segments:,} segments x {SEGMENT_BYTES_POINT:,} B = {self.bytes / GiB:.2f} "
                f"GiB, band {self.low_bytes / GiB:.2f} to {self.high_bytes / GiB:.2f} GiB: the driver's bytes per "
                f"graph segment are an assumption, {SEGMENT_BYTES_LOW:,} to {SEGMENT_BYTES_HIGH:,} B as vLLM "
                f"0.19.0 and 0.21.0 printed them (facts/vllm_cudagraphs.py GRAPH_LOGS){statement}")


def cudagraph_estimate(release: tuple[int, int, int], max_num_seqs: int, max_num_batched_tokens: int, layers: int,
                       pool: Callable[[int], int], blackwell: bool = False, query_len: int = 1,
                       draft_layers: int = 0, explicit_sizes: tuple[int, ...] | None = None,
                       max_size: int | None = None, mode: str | None = None) -> CudagraphEstimate:
    """The graphs' memory for a release and its limits (module docstring).  ``pool(tokens)`` is the forward
    peak over ``tokens`` tokens, taken at the largest captured size; ``query_len`` is 1 + num_speculative_tokens,
    ``draft_layers`` a speculative proposer's own layers (its piecewise graphs join the count).  ``explicit_sizes``,
    ``max_size`` and ``mode`` are the user's (``serve.cudagraph_capture_sizes``, ``max_cudagraph_capture_size``,
    ``cudagraph_mode`` other than NONE; the caller checks the release has them)."""
    rule, exact = cudagraph_rule(release)
    user = explicit_sizes is not None or max_size is not None
    sizes = (user_capture_sizes(rule, release, max_num_batched_tokens, explicit_sizes, max_size) if user
             else capture_sizes(rule, max_num_seqs, max_num_batched_tokens, blackwell, query_len))
    modes = USER_MODES[mode] if mode is not None else rule.modes
    graphs, segments = graph_segments(rule, sizes, layers, max_num_seqs, query_len,
                                      draft_layers if modes != "full" else 0, modes)
    q = query_len if rule.spec_query else 1
    # the pool holds the largest captured size's forward; FULL_DECODE_ONLY captures the decode sizes alone
    captured = [x for x in sizes if q <= x <= max_num_seqs * q] if modes == "full_decode_only" else list(sizes)
    pool_bytes = pool(captured[-1]) if captured else 0
    high = pool_bytes + segments * SEGMENT_BYTES_HIGH
    return CudagraphEstimate(
        rule=rule, exact=exact, sizes=sizes, graphs=graphs, segments=segments, pool_bytes=pool_bytes,
        bytes=pool_bytes + segments * SEGMENT_BYTES_POINT, low_bytes=pool_bytes + segments * SEGMENT_BYTES_LOW,
        high_bytes=max(high, rule.statement_bytes), modes=modes, user_sizes=user)
