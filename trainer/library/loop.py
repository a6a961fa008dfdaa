"""The training loop: a compiled Keras 3 model, trained under any tf.distribute strategy.

Keras 3's own `Model.fit` cannot train across workers on TensorFlow: under
MultiWorkerMirroredStrategy it fails as soon as two worker processes run (keras-team/keras#20585),
and it has no ParameterServerStrategy support at all (keras-team/keras#18624). This module trains
the same compiled model with a loop of its own and reports the metrics `fit` would report:

    with strategy.scope():
        model = build_model()
        model.compile(optimizer=..., loss=..., metrics=[...])
    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    steps = Steps(strategy, model)
    steps.build(element_spec)                 # the model, its metrics and the optimizer, in scope
    history = fit(steps, iter(dataset), epochs=3, steps_per_epoch=100)

Each replica's step is Keras' own recipe: the forward pass under `tf.GradientTape`, the model's
`compute_loss` and `compute_metrics`, and the optimizer's `apply`, which all-reduces the
gradients under the mirrored strategies (MultiWorkerMirrored, Mirrored). Under
ParameterServerStrategy the same step runs on whichever worker is free (`ClusterCoordinator`).

Where it departs from `fit`, and why:
- Metric updates are computed from a zero state inside `keras.StatelessScope` and added to the
  metric variables with one `assign_add` each. Keras 3's `Variable.assign_add` reads, adds and
  writes back; two ParameterServer workers that update one metric at once lose each other's counts
  (2 workers, 20 steps: the optimizer counted 17). TensorFlow's own `assign_add` is atomic. For the
  same reason the optimizer's step counter is given TensorFlow's `assign_add` under that strategy.
- Regularization losses (`model.losses`) are divided by the replicas in sync, like the compiled
  loss is: Keras 3 adds them whole on every replica, and the all-reduce would sum them once per
  replica.
- Under the mirrored strategies, batch-norm statistics and other non-trainable float variables
  are averaged over the replicas at each epoch's end (`sync_state`): Keras 3 updates them on each
  replica alone, so without it every worker would save statistics of its own share of the data.
- Every step measures how long it waited for its batch (`trainer.library.input_wait`), outside any XLA
  region.
XLA (`jit_compile`) compiles the forward and backward pass only: the gradients' all-reduce runs
outside it (TensorFlow implements no collectives for CPUs under XLA).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf

from trainer.library import input_wait


class UnsupportedModel(ValueError):
    """A model this loop cannot train as it is. str() is one line."""


class Events:
    """What the loop tells its caller between steps; each method may be left as it is.

    `steps_done` runs after every call of the train function (`steps_per_execution` steps) with
    the 1-based epoch and the steps done in it; raising there stops training (a preemption)."""

    def epoch_begin(self, epoch: int) -> None:
        pass

    def steps_done(self, epoch: int, step: int) -> None:
        pass

    def epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        pass


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


class Steps:
    """The compiled train and test steps of one model under one strategy, and their metrics.

    Build it in no scope; it enters the strategy's scope itself where it creates variables."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model, *, steps_per_execution: int = 1,
                 jit_compile: bool = False, coordinator: tf.distribute.coordinator.ClusterCoordinator | None = None,
                 input_lanes: int | None = None):
        check_trainable(model)
        self.strategy = strategy
        self.model = model
        self.optimizer = model.optimizer
        self.steps_per_execution = steps_per_execution
        self.coordinator = coordinator
        self.replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            # `lanes`: replicas that step side by side (every worker's, under ParameterServerStrategy).
            self.input_wait = input_wait.InputWait(input_lanes or self.replicas)
        self._gradients = tf.function(self._forward_backward, jit_compile=True) if jit_compile else self._forward_backward
        self._train = tf.function(self._train_steps)
        # One step without a loop: a profile groups a step's ops under the step's marker only when
        # the function runs them outside a while loop (measured with xprof 2.24's trace viewer).
        self._train_one = tf.function(lambda iterator: self.strategy.run(self._train_step, args=(next(iterator),)))
        self._test = tf.function(self._test_steps)
        self._read = tf.function(self._metric_results)
        self._started = False
        self._sync = tf.function(self._sync_state)

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
                self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
                self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

        with self.strategy.scope():
            tf.function(trace).get_concrete_function(element_spec)
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
            loss = self._loss(x, y, y_pred, sample_weight, training=True)
            scaled = self.optimizer.scale_loss(loss)  # float16: LossScaleOptimizer's scale
        gradients = tape.gradient(scaled, model.trainable_variables)
        return gradients, self._metric_increments(loss, x, y, y_pred, sample_weight)

    def _metric_increments(self, loss, x, y, y_pred, sample_weight) -> list:
        """What this batch adds to each metric variable, computed from a zero state."""
        zero_state = [(v, tf.zeros(v.shape, v.dtype)) for v in self.metric_variables]
        with keras.StatelessScope(state_mapping=zero_state) as scope:
            self._track_loss(loss, x)
            self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return [scope.get_current_value(v) for v in self.metric_variables]

    def _loss(self, x, y, y_pred, sample_weight, training: bool):
        loss = self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        if self.model.losses and self.replicas > 1:
            # compute_loss divides the compiled loss by the replicas, but adds model.losses whole.
            loss -= tf.cast(tf.add_n(self.model.losses), loss.dtype) * (1.0 - 1.0 / self.replicas)
        return loss

    def _track_loss(self, loss, x) -> None:
        """The loss as `fit` logs it: this replica's mean over its batch, weighted by its size."""
        if self.loss_tracker is not None:
            batch = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
            self.loss_tracker.update_state(loss * self.replicas, sample_weight=batch)

    def _add_to_metrics(self, increments) -> None:
        for variable, increment in zip(self.metric_variables, increments):
            variable.value.assign_add(tf.cast(increment, variable.dtype))

    def _train_step(self, batch) -> None:
        started = tf.timestamp()
        with tf.control_dependencies(tf.nest.flatten(batch)):
            ready = tf.timestamp()
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        gradients, increments = self._gradients(x, y, sample_weight)
        self.optimizer.apply(gradients, self.model.trainable_variables)
        self._add_to_metrics(increments)
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
        loss = self._loss(x, y, y_pred, sample_weight, training=False)
        self._add_to_metrics(self._metric_increments(loss, x, y, y_pred, sample_weight))

    # -- compiled functions over a distributed iterator ---------------------------------------
    def _train_steps(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self._train_step, args=(next(iterator),))

    def _test_steps(self, iterator, steps):
        for _ in tf.range(steps):
            self.strategy.run(self._test_step, args=(next(iterator),))

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
            # The run's first call waits for the input pipeline to start (and, under
            # ParameterServerStrategy, for every worker to build it): no pipeline avoids that, and
            # it says nothing of whether the job is input-bound, so it is not counted.
            self._started = True
            self.wait()
            self.input_wait.reset()

    def test(self, iterator, steps: int) -> None:
        self._test(iterator, tf.constant(steps))

    def wait(self) -> None:
        """Until every step scheduled so far has run (ParameterServerStrategy)."""
        if self.coordinator is not None:
            self.coordinator.join()

    def results(self, prefix: str = "") -> dict[str, float]:
        """The metrics since the last reset, aggregated over every replica, as `fit` logs them.
        Under MultiWorkerMirroredStrategy every worker must call it at the same point."""
        self.wait()
        results = self._read() if self.coordinator is None else self.model.get_metrics_result()
        return {f"{prefix}{name}": float(value) for name, value in results.items()}

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


