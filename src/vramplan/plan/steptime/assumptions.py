"""The stated assumptions of the step-time model: every constant that is not a GPU fact.

GPU facts (dense peak FLOP/s per dtype, HBM bandwidth, NVLink/PCIe and host-link bandwidth)
come from the GPU catalog (``catalog/data/gpus.json``).  What the catalog cannot know is
listed here, with where the default comes from; every plan prints these values.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_ASSUMPTIONS", "PerfAssumptions"]


@dataclass(frozen=True)
class PerfAssumptions:
    """Knobs of the step-time model (the CLI exposes the first three).

    * ``mfu``: the fraction of the dense peak that matmuls reach (model FLOPs utilisation).
      0.40 sits in the published range for well-tuned bf16 training: Llama 3 reports 38-43%
      on H100 (arXiv 2407.21783, table 4), PaLM 46.2% on TPU v4 (arXiv 2204.02311, sec. 4),
      Megatron-LM 52% on A100 for its largest model (arXiv 2104.04473, sec. 5.1).  It is one
      number for every candidate: the model ranks setups by what they add on top of the
      matmuls (recomputation, communication, offload, optimizer traffic), not by kernel quality.
    * ``inter_node_bytes_per_s``: per-GPU network bandwidth between nodes, one direction.
      25 GB/s = one 200 Gb/s HDR InfiniBand adapter per GPU (DGX A100 reference design);
      an NDR 400 Gb/s fabric (DGX H100) is 50 GB/s.
    * ``host_memory_bytes_per_s``: DRAM bandwidth of one node for the CPU optimizer step,
      shared by the node's GPUs.  200 GB/s = two sockets at the upper end of the "~50 to 100 GB/s
      per socket" figure of the seed article on CPU memory.
    * ``collective_latency_s``: fixed cost of one NCCL collective (launch and ring start-up),
      10 us, the order of the small-message all-reduce time inside one NVLink node; it only
      matters for the many small all-reduces of tensor-parallel decoding.
    * ``decode_context_fraction``: during steady serving a sequence has, on average, used this
      fraction of ``max_model_len`` (0.5: uniform progress), which sets the KV bytes each decode
      step reads.
    """

    mfu: float = 0.40
    inter_node_bytes_per_s: float = 25e9
    host_memory_bytes_per_s: float = 200e9
    collective_latency_s: float = 10e-6
    decode_context_fraction: float = 0.5

    def describe(self, task: str = "train") -> list[str]:
        if task == "serve":
            return [
                (f"decode reads every weight and each running sequence's KV cache once per step; sequences are on "
                f"average {self.decode_context_fraction:.0%} through max_model_len"),
                f"matmuls run at {self.mfu:.0%} of the GPU's dense peak (only binding for large batches)",
                f"{self.collective_latency_s * 1e6:g} us fixed cost per tensor-parallel all-reduce",
            ]
        return [
            f"matmuls run at {self.mfu:.0%} of the GPU's dense peak for the compute dtype (MFU assumption)",
            (f"inter-node bandwidth {self.inter_node_bytes_per_s / 1e9:g} GB/s per GPU; NVLink/PCIe from the "
            "GPU catalog, half of the bidirectional figure per direction"),
            f"host DRAM {self.host_memory_bytes_per_s / 1e9:g} GB/s per node for CPU optimizer steps",
            f"{self.collective_latency_s * 1e6:g} us fixed cost per collective",
            ("data-parallel collectives overlap the micro-step's compute (only the excess is exposed); "
            "tensor-parallel all-reduces, the pipeline bubble, optimizer steps and the CPU optimizer are serial"),
        ]


DEFAULT_ASSUMPTIONS = PerfAssumptions()
