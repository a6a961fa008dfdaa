"""The JobSet rehearsal's rules, read from manifests without running anything."""

from __future__ import annotations

import copy
import json
import re
import time

import pytest
import yaml

from scripts import jobspec
from scripts.rehearsal import runner
from scripts.rehearsal.jobset import admission, controller, failure_policy, manifest as manifests, pods as jobset_pods
from scripts.submit_job import build_parser, build_spec


def generated(*args: str) -> dict:
    split = args.index("--") if "--" in args else len(args)
    parsed = build_parser().parse_args(["jobset", "--image-uri", "img:1", *args[:split]])
    parsed.trainer_args = list(args[split + 1:])
    return build_spec(parsed)[1]


def job_spec(manifest: dict, role: str) -> dict:
    return next(r["template"]["spec"] for r in manifest["spec"]["replicatedJobs"] if r["name"] == role)


def test_exit_codes_the_generated_policy_fails_at_once_and_those_it_counts():
    manifest = generated("--workers", "2")
    worker = job_spec(manifest, "worker")
    assert failure_policy.pod_failure_action(worker, 2, disrupted=False) == "FailJob"
    # An MWMS task exits 1 when a peer is lost (a plain script's uncaught error): counted, not permanent.
    assert failure_policy.pod_failure_action(worker, 1, disrupted=False) == "Count"
    for signalled in (130, 137, 138, 143):
        assert failure_policy.pod_failure_action(worker, signalled, disrupted=False) == "Count"
    # An eviction is counted for MWMS (every worker is needed), whatever the code.
    assert failure_policy.pod_failure_action(worker, 1, disrupted=True) == "Count"


def test_a_pss_worker_evicted_is_recreated_uncounted():
    manifest = generated("--strategy", "pss", "--workers", "2", "--ps", "1", "--evaluator")
    assert failure_policy.pod_failure_action(job_spec(manifest, "worker"), 143, disrupted=True) == "Ignore"
    assert failure_policy.pod_failure_action(job_spec(manifest, "chief"), 143, disrupted=True) == "Count"


def test_a_job_failed_by_policy_fails_the_jobset_and_others_restart_it():
    policy = generated("--workers", "1", "--max-restarts", "2")["spec"]["failurePolicy"]
    assert failure_policy.jobset_failure_action(policy, "worker", "PodFailurePolicy") == "FailJobSet"
    assert failure_policy.jobset_failure_action(policy, "worker", "BackoffLimitExceeded") == "RestartJobSet"
    targeted = {"rules": [{"action": "RestartJobSetAndIgnoreMaxRestarts", "targetReplicatedJobs": ["ps"]}]}
    assert failure_policy.jobset_failure_action(targeted, "ps", "BackoffLimitExceeded") == "RestartJobSetAndIgnoreMaxRestarts"
    assert failure_policy.jobset_failure_action(targeted, "worker", "BackoffLimitExceeded") == "RestartJobSet"


def test_pods_get_their_hostname_subdomain_and_job():
    pods = jobset_pods.pods_of(generated("--name", "demo", "--workers", "2", "--", "--epochs", "1"))
    assert [(p.hostname, p.job, p.subdomain) for p in pods] == [
        ("demo-chief-0-0", "demo-chief-0", "demo"), ("demo-worker-0-0", "demo-worker-0", "demo"),
        ("demo-worker-0-1", "demo-worker-0", "demo")]
    assert pods[2].env["JOBSET_REPLICATED_JOB"] == "worker" and pods[2].env["JOB_COMPLETION_INDEX"] == "1"
    assert pods[0].args[-2:] == ["--epochs", "1"]


def test_claims_are_shared_and_other_volume_kinds_are_refused():
    manifest = generated("--workers", "1")
    for rjob in manifest["spec"]["replicatedJobs"]:
        pod_spec = rjob["template"]["spec"]["template"]["spec"]
        pod_spec["volumes"] = [{"name": "m", "persistentVolumeClaim": {"claimName": "models"}}, {"name": "s", "emptyDir": {}}]
        pod_spec["containers"][0]["volumeMounts"] = [{"name": "m", "mountPath": "/models"}, {"name": "s", "mountPath": "/scratch"}]
    pods = jobset_pods.pods_of(manifest)
    assert {tuple(p.mounts) for p in pods} == {(("models", "/models", False), (None, "/scratch", False))}
    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"][0] = {
        "name": "m", "hostPath": {"path": "/data"}}
    with pytest.raises(jobspec.SpecError, match="hostPath"):
        jobset_pods.pods_of(manifest)


@pytest.mark.parametrize("text", ["demo-worker-0-0", "demo-worker-0-0@", "Demo@3", "demo@/(/", "demo@soon"])
def test_a_bad_preempt_is_one_line(text):
    with pytest.raises(jobspec.SpecError, match="--preempt takes POD@SECONDS or POD@/REGEX/"):
        controller.parse_eviction(text)


def test_preempt_parses_seconds_and_patterns():
    assert controller.parse_eviction("demo-worker-0-1@40").seconds == 40
    assert controller.parse_eviction("demo-worker-0-1@/epoch 2/").pattern.pattern == "epoch 2"


def test_load_reads_the_first_jobset_and_refuses_the_rest(tmp_path):
    manifest = generated("--workers", "1")
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump({"kind": "ConfigMap", "apiVersion": "v1"}) + "---\n" + yaml.safe_dump(manifest))
    assert manifests.load(str(path))["metadata"] == manifest["metadata"]
    path.write_text(yaml.safe_dump({"kind": "ConfigMap"}))
    with pytest.raises(jobspec.SpecError, match="no JobSet"):
        manifests.load(str(path))
    path.write_text(yaml.safe_dump({**manifest, "apiVersion": "jobset.x-k8s.io/v1alpha1"}))
    with pytest.raises(jobspec.SpecError, match="v1alpha2"):
        manifests.load(str(path))
    path.write_text("kind: [")
    with pytest.raises(jobspec.SpecError):
        manifests.load(str(path))


