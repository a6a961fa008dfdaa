"""TensorFlow's import with Python's cyclic garbage collector paused, its objects then frozen.

Importing TensorFlow (Keras 3 with it) leaves about 285,000 objects the collector tracks, nearly all
alive until the process ends: modules, functions, classes, op definitions. While they are created
the collector keeps running and finds almost nothing to free (here: 5 full collections, 5 objects);
after, each full collection walks them all again (0.13 CPU s a walk on a Xeon), and tracing a
model's functions creates enough objects to set off several. `gc.freeze` moves what exists into a
generation the collector never walks, so a task pays for TensorFlow's objects once.

Only what was created before the freeze is exempt; the cycles a task makes later are collected as
ever. The garbage the import made is never freed: a few hundred kilobytes, once per process.
`benchmarks/task_startup.py --baseline collector` measures a whole task with and without.
"""

from __future__ import annotations

import gc
import importlib


def import_frozen(*modules: str) -> None:
    """Imports `modules` with the collector paused (unless someone else paused it), then freezes
    every object that exists."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        if was_enabled:
            gc.enable()
    gc.freeze()