def _atomic_counter(variable: keras.Variable) -> None:
    """Makes this Keras variable's `assign_add` TensorFlow's atomic one (see the module's docstring)."""
    def assign_add(value):
        return variable.value.assign_add(tf.cast(value, variable.dtype))

    variable.assign_add = assign_add


def fit(steps: Steps, train: Iterator, *, epochs: int, steps_per_epoch: int, start_epoch: int = 1,
        start_step: int = 0, validation: tuple[Iterator, int] | None = None, events: Events | None = None,
        clock: Callable[[], float] = time.monotonic) -> list[dict[str, float]]:
    """Trains from epoch `start_epoch` (1-based), `start_step` steps into it, to the end of epoch
    `epochs`; after each epoch, validates on `validation` (an iterator over validation batches and
    how many to read) and hands the epoch's logs to `events`. Returns every epoch's logs: the
    metrics as `fit` names them (`loss`, `accuracy`, `val_loss`, ...), plus the input wait's
    (trainer.library.input_wait) and `seconds`."""
    events = events or Events()
    history = []
    for epoch in range(start_epoch, epochs + 1):
        events.epoch_begin(epoch)
        started = clock()
        done = start_step if epoch == start_epoch else 0
        while done < steps_per_epoch:
            count = min(steps.steps_per_execution, steps_per_epoch - done)
            # The step marker a profile's step-time views group by (as Keras' fit writes it; 0-based).
            with tf.profiler.experimental.Trace("train", epoch_num=epoch - 1, step_num=done, _r=1):
                steps.train(train, count)
            done += count
            events.steps_done(epoch, done)
        logs = steps.results()
        logs.update(steps.input_wait.results(steps.strategy))
        steps.reset()
        steps.input_wait.reset()
        steps.sync_state()
        if validation is not None:
            iterator, count = validation
            steps.test(iterator, count)
            logs.update(steps.results("val_"))
            steps.reset()
        logs["seconds"] = clock() - started
        history.append(logs)
        events.epoch_end(epoch, logs)
    return history


