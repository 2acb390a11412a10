"""Compatibility: the task dispatch ``estimate`` moved to ``vramplan.engine``.

It composes the analytic engine with the serving model in ``vramplan.serve``, a layer above
``analytic``, so it sits above both.  ``cli/main.py``, ``cli/serve_cmd.py`` and ``plan/context.py``
still import it from here; delete this module once they import ``vramplan.engine``.  Nothing in
``vramplan.analytic`` imports this module, so the package itself still imports nothing above it.
"""

from vramplan.engine import ReservedModel, estimate

__all__ = ["ReservedModel", "estimate"]
