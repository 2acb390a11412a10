"""Build configuration beyond pyproject.toml: the optional C replay of the caching-allocator model.

``vramplan.alloc._replay`` (src/vramplan/alloc/_replay.c) replays the analytic engine's event
streams several times faster than the pure-Python model it mirrors (``vramplan.alloc.compact``).
It is optional: where no C compiler is available the build goes on without it and
``vramplan.alloc`` uses the Python replay, which gives the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vramplan.alloc._replay", ["src/vramplan/alloc/_replay.c"], optional=True)])
