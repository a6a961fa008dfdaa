"""The training loop: a compiled Keras 3 model, trained under any tf.distribute strategy.

Keras 3's own `Model.fit` cannot train across workers on TensorFlow: under
MultiWorkerMirroredStrategy it fails as soon as two worker processes run (keras-team/keras#20585),
and it has no ParameterServerStrategy support at all (keras-team/keras#18624). This module trains
the same compiled model with a loop of its own, calls Keras callbacks as `fit` calls them, and
returns the metrics `fit` would log:

    with strategy.scope():
        model = build_model()
        model.compile(optimizer=..., loss=..., metrics=[...])
    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    steps = Steps(strategy, model)
    steps.build(element_spec)                 # the model, its metrics and the optimizer, in scope
    history = fit(steps, iter(dataset), epochs=3, steps_per_epoch=100, callbacks=[...])

It imports Keras and TensorFlow and nothing else: the file can be copied into a project as it is.
(`trainer.library.fit_model` is `model.fit` for a script on top of it.)

Each replica's step is Keras' own recipe, as its TensorFlow trainer writes `train_step`
(keras/src/backend/tensorflow/trainer.py, keras 3.15): the forward pass under
`tf.GradientTape`; the loss through `Model._compute_loss`, Keras' wrapper that also calls a
`compute_loss` override written before Keras 3.3 (without `training`); the loss tracked unscaled
(`unscale_loss_for_distribution`: Keras' loss reduction divides it by the replicas in sync, and so
does its TensorFlow trainer for `model.losses`); `compute_metrics`; the optimizer's `scale_loss`
and `apply`, which all-reduces the gradients under the mirrored strategies (MultiWorkerMirrored,
Mirrored). Under ParameterServerStrategy the same step runs on whichever worker is free
(`ClusterCoordinator`). Those two helpers are private in Keras 3.15 (the version pinned here);
its trainer calls them the same way.

`fit` drives `keras.callbacks` as `Model.fit` does: train begin and end, each epoch's begin and
end (0-based, with the epoch's logs), a train batch's begin and end around each call of the train
function (the index of its last step in the epoch; no per-batch logs: reading the metrics across
workers at every step would cost a collective each), test begin and end around validation. It
stops once `model.stop_training` is set, after a call of the train function or at an epoch's end,
and ends with the optimizer's `finalize_variable_values` (an EMA optimizer's averages), as `fit`
does.

Where it departs from `fit`, and why:
- Metric updates are computed from a zero state inside `keras.StatelessScope` and added to the
  metric variables with one `assign_add` each. Keras 3's `Variable.assign_add` reads, adds and
  writes back; two ParameterServer workers that update one metric at once lose each other's counts
  (2 workers, 20 steps: the optimizer counted 17). TensorFlow's own `assign_add` is atomic. For the
  same reason the optimizer's step counter is given TensorFlow's `assign_add` under that strategy.
- Under the mirrored strategies, batch-norm statistics and other non-trainable float variables
  are averaged over the replicas at each epoch's end (`sync_state`): Keras 3 updates them on each
  replica alone, so without it every worker would save statistics of its own share of the data.
- Under mixed_float16 with more than one replica, the replicas agree whether a step's gradients
  overflowed before the LossScaleOptimizer judges them (one number all-reduced): Keras judges each
  replica's own gradients, and replicas that judge differently hang at the gradients' all-reduce
  (across workers) or sum one replica's inf into the weights (one worker's CPUs).
- A caller may measure each step's wait for its batch: `Steps(..., input_wait=...)` takes an
  object with `record(waited, stepped)` and `reset()` (trainer/library/input_wait.py is one),
  which each replica's step then hands two spans measured inside it, outside any XLA region.
XLA (`jit_compile`) compiles the forward and backward pass only: the gradients' all-reduce runs
outside it (TensorFlow implements no collectives for CPUs under XLA).

Every function here is traced as written (`autograph=False`), as Keras 3's trainer traces its own
steps (`do_not_convert`): AutoGraph would read, parse and rewrite the source of each of this
module's functions a step calls, in every process of every job, for code that is TensorFlow ops
already (a `tf.cond`, never a Python `if` on a tensor). Keras' own code, a model's layers among
it, AutoGraph never converts: a model is traced here as `fit` traces it. The loop over a call's
steps is a `tf.while_loop` (`_repeat`), what AutoGraph makes of `for _ in tf.range(steps)`.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

import keras
import tensorflow as tf
from keras.src.losses.loss import unscale_loss_for_distribution


class UnsupportedModel(ValueError):
    """A model this loop cannot train as it is. str() is one line."""


class StepTimer(Protocol):
    """What `Steps(input_wait=...)` takes: created in the strategy's scope, handed each replica's
    step from inside it."""

    def record(self, waited: tf.Tensor, stepped: tf.Tensor) -> None:
        """Seconds this replica's step waited for its batch, and seconds the whole step took."""

    def reset(self) -> None:
        """Forgets what was recorded."""


