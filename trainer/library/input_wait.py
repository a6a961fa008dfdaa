"""How long the training steps waited for their batches: whether a job is input-bound.

Measured inside each replica's train step, on the machine that runs it, whatever the strategy:
an `InputWait` handed to the loop's `Steps(input_wait=...)` (trainer/library/loop.py) gets each
step's spans. Three timestamps: when the step's function starts, when its batch is there, and
when the step has applied its update. Nothing orders the first after the iterator's `next()`
(TensorFlow's automatic control dependencies order ops that share a resource, and the first
timestamp touches none), while the second depends on the batch and the third on a read of every
trainable variable, which those dependencies order after the variable's update (and so after the
gradients' all-reduce under the mirrored strategies). The wait is the first span,
the step the whole one: a wait is always part of the step it delays, so the epoch's share can
never exceed 1, in any strategy, however busy the machine is. When the pipeline keeps ahead of
the model, a batch waits in a prefetch buffer and the wait is a few microseconds.

The run's first call of the train function is left out (the loop resets the measurement after
it): it waits for the input pipeline to start, whatever the pipeline, which says nothing of
whether the job is input-bound.

A synchronous step (MultiWorkerMirroredStrategy, mirrored) goes at the pace of its last replica's
batch, so each replica books the longest wait of the step over the replicas (one small all-reduce
beside the gradients'), capped by its own step's time.

Both sums live in two variables summed over the replicas (under ParameterServerStrategy on a
parameter server, where every worker adds to them); per replica they are the sums over the
`lanes` replicas that step side by side. `results` reads them as `Waits`, apart from the
metrics; the runtime's epoch line says them (trainer.runtime.callbacks), and TensorBoard and
run.json get them.

What it cannot see: on a machine without accelerators the pipeline and the model share the same
cores, and a pipeline that decodes ahead of the model takes their time without making any step
wait. The step is then slower, not waiting; a profile (`--profile-steps`) shows where the cores went.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

# At or above this share of the training time spent waiting for batches, the job is input-bound:
# its input pipeline, not the model, sets the pace. (Below it, waits are start-up and jitter.)
INPUT_BOUND_SHARE = 0.2


@dataclasses.dataclass(frozen=True)
class Waits:
    """An epoch's measurement, per replica: seconds its steps waited for their batches, and
    seconds the steps took."""

    waited: float
    stepped: float

    @property
    def share(self) -> float:
        """The share of the steps' time spent waiting (0-1)."""
        return self.waited / self.stepped if self.stepped > 0 else 0.0

    def describe(self) -> str:
        """`input: the steps waited 0.2 s of 14.3 s for their batches (1%): not input-bound`."""
        text = f"input: the steps waited {self.waited:.1f} s of {self.stepped:.1f} s for their batches ({self.share:.0%})"
        if self.share >= INPUT_BOUND_SHARE:
            return (f"{text}: input-bound, the input pipeline sets the pace (a faster one could make "
                    f"this epoch's steps up to x{1 / max(1 - self.share, 0.01):.1f} faster)")
        return f"{text}: not input-bound"


def _summed(name: str) -> tf.Variable:
    return tf.Variable(0.0, dtype=tf.float64, trainable=False, name=name,
                       synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM)


class InputWait:
    """The epoch's wait for input and its steps' time, summed over `lanes` replicas. Create it in
    the strategy's scope."""

    def __init__(self, lanes: int):
        self.lanes = lanes
        self.waited = _summed("input_waited")
        self.stepped = _summed("input_stepped")
        self._read = None

    def record(self, waited, stepped) -> None:
        """One replica's step: seconds it waited for its batch, seconds the whole step took."""
        waited, stepped = tf.cast(waited, tf.float64), tf.cast(stepped, tf.float64)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            # Only a scalar per replica: its wait in its own slot, summed, then the largest.
            slots = tf.one_hot(context.replica_id_in_sync_group, context.num_replicas_in_sync, dtype=tf.float64)
            waited = tf.reduce_max(context.all_reduce(tf.distribute.ReduceOp.SUM, slots * waited))
        self.waited.assign_add(tf.minimum(waited, stepped))
        self.stepped.assign_add(stepped)

    def results(self, strategy: tf.distribute.Strategy) -> Waits:
        """What was recorded since the last reset, per replica. Under MultiWorkerMirroredStrategy
        every worker must call it at the same point."""
        if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
            waited, stepped = self.waited.read_value(), self.stepped.read_value()
        else:
            if self._read is None:
                self._read = tf.function(lambda: (self.waited.read_value(), self.stepped.read_value()), autograph=False)
            waited, stepped = self._read()
        return Waits(float(waited) / self.lanes, float(stepped) / self.lanes)

    def reset(self) -> None:
        for variable in (self.waited, self.stepped):
            variable.assign(tf.zeros_like(variable))
