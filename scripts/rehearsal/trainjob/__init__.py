"""Kubeflow Trainer v2's rules over the JobSet rehearsal: a TrainJob and the runtime it names turned
into the JobSet the Trainer controller would apply, then run as jobset/ runs any JobSet.

Read from kubeflow/trainer v2.3.0 (tag v2.3.0, commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab,
2026-08-06): pkg/webhooks/, pkg/runtime/core/, pkg/runtime/framework/plugins/{plainml,jobset}/,
pkg/controller/trainjob_controller.go and the CRDs' markers in pkg/apis/trainer/v1alpha1/. Each
module names the functions and lines it follows.

Not emulated, and named at the start of every run: Kueue's admission (a TrainJob labelled for a
LocalQueue runs at once here), the Kubeflow SDK's dataset and model initializers (Jobs the
TensorFlow runtimes do not have; a TrainJob that asks for one is refused as the webhook refuses
it), the framework plugins other than plainML (torch, mpi, jax, xgboost, flux), gang scheduling
(podGroupPolicy), MultiKueue (managedBy), suspension, and the runtime snapshot (the runtime is
read once, at the start, which is what a snapshot guarantees).

| module        | its one concern                                                                  |
|---------------|----------------------------------------------------------------------------------|
| manifest.py   | reading TrainJobs and runtimes; the runtimes this project ships                  |
| admission.py  | the CRDs' defaults and rules, the webhooks' refusals, the runtime's lookup        |
| patches.py    | runtimePatches merged over the runtime's JobSet template; the JobSet's labels     |
| pod_sets.py   | each replicatedJob's pods from the runtime; resourcesPerNode into the trainer     |
| ml_policy.py  | plainML: numNodes and the TrainJob's env into the first trainer replicatedJob      |
| build.py      | the JobSet plugin: its checks, and the JobSet it builds (image, command, args, env) |
| controller.py | one TrainJob's life: built, run by jobset/, its deadline, its end                 |
"""

from scripts.rehearsal.trainjob.controller import Built, check, run, to_jobset
from scripts.rehearsal.trainjob.manifest import load, runtimes_in, shipped_runtimes, with_image

__all__ = ["Built", "check", "load", "run", "runtimes_in", "shipped_runtimes", "to_jobset", "with_image"]
