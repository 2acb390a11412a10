"""Serving: the engines' start-up memory decisions, and a request-level simulator of KV-cache use.

* ``vramplan.serve.vllm``: how vLLM's V1 engine sizes its KV cache at start-up
  (``decide``), the number of blocks, the concurrency and the largest context that fits.
* ``vramplan.serve.sglang``: how SGLang sizes its token pool at start-up, by release
  (``decide_sglang``): ``mem_fraction_static`` of the free memory, less the weights.
* ``vramplan.serve.report``: the decision of ``serve.engine`` as the report's moment and serve
  block (``serve``), which ``vramplan.estimate`` reports for a ``task: serve`` scenario.
* ``vramplan.serve.simulate``: replays a stream of requests through continuous batching
  with contiguous per-request reservations or with paged blocks, and measures waste.
* ``vramplan.serve.workloads``: bundled request-length distributions (with sources) and
  CSV traces.
"""

from vramplan.serve.report import ServeResult, serve
from vramplan.serve.sglang import SGLANG_BEHAVIOURS, SglangDecision, decide_sglang
from vramplan.serve.vllm import VLLM_BEHAVIOURS, VllmDecision, decide

__all__ = ["SGLANG_BEHAVIOURS", "VLLM_BEHAVIOURS", "ServeResult", "SglangDecision", "VllmDecision", "decide",
           "decide_sglang", "serve"]