class Events(keras.callbacks.Callback):
    """A Keras callback in the loop's own terms, for hooks that count steps: 1-based epochs, and
    the steps done in the epoch after each call of the train function (`steps_per_execution`
    steps). Each method may be left as it is; raising in `steps_done` stops training (a
    preemption)."""

    _epoch = 0

    def epoch_begin(self, epoch: int) -> None:
        pass

    def steps_done(self, epoch: int, step: int) -> None:
        pass

    def epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        pass

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1
        self.epoch_begin(self._epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.steps_done(self._epoch, batch + 1)

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_end(epoch + 1, dict(logs or {}))


def check_trainable(model: Any) -> None:
    """Refuses what the loop cannot train, with one line: not a compiled Keras 3 model, or one whose
    `train_step` is its own (the loop calls `compute_loss` and `compute_metrics`, which a model
    may override, but never `train_step`)."""
    if not isinstance(model, keras.Model):
        kind = f"{type(model).__module__}.{type(model).__name__}"
        legacy = " (legacy Keras 2: build it with `import keras`, docs/keras.md#from-tf-keras)" if kind.startswith("tf_keras") else ""
        raise UnsupportedModel(f"expected a Keras 3 keras.Model, got {kind}{legacy}")
    if not model.compiled or model.optimizer is None:
        raise UnsupportedModel("the model is not compiled with an optimizer")
    if type(model).train_step is not keras.Model.train_step:
        raise UnsupportedModel(
            f"{type(model).__name__} overrides train_step, which this loop does not call: override compute_loss "
            "and compute_metrics instead (docs/keras.md#what-the-loop-calls)")


def zeros_like_spec(spec) -> Any:
    """A batch of one example (every unknown dimension 1) for `spec`, a dataset's element_spec."""
    return tf.nest.map_structure(lambda s: tf.zeros([1 if d is None else d for d in s.shape], s.dtype), spec)


def _repeat(steps: tf.Tensor, step) -> None:
    """Runs `step()` `steps` times, in a tf.function: one `tf.while_loop`, whose body the ops
    `step` makes run in each iteration, in order (automatic control dependencies)."""

    def body(done):
        step()
        return done + 1

    tf.while_loop(lambda done: done < steps, body, [tf.zeros([], steps.dtype)])


class Steps:
    """The compiled train and test steps of one model under one strategy, and their metrics.

    Build it in no scope; it enters the strategy's scope itself where it creates variables."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model, *, steps_per_execution: int = 1,
                 jit_compile: bool = False, coordinator: tf.distribute.coordinator.ClusterCoordinator | None = None,
                 input_wait: StepTimer | None = None):
        check_trainable(model)
        self.strategy = strategy
        self.model = model
        self.optimizer = model.optimizer
        self.steps_per_execution = steps_per_execution
        self.coordinator = coordinator
        self.replicas = strategy.num_replicas_in_sync
        self._overflow_is_agreed = self.replicas > 1 and isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        self.input_wait = input_wait
        self._gradients = (tf.function(self._forward_backward, jit_compile=True, autograph=False) if jit_compile
                           else self._forward_backward)
        self._train = tf.function(self._train_steps, autograph=False)
        # One step without a loop: a profile groups a step's ops under the step's marker only when
        # the function runs them outside a while loop (measured with xprof 2.24's trace viewer).
        self._train_one = tf.function(lambda iterator: self.strategy.run(self._train_step, args=(next(iterator),)),
                                      autograph=False)
        self._test = tf.function(self._test_steps, autograph=False)
        self._read = tf.function(self._metric_results, autograph=False)
        self._started = False
        self._sync = tf.function(self._sync_state, autograph=False)

    # -- building ---------------------------------------------------------------------------
    def build(self, element_spec) -> None:
        """Creates every variable before the first step, in the strategy's scope: the model's (if
        it is not built), the compiled loss's and metrics' (Keras builds them from the first batch)
        and the optimizer's. `element_spec`: one input pipeline's batches, (x, y[, sample_weight]).

        Keras' own `fit` builds them from a batch it reduces over the replicas, which is what
        fails across workers; here a forward pass, the loss and the metrics are traced from the
        batch's spec and never run (so no value, a string lookup's, say, is ever checked), with
        no update applied (`keras.StatelessScope`)."""

        def trace(batch):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            y_pred = self.model(x, training=False)
            # Regularizers read the weights from the scope's mapping.
            with keras.StatelessScope(state_mapping=[(v, v.value) for v in self.model.trainable_variables]):
                self.model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
                self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

        with self.strategy.scope():
            tf.function(trace, autograph=False).get_concrete_function(element_spec)
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)
        self.metric_variables = [v for metric in self.model.metrics for v in metric.variables]
        self.loss_tracker = next((m for m in self.model.metrics if m.name == "loss"), None)
        if isinstance(self.strategy, tf.distribute.experimental.ParameterServerStrategy):
            _atomic_counter(self.optimizer.iterations)

    # -- one replica's steps ----------------------------------------------------------------
    def _forward_backward(self, x, y, sample_weight):
        """Gradients of one replica's batch, and what the batch adds to each metric variable."""
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)  # float16: LossScaleOptimizer's scale
        gradients = tape.gradient(scaled, model.trainable_variables)
        return gradients, self._metric_increments(loss, x, y, y_pred, sample_weight)

    def _metric_increments(self, loss, x, y, y_pred, sample_weight) -> list:
        """What this batch adds to each metric variable, computed from a zero state."""
        zero_state = [(v, tf.zeros(v.shape, v.dtype)) for v in self.metric_variables]
        with keras.StatelessScope(state_mapping=zero_state) as scope:
            if self.loss_tracker is not None:
                # As `fit` logs it: this replica's mean over its batch, weighted by its size.
                batch = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
                self.loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=batch)
            self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return [scope.get_current_value(v) for v in self.metric_variables]

    def _add_to_metrics(self, increments) -> None:
        for variable, increment in zip(self.metric_variables, increments):
            variable.value.assign_add(tf.cast(increment, variable.dtype))

    def _step(self, batch) -> None:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        gradients, increments = self._gradients(x, y, sample_weight)
        if self._overflow_is_agreed:
            gradients = self._skipped_by_all_if_any_overflowed(gradients)
        self.optimizer.apply(gradients, self.model.trainable_variables)
        self._add_to_metrics(increments)

    def _skipped_by_all_if_any_overflowed(self, gradients: list) -> list:
        """This replica's gradients, or, if any replica's overflowed, non-finite ones.

        Keras 3.15's LossScaleOptimizer judges overflow on the gradients it is handed, this
        replica's own, before its inner optimizer all-reduces them, and skips the step where they
        are not finite. Replicas that judge differently part ways: across workers the finite ones
        enter the gradients' all-reduce and the others never do, and the job hangs (rehearsed CI,
        mixed_float16 on 2 workers: 600 s); within one worker on CPUs Keras takes the first
        replica's verdict for all of them, and another replica's inf is summed into every weight.
        A one-number all-reduce makes the verdict the one the all-reduced gradients would give:
        every replica skips the step, and halves the scale, if any overflowed."""
        overflowed_here = tf.cast(tf.logical_not(self.optimizer.check_finite(gradients)), tf.float32)
        overflowed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, overflowed_here)

        present = [g for g in gradients if g is not None]  # a branch of tf.cond returns no None
        chosen = iter(tf.cond(overflowed > 0, lambda: [_times_nan(g) for g in present], lambda: present))
        return [None if g is None else next(chosen) for g in gradients]

    def _train_step(self, batch) -> None:
        if self.input_wait is None:
            self._step(batch)
            return
        started = tf.timestamp()
        with tf.control_dependencies(tf.nest.flatten(batch)):
            ready = tf.timestamp()
        self._step(batch)
        with tf.control_dependencies([self.optimizer.iterations.value.read_value(), *self._update_applied()]):
            ended = tf.timestamp()
        self.input_wait.record(ready - started, ended - started)

    def _update_applied(self) -> list:
        """Ops that run once this replica's update is applied: a read of every trainable variable,
        which automatic control dependencies order after that variable's update. They order ops
        only by the resource they share: the optimizer's step counter, moved last in the
        program, is not moved after the gradients' all-reduce and the variables' updates, and a
        timestamp after it missed them (2 workers, ResNet50: 0.2 s of a 0.65 s step). One group
        per device the variables live on: under ParameterServerStrategy one control edge to the
        worker per parameter server, not one per variable."""
        by_device: dict[str, list] = {}
        for variable in self.model.trainable_variables:
            by_device.setdefault(variable.value.device, []).append(variable.value)
        groups = []
        for device, variables in by_device.items():
            with tf.device(device):
                groups.append(tf.group(*[variable.read_value() for variable in variables]))
        return groups

    def _test_step(self, batch) -> None:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        y_pred = self.model(x, training=False)
        loss = self.model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
        self._add_to_metrics(self._metric_increments(loss, x, y, y_pred, sample_weight))

    # -- compiled functions over a distributed iterator ---------------------------------------
    def _train_steps(self, iterator, steps):
        _repeat(steps, lambda: self.strategy.run(self._train_step, args=(next(iterator),)))

    def _test_steps(self, iterator, steps):
        _repeat(steps, lambda: self.strategy.run(self._test_step, args=(next(iterator),)))

    def _metric_results(self):
        return self.model.get_metrics_result()

    def _sync_state(self):
        floats = [v for v in self.model.non_trainable_variables if v.dtype in ("float16", "bfloat16", "float32", "float64")]

        def average():
            context = tf.distribute.get_replica_context()
            means = context.all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(v.value) for v in floats])
            for variable, mean in zip(floats, means):
                variable.assign(mean)

        if floats:
            self.strategy.run(average)

    def train(self, iterator, steps: int) -> None:
        """Runs `steps` train steps (at most steps_per_execution) on every replica, or schedules
        them on a worker under ParameterServerStrategy."""
        function, args = (self._train_one, (iterator,)) if steps == 1 else (self._train, (iterator, tf.constant(steps)))
        if self.coordinator is not None:
            self.coordinator.schedule(function, args=args)
        else:
            function(*args)
        if not self._started:
            self._started = True
            if self.input_wait is not None:
                # The run's first call waits for the input pipeline to start (and, under
                # ParameterServerStrategy, for every worker to build it): no pipeline avoids that,
                # and it says nothing of whether the job is input-bound, so it is not counted.
                self.wait()
                self.input_wait.reset()

    def test(self, iterator, steps: int) -> None:
        self._test(iterator, tf.constant(steps))

    def wait(self) -> None:
        """Until every step scheduled so far has run (ParameterServerStrategy)."""
        if self.coordinator is not None:
            self.coordinator.join()

    def results(self) -> dict[str, float]:
        """The metrics since the last reset, aggregated over every replica, as `fit` logs them.
        Under MultiWorkerMirroredStrategy every worker must call it at the same point."""
        self.wait()
        results = self._read() if self.coordinator is None else self.model.get_metrics_result()
        return {name: float(value) for name, value in results.items()}

    def reset(self) -> None:
        self.model.reset_metrics()

    def sync_state(self) -> None:
        """Averages the non-trainable state over the replicas (every worker calls it alike)."""
        if self.coordinator is None and self.replicas > 1:
            self._sync()

    def train_graph(self, iterator) -> tf.Graph:
        """The traced train function's graph (for TensorBoard), once it has run."""
        if self.steps_per_execution == 1:
            return self._train_one.get_concrete_function(iterator).graph
        return self._train.get_concrete_function(iterator, tf.constant(self.steps_per_execution)).graph


