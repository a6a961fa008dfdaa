"""The Vertex AI rehearsal (scripts/rehearsal/vertex.py): what it tells each replica and how it draws trials, as plain values, no engine."""

import json
import random

import pytest

from scripts import jobspec
from scripts.rehearsal import storage, vertex
from scripts.rehearsal.runner import RehearsalError
from trainer.cluster import resolve

REQUEST = jobspec.build_request(
    name="job", strategy="pss", workers=2, ps=1, evaluator=True, image_uri="img:1", gpu_image_uri=None,
    machine_type="n1-standard-4", accelerator_type=None, accelerator_count=0, ps_machine_type="n1-standard-4",
    evaluator_machine_type=None, trainer_args=("--epochs", "2"), base_output_dir="gs://bkt/base")


def test_every_replica_is_named_and_told_its_cluster_as_vertex_tells_it():
    job = jobspec.vertex_custom_job(REQUEST)
    environments = vertex.replica_environments(job["jobSpec"], "123")
    assert list(environments) == ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool2-0", "workerpool3-0"]
    worker = environments["workerpool1-1"]
    cluster_spec = json.loads(worker["CLUSTER_SPEC"])
    assert cluster_spec["task"] == {"type": "workerpool1", "index": 1}
    assert cluster_spec["job"] == job["jobSpec"]  # "the CustomJobSpec ... represented as a dictionary"
    tf_config = json.loads(worker["TF_CONFIG"])
    assert tf_config["task"] == {"type": "worker", "index": 1} and tf_config["job"] == job["jobSpec"]
    # The evaluator is told its task, but "evaluators are not considered part of the training cluster".
    assert set(tf_config["cluster"]) == {"chief", "worker", "ps"} and "workerpool3" in cluster_spec["cluster"]
    assert json.loads(environments["workerpool3-0"]["TF_CONFIG"])["task"] == {"type": "evaluator", "index": 0}
    assert worker["AIP_MODEL_DIR"] == "gs://bkt/base/model/" and worker["CLOUD_ML_JOB_ID"] == "123"
    assert worker["CLOUD_ML_PROJECT_ID"].isdigit()  # a project number, as Vertex gives it
    assert "CLOUD_ML_TRIAL_ID" not in worker
    for name, env in environments.items():  # the trainer reads each of them to the same task
        from_tf_config = resolve({"TF_CONFIG": env["TF_CONFIG"]})
        from_cluster_spec = resolve({"CLUSTER_SPEC": env["CLUSTER_SPEC"]})
        assert (from_tf_config.task_type, from_tf_config.task_index) == (
            from_cluster_spec.task_type, from_cluster_spec.task_index), name


def test_a_single_replica_job_gets_a_cluster_spec_and_no_tf_config():
    single = jobspec.vertex_custom_job(jobspec.build_request(
        name="one", strategy="mwms", workers=1, ps=0, evaluator=False, image_uri="img:1", gpu_image_uri=None,
        machine_type="n1-standard-4", accelerator_type=None, accelerator_count=0, ps_machine_type="n1-standard-4",
        evaluator_machine_type=None))
    single["jobSpec"]["workerPoolSpecs"] = single["jobSpec"]["workerPoolSpecs"][:1]
    env = vertex.replica_environments(single["jobSpec"], "9")["workerpool0-0"]
    assert "TF_CONFIG" not in env  # "Vertex AI does not set TF_CONFIG for single-replica training jobs"
    assert json.loads(env["CLUSTER_SPEC"])["cluster"] == {"workerpool0": ["workerpool0-0:2222"]}
    cluster = resolve(env)  # the trainer then trains as one process
    assert cluster.is_chief and not cluster.is_distributed and cluster.source == "CLUSTER_SPEC"


def test_a_trial_gets_its_id_and_its_own_directories():
    job = jobspec.vertex_custom_job(REQUEST)
    env = vertex.replica_environments(job["jobSpec"], "123", trial="7")["workerpool0-0"]
    assert env["CLOUD_ML_TRIAL_ID"] == "7"
    assert json.loads(env["CLUSTER_SPEC"])["task"]["trial"] == "7"
    assert (env["AIP_MODEL_DIR"], env["AIP_CHECKPOINT_DIR"], env["AIP_TENSORBOARD_LOG_DIR"]) == (
        "gs://bkt/base/7/model/", "gs://bkt/base/7/checkpoints/", "gs://bkt/base/7/logs/")
    assert resolve(env).trial == "7"


