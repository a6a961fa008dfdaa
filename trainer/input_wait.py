"""How long the training steps waited for their batches: whether a job is input-bound.

Measured inside each train step, on the worker that runs it, whatever the strategy: one timestamp
when the step's function starts and one when its batch is there. Nothing orders the first after
the iterator's `next()` (TensorFlow's automatic control dependencies chain only ops that share a
resource, and ops that touch none in program order: the first timestamp runs as soon as the
function starts, beside the `IteratorGetNext` op), while the second depends on the batch. Their
difference is how long the step waited for the input pipeline; when the pipeline keeps ahead of
the model it is a few microseconds: the batch waits in a prefetch buffer. A synchronous step
(MultiWorkerMirroredStrategy, mirrored) goes at the pace of its last replica's batch, so each
of its steps counts the longest wait over the replicas (one scalar per replica, all-reduced).

The waits are summed in a Keras metric (`InputWait`) over every replica's steps of the epoch:
under MultiWorkerMirroredStrategy its variables are read as the sum over the workers, under
ParameterServerStrategy they live on a parameter server and every worker adds to them. Its
results, `input_wait` (the share of the steps' time spent waiting), `input_wait_seconds` and
`input_step_seconds` (per replica), go to the epoch's logs and TensorBoard, and the chief's
epoch line (trainer.callbacks.EpochLog) says them. The cost is three small ops and four
variable updates per step, plus, in a synchronous job of several replicas, the all-reduce of one
scalar per replica.

What it cannot see: on a machine without accelerators the pipeline and the model share the same
cores, and a pipeline that decodes ahead of the model takes their time without making any step
wait. The step is then slower, not waiting; a profile (trainer.profiling) shows where the cores
went.

XLA cannot compile a timestamp, so with --jit-compile trainer.plan.compile_model leaves this out.
"""

from __future__ import annotations

import tensorflow as tf

METRIC = "input_wait"  # the share of the steps' time spent waiting for batches (0-1)
WAITED = "input_wait_seconds"  # per replica
STEPPED = "input_step_seconds"  # the steps' time, per replica
# At or above this share of the training time spent waiting for batches, the job is input-bound:
# its input pipeline, not the model, sets the pace. (Below it, waits are start-up and jitter.)
INPUT_BOUND_SHARE = 0.2
_NEVER = 1e18  # seconds since the epoch: later than any step


class InputWait(tf.keras.metrics.Metric):
    """The epoch's wait for input: `lanes` replicas step side by side; each adds its wait and
    step start time. The steps' time is the span from the first step's start to the last one's,
    stretched by n/(n-1) for the last step's own time: measured by the steps themselves, so it
    leaves out what fit does around them (tracing, checkpoints, callbacks)."""

    def __init__(self, lanes: int, name: str = METRIC, **kwargs):
        super().__init__(name=name, dtype=tf.float64, **kwargs)
        self.lanes = lanes
        self.waited = self.add_weight("waited", initializer="zeros", dtype=tf.float64)
        self.steps = self.add_weight("steps", initializer="zeros", dtype=tf.float64)
        # Read from the first replica under MultiWorkerMirroredStrategy (the chief's own span);
        # shared by every worker under ParameterServerStrategy (the span of them all).
        self.first = self.add_weight("first", initializer=tf.keras.initializers.Constant(_NEVER), dtype=tf.float64,
                                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.last = self.add_weight("last", initializer="zeros", dtype=tf.float64,
                                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def update_state(self, started, waited):
        self.waited.assign_add(waited)
        self.steps.assign_add(tf.constant(1.0, tf.float64))
        self.first.assign(tf.minimum(self.first, started))
        self.last.assign(tf.maximum(self.last, started))

    def result(self):
        per_lane = self.steps / self.lanes
        stretch = tf.math.divide_no_nan(per_lane, per_lane - 1.0)
        stepped = tf.maximum(self.last - self.first, 0.0) * stretch
        waited = self.waited / self.lanes
        return {METRIC: tf.minimum(tf.math.divide_no_nan(waited, stepped), 1.0), WAITED: waited, STEPPED: stepped}

    def reset_state(self):
        self.waited.assign(tf.constant(0.0, tf.float64))
        self.steps.assign(tf.constant(0.0, tf.float64))
        self.first.assign(tf.constant(_NEVER, tf.float64))
        self.last.assign(tf.constant(0.0, tf.float64))


def install(model: tf.keras.Model, lanes: int) -> None:
    """Makes `model.fit` measure each step's wait for its batch (the metric's three results).
    `lanes`: the replicas that step side by side (every replica of a synchronous job, every
    worker's of a ParameterServer job). Call after `compile`, in the strategy's scope."""
    metric = InputWait(lanes)
    # Listed in model.metrics (so reset each epoch and logged), but not an attribute: the
    # checkpoints then hold what they held before, and the evaluator and the export, which
    # build the model without it, read them without a mismatch.
    model._metrics.append(metric)
    train_step = model.train_step

    def timed_train_step(data):
        started = tf.timestamp()
        with tf.control_dependencies(tf.nest.flatten(data)):
            waited = tf.timestamp() - started
        logs = train_step(data)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            # A synchronous step waits for the last replica's batch: every replica records the
            # longest wait of the step (one small all-reduce, beside the gradients').
            waits = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.one_hot(
                context.replica_id_in_sync_group, context.num_replicas_in_sync, dtype=tf.float64) * waited)
            waited = tf.reduce_max(waits)
        metric.update_state(started, waited)
        return {**logs, **metric.result()}

    model.train_step = timed_train_step


def pop(logs: dict) -> tuple[float, float, float] | None:
    """Removes the metric's results (and their validation copies, always 0) from an epoch's logs;
    returns (share, seconds waited, seconds stepped) per replica, or None without them."""
    for name in (METRIC, WAITED, STEPPED):
        logs.pop(f"val_{name}", None)
    if METRIC not in logs:
        return None
    return tuple(float(logs.pop(name)) for name in (METRIC, WAITED, STEPPED))


def describe(share: float, waited: float, stepped: float) -> str:
    """`input: the steps waited 0.2 s of 14.3 s for their batches (1%): not input-bound`."""
    text = f"input: the steps waited {waited:.1f} s of {stepped:.1f} s for their batches ({share:.0%})"
    if share >= INPUT_BOUND_SHARE:
        return (f"{text}: input-bound, the input pipeline sets the pace (a faster one could make "
                f"this epoch's steps up to x{1 / max(1 - share, 0.01):.1f} faster)")
    return f"{text}: not input-bound"
