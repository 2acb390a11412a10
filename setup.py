"""Build configuration beyond pyproject.toml: the optional C replay of the caching-allocator model.

``vramplan.alloc._replay`` (src/vramplan/alloc/_replay.c) replays the analytic engine's event
streams about ten times faster than the pure-Python reference model it mirrors
(``vramplan.alloc.caching.CachingAllocator``), with the rules ``vramplan.alloc.rules`` hands it at
import.  It is optional: where no C compiler is available the build goes on without it and
``vramplan.alloc`` replays through the reference, which gives the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vramplan.alloc._replay", ["src/vramplan/alloc/_replay.c"], optional=True)])
