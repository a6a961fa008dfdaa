"""The Task runtime: trains a `trainer.tasks.Task` in every process of a job, whatever its role.

entry.py is `python -m trainer.fit` and `trainer.fit.run`: who this process is, its flags, then
its role (roles/). What the roles share: the flags (config.py), the strategy (strategy.py), what
runs between epochs (callbacks.py), saving from the chief (saving.py), Cloud Storage as a job
meets it (storage.py), the tuning report (hypertune.py), profiles (profiling.py), lost peers
(peers.py), the log format (logs.py), `run.json` (provenance.py) and TensorFlow's import kept
out of the garbage collector's way (heap.py).
"""
