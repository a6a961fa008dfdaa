"""One TrainJob from its creation to its end: admitted (admission.py), turned into the JobSet Kubeflow
Trainer v2.3.0 would apply (patches.py, pod_sets.py, ml_policy.py, build.py, in the order of
TrainingRuntime.RuntimeInfo and RunComponentBuilderPlugins: pkg/runtime/core/trainingruntime.go:88-139,
pkg/runtime/framework/core/framework.go:136-151), then run by the JobSet rehearsal (jobset/), whose
end is the TrainJob's: the JobSet's Completed or Failed condition becomes the TrainJob's
(JobSet.Status, plugins/jobset/jobset.go:438-457). Its activeDeadlineSeconds counts from the
TrainJob's creation; once passed, the TrainJob controller marks it Failed (DeadlineExceeded) and
deletes its JobSet (reconcileDeadline, pkg/controller/trainjob_controller.go:161-200)."""

from __future__ import annotations

import dataclasses

from scripts.jobspec import trainjob as trainjob_spec
from scripts.rehearsal.jobset import controller as jobset_controller
from scripts.rehearsal.runner import RehearsalError, Session
from scripts.rehearsal.trainjob import admission, build, ml_policy, patches, pod_sets
from scripts.rehearsal.trainjob.manifest import CLUSTER_RUNTIME

# What the rehearsal does not emulate of Trainer, named at the start of every run.
NOT_EMULATED = ("Kueue's admission (a TrainJob runs at once, its queue label unread), the SDK's dataset and model "
                "initializers (no runtime here has their Jobs), podGroupPolicy gang scheduling, runtime snapshots "
                "(the runtime is read once, at the start, as a snapshot keeps it), the TrainJobStatus plugin")
DEADLINE_MESSAGE = "TrainJob exceeded its active deadline"  # constants.TrainJobDeadlineExceededMessage


@dataclasses.dataclass(frozen=True)
class Built:
    """A TrainJob, admitted, and the JobSet Trainer would apply for it."""

    trainjob: dict
    runtime: dict
    jobset: dict
    warnings: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.trainjob["metadata"]["name"]

    @property
    def deadline(self) -> int | None:
        return self.trainjob["spec"].get("activeDeadlineSeconds")


def to_jobset(trainjob: dict, runtimes: list[dict]) -> Built:
    """The JobSet Trainer would apply for `trainjob` on the runtime it names among `runtimes`;
    RehearsalError, one line, for what the API server, the webhooks or the controller refuse."""
    trainjob_spec.check_schema(trainjob)  # the models' strict check, as kubectl's strict field validation
    for runtime in runtimes:
        trainjob_spec.check_schema(runtime)
    installed = [admission.admitted_runtime(runtime) for runtime in runtimes]
    trainjob = admission.admitted_trainjob(trainjob)
    if trainjob["spec"]["managedBy"] == admission.MULTIKUEUE:
        raise RehearsalError(f"TrainJob {trainjob['metadata']['name']}: spec.managedBy {admission.MULTIKUEUE}: the "
                             "TrainJob controller leaves it to Kueue's MultiKueue, which runs it on a worker cluster; "
                             "not emulated")
    if trainjob["spec"]["suspend"]:
        raise RehearsalError(f"TrainJob {trainjob['metadata']['name']}: spec.suspend is true: its JobSet is created "
                             "suspended and no pod runs until it is resumed (Kueue resumes what it admits); not emulated")
    runtime, warnings = admission.runtime_of(trainjob, installed)
    runtime_spec = runtime.get("spec") or {}
    policy = runtime_spec.get("mlPolicy")
    ml_policy.check(policy, runtime["metadata"]["name"])
    if runtime_spec.get("podGroupPolicy") is not None:
        raise RehearsalError(f"runtime {runtime['metadata']['name']}: podGroupPolicy (gang scheduling through the "
                             "coscheduling or Volcano plugin) is not emulated")
    template = patches.patched_template(runtime_spec.get("template") or {}, trainjob["spec"].get("runtimePatches") or [])
    build.refuse(build.validate(template["spec"], trainjob, trainjob["spec"]["runtimeRef"]), admission.TRAINJOB_WEBHOOK)
    pod_sets.merge_resources(template["spec"], policy, trainjob)
    sets = pod_sets.pod_sets(template["spec"], policy)
    ml_policy.enforce(sets, template["spec"], trainjob)
    jobset = build.build(template, sets, trainjob)
    _check_applicable(jobset, trainjob)
    return Built(trainjob, runtime, jobset, tuple(warnings))


def _check_applicable(jobset: dict, trainjob: dict) -> None:
    """What the API server refuses in the JobSet the controller applies, which the TrainJob then
    reports only as an event (TrainJobResourcesCreationFailed): a container without an image,
    such as one a runtime patch adds."""
    for i, rjob in enumerate(jobset["spec"]["replicatedJobs"]):
        for j, container in enumerate(pod_sets.pod_spec_of(rjob).get("containers") or [None]):
            if not (container or {}).get("image"):
                raise RehearsalError(
                    f"TrainJob {trainjob['metadata']['name']}: the API server refuses the JobSet Trainer builds: "
                    f"spec.replicatedJobs[{i}].template.spec.template.spec.containers[{j}].image: Required value "
                    "(the TrainJob stays without pods, with a TrainJobResourcesCreationFailed event)")


def check(built: Built, faults=()) -> None:
    jobset_controller.check(built.jobset, faults)


def run(session: Session, built: Built, run_id: str, faults=(), bucket_directory=None) -> int:
    """Runs the TrainJob's JobSet; returns the rehearsal's exit code."""
    kind = built.trainjob["spec"]["runtimeRef"]["kind"]
    where = "" if kind == CLUSTER_RUNTIME else f" in namespace {built.runtime['metadata'].get('namespace', 'default')}"
    session.output.note(f"TrainJob {built.name}: {kind} {built.runtime['metadata']['name']}{where}, "
                        f"as Kubeflow Trainer v2.3.0 builds its JobSet")
    session.output.note(f"not emulated, of Trainer: {NOT_EMULATED}")
    for warning in built.warnings:
        session.output.note(warning, "WARNING")
    deadline = None
    if built.deadline:
        deadline = jobset_controller.OwnerDeadline(
            built.deadline, f"{DEADLINE_MESSAGE} ({built.deadline}s): Trainer marks it Failed (DeadlineExceeded) and "
                            "deletes its JobSet")
    code = jobset_controller.run(session, built.jobset, run_id, faults, bucket_directory, owner_deadline=deadline)
    session.output.note(f"TrainJob {built.name}: {'Complete' if code == 0 else 'Failed'}", "INFO" if code == 0 else "ERROR")
    return code