# --- JobSet's and Kubernetes' rules, against a run that records what the rules ask of it ----------

class RecordingRun:
    """What the JobSet rules ask of the runner, recorded: no engine, no containers."""

    def __init__(self):
        self.launched, self.stopped, self.last, self.alive = [], [], {}, {}

    def launch(self, container, fresh=True):
        self.launched.append((container, fresh))
        self.last[container.key] = self.alive[container.key] = container

    def running(self):
        return list(self.alive.values())

    def started(self, key):
        return key in self.alive

    def current(self, key):
        return self.alive.get(key)

    def send(self, container, signal_name):
        self.stopped.append((container, signal_name))

    def stop(self, containers=None, wait=True):
        for container in list(self.alive.values()) if containers is None else containers:
            self.alive.pop(container.key, None)
            self.stopped.append(container)

    def volume(self, name):
        return f"run-{name}"

    def exit(self, rules, key, code, fault=None):
        """A poll that reaped this one exit."""
        return self.poll(rules, {key: code}, {key: fault} if fault else None)

    def poll(self, rules, codes, faults=None):
        """As the runner's drive loop does: every container that ended since the last poll is
        reaped at once, each exit is judged in turn (in `codes`' order), then tick. The first
        decision ends the poll."""
        reaped = [(self.alive.pop(key), code) for key, code in codes.items()]
        for container, code in reaped:
            decision = rules.exited(self, container, code, (faults or {}).get(container.key))
            if decision is not None:
                return decision
        return rules.tick(self, time.monotonic())


def rules_for(manifest):
    from scripts.rehearsal.runner import Output
    import io

    output = io.StringIO()
    rules = controller.JobSetRules(manifest, Output(output), network="rehearsal-test")
    return rules, output


