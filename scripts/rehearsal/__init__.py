"""The rehearsal: a Vertex AI job, a Kubernetes JobSet or a Kubeflow Trainer TrainJob run on this
machine, one container per replica or pod, before a real one costs (`python scripts/submit_job.py local ...`), and a Model
deployed to an endpoint (`python scripts/deploy_model.py local ...`).

| module       | its one job                                                                        |
|--------------|------------------------------------------------------------------------------------|
| session.py   | one rehearsal from start to end: options, engine, storage, signals, cleanup          |
| runner.py    | the one container runner: create, start, relay, stop, remove; the loop over rules    |
| vertex.py    | Vertex AI's rules, and what Vertex tells each replica                                |
| jobset/      | JobSet's and Kubernetes' rules, and what each pod gets: a module per policy      |
| trainjob/    | Kubeflow Trainer v2's rules: a TrainJob and its runtime into the JobSet it applies |
| endpoint.py  | a Model deployed to an endpoint: the prediction image, ready when healthy           |
| engine.py    | the container engine (docker or podman) and its settings, for every script         |
| engine_front.py | before podman's Docker API socket: container waits without podman 4.3's busy loop |
| relay.py     | bytes both ways between two sockets, for the fronts                                 |
| storage.py   | Cloud Storage and /gcs/ for every container, from one setup                          |
| local_gcs/   | the local Cloud Storage server and its proxy (`python -m scripts.rehearsal.local_gcs`), a module per part |
| gcs_fuse.py  | the local server's buckets as files                                                 |
| tls.py       | the throwaway CA and server certificate of a local stand-in for Google's hosts      |
| fields.py    | the spec fields a rehearsal does not emulate, named at its start                    |

Every module imports its siblings as `scripts.rehearsal.X`, from the repository's root; the one
command lines, scripts/submit_job.py and scripts/deploy_model.py, put the root on sys.path when
they are run as files.
"""