class _PrintEpochs(Events):
    """Keras' `verbose=2` line per epoch, from the chief only."""

    def __init__(self, epochs: int):
        self.epochs = epochs

    def epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        shown = {name: value for name, value in logs.items() if not name.startswith("input_")}
        seconds = shown.pop("seconds", 0.0)
        print(f"Epoch {epoch}/{self.epochs} - {seconds:.0f}s - "
              + " - ".join(f"{name}: {value:.4f}" for name, value in shown.items()), flush=True)


def fit_model(model: keras.Model, dataset: tf.data.Dataset | Callable[[tf.distribute.InputContext], tf.data.Dataset],
              *, epochs: int, steps_per_epoch: int,
              validation_data: tf.data.Dataset | Callable[[tf.distribute.InputContext], tf.data.Dataset] | None = None,
              validation_steps: int | None = None, backup_dir: str | None = None, verbose: int = 2,
              steps_per_execution: int = 1) -> keras.callbacks.History:
    """`model.fit` for a script of your own, under any strategy, MultiWorkerMirrored included.

    In place of `model.fit(dataset, epochs=3, steps_per_epoch=100)`, with the model built and
    compiled in `strategy.scope()` as `fit` under a strategy wants it:

        from trainer.loop import fit_model
        history = fit_model(model, dataset, epochs=3, steps_per_epoch=100)

    `dataset` is what `fit` takes under a strategy: a `tf.data.Dataset` of global batches (each
    worker reads its share, as `fit` shards it), or a function from a `tf.distribute.InputContext`
    to a dataset of per-replica batches. It is repeated: `steps_per_epoch` says how many batches
    an epoch is. `validation_data` the same, read for `validation_steps` batches after each
    epoch. With `backup_dir` (on storage every worker reaches, e.g. a gs:// path), the training
    state is backed up there every few minutes and on SIGTERM, which then ends the process with
    exit code 143; a rerun resumes at the step. `verbose=2` prints a line per epoch from the
    chief. Returns a `keras.callbacks.History`, as `fit` does. ParameterServerStrategy needs the
    runtime's coordinator: use a `trainer.tasks.Task` there.
    """
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise UnsupportedModel("fit_model runs the synchronous strategies; a ParameterServer job needs a "
                               "trainer.tasks.Task (docs/your-own-code.md)")
    steps = Steps(strategy, model, steps_per_execution=steps_per_execution)
    train, spec = _distribute(strategy, dataset)
    steps.build(spec)
    validation = None
    if validation_data is not None:
        if not validation_steps:
            raise UnsupportedModel("validation_data needs validation_steps: batches to read after each epoch")
        validation = (iter(_distribute(strategy, validation_data)[0]), validation_steps)
    chief = strategy.extended.should_checkpoint
    events: list[Events] = [_PrintEpochs(epochs)] if verbose and chief else []
    start_epoch, start_step = 1, 0
    from trainer.library import backup as backup_lib
    from trainer.runtime import callbacks

    with backup_lib.sigterm_flag() as sigterm:
        if backup_dir:
            saved = backup_lib.Backup(backup_dir, model, steps_per_epoch, chief, every_steps=None)
            start_epoch, start_step = backup_lib.resume_point(saved.restore(), steps_per_epoch)
            events.insert(0, backup_lib.SynchronousGuard(saved, strategy, sigterm, steps.sync_state))
        try:
            logs = fit(steps, iter(train), epochs=epochs, steps_per_epoch=steps_per_epoch, start_epoch=start_epoch,
                       start_step=start_step, validation=validation, events=callbacks.Composite(events))
        except backup_lib.Preempted as stop:
            print(f"preempted (SIGTERM): saved a backup in {backup_dir}; a rerun resumes at epoch {stop.epoch} "
                  f"step {stop.step}", file=sys.stderr, flush=True)
            raise SystemExit(143) from None
    if backup_dir:
        saved.finish()
    history = keras.callbacks.History()
    history.set_model(model)
    history.epoch = list(range(start_epoch - 1, epochs))
    for epoch_logs in logs:
        for name, value in epoch_logs.items():
            if not name.startswith("input_") and name != "seconds":
                history.history.setdefault(name, []).append(value)
    return history


def _distribute(strategy: tf.distribute.Strategy, dataset):
    """(distributed dataset, one input pipeline's element_spec) for a dataset or a dataset function."""
    if isinstance(dataset, tf.data.Dataset):
        return strategy.experimental_distribute_dataset(dataset.repeat()), dataset.element_spec
    specs: list = []

    def built(context):
        made = dataset(context)
        specs.append(made.element_spec)
        return made.repeat()

    distributed = strategy.distribute_datasets_from_function(built)
    return distributed, specs[0]
