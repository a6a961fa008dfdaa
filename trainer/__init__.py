"""The multi-worker TensorFlow runtime these images carry, for any model.

Two ways in (docs/your-own-code.md):

1. Your script, unchanged: `python -m trainer.run -- python task.py` resolves the cluster on
   every platform into TF_CONFIG, sets the output directories, relays stderr at Cloud Logging's
   severity, forwards SIGTERM and maps the exit status to the exit-code contract (trainer.exits).
2. Your Keras model: subclass `trainer.tasks.Task` and hand it to `trainer.fit`; the job then gets
   the strategy, global batch, sharding, precision agreement, step backups and the SIGTERM vote,
   lost-peer exits, chief-only saving, the side-car evaluator, the tuning report, profiles and
   the input-wait line.

The public names, each documented and typed where it is defined; everything else in this
package may change between releases:

| module           | names                                                                 |
|------------------|-----------------------------------------------------------------------|
| trainer.tasks    | Task, Run, Examples, DataError                                         |
| trainer.fit      | run, main, build_parser, load_task; `python -m trainer.fit --task M`    |
| trainer.inputs   | shard, per_replica_batch, without_autoshard                            |
| trainer.cli      | OneLineParser, whole_number, at_least, positive_int, non_negative_int, positive_float |
| trainer.precision| float32_policy                                                         |
| trainer.relay    | run (a command's `__main__` in the images)                             |
| trainer.cluster  | resolve, environ_with_hostname, Cluster, ClusterConfigError; `python -m trainer.cluster` |
| trainer.exits    | OK, CONFIG, RETRYABLE                                                  |
| commands         | `python -m trainer.run`, `python -m trainer.launch`, `python -m trainer.selfcheck`, `python -m trainer.gpu_stack` |

Legacy Keras (tf-keras) is selected here, before any module of this package can import
TensorFlow: Keras 3's `model.fit` fails under MultiWorkerMirroredStrategy once two real worker
processes run, and does not support ParameterServerStrategy at all. TensorFlow reads the variable
once, at its first import, so it must be set before that.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
