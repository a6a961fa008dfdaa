"""The process wrapper: runs commands as processes and supervises them, with no TensorFlow.

- command.py: your command under the runtime (`python -m trainer.run`): TF_CONFIG, the output
  directories, stderr at its Cloud Logging severity, signals forwarded, the exit code mapped;
- launch.py: a whole multi-worker job on one machine, one process per task (`python -m trainer.launch`);
- relay.py, severity.py: what the supervisors leave out of a child's stderr, and at which
  severity they write the rest;
- exit_hook/, peer_loss.py: loaded in the command's Python processes: their orderly end, and exit
  143 for an uncaught error that says a peer is gone;
- stopping.py, ports.py: stopping processes as the platforms do; free ports.
"""