def _times_nan(gradient):
    """`gradient` with every value NaN (a sparse gradient's values)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * tf.constant(float("nan"), gradient.values.dtype),
                                gradient.indices, gradient.dense_shape)
    return gradient * tf.constant(float("nan"), gradient.dtype)


def _atomic_counter(variable: keras.Variable) -> None:
    """Makes this Keras variable's `assign_add` TensorFlow's atomic one (see the module's docstring)."""
    def assign_add(value):
        return variable.value.assign_add(tf.cast(value, variable.dtype))

    variable.assign_add = assign_add


def fit(steps: Steps, train: Iterator, *, epochs: int, steps_per_epoch: int, start_epoch: int = 1,
        start_step: int = 0, validation: tuple[Iterator, int] | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | keras.callbacks.CallbackList | None = None,
        ) -> list[dict[str, float]]:
    """Trains from epoch `start_epoch` (1-based), `start_step` steps into it, to the end of epoch
    `epochs` or until `model.stop_training` is set; after each epoch, validates on `validation`
    (an iterator over validation batches and how many to read). `callbacks`: Keras callbacks
    (`Events` among them), called as the module's docstring says. Returns each epoch's logs as
    `fit` names them (`loss`, `accuracy`, `val_loss`, ...): the metrics, nothing else."""
    model = steps.model
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(callbacks, model=model, epochs=epochs, steps=steps_per_epoch)
    model.stop_training = False
    history: list[dict[str, float]] = []
    callbacks.on_train_begin()
    for epoch in range(start_epoch, epochs + 1):
        callbacks.on_epoch_begin(epoch - 1)
        done = start_step if epoch == start_epoch else 0
        while done < steps_per_epoch and not model.stop_training:
            count = min(steps.steps_per_execution, steps_per_epoch - done)
            callbacks.on_train_batch_begin(done)
            # The step marker a profile's step-time views group by (as Keras' fit writes it; 0-based).
            with tf.profiler.experimental.Trace("train", epoch_num=epoch - 1, step_num=done, _r=1):
                steps.train(train, count)
            done += count
            callbacks.on_train_batch_end(done - 1)
        logs = steps.results()
        steps.reset()
        steps.sync_state()
        if validation is not None:
            iterator, count = validation
            callbacks.on_test_begin()
            steps.test(iterator, count)
            evaluated = steps.results()
            steps.reset()
            callbacks.on_test_end(evaluated)
            logs.update({f"val_{name}": value for name, value in evaluated.items()})
        callbacks.on_epoch_end(epoch - 1, logs)
        history.append(logs)
        if model.stop_training:
            break
    model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(history[-1] if history else None)
    return history
