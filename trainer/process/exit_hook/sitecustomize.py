"""Loaded by every Python process of a command trainer.run runs (trainer.run puts this folder on
the command's PYTHONPATH; Python imports the first `sitecustomize` it finds as it starts): the
process's end is made orderly with the job's other tasks, should it run MultiWorkerMirroredStrategy
(trainer.library.ending.at_exit; nothing otherwise), and an uncaught error that says a peer is
gone ends it with 143 rather than 1 (trainer.process.peer_loss). Then the `sitecustomize` this one
hides, if any (a distribution's, a virtualenv's), runs as it would have.

Not a package: the folder holds this one module, so that nothing else of the runtime shadows a
name of the script's."""

import atexit
import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    from trainer.library import ending
    from trainer.process import peer_loss

    sys.excepthook = peer_loss.retryable_when_a_peer_is_lost(ending.note_failure(sys.excepthook))
    atexit.register(ending.at_exit)


def _run_the_next_one() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [path for path in sys.path if os.path.abspath(path or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _install()
except ImportError:  # the runtime is not importable here: nothing to order
    pass
_run_the_next_one()
