"""What your own code can use, with or without the rest of the runtime: the training loop
(loop.py), step backups with the SIGTERM vote (backup.py), the input-wait measurement
(input_wait.py), input sharding (inputs.py) and layers (layers.py). Import them by their public
names: trainer.loop, trainer.inputs, trainer.layers."""
