"""One module per role a process of a job can have: a synchronous job's chief and workers
(synchronous.py), a ParameterServer job's coordinator and servers (parameter_server.py), and the
side-car evaluator (evaluator.py)."""
