"""Compatibility: the serving composition moved to ``vramplan.serve.report``.

It turns ``vramplan.serve.vllm``'s decision into the report's moment, so it belongs to ``serve``,
a layer above ``analytic``.  ``cli/serve_cmd.py`` still imports ``serve`` from here; delete this
module once it imports ``vramplan.serve.report``.  Nothing in ``vramplan.analytic`` imports this
module, so the package itself still imports nothing above it.
"""

from vramplan.serve.report import ServeResult, serve

__all__ = ["ServeResult", "serve"]