def test_the_specs_own_env_is_kept_and_pool_zero_must_have_one_replica():
    pool = {"replicaCount": 1, "containerSpec": {"imageUri": "i", "env": [{"name": "A", "value": "b"}]}}
    assert vertex.replica_environments({"workerPoolSpecs": [pool]}, "1")["workerpool0-0"]["A"] == "b"
    with pytest.raises(RehearsalError, match="exactly one replica in pool 0"):
        vertex.replicas_of({"workerPoolSpecs": [{**pool, "replicaCount": "2"}]})
    with pytest.raises(RehearsalError, match="containerSpec.imageUri"):
        vertex.replicas_of({"workerPoolSpecs": [{"replicaCount": 1, "pythonPackageSpec": {}}]})
    with pytest.raises(RehearsalError, match="not a CustomJob"):
        vertex.job_spec_of({"displayName": "x"})


def test_the_buckets_a_spec_names():
    spec = {"a": ["--data-dir", "gs://data-bucket/x", "/gcs/fuse.bucket/y", "gs://x"], "b": "gs://out_bkt"}
    assert storage.buckets_named(spec) == ["data-bucket", "fuse.bucket", "out_bkt"]


def test_random_search_draws_within_each_parameters_spec_and_formats_as_vertex_passes():
    study = jobspec.vertex_tuning_job(REQUEST, jobspec.Tuning(learning_rate_range=(1e-5, 1e-1),
                                                               batch_sizes=(16, 32)))["studySpec"]
    study["parameters"].append({"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "3"}})
    draws = [vertex.draw_parameters(study, random.Random(seed)) for seed in range(200)]
    rates = [float(d["learning-rate"]) for d in draws]
    assert all(1e-5 <= r <= 1e-1 for r in rates)
    # Log scale: about as many draws in each decade.
    below = sum(r < 1e-3 for r in rates)
    assert 60 < below < 140
    assert {d["per-replica-batch-size"] for d in draws} == {"16", "32"}  # integers, as the trainer parses them
    assert {d["layers"] for d in draws} == {"1", "2", "3"}
    assert draws[0] == vertex.draw_parameters(study, random.Random(0))


def test_a_trials_values_are_appended_to_every_pools_args():
    job = jobspec.vertex_custom_job(REQUEST)["jobSpec"]
    trial = vertex.with_trial_args(job, {"learning-rate": "0.01"})
    for pool in trial["workerPoolSpecs"]:
        assert pool["containerSpec"]["args"] == ["--strategy", "parameter_server", "--epochs", "2", "--learning-rate=0.01"]
    assert job["workerPoolSpecs"][0]["containerSpec"]["args"][-1] == "2"  # the original is untouched


def test_the_last_reported_metric_is_read(tmp_path):
    path = tmp_path / "output.metrics"
    path.write_text('{"accuracy": "0.25", "global_step": "1"}\n{"accuracy": "0.5", "global_step": "2"}\n')
    assert vertex.last_metric(path, "accuracy") == 0.5
    assert vertex.last_metric(path, "loss") is None
    assert vertex.last_metric(tmp_path / "missing", "accuracy") is None


@pytest.mark.parametrize("text, expected", [
    ("workerpool1-0@40", ("workerpool1-0", 40.0, None)),
    ("workerpool0-0@2.5", ("workerpool0-0", 2.5, None)),
    ("workerpool1-1@/epoch 2/3 begins/", ("workerpool1-1", None, "epoch 2/3 begins")),
])
def test_preemptions_are_read(text, expected):
    preemption = vertex.parse_preemption(text)
    assert (preemption.replica, preemption.seconds, preemption.pattern and preemption.pattern.pattern) == expected


@pytest.mark.parametrize("text", ["chief@10", "workerpool1-0", "workerpool1-0@", "workerpool1-0@//", "workerpool1-0@/[/"])
@pytest.mark.parametrize("kind, option", [(vertex.SPOT, "--preempt"), ("maintenance", "--maintenance")])
def test_a_wrong_preemption_is_refused(text, kind, option):
    with pytest.raises(RehearsalError, match=f"^{option} takes REPLICA@SECONDS"):
        vertex.parse_preemption(text, kind)


def test_maintenance_is_its_own_kind_of_event():
    assert vertex.parse_preemption("workerpool1-0@5").kind == vertex.SPOT
    assert vertex.parse_preemption("workerpool1-0@5", "maintenance").kind == "maintenance"


def test_the_compose_file_has_vertex_names_and_environment_and_no_restarts():
    job = jobspec.vertex_custom_job(REQUEST)["jobSpec"]
    compose = vertex.compose_file(job, "42")
    assert list(compose["services"]) == ["workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool2-0", "workerpool3-0"]
    service = compose["services"]["workerpool2-0"]
    assert service["networks"]["job"]["aliases"] == ["workerpool2-0"] and service["hostname"] == "workerpool2-0"
    assert service["environment"] == vertex.replica_environments(job, "42")["workerpool2-0"]
    assert service["restart"] == "no"  # a replica's failure fails the job on Vertex: compose cannot say that
    assert service["command"] == ["--strategy", "parameter_server", "--epochs", "2"]


def test_real_cloud_storage_needs_credentials(tmp_path):
    with pytest.raises(RehearsalError, match="application-default login"):
        storage.default_credentials({"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "none.json")})
    key = tmp_path / "adc.json"
    key.write_text("{}")
    assert storage.default_credentials({"GOOGLE_APPLICATION_CREDENTIALS": str(key)}) == str(key)
    compose = vertex.compose_file(jobspec.vertex_custom_job(REQUEST)["jobSpec"], "1", str(key))
    service = compose["services"]["workerpool0-0"]
    assert service["volumes"] == [f"{key}:{storage.CREDENTIALS_IN_CONTAINER}:ro"]
    assert service["environment"]["GOOGLE_APPLICATION_CREDENTIALS"] == storage.CREDENTIALS_IN_CONTAINER


def test_the_run_says_once_that_machines_are_not_emulated():
    job = jobspec.vertex_custom_job(REQUEST)["jobSpec"]
    line = vertex.not_emulated(job)
    assert line.startswith("not emulated, every replica runs here at once on this machine's CPUs: ")
    assert "n1-standard-4" in line


def test_the_default_restart_budget_is_vertexs():
    from scripts import submit_job

    # Vertex: a replica that exits non-zero is restarted up to 5 times, then the job up to 3 times.
    options = submit_job.build_local_parser().parse_args([])
    assert (options.replica_restarts, options.job_retries) == (5, 3)
    assert (vertex.REPLICA_RESTARTS, vertex.JOB_RETRIES, vertex.SPOT_GRACE_SECONDS) == (5, 3, 30)


# --- Vertex's rules, against a run that records what the rules ask of it ----------------------------

class RecordingRun:
    """What the Vertex rules ask of the runner, recorded: no engine, no containers."""

    class engine:
        @staticmethod
        def out_of_memory(name):
            return False

    def __init__(self):
        import collections

        self.launched, self.stopped, self.alive = [], [], {}
        self.last_errors = collections.defaultdict(list)

    def launch(self, container, fresh=True):
        self.launched.append((container.key, fresh))
        self.alive[container.key] = container

    def running(self):
        return list(self.alive.values())

    def stop(self, containers=None, wait=True):
        for container in list(self.alive.values()) if containers is None else containers:
            self.stopped.append(self.alive.pop(container.key).key)

    def exit(self, rules, key, code, fault=None):
        return rules.exited(self, self.alive.pop(key), code, fault)


def two_replicas(**scheduling):
    pool = {"replicaCount": 1, "containerSpec": {"imageUri": "img:1"}}
    return {"workerPoolSpecs": [pool, pool], **({"scheduling": scheduling} if scheduling else {})}


def vertex_rules(job_spec):
    import io

    from scripts.rehearsal.runner import Output

    output = io.StringIO()
    return vertex.VertexRules(job_spec, "1", Output(output), network="rehearsal-test"), output


@pytest.mark.parametrize("disable", [False, True])
def test_a_transient_exit_retries_the_job_unless_retries_are_disabled(disable):
    rules, output = vertex_rules(two_replicas(**({"disableRetries": True} if disable else {})))
    run = RecordingRun()
    rules.begin(run, 0)
    decision = run.exit(rules, "workerpool1-0", 139)
    if disable:
        assert decision.code == 139 and decision.message.endswith(
            "(possibly transient); the job is not restarted (scheduling.disableRetries)"), decision
    else:
        assert isinstance(decision, vertex.Restart) and "(retry 1 of 3)" in output.getvalue()


@pytest.mark.parametrize("disable", [False, True])
def test_a_spot_preemption_restarts_the_job_unless_retries_are_disabled(disable):
    rules, output = vertex_rules(two_replicas(**({"disableRetries": True} if disable else {})))
    run = RecordingRun()
    rules.begin(run, 0)
    fault = vertex.parse_preemption("workerpool1-0@5")
    assert rules.disrupt(run, run.alive["workerpool1-0"], fault) == vertex.SPOT_GRACE_SECONDS
    assert run.exit(rules, "workerpool0-0", 143) is None  # the job restarts anyway: not the chief's failure
    decision = run.exit(rules, "workerpool1-0", 143, fault)
    if disable:
        assert decision.code == 143 and "was preempted (STOCKOUT); the job is not restarted" in decision.message
    else:
        assert isinstance(decision, vertex.Restart) and "(Spot restart 1 of 6)" in output.getvalue()


@pytest.mark.parametrize("scheduling, expected", [
    ({}, "alone"),
    ({"restartJobOnWorkerRestart": True}, "everyone"),
    ({"restartJobOnWorkerRestart": True, "disableRetries": True}, "failed"),
    ({"disableRetries": True}, "failed"),
])
def test_maintenance_restarts_the_replica_or_every_replica_unless_retries_are_disabled(scheduling, expected):
    rules, _ = vertex_rules(two_replicas(**scheduling))
    run = RecordingRun()
    rules.begin(run, 0)
    run.launched.clear()
    fault = vertex.parse_preemption("workerpool1-0@5", vertex.MAINTENANCE)
    rules.disrupt(run, run.alive["workerpool1-0"], fault)
    decision = run.exit(rules, "workerpool1-0", 143, fault)
    if expected == "failed":
        assert decision.code == 143 and decision.message.endswith("is not restarted (scheduling.disableRetries)")
        assert run.launched == []
    elif expected == "alone":
        assert decision is None and run.launched == [("workerpool1-0", True)]
    else:  # the chief keeps its machine (started again), the worker gets a new one
        assert decision is None and run.launched == [("workerpool0-0", False), ("workerpool1-0", True)]


def test_a_replicas_restarts_after_maintenance_run_out_into_a_retry_of_the_job():
    rules, output = vertex_rules(two_replicas())
    rules.replica_restarts = 1
    run = RecordingRun()
    rules.begin(run, 0)
    fault = vertex.parse_preemption("workerpool1-0@5", vertex.MAINTENANCE)
    assert run.exit(rules, "workerpool1-0", 143, fault) is None
    assert isinstance(run.exit(rules, "workerpool1-0", 143, fault), vertex.Restart)
    assert "workerpool1-0 was restarted 1 times: restarting the whole job" in output.getvalue()


def test_the_not_emulated_line_names_every_field_it_does_not_apply_once():
    job = jobspec.vertex_custom_job(REQUEST)
    job["jobSpec"]["scheduling"] = {"strategy": "FLEX_START", "maxWaitDuration": "1800s", "timeout": "3600s",
                                    "disableRetries": True}
    job["jobSpec"]["enableWebAccess"] = True
    job["jobSpec"]["persistentResourceId"] = "my-cluster"
    line = vertex.not_emulated(job)
    for field in ("scheduling.strategy=FLEX_START", "scheduling.maxWaitDuration=1800s", "jobSpec.enableWebAccess=true",
                  "jobSpec.persistentResourceId=my-cluster",
                  "jobSpec.workerPoolSpecs[0,1,2,3].machineSpec.machineType=n1-standard-4"):
        assert field in line, (field, line)
    for emulated in ("timeout", "disableRetries", "imageUri", "replicaCount", "outputUriPrefix"):
        assert emulated not in line, (emulated, line)


def test_sessions_started_in_one_millisecond_get_different_ids_numeric_like_vertex_job_ids():
    from scripts.rehearsal.session import new_run_id
    ids = [new_run_id() for _ in range(2000)]  # far more than one millisecond's worth of starts
    assert len(set(ids)) == len(ids)
    assert all(len(run_id) == 19 and run_id.isdigit() for run_id in ids)
