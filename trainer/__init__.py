"""The multi-worker TensorFlow runtime these images carry, for any Keras 3 model.

Two ways in (docs/your-own-code.md):

1. Your script, unchanged: `python -m trainer.run -- python task.py` resolves the cluster on
   every platform into TF_CONFIG, sets the output directories, relays stderr at Cloud Logging's
   severity, forwards SIGTERM and maps the exit status to the exit-code contract (trainer.exits).
   A Keras 3 script whose `model.fit` cannot run across workers calls `trainer.loop.fit_model`
   in its place (docs/keras.md).
2. Your Keras model: subclass `trainer.tasks.Task` and hand it to `trainer.fit`; the job then gets
   the strategy, the training loop (trainer.loop), global batch, sharding, precision agreement,
   step backups and the SIGTERM vote, lost-peer exits, chief-only saving, the side-car evaluator,
   the tuning report, profiles and the input-wait line.

The package, by job:

| where                  | what                                                                  |
|------------------------|-----------------------------------------------------------------------|
| trainer/process/       | the process wrapper: `trainer.run` and `trainer.launch`, the stderr relay, signals, stops; no TensorFlow |
| trainer/runtime/       | the Task runtime: `trainer.fit`, its flags, the roles (runtime/roles/) and what they share |
| trainer/library/       | what any script can use: the loop and `fit_model`, step backups, the input-wait measurement, input sharding, layers, the SavedModel export, the orderly end |
| trainer/checks/        | the image checks: `trainer.selfcheck`, `trainer.gpu_stack`            |
| trainer/*.py           | what several of them share (tasks, cluster, exits, cli, outputs, precision), and the public names below |

The public names, each documented and typed; import them from the module named here, whose own
file is the code or, for fit, loop, layers, inputs and export, names it from where it lives. The command
modules run, launch, selfcheck and gpu_stack are the commands' documented paths and hold nothing
else (trainer.run also names the environment its command gets). Everything else in this package may change between releases:

| module           | names                                                                 |
|------------------|-----------------------------------------------------------------------|
| trainer.tasks    | Task, Run, Examples, DataError                                         |
| trainer.fit      | run, main, build_parser, load_task; `python -m trainer.fit --task M`    |
| trainer.loop     | fit_model, Steps, fit, Events                                          |
| trainer.layers   | FusedBatchNormalization, fuse_batch_norm                               |
| trainer.export   | write                                                                  |
| trainer.inputs   | shard, shard_files, shard_records, sharding_mode, FILE, DATA, without_autoshard |
| trainer.cli      | OneLineParser, whole_number, at_least, positive_int, non_negative_int, positive_float, fraction |
| trainer.precision| float32_policy                                                         |
| trainer.cluster  | resolve, environ_with_hostname, Cluster, ClusterConfigError; `python -m trainer.cluster` |
| trainer.exits    | OK, CONFIG, RETRYABLE                                                  |
| trainer.run      | child_environment; `python -m trainer.run -- COMMAND`                 |
| commands         | `python -m trainer.run`, `python -m trainer.launch`, `python -m trainer.selfcheck`, `python -m trainer.gpu_stack` |

The runtime's Keras is Keras 3, the one TensorFlow 2.21 ships (`import keras`, and `tf.keras` too):
nothing here selects legacy Keras for anyone, and a task whose model is a legacy tf_keras one is
refused with one line (docs/keras.md says why and how to move).
"""