def hand_written(restart_policy="Never", **job_spec):
    """One replicatedJob `main` of two pods, written by hand."""
    template = {"spec": {"containers": [{"name": "c", "image": "img:1", "env": [
        {"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]}}
    if restart_policy:
        template["spec"]["restartPolicy"] = restart_policy
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "demo"},
            "spec": {"failurePolicy": {"maxRestarts": 2}, "replicatedJobs": [{"name": "main", "template": {
                "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0, "template": template, **job_spec}}}]}}


def test_a_restarted_jobsets_pods_read_the_new_restart_attempt_through_the_downward_api():
    """The Jobs of attempt N carry restart-attempt N (labelAndAnnotateObject): the downward API
    gives the new value, not the first attempt's."""
    assert {pod.env["ATTEMPT"] for pod in jobset_pods.pods_of(hand_written(), restart_attempt=3)} == {"3"}
    rules, _ = rules_for(hand_written())
    run = RecordingRun()
    rules.begin(run, 0)
    assert {c.env["ATTEMPT"] for c, _ in run.launched} == {"0"}
    assert isinstance(run.exit(rules, "demo-main-0-0", 1), runner.Restart)
    run.launched.clear()
    rules.begin(run, 1)
    assert {c.env["ATTEMPT"] for c, _ in run.launched} == {"1"}
    assert {c.labels["jobset.sigs.k8s.io/restart-attempt"] for c, _ in run.launched} == {"1"}


def test_restarts_that_ignore_max_restarts_are_not_counted_towards_it():
    """RestartJobSetAndIgnoreMaxRestarts restarts without counting (RestartsCountTowardsMax)."""
    manifest = hand_written()
    manifest["spec"]["failurePolicy"] = {"maxRestarts": 1, "rules": [
        {"name": "signals", "action": "RestartJobSetAndIgnoreMaxRestarts",
         "onJobFailureMessagePatterns": ["exit code 143"]}]}
    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"] = {"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [143, 3]}}]}
    rules, output = rules_for(manifest)
    run = RecordingRun()
    for attempt in range(3):  # three uncounted restarts: maxRestarts 1 is never reached
        rules.begin(run, attempt)
        assert isinstance(run.exit(rules, "demo-main-0-1", 143), runner.Restart)
    assert (rules.restarts, rules.restarts_counted) == (3, 0)
    rules.begin(run, 3)
    assert isinstance(run.exit(rules, "demo-main-0-1", 3), runner.Restart)  # counted: 1 of 1
    rules.begin(run, 4)
    outcome = run.exit(rules, "demo-main-0-1", 3)
    assert outcome.code == 3 and outcome.message.endswith("(maxRestarts 1 reached)"), outcome
    assert "restart 3, not counted" in output.getvalue() and "restart 1 of 1" in output.getvalue()


def chief_exits_beside_a_preempted_worker(chief_code: int, order: tuple[str, str]):
    """A generated two-task JobSet whose preempted worker (DisruptionTarget, 137 after the grace)
    and chief (`chief_code`) are reaped in one poll, in `order`: (decision, output)."""
    rules, output = rules_for(generated("--name", "race", "--workers", "1", "--max-restarts", "2"))
    run = RecordingRun()
    rules.begin(run, 0)
    codes = {"chief": ("race-chief-0-0", chief_code), "worker": ("race-worker-0-0", 137)}
    decision = run.poll(rules, dict(codes[role] for role in order),
                        {"race-worker-0-0": controller.parse_eviction("race-worker-0-0@1")})
    return decision, output.getvalue()


BOTH_ORDERS = pytest.mark.parametrize("order", [("chief", "worker"), ("worker", "chief")])


@BOTH_ORDERS
def test_a_preempted_worker_and_the_chief_that_lost_it_restart_the_jobset_in_either_order(order):
    """The race a plain script meets: its chief's collective fails at once (exit 1) as its worker
    is preempted: both Jobs fail without a permanent code, and the JobSet restarts."""
    decision, output = chief_exits_beside_a_preempted_worker(1, order)
    assert isinstance(decision, runner.Restart), (decision, output)
    assert "restart 1 of 2" in output and ", as well" in output


@BOTH_ORDERS
def test_jobs_failed_in_one_poll_are_judged_by_the_first_rule_any_of_them_matches(order):
    """JobSet tries its rules in order over every failed Job (findFirstFailedPolicyRuleAndJob): a
    permanent exit on the chief fails the JobSet even when a preempted worker's Job failed first."""
    outcome, output = chief_exits_beside_a_preempted_worker(2, order)
    assert isinstance(outcome, runner.Outcome) and outcome.code == 2, outcome
    assert outcome.message == ("failed: Job race-chief-0 failed (PodFailurePolicy): pod race-chief-0-0 exited 2 "
                               "(failurePolicy: FailJobSet, rule permanentExitCode)")
    assert "Job race-worker-0 failed (BackoffLimitExceeded): pod race-worker-0-0 exited 137, as well" in output
    assert "recreates every Job" not in output


def test_a_failed_job_is_judged_before_the_success_policy_in_the_same_poll():
    """JobSet's reconcile runs the failurePolicy before the successPolicy: the chief's success and
    a worker's failure, reaped together, restart the JobSet."""
    manifest = generated("--name", "late", "--workers", "1", "--max-restarts", "1")
    rules, _ = rules_for(manifest)
    run = RecordingRun()
    rules.begin(run, 0)
    assert isinstance(run.poll(rules, {"late-chief-0-0": 0, "late-worker-0-0": 143}), runner.Restart)
    rules.begin(run, 1)
    assert run.poll(rules, {"late-chief-0-0": 0}).code == 0


def test_the_first_matching_rule_picks_the_earliest_failed_job_and_none_the_earliest_of_all():
    policy = {"rules": [{"name": "oom", "action": "FailJobSet", "onJobFailureMessagePatterns": ["exit code 137"]},
                        {"name": "any", "action": "RestartJobSetAndIgnoreMaxRestarts", "targetReplicatedJobs": ["ps"]}]}
    failed = [("worker", "BackoffLimitExceeded", failure_policy.BACKOFF_MESSAGE),
              ("ps", "PodFailurePolicy", "... failed with exit code 137 matching FailJob rule at index 1"),
              ("chief", "PodFailurePolicy", "... failed with exit code 137 matching FailJob rule at index 1")]
    assert failure_policy.first_failed_rule_and_job(policy, failed) == (policy["rules"][0], 1)
    assert failure_policy.first_failed_rule_and_job(policy, failed[:1]) == (None, 0)
    assert failure_policy.first_failed_rule_and_job(policy, [failed[0], ("ps", "BackoffLimitExceeded", "")]) == (
        policy["rules"][1], 1)


def test_failure_rules_match_the_job_conditions_message_as_kubernetes_writes_it():
    manifest = hand_written()
    job_spec = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    job_spec["podFailurePolicy"] = {"rules": [{"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [143]}}]}
    pod = jobset_pods.pods_of(manifest)[1]
    message = failure_policy.pod_failure_message(job_spec, 42, False, pod, "default")
    assert message == f"Container c for pod default/{pod.name} failed with exit code 42 matching FailJob rule at index 0"
    policy = {"rules": [{"name": "oom", "action": "FailJobSet", "onJobFailureMessagePatterns": [r"exit code (42|137)\b"]}]}
    assert failure_policy.jobset_failure_action(policy, "main", "PodFailurePolicy", message) == "FailJobSet"
    assert failure_policy.jobset_failure_action(policy, "main", "PodFailurePolicy", message.replace("42", "1")) == "RestartJobSet"
    assert failure_policy.jobset_failure_action(policy, "main", "BackoffLimitExceeded", failure_policy.BACKOFF_MESSAGE) == "RestartJobSet"
    broken = {"rules": [{"name": "bad", "action": "FailJobSet", "onJobFailureMessagePatterns": ["("]}]}
    assert failure_policy.jobset_failure_action(broken, "main", "PodFailurePolicy", message) == "RestartJobSet"  # never matches


@pytest.mark.parametrize("action", ["RestartJob", "RestartJobAndIgnoreMaxRestarts"])
def test_restart_job_is_refused_as_the_webhook_refuses_it_with_its_feature_gate_off(action):
    manifest = hand_written()
    manifest["spec"]["failurePolicy"]["rules"] = [{"name": "one", "action": action}]
    with pytest.raises(jobspec.SpecError, match=f"action {action}: JobSet's webhook refuses it while the RestartJob feature gate is off"):
        admission.admitted(manifest)


@pytest.mark.parametrize("strategy, blocking", [(None, False), ("Recreate", False), ("BlockingRecreate", True)])
def test_recreate_starts_new_pods_beside_the_old_ones_and_blocking_recreate_waits(strategy, blocking):
    manifest = hand_written()
    if strategy:
        manifest["spec"]["failurePolicy"]["restartStrategy"] = strategy
    rules, _ = rules_for(manifest)
    run = RecordingRun()
    rules.begin(run, 0)
    assert run.exit(rules, "demo-main-0-0", 1) == runner.Restart(blocking=blocking)


def test_no_restart_policy_is_onfailure_which_kubernetes_refuses_beside_a_pod_failure_policy():
    manifest = hand_written(restart_policy=None, podFailurePolicy={"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]})
    with pytest.raises(jobspec.SpecError, match="podFailurePolicy needs the pod template's restartPolicy Never; it is "
                                                r"OnFailure \(defaulted to OnFailure by JobSet's webhook"):
        admission.admitted(manifest)
    assert admission.admitted(hand_written(restart_policy=None))["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["restartPolicy"] == "OnFailure"


def test_under_onfailure_the_kubelet_restarts_the_container_in_place_after_its_back_off():
    manifest = hand_written(restart_policy=None)
    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 3
    rules, output = rules_for(manifest)
    run = RecordingRun()
    rules.begin(run, 0)
    first = run.last["demo-main-0-1"]
    assert run.exit(rules, "demo-main-0-1", 1) is None
    assert "restarts its container in place in 10s" in output.getvalue()
    assert rules.tick(run, time.monotonic()) is None and len(run.launched) == 2  # not before its back-off
    assert rules.tick(run, time.monotonic() + 11) is None
    assert run.launched[-1] == (first, False)  # the same container, started again: the same pod and name
    assert failure_policy.crash_loop_delay(2) == 20 and failure_policy.crash_loop_delay(20) == 300
    assert run.exit(rules, "demo-main-0-1", 1) is None
    rules.tick(run, time.monotonic() + 100)
    assert isinstance(run.exit(rules, "demo-main-0-1", 1), runner.Restart)  # 3 restarts reach backoffLimit 3


def test_active_deadline_seconds_fails_the_job_and_stops_its_pods():
    manifest = hand_written(activeDeadlineSeconds=15)
    manifest["spec"]["failurePolicy"]["rules"] = [{"name": "timeLimit", "action": "FailJobSet",
                                                   "onJobFailureReasons": ["DeadlineExceeded"]}]
    rules, _ = rules_for(manifest)
    run = RecordingRun()
    rules.begin(run, 0)
    assert rules.tick(run, time.monotonic() + 5) is None
    outcome = rules.tick(run, time.monotonic() + 16)
    assert outcome.code == controller.DEADLINE_EXIT and "(DeadlineExceeded)" in outcome.message, outcome
    assert "FailJobSet, rule timeLimit" in outcome.message
    assert {c.key for c in run.stopped} == {"demo-main-0-0", "demo-main-0-1"} and not run.running()


def test_other_pods_reach_a_pod_by_its_subdomain_name_only():
    """JobSet's headless Service gives `{hostname}.{subdomain}`; nothing gives the bare hostname."""
    rules, _ = rules_for(hand_written())
    run = RecordingRun()
    rules.begin(run, 0)
    container = run.last["demo-main-0-1"]
    assert "demo-main-0-1" not in container.aliases
    assert container.aliases == ("demo-main-0-1.demo", "demo-main-0-1.demo.default.svc",
                                 "demo-main-0-1.demo.default.svc.cluster.local")
    assert container.hostname == "demo-main-0-1"  # its own name, in its own /etc/hosts, as the kubelet writes it


def test_each_new_pod_gets_a_name_with_five_random_characters():
    rules, _ = rules_for(hand_written(podFailurePolicy={"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}))
    run = RecordingRun()
    rules.begin(run, 0)
    first = run.last["demo-main-0-0"]
    assert re.fullmatch(r"demo-main-0-0-[bcdfghjklmnpqrstvwxz2456789]{5}", first.env["POD"])
    assert first.name == f"rehearsal-test-{first.env['POD']}"
    evicted = runner.Fault("demo-main-0-0", controller.EVICTION)
    assert run.exit(rules, "demo-main-0-0", 143, evicted) is None  # Ignore: the Job replaces the pod
    second = run.last["demo-main-0-0"]
    assert second.env["POD"] != first.env["POD"] and second.hostname == first.hostname


def test_jobset_pods_get_the_same_cloud_storage_as_vertex_replicas():
    """The storage's variables reach a pod's container, with the pods' own names kept off the proxy,
    and a Cloud Storage FUSE CSI volume is its bucket's files."""
    from scripts.rehearsal.runner import Output, Run, Session

    class Network:
        def create_network(self, name):
            return "10.89.0.0/24", "10.89.0.1"

        def gpu_flags(self):
            return []

    proxy = {"https_proxy": "http://10.89.0.1:4443", "CURL_CA_BUNDLE": "/etc/local-gcs/ca-bundle.pem"}
    session = Session(Network(), Output(), lambda subnet, gateway: (proxy, ["/tmp/ca.pem:/etc/local-gcs/ca-bundle.pem:ro"]))
    manifest = hand_written()
    pod_spec = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "data", "csi": {"driver": "gcsfuse.csi.storage.gke.io",
                                                    "volumeAttributes": {"bucketName": "my-data"}}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data", "readOnly": True}]
    rules = controller.JobSetRules(manifest, Output(), network="rehearsal-test", bucket_directory=lambda b: f"/files/{b}")
    run = Run(session, "rehearsal-test", hosts=rules.hosts())
    run.open()
    arguments = run.create_arguments(rules.container(run, rules.pods[0]))
    assert "https_proxy=http://10.89.0.1:4443" in arguments and "/files/my-data:/data:ro" in arguments
    bypass = next(a for a in arguments if a.startswith("no_proxy="))
    assert "demo-main-0-1.demo" in bypass.split(",")


def ordered(status="Ready"):
    """ps before the workers, as dependsOn writes it."""
    manifest = hand_written()
    main = manifest["spec"]["replicatedJobs"][0]
    ps = json.loads(json.dumps(main))
    ps["name"] = "ps"
    ps["template"]["spec"].update(completions=1, parallelism=1)
    manifest["spec"]["replicatedJobs"] = [ps, {**main, "dependsOn": [{"name": "ps", "status": status}]}]
    return manifest


def test_pods_that_end_in_the_same_poll_meet_the_success_policy_together():
    """All of them exit 0 between two polls: the first exit judged leaves no container running,
    yet the JobSet is not stuck, as the other exits of the poll complete its Jobs."""
    manifest = hand_written()
    manifest["spec"]["replicatedJobs"].append({**copy.deepcopy(manifest["spec"]["replicatedJobs"][0]), "name": "side"})
    rules, _ = rules_for(manifest)
    run = RecordingRun()
    rules.begin(run, 0)
    outcome = run.poll(rules, {key: 0 for key in list(run.alive)})
    assert isinstance(outcome, runner.Outcome) and outcome.code == 0, outcome


def test_pods_still_running_after_a_poll_keep_the_jobset_waiting():
    rules, _ = rules_for(hand_written())
    run = RecordingRun()
    rules.begin(run, 0)
    assert run.poll(rules, {"demo-main-0-0": 0}) is None
    assert run.poll(rules, {"demo-main-0-1": 0}).code == 0


def test_depends_on_creates_a_replicated_jobs_pods_once_its_dependency_is_ready():
    rules, output = rules_for(ordered("Ready"))
    run = RecordingRun()
    rules.begin(run, 0)
    assert [c.key for c, _ in run.launched] == ["demo-ps-0-0"]
    del run.alive["demo-ps-0-0"]  # not running yet (still being scheduled): not Ready
    assert rules.tick(run, time.monotonic()) is None and len(run.launched) == 1
    run.alive["demo-ps-0-0"] = run.last["demo-ps-0-0"]
    assert rules.tick(run, time.monotonic()) is None
    assert [c.key for c, _ in run.launched] == ["demo-ps-0-0", "demo-main-0-0", "demo-main-0-1"]
    assert "main: ps is Ready: creating its Jobs" in output.getvalue()


def test_depends_on_complete_waits_for_the_dependency_to_succeed():
    rules, _ = rules_for(ordered("Complete"))
    run = RecordingRun()
    rules.begin(run, 0)
    assert rules.tick(run, time.monotonic()) is None and len(run.launched) == 1  # running is not complete
    assert run.exit(rules, "demo-ps-0-0", 0) is None
    rules.tick(run, time.monotonic())
    assert [c.key for c, _ in run.launched][1:] == ["demo-main-0-0", "demo-main-0-1"]


@pytest.mark.parametrize("change, message", [
    (lambda js: js["spec"]["replicatedJobs"][0].update(dependsOn=[{"name": "main", "status": "Ready"}]),
     "replicatedJob ps: dependsOn can't be set for the first ReplicatedJob"),
    (lambda js: js["spec"]["replicatedJobs"][1].update(dependsOn=[{"name": "later", "status": "Ready"}]),
     "replicatedJob main: cannot depend on replicatedJob 'later'"),
    (lambda js: js["spec"]["replicatedJobs"][1].update(dependsOn=[{"name": "ps", "status": "Started"}]),
     "replicatedJob main: dependsOn status 'Started' is not Ready or Complete"),
    (lambda js: js["spec"]["failurePolicy"].update(restartStrategy="InPlaceRestart"),
     "failurePolicy.restartStrategy InPlaceRestart: JobSet's webhook refuses it"),
    (lambda js: js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"].update(restartPolicy="Always"),
     "replicatedJob main: restartPolicy Always: a Job's pods take Never or OnFailure"),
    (lambda js: js["spec"].update(suspend=True), "spec.suspend is true: the JobSet's pods start only once it is resumed"),
])
def test_what_the_webhook_or_kubernetes_refuses_is_refused_before_anything_runs(change, message):
    manifest = ordered()
    change(manifest)
    with pytest.raises(jobspec.SpecError) as error:
        admission.admitted(manifest)
    assert str(error.value).startswith(message), error.value


def test_the_start_names_every_field_of_the_jobset_the_rehearsal_does_not_apply():
    manifest = generated("--workers", "1", "--spot", "--queue", "team-a")
    line = manifests.not_emulated(manifest)
    for field in ("metadata.labels.kueue.x-k8s.io/queue-name=team-a",
                  "spec.replicatedJobs[0,1].template.spec.template.spec.nodeSelector.cloud.google.com/gke-spot=true",
                  "spec.replicatedJobs[0,1].template.spec.template.spec.tolerations[0].effect=NoSchedule"):
        assert field in line, (field, line)
    for emulated in ("image", "env", "podFailurePolicy", "failurePolicy", "restartPolicy", "completions"):
        assert emulated not in line, (emulated, line)


def one_job(**job_spec) -> dict:
    """A JobSet of one replicatedJob `main` whose Job spec sets only `job_spec`."""
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "demo"},
            "spec": {"replicatedJobs": [{"name": "main", "template": {"spec": {
                **job_spec, "template": {"spec": {"containers": [{"name": "c", "image": "img:1"}]}}}}}]}}


@pytest.mark.parametrize("job_spec, completions, parallelism", [
    ({}, 1, 1),  # neither set: a non-parallel Job (SetDefaults_Job)
    ({"completions": 3, "parallelism": 3}, 3, 3),
    ({"completions": 1}, 1, 1),  # parallelism alone defaults to 1
    ({"completions": 2, "parallelism": 5}, 2, 5),
])
def test_kubernetes_defaults_completions_and_parallelism_of_a_job_that_sets_neither(job_spec, completions, parallelism):
    admitted = admission.admitted(one_job(**job_spec))["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert (admitted["completions"], admitted["parallelism"]) == (completions, parallelism)
    assert [pod.hostname for pod in jobset_pods.pods_of(one_job(**job_spec))] == [f"demo-main-0-{i}" for i in range(completions)]


@pytest.mark.parametrize("job_spec, refusal", [
    ({"parallelism": 2}, "spec.completions: Required value: when completion mode is Indexed"),
    ({"completions": 2}, "parallelism 1 starts only that many of its 2 pods"),  # parallelism defaulted to 1
])
def test_a_job_kubernetes_leaves_without_completions_or_short_of_parallelism_is_refused(job_spec, refusal):
    with pytest.raises(runner.RehearsalError, match=re.escape(refusal)):
        jobset_pods.pods_of(one_job(**job_spec))


@pytest.mark.parametrize("policy, complete, met", [
    ({}, ["a", "b"], False),  # All, no targets: every Job of every replicatedJob (a has 2)
    ({}, ["a", "a", "b"], True),
    ({"operator": "Any"}, ["b"], True),
    ({"operator": "Any", "targetReplicatedJobs": ["a"]}, ["b"], False),
    ({"operator": "All", "targetReplicatedJobs": ["b"]}, ["b"], True),
    ({"operator": "All", "targetReplicatedJobs": ["a"]}, ["a", "b"], False),
])
def test_the_success_policy_counts_the_complete_jobs_of_its_targets(policy, complete, met):
    from scripts.rehearsal.jobset import success_policy

    assert success_policy.met(policy, {"a": 2, "b": 1}, complete) is met


@pytest.mark.parametrize("status, counts, reached", [
    ("Complete", dict(ready=0, succeeded=2, failed=0), True),
    ("Complete", dict(ready=1, succeeded=1, failed=0), False),
    ("Ready", dict(ready=1, succeeded=1, failed=0), True),
    ("Ready", dict(ready=0, succeeded=0, failed=2), True),  # a failed Job is the failurePolicy's to judge
    ("Ready", dict(ready=1, succeeded=0, failed=0), False),
])
def test_a_dependency_is_reached_as_jobsets_depends_on_counts_its_jobs(status, counts, reached):
    from scripts.rehearsal.jobset import depends_on

    assert depends_on.reached(status, 2, **counts) is reached


def test_in_order_startup_waits_for_the_replicated_job_before_as_depends_on_ready():
    from scripts.rehearsal.jobset import depends_on

    spec = {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [
        {"name": "driver"}, {"name": "workers", "dependsOn": [{"name": "driver", "status": "Complete"}]}, {"name": "ps"}]}
    assert depends_on.requirements(spec) == {"driver": [], "workers": [("driver", "Complete"), ("driver", "Ready")],
                                             "ps": [("workers", "Ready")]}
    spec["startupPolicy"] = {"startupPolicyOrder": "AnyOrder"}
    assert depends_on.requirements(spec)["ps"] == []


@pytest.mark.parametrize("text, expanded", [
    ("$(A)", "a"),
    ("x-$(A)-$(B)-y", "x-a-b-y"),
    ("$$(A)", "$(A)"),  # $$ escapes
    ("$$$(A)", "$a"),
    ("$$$$(A)", "$$(A)"),
    ("$(UNSET)", "$(UNSET)"),  # left as written
    ("$(A$(B))", "$(A$(B))"),  # the name runs to the first ')': "A$(B" is no variable
    ("$(a b)", "$(a b)"),
    ("tail $(A", "tail $(A"),  # never closed
    ("$($($(A)", "$($($(A)"),  # the first '$(' reads up to the ')': the name "$($(A" is no variable
    ("$( $(A)", "$( $(A)"),
    ("$A ${A} $? 100$", "$A ${A} $? 100$"),  # shell syntax and a trailing '$' pass through
    ("$(EMPTY)end", "end"),
])
def test_dependent_variables_expand_as_kubernetes_expansion_reads_them(text, expanded):
    from scripts.rehearsal.jobset.environment import expand

    assert expand(text, {"A": "a", "B": "b", "EMPTY": ""}) == expanded


def test_the_completion_index_annotation_and_jobset_labels_reach_env_and_args_through_the_downward_api():
    manifest = one_job(completions=2, parallelism=2)
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        {"name": "EARLY", "value": "$(INDEX)"},  # INDEX is defined after it: left as written
        {"name": "INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "RJOB", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"}}},
        {"name": "TASK", "value": "$(RJOB)-$(INDEX) costs $$5"}]
    container["args"] = ["--task=$(TASK)", "--index=$(JOB_COMPLETION_INDEX)"]
    second = jobset_pods.pods_of(manifest)[1]
    assert (second.env["EARLY"], second.env["INDEX"], second.env["TASK"]) == ("$(INDEX)", "1", "main-1 costs $5")
    assert second.args == ["--task=main-1 costs $5", "--index=1"]


def test_every_container_gets_the_api_servers_service_links_and_its_own_entries_win():
    """The kubelet gives every container the `kubernetes` Service's variables, whatever
    enableServiceLinks says: trainer.run reads KUBERNETES_SERVICE_HOST to log for GKE (JSON)."""
    manifest = one_job()
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]
    container["args"] = ["--api=$(KUBERNETES_PORT_443_TCP_ADDR)", "--port=$(KUBERNETES_SERVICE_PORT)", "--host=$(HOSTNAME)"]
    pod = jobset_pods.pods_of(manifest)[0]
    host = pod.env["KUBERNETES_SERVICE_HOST"]
    assert host and pod.env["KUBERNETES_PORT"] == pod.env["KUBERNETES_PORT_443_TCP"] == f"tcp://{host}:443"
    assert (pod.env["KUBERNETES_SERVICE_PORT_HTTPS"], pod.env["KUBERNETES_PORT_443_TCP_PROTO"],
            pod.env["KUBERNETES_PORT_443_TCP_PORT"], pod.env["KUBERNETES_PORT_443_TCP_ADDR"]) == ("443", "tcp", "443", host)
    # The entry before KUBERNETES_SERVICE_PORT's own read the link; the args read the container's own.
    assert pod.env["API"] == f"https://{host}:443" and pod.env["KUBERNETES_SERVICE_PORT"] == "6443"
    # HOSTNAME is the runtime's, set after the kubelet expanded the args.
    assert pod.args == [f"--api={host}", "--port=6443", "--host=$(HOSTNAME)"]


@pytest.mark.parametrize("stream, line, severity, texts", [
    ("ERROR", '{"severity": "INFO", "message": "Epoch 1/2"}', "INFO", ["Epoch 1/2"]),
    ("INFO", '{"severity": "warning", "message": "slow"}', "WARNING", ["slow"]),  # any case
    ("ERROR", '{"severity": "loud", "message": "x"}', "ERROR", ["x"]),  # no LogSeverity: the stream's
    ("INFO", '{"severity": 500, "message": "x"}', "INFO", ["x"]),
    ("ERROR", '{"message": "Traceback (most recent call last):\\n  File \\"a.py\\"\\nValueError: bad"}', "ERROR",
     ["Traceback (most recent call last):", '  File "a.py"', "ValueError: bad"]),
    ("INFO", '{"severity": "INFO", "count": 3}', "INFO", ['{"severity": "INFO", "count": 3}']),  # no message: the line
    ("ERROR", "W1125 12:00:00.123456 1 file.cc:1] plain", "ERROR", ["W1125 12:00:00.123456 1 file.cc:1] plain"]),
    ("INFO", '["INFO", "a list"]', "INFO", ['["INFO", "a list"]']),
    ("ERROR", '{"severity": "INFO", "message": "cut', "ERROR", ['{"severity": "INFO", "message": "cut']),
])
def test_a_line_holding_one_json_object_is_read_as_gkes_agent_reads_it(stream, line, severity, texts):
    assert runner.structured_entry(stream, line) == (severity, texts)


def test_the_runtimes_json_entries_reach_a_jobsets_output_at_their_own_severity_and_vertexs_as_written():
    """trainer.run writes JSON in a pod (severity.entry); the JobSet rehearsal shows each entry as
    GKE's agent records it, the Vertex rehearsal as Vertex AI does: the line, at its stream's."""
    import io
    import types

    from trainer.process import severity

    line = severity.entry(severity.WARNING, "Traceback (most recent call last):\nKeyError: 'x'") + "\n"
    pod = types.SimpleNamespace(shown_as="demo-main-0-0", key="demo-main-0-0")
    shown = {}
    for structured in (True, False):
        stream = io.StringIO()
        job = runner.Run(runner.Session(None, runner.Output(stream)), "rehearsal-test", structured_logs=structured)
        job._line(pod, "ERROR", line)
        shown[structured] = [text.split(None, 2) for text in stream.getvalue().splitlines()]
    assert shown[True] == [["demo-main-0-0", "WARNING", "Traceback (most recent call last):"],
                           ["demo-main-0-0", "WARNING", "KeyError: 'x'"]]
    assert shown[False] == [["demo-main-0-0", "ERROR", line.strip()]]


# --- Readiness and startup probes, as the kubelet runs them ------------------------------------------

def probe_of(kind="readinessProbe", **spec):
    from scripts.rehearsal.jobset import probes

    container = {"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}
    return probes.parse(kind, spec or {"exec": {"command": ["true"]}}, container, "pod p container c")


def test_a_probe_gets_kubernetes_defaults_and_a_named_port_its_number():
    probe = probe_of(httpGet={"port": "http", "path": "healthz"})
    assert (probe.handler, probe.port, probe.path, probe.scheme) == ("httpGet", 8080, "/healthz", "HTTP")
    assert (probe.initial_delay, probe.timeout, probe.period, probe.success_threshold, probe.failure_threshold) == (
        0, 1, 10, 1, 3)


@pytest.mark.parametrize("kind, spec, refusal", [
    ("readinessProbe", {"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}}, "must have exactly one of"),
    ("readinessProbe", {"initialDelaySeconds": 5}, "must have exactly one of"),
    ("readinessProbe", {"grpc": {"port": 9000}}, "grpc probes are not emulated"),
    ("startupProbe", {"exec": {"command": ["true"]}, "successThreshold": 2}, "successThreshold must be 1"),
    ("readinessProbe", {"tcpSocket": {"port": "metrics"}}, "'metrics' names no port"),
    ("readinessProbe", {"exec": {"command": ["true"]}, "periodSeconds": 0}, "periodSeconds 0 must be an integer of at least 1"),
])
def test_a_probe_kubernetes_would_refuse_is_refused_in_one_line(kind, spec, refusal):
    with pytest.raises(runner.RehearsalError, match=re.escape(refusal)):
        probe_of(kind, **spec)


@pytest.mark.parametrize("offsets, probed", [
    # initialDelaySeconds 30, periodSeconds 10: the ticker fires at 0, 10, 20, 30, ... after the
    # start; a tick probes once the container has run 30 whole seconds.
    ([0, 10, 20, 29.9], [False, False, False, False]),
    ([0, 30.2], [False, True]),
    ([30.2, 31, 39.9, 40.3], [True, False, False, True]),  # between ticks, nothing
])
def test_a_readiness_probe_runs_on_its_ticks_after_its_initial_delay(offsets, probed):
    from scripts.rehearsal.jobset import probes

    worker = probes.ProbeWorker(probe_of(exec={"command": ["true"]}, initialDelaySeconds=30), started_at=1000.0)
    assert [worker.due(1000.0 + offset, container_started=True) for offset in offsets] == probed


@pytest.mark.parametrize("results, states", [
    ([True], [True]),  # successThreshold 1
    ([False, False, False], [False, False, False]),  # readiness starts failed
    ([True, False, False, True, False, False, False], [True, True, True, True, True, True, False]),  # failureThreshold 3 in a row
])
def test_a_probes_state_changes_only_after_its_threshold_in_a_row(results, states):
    from scripts.rehearsal.jobset import probes

    worker = probes.ProbeWorker(probe_of(), started_at=0.0)
    seen = []
    for result in results:
        worker.record(result)
        seen.append(worker.state)
    assert seen == states


def test_readiness_waits_for_the_startup_probe_then_runs_at_once():
    from scripts.rehearsal.jobset import probes

    startup = probe_of("startupProbe", exec={"command": ["true"]}, initialDelaySeconds=5)
    readiness = probe_of(exec={"command": ["true"]}, periodSeconds=10)
    container = probes.ContainerProbes.start((startup, readiness), started_at=0.0)
    assert container.due(0.0) == [] and not container.started and not container.ready  # both wait: startup its delay
    assert container.due(10.0) == [startup]  # the readiness worker's tick at 10 is skipped: not started
    container.workers["startupProbe"].record(True)
    assert container.started and not container.ready
    assert container.due(10.5) == [readiness]  # between its ticks: the status update that sees the start runs it
    container.workers["readinessProbe"].record(True)
    assert container.ready and container.due(20.0) == [readiness]  # the startup worker has nothing more to do


def test_a_failed_startup_probe_holds_until_a_new_container():
    from scripts.rehearsal.jobset import probes

    worker = probes.ProbeWorker(probe_of("startupProbe", exec={"command": ["false"]}, failureThreshold=2), started_at=0.0)
    assert worker.due(0.0, False) and not worker.record(False)
    assert worker.due(10.0, False) and worker.record(False) and worker.state is False
    assert not worker.due(20.0, False)


def probed_jobset(order="dependsOn"):
    """startup-driver-ready's shape: a driver whose readinessProbe waits 30 s, then its workers."""
    driver = {"name": "driver", "template": {"spec": {"template": {"spec": {"containers": [
        {"name": "sleep", "image": "img:1", "command": ["sleep", "1000s"],
         "readinessProbe": {"exec": {"command": ["echo", "ready"]}, "initialDelaySeconds": 30}}]}}}}}
    workers = {"name": "workers", "template": {"spec": {"completions": 2, "parallelism": 2, "template": {"spec": {
        "containers": [{"name": "sleep", "image": "img:1", "command": ["sleep", "100s"]}]}}}}}
    spec = {"replicatedJobs": [driver, workers]}
    if order == "dependsOn":
        workers["dependsOn"] = [{"name": "driver", "status": "Ready"}]
    else:
        spec["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "demo"}, "spec": spec}


@pytest.mark.parametrize("order", ["dependsOn", "InOrder"])
def test_a_replicated_job_waits_until_its_dependencys_readiness_probe_succeeds(order):
    rules, output = rules_for(probed_jobset(order))
    probed = []
    rules.spawn = lambda task: task()  # each probe at once, in this thread
    rules.run_probe = lambda run, name, probe: probed.append(probe.command) or True
    run = RecordingRun()
    started = time.monotonic()
    rules.begin(run, 0)
    for offset in (0, 10, 20, 29.5):
        rules.tick(run, started + offset)
    assert [c.key for c, _ in run.launched] == ["demo-driver-0-0"] and probed == []  # running is not Ready
    rules.tick(run, started + 30.5)  # the probe runs; its result is read on the next poll
    rules.tick(run, started + 30.7)
    assert probed == [("echo", "ready")]
    assert [c.key for c, _ in run.launched] == ["demo-driver-0-0", "demo-workers-0-0", "demo-workers-0-1"]
    assert "demo-driver-0-0: Ready (readinessProbe succeeded)" in output.getvalue()


def test_the_first_line_no_longer_names_readiness_or_startup_probes():
    manifest = probed_jobset()
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["startupProbe"] = {"tcpSocket": {"port": 80}}
    container["livenessProbe"] = {"exec": {"command": ["true"]}}
    line = manifests.not_emulated(manifest)
    assert "readinessProbe" not in line and "startupProbe" not in line and "livenessProbe" in line


@pytest.fixture
def status_server():
    """A server on loopback answering GET /STATUS with that status, recording each request's headers."""
    import http.server
    import threading

    seen = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(dict(self.headers))
            self.send_response(int(self.path.strip("/")))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status, success", [(200, True), (302, True), (399, True), (404, False), (500, False)])
def test_an_http_probe_succeeds_on_a_status_from_200_to_399(status_server, status, success):
    from scripts.rehearsal.jobset import prober

    port, seen = status_server
    probe = probe_of(httpGet={"port": port, "path": f"/{status}", "httpHeaders": [{"name": "X-Probe", "value": "1"}]})
    assert prober.succeeds(probe, engine=None, container="c", address="127.0.0.1") is success
    assert seen[-1]["User-Agent"].startswith("kube-probe/") and seen[-1]["X-Probe"] == "1"


def test_tcp_and_http_probes_fail_where_nothing_listens(status_server):
    from scripts.rehearsal.jobset import prober
    from scripts.rehearsal.local_gcs.launcher import free_port

    port, _ = status_server
    closed = free_port()
    assert prober.succeeds(probe_of(tcpSocket={"port": port}), None, "c", "127.0.0.1")
    assert not prober.succeeds(probe_of(tcpSocket={"port": closed}), None, "c", "127.0.0.1")
    assert not prober.succeeds(probe_of(httpGet={"port": closed}), None, "c", "127.0.0.1")


@pytest.mark.parametrize("outcome, success", [(0, True), (1, False), ("timeout", False)])
def test_an_exec_probe_runs_in_the_container_and_succeeds_on_exit_0(outcome, success):
    import subprocess

    from scripts.rehearsal.jobset import prober

    class Engine:
        def run(self, *args, timeout=None):
            self.args, self.timeout = args, timeout
            if outcome == "timeout":
                raise subprocess.TimeoutExpired(list(args), timeout)
            return subprocess.CompletedProcess(list(args), outcome, "", "")

    engine = Engine()
    probe = probe_of(exec={"command": ["cat", "/tmp/ready"]}, timeoutSeconds=2)
    assert prober.succeeds(probe, engine, "rehearsal-x-pod", "") is success
    assert (engine.args, engine.timeout) == (("exec", "rehearsal-x-pod", "cat", "/tmp/ready"), 2)
