"""What your own code can use, with or without the rest of the runtime: the training loop
(loop.py), step backups with the SIGTERM vote (backup.py), the input-wait measurement
(input_wait.py), input sharding (inputs.py), layers (layers.py), a SavedModel of serving
functions (export.py) and the orderly end of a multi-worker process (ending.py, which
trainer.fit's tasks and trainer.run's exit hook use). Import
the first ones by their public names: trainer.loop, trainer.inputs, trainer.layers, trainer.export."""
