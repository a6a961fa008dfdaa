"""scripts/jobspec/vertex.py's specs: a CustomJob, a tuning job and the self-check job loaded into
aiplatform v1's types (unknown fields failing), Vertex's restart settings, 2026's GPUs, its
capacity and machine options, and Reduction Server."""

from __future__ import annotations

import json

import pytest

from helpers import run_main
from scripts import jobspec, submit_job
from unit.jobspec_cases import CPU, GPU, REQUESTS, TRAINER_ARGS, custom_job_spec, spec, validated
from trainer.cluster import resolve


# --- Vertex AI: aiplatform v1 protobuf types, unknown fields failing --------------------------

@pytest.mark.parametrize("name", REQUESTS)
def test_vertex_custom_job_loads_into_aiplatform_v1_types(name):
    from google.cloud import aiplatform_v1

    custom = spec("vertex", name)
    job = aiplatform_v1.CustomJob.from_json(json.dumps(custom), ignore_unknown_fields=False)
    job_spec = aiplatform_v1.CustomJobSpec.from_json(json.dumps(custom["jobSpec"]), ignore_unknown_fields=False)
    pools = job_spec.worker_pool_specs
    assert pools[0].replica_count == 1
    assert list(pools[1].container_spec.args)[-4:] == TRAINER_ARGS[-4:]
    assert job.display_name == "cassava-multiworker"


def test_vertex_unknown_field_fails_the_schema():
    from google.cloud import aiplatform_v1

    custom = spec("vertex", "mwms-v100")
    custom["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["gpuType"] = "V100"
    with pytest.raises(Exception, match="gpuType"):
        aiplatform_v1.CustomJobSpec.from_json(json.dumps(custom["jobSpec"]), ignore_unknown_fields=False)


def test_vertex_gpu_pools_use_the_gpu_image_and_ps_do_not():
    pools = spec("vertex", "mwms-v100")["jobSpec"]["workerPoolSpecs"]
    assert [p["containerSpec"]["imageUri"] for p in pools] == [GPU, GPU]
    assert pools[1]["machineSpec"] == {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_V100", "acceleratorCount": 1}
    pss = spec("vertex", "pss-evaluator")["jobSpec"]
    assert [p["replicaCount"] for p in pss["workerPoolSpecs"]] == ["1", "4", "2", "1"]
    assert pss["baseOutputDirectory"] == {"outputUriPrefix": "gs://bucket/run-1"}
    assert pss["workerPoolSpecs"][1]["containerSpec"]["args"][:2] == ["--strategy", "parameter_server"]


@pytest.mark.parametrize("name", REQUESTS)
def test_hptune_job_loads_into_aiplatform_v1_types(name):
    from google.cloud import aiplatform_v1

    tuning = spec("hptune", name, "--max-trials", "6", "--parallel-trials", "3")
    job = aiplatform_v1.HyperparameterTuningJob.from_json(json.dumps(tuning), ignore_unknown_fields=False)
    assert job.study_spec.metrics[0].metric_id == "accuracy"
    parameters = {p.parameter_id: p for p in job.study_spec.parameters}
    # The parameter ids become the trainer's own flags (--learning-rate=..., --per-replica-batch-size=...).
    assert set(parameters) == {"learning-rate", "per-replica-batch-size"}
    assert parameters["learning-rate"].scale_type == aiplatform_v1.StudySpec.ParameterSpec.ScaleType.UNIT_LOG_SCALE
    assert list(parameters["per-replica-batch-size"].discrete_value_spec.values) == [32.0, 64.0, 128.0]
    assert (job.max_trial_count, job.parallel_trial_count) == (6, 3)


def test_tuned_values_are_accepted_by_the_trainer_flags():
    from cassava.task import CassavaTask
    from trainer import fit

    parsed = fit.build_parser(CassavaTask()).parse_args(["--learning-rate=0.00031", "--per-replica-batch-size=64.0"])
    assert (parsed.learning_rate, parsed.per_replica_batch_size) == (0.00031, 64)


# --- self-check job and GPU warnings ------------------------------------------------------------

def test_self_check_is_one_replica_of_the_chief_machine_running_selfcheck():
    from google.cloud import aiplatform_v1

    args = submit_job.build_parser().parse_args(["vertex", "--self-check", "--strategy", "pss", "--ps", "2",
                                                 *REQUESTS["mwms-v100"]])
    args.trainer_args = ["--image-size", "224"]
    custom = submit_job.build_spec(args)[1]
    job_spec = aiplatform_v1.CustomJobSpec.from_json(json.dumps(custom["jobSpec"]), ignore_unknown_fields=False)
    [pool] = job_spec.worker_pool_specs
    assert pool.replica_count == 1
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_type.name, pool.machine_spec.accelerator_count) == \
        ("n1-standard-8", "NVIDIA_TESLA_V100", 1)
    assert pool.container_spec.image_uri == GPU
    assert list(pool.container_spec.command) == ["python", "-m", "trainer.selfcheck"]
    assert list(pool.container_spec.args) == ["--image-size", "224"]  # no --strategy: not a training run
    assert custom["displayName"] == "cassava-multiworker-selfcheck"


def test_self_check_args_are_flags_the_selfcheck_accepts():
    from trainer.checks import selfcheck

    with pytest.raises(SystemExit) as exit_info:
        selfcheck.main(["--help"])
    assert exit_info.value.code == 0
    with pytest.raises(SystemExit) as exit_info:
        selfcheck.main(["--epochs", "3"])  # a training flag is refused, not ignored
    assert exit_info.value.code == 2


def test_self_check_is_only_for_vertex():
    result = run_main(submit_job.main, "tfjob", "--self-check", *REQUESTS["mwms-cpu-gcr"])
    assert result.returncode == 2 and result.stderr == "submit_job: error: --self-check is for the vertex target\n"


# --- restart settings -------------------------------------------------------------------------------

def vertex_scheduling(target, name, *extra):
    from google.cloud import aiplatform_v1

    custom = spec(target, name, *extra)
    job_spec = custom["jobSpec"] if target == "vertex" else custom["trialJobSpec"]
    return aiplatform_v1.CustomJobSpec.from_json(json.dumps(job_spec), ignore_unknown_fields=False).scheduling


@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_vertex_mwms_jobs_restart_as_a_whole_and_pss_jobs_do_not(target):
    assert vertex_scheduling(target, "mwms-v100").restart_job_on_worker_restart is True
    assert vertex_scheduling(target, "pss-evaluator").restart_job_on_worker_restart is False  # workers rejoin


def test_vertex_spot_and_timeout_load_into_the_schema():
    from google.cloud import aiplatform_v1

    scheduling = vertex_scheduling("vertex", "mwms-cpu-gcr", "--spot", "--timeout", "7200")
    assert scheduling.strategy == aiplatform_v1.Scheduling.Strategy.SPOT
    assert scheduling.timeout.total_seconds() == 7200
    plain = vertex_scheduling("vertex", "mwms-cpu-gcr")
    assert plain.strategy == aiplatform_v1.Scheduling.Strategy.STRATEGY_UNSPECIFIED and not plain.timeout


# --- 2026's GPUs: every machine type of the table, written and validated -------------------------

GPU_JOBS = {
    "h100": ["--machine-type", "a3-highgpu-8g", "--accelerator-type", "NVIDIA_H100_80GB", "--accelerator-count", "8"],
    "h100-mega": ["--machine-type", "a3-megagpu-8g", "--accelerator-type", "NVIDIA_H100_MEGA_80GB", "--accelerator-count", "8"],
    "h200": ["--machine-type", "a3-ultragpu-8g", "--accelerator-type", "NVIDIA_H200_141GB", "--accelerator-count", "8"],
    "b200": ["--machine-type", "a4-highgpu-8g", "--accelerator-type", "NVIDIA_B200", "--accelerator-count", "8"],
    "l4": ["--machine-type", "g2-standard-24", "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "2"],
    "rtx-pro-6000": ["--machine-type", "g4-standard-48", "--accelerator-type", "NVIDIA_RTX_PRO_6000", "--accelerator-count", "1"],
}


@pytest.mark.parametrize("target", ["vertex", "hptune"])
@pytest.mark.parametrize("gpu", GPU_JOBS)
def test_specs_for_current_gpus_print_and_validate(target, gpu):
    result = run_main(submit_job.main, target, "--dry-run", "--workers", "3", "--image-uri", CPU,
                        "--gpu-image-uri", GPU, *GPU_JOBS[gpu])
    assert result.returncode == 0, result.stderr
    job_spec = validated(target, json.loads(result.stdout))
    machine = job_spec.worker_pool_specs[1].machine_spec
    given = dict(zip(GPU_JOBS[gpu][::2], GPU_JOBS[gpu][1::2]))
    assert (machine.machine_type, machine.accelerator_type.name, machine.accelerator_count) == (
        given["--machine-type"], given["--accelerator-type"], int(given["--accelerator-count"]))
    assert job_spec.worker_pool_specs[1].container_spec.image_uri == GPU
    # A3 Ultra, A4 and G4 boot from Hyperdisk only; the others from Vertex's default pd-ssd.
    hyperdisk = given["--machine-type"].startswith(("a3-ultragpu", "a4-", "g4-"))
    assert job_spec.worker_pool_specs[1].disk_spec.boot_disk_type == ("hyperdisk-balanced" if hyperdisk else "pd-ssd")


@pytest.mark.parametrize("argv, message", [
    (["--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_K80", "--accelerator-count", "1"],
     "NVIDIA_TESLA_K80 is retired: Compute Engine ended its support on 2024-05-01"),
    (["--machine-type", "n1-standard-8", "--accelerator-type", "NVIDIA_TESLA_P100", "--accelerator-count", "1"],
     "NVIDIA_TESLA_P100 is retired: Compute Engine shut P100 GPUs down on 2026-09-15"),
    (["--machine-type", "a4x-highgpu-4g", "--accelerator-type", "NVIDIA_GB200", "--accelerator-count", "4"],
     "machine type a4x-highgpu-4g has arm64 CPUs (NVIDIA Grace); the images are built for x86_64"),
    (["--machine-type", "a3-ultragpu-8g", "--accelerator-type", "NVIDIA_H100_80GB", "--accelerator-count", "8"],
     "machine type a3-ultragpu-8g cannot take NVIDIA_H100_80GB (it takes NVIDIA_H200_141GB)"),
    (["--machine-type", "a4-highgpu-8g", "--accelerator-type", "NVIDIA_B200", "--accelerator-count", "4"],
     "machine type a4-highgpu-8g takes 8 NVIDIA_B200, not 4"),
    (["--machine-type", "a3-highgpu-8g"], "machine type a3-highgpu-8g comes with 8 NVIDIA_H100_80GB: give --accelerator-type"),
    (["--machine-type", "n1-standard-8", "--ps-machine-type", "a2-highgpu-1g", "--strategy", "pss", "--ps", "1"],
     "--ps-machine-type: machine type a2-highgpu-1g comes with 1 NVIDIA_TESLA_A100"),
    (["--evaluator", "--evaluator-machine-type", "n9-highmem-8"],
     "--evaluator-machine-type: machine type n9-highmem-8 is not one Vertex AI offers"),
    (["--machine-type", "a3-ultragpu-8g", "--accelerator-type", "NVIDIA_H200_141GB", "--accelerator-count", "8",
      "--boot-disk-type", "pd-ssd"], "--boot-disk-type pd-ssd: machine type a3-ultragpu-8g boots only from hyperdisk-balanced"),
    (["--boot-disk-size-gb", "50"], "--boot-disk-size-gb must be between 100 and 64000, got 50"),
])
@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_retired_or_wrong_machines_exit_2_with_one_line(target, argv, message):
    result = run_main(submit_job.main, target, "--dry-run", "--image-uri", CPU, *argv)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


# --- capacity and machine options ------------------------------------------------------------------

H200 = GPU_JOBS["h200"]
OPTION_FIELDS = [
    (["--flex-start", "--max-wait", "2h"], lambda spec: (spec.scheduling.strategy.name,
                                                         spec.scheduling.max_wait_duration.total_seconds()),
     ("FLEX_START", 7200)),
    (["--flex-start", "--max-wait", "0"], lambda spec: spec.scheduling.max_wait_duration.total_seconds(), 0),
    (["--reservation", "any"], lambda spec: [p.machine_spec.reservation_affinity.reservation_affinity_type.name
                                             for p in spec.worker_pool_specs], ["ANY_RESERVATION"] * 2),
    (["--reservation", "none"], lambda spec: spec.worker_pool_specs[0].machine_spec.reservation_affinity
     .reservation_affinity_type.name, "NO_RESERVATION"),
    (["--reservation", "projects/p/zones/us-central1-b/reservations/h200-block"],
     lambda spec: (spec.worker_pool_specs[1].machine_spec.reservation_affinity.reservation_affinity_type.name,
                   spec.worker_pool_specs[1].machine_spec.reservation_affinity.key,
                   list(spec.worker_pool_specs[1].machine_spec.reservation_affinity.values)),
     ("SPECIFIC_RESERVATION", "compute.googleapis.com/reservation-name",
      ["projects/p/zones/us-central1-b/reservations/h200-block"])),
    (["--persistent-resource-id", "h200-pool"], lambda spec: spec.persistent_resource_id, "h200-pool"),
    (["--boot-disk-size-gb", "500"], lambda spec: [(p.disk_spec.boot_disk_type, p.disk_spec.boot_disk_size_gb)
                                                   for p in spec.worker_pool_specs], [("hyperdisk-balanced", 500)] * 2),
    (["--enable-web-access"], lambda spec: spec.enable_web_access, True),
    (["--tensorboard", "projects/p/locations/us-central1/tensorboards/77", "--base-output-dir", "gs://b/run",
      "--service-account", "trainer@p.iam.gserviceaccount.com"],
     lambda spec: spec.tensorboard, "projects/p/locations/us-central1/tensorboards/77"),
    (["--disable-retries"], lambda spec: (spec.scheduling.disable_retries, spec.scheduling.restart_job_on_worker_restart),
     (True, False)),
]


@pytest.mark.parametrize("target", ["vertex", "hptune"])
@pytest.mark.parametrize("argv, field, expected", OPTION_FIELDS, ids=[" ".join(o[0][:2]) for o in OPTION_FIELDS])
def test_each_capacity_and_machine_option_reaches_a_validated_spec(target, argv, field, expected):
    spec = validated(target, custom_job_spec(target, [*H200, *argv]))
    assert field(spec) == expected


def test_without_options_the_spec_has_none_of_their_fields():
    job_spec = custom_job_spec("vertex", H200)["jobSpec"]
    assert not {"persistentResourceId", "enableWebAccess", "tensorboard"} & set(job_spec)
    assert job_spec["scheduling"] == {"restartJobOnWorkerRestart": True}
    assert all("reservationAffinity" not in p["machineSpec"] for p in job_spec["workerPoolSpecs"])


def test_a_reservation_is_taken_only_by_the_pools_on_the_reserved_machine():
    pools = custom_job_spec("vertex", [*H200, "--evaluator", "--evaluator-machine-type", "n1-standard-8",
                                       "--reservation", "any"])["jobSpec"]["workerPoolSpecs"]
    assert ["reservationAffinity" in p["machineSpec"] for p in pools if p] == [True, True, False]


def test_the_self_check_obtains_its_machine_as_the_job_would_and_uploads_nothing():
    args = submit_job.build_parser().parse_args(["vertex", "--self-check", "--image-uri", CPU, "--gpu-image-uri", GPU,
                                                 *H200, "--reservation", "any", "--boot-disk-size-gb", "200",
                                                 "--tensorboard", "projects/p/locations/l/tensorboards/1",
                                                 "--base-output-dir", "gs://b/r", "--service-account", "s@p.iam"])
    args.trainer_args = []
    job_spec = validated("vertex", submit_job.build_spec(args)[1])
    [pool] = job_spec.worker_pool_specs
    assert pool.machine_spec.reservation_affinity.reservation_affinity_type.name == "ANY_RESERVATION"
    assert (pool.disk_spec.boot_disk_type, pool.disk_spec.boot_disk_size_gb) == ("hyperdisk-balanced", 200)
    assert not job_spec.tensorboard and not job_spec.base_output_directory.output_uri_prefix


@pytest.mark.parametrize("argv, message", [
    (["--flex-start", "--spot"], "--flex-start and --spot are two values of one field, scheduling.strategy"),
    (["--max-wait", "1h"], "--max-wait is for --flex-start"),
    (["--flex-start", "--max-wait", "soon"], "--max-wait takes a duration such as 3600, 3600s, 90m, 12h or 2d; got 'soon'"),
    (["--flex-start", "--max-wait", "-5"], "--max-wait takes a duration"),
    (["--flex-start", "--timeout", str(8 * 86400)], "--flex-start takes jobs with a --timeout of at most 7 days"),
    (["--flex-start", "--evaluator", "--evaluator-machine-type", "n1-standard-8"],
     "--flex-start needs the same machine configuration in every worker pool (Dynamic Workload Scheduler), but the "
     "evaluator pool runs on n1-standard-8"),
    (["--flex-start", "--reduction-server", "4"], "--flex-start needs the same machine configuration in every worker pool"),
    (["--reservation", "any", "--spot"], "--reservation with --spot: a reservation's capacity cannot create Spot VMs"),
    (["--reservation", "projects/p/zones/z/reservations/r", "--flex-start"],
     "--reservation with --flex-start: Vertex AI runs Flex Start jobs without Compute Engine reservations"),
    (["--reservation", "any", "--persistent-resource-id", "pool-1"], "--reservation with --persistent-resource-id"),
    (["--reservation", "my-reservation"], "--reservation is any, none, or a reservation's full name"),
    (["--persistent-resource-id", "pool-1", "--spot"], "--persistent-resource-id with --spot: a job on a persistent "
                                                       "resource runs on the VMs the resource already holds"),
    (["--persistent-resource-id", "pool-1", "--flex-start"], "--persistent-resource-id with --flex-start"),
    (["--persistent-resource-id", "Pool_1"], "--persistent-resource-id is a persistent resource's ID"),
    (["--tensorboard", "projects/p/locations/l/tensorboards/1", "--service-account", "s@p.iam"],
     "--tensorboard needs --base-output-dir"),
    (["--tensorboard", "projects/p/locations/l/tensorboards/1", "--base-output-dir", "gs://b/r"],
     "--tensorboard needs --service-account"),
    (["--tensorboard", "my-board", "--base-output-dir", "gs://b/r", "--service-account", "s"],
     "--tensorboard is a Vertex AI TensorBoard's name"),
])
@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_combinations_vertex_refuses_exit_2_with_one_line(target, argv, message):
    result = run_main(submit_job.main, target, "--dry-run", "--image-uri", CPU, "--gpu-image-uri", GPU,
                        *H200, *argv)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("gpu, machine, count", [("NVIDIA_TESLA_V100", "n1-standard-8", "1"),
                                                 ("NVIDIA_TESLA_T4", "n1-standard-8", "1"),
                                                 ("NVIDIA_RTX_PRO_6000", "g4-standard-48", "1")])
def test_flex_start_is_refused_on_gpus_dynamic_workload_scheduler_does_not_provision(gpu, machine, count):
    result = run_main(submit_job.main, "vertex", "--dry-run", "--image-uri", CPU, "--flex-start",
                        "--machine-type", machine, "--accelerator-type", gpu, "--accelerator-count", count)
    assert result.returncode == 2
    assert result.stderr.startswith("submit_job: error: --flex-start needs GPUs Dynamic Workload Scheduler provisions "
                                    "(NVIDIA_TESLA_A100, NVIDIA_A100_80GB, NVIDIA_L4, NVIDIA_H100_80GB")
    assert f"this job asks for {gpu}" in result.stderr


def test_flex_start_on_cpu_machines_is_refused():
    result = run_main(submit_job.main, "vertex", "--dry-run", "--image-uri", CPU, "--flex-start")
    assert result.returncode == 2 and "this job asks for none" in result.stderr


@pytest.mark.parametrize("target", ["jobset", "tfjob", "ai-platform"])
@pytest.mark.parametrize("option", [["--flex-start"], ["--reservation", "any"], ["--enable-web-access"],
                                    ["--reduction-server", "2"], ["--disable-retries"]])
def test_vertex_options_on_other_targets_exit_2(target, option):
    result = run_main(submit_job.main, target, "--image-uri", CPU, "--evaluator-image-uri", CPU, *option)
    assert result.returncode == 2
    assert result.stderr == f"submit_job: error: {option[0]}: for the vertex and hptune targets ({target} has no such setting)\n"


# --- Reduction Server ----------------------------------------------------------------------------

REDUCER_JOB = [*H200, "--workers", "3", "--reduction-server", "4"]


@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_the_reducer_pool_is_worker_pool_2_with_googles_image_and_machine(target):
    spec = custom_job_spec(target, REDUCER_JOB, ["--epochs", "3"])
    job_spec = validated(target, spec)
    reducers = job_spec.worker_pool_specs[2]
    assert reducers.replica_count == 4 and reducers.machine_spec.machine_type == "n1-highcpu-16"
    assert not reducers.machine_spec.accelerator_count  # reducers use no GPUs
    assert reducers.container_spec.image_uri == "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    assert list(reducers.container_spec.args) == [] and list(reducers.container_spec.command) == []
    assert list(job_spec.worker_pool_specs[1].container_spec.args) == ["--epochs", "3"]
    assert job_spec.scheduling.restart_job_on_worker_restart  # an MWMS job


def test_the_reducer_machine_and_image_can_be_chosen():
    pools = custom_job_spec("vertex", [*REDUCER_JOB, "--reduction-server-machine-type", "n2-highcpu-16",
                                       "--reduction-server-image",
                                       "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"]
                            )["jobSpec"]["workerPoolSpecs"]
    assert pools[2]["machineSpec"] == {"machineType": "n2-highcpu-16"}
    assert pools[2]["containerSpec"]["imageUri"].startswith("europe-docker.pkg.dev/")


@pytest.mark.parametrize("argv, message", [
    (["--reduction-server", "2", "--strategy", "pss", "--ps", "1", *H200],
     "--reduction-server is for --strategy mwms: worker pool 2 holds either parameter servers or reducers"),
    (["--reduction-server", "2"], "--reduction-server needs GPU workers (--accelerator-type)"),
    (["--reduction-server", "2", *H200, "--reduction-server-image", "gcr.io/me/reducer:1"],
     "--reduction-server-image must be one of Google's Reduction Server images"),
    (["--reduction-server", "2", *H200, "--reduction-server-machine-type", "a2-highgpu-1g"],
     "--reduction-server-machine-type: machine type a2-highgpu-1g comes with 1 NVIDIA_TESLA_A100"),
    (["--reduction-server", "-1", *H200], "--reduction-server takes a number of reducers, got -1"),
])
def test_reducers_where_vertex_cannot_use_them_exit_2_with_one_line(argv, message):
    result = run_main(submit_job.main, "vertex", "--dry-run", "--image-uri", CPU, *argv)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"submit_job: error: {message}") and result.stderr.count("\n") == 1


def test_a_reducer_job_warns_once_what_the_image_needs():
    result = run_main(submit_job.main, "vertex", "--dry-run", "--image-uri", CPU, "--gpu-image-uri", GPU,
                        *GPU_JOBS["l4"], "--reduction-server", "2")
    assert result.returncode == 0
    [warning] = result.stderr.splitlines()
    assert warning.startswith("warning: --reduction-server: the workers' image must carry Google's NCCL plugin, the apt "
                              "package google-reduction-server")
    assert "docs/gpus.md#reduction-server" in warning


@pytest.mark.parametrize("target", ["vertex", "hptune"])
def test_every_replica_of_a_reducer_job_is_told_what_vertex_tells_it(target):
    """Vertex names tasks by pool: the reducers are `workerpool2` and `ps` like parameter servers,
    and `job` (the spec) says pool 2 runs Google's image. The trainer must train MWMS over the
    chief and workers, with the reducers counted apart and never given to TensorFlow."""
    environments = jobspec.cluster_environments("vertex", custom_job_spec(target, REDUCER_JOB))
    assert len(environments) == 1 + 3 + 4
    reducer_hosts = [f"workerpool2-{i}:2222" for i in range(4)]
    for environment in environments:
        assert json.loads(environment["CLUSTER_SPEC"])["cluster"]["workerpool2"] == reducer_hosts
        assert json.loads(environment["TF_CONFIG"])["cluster"]["ps"] == reducer_hosts
    trainers, reducers = environments[:4], environments[4:]
    for environment in trainers:
        for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
            cluster = resolve({variable: environment[variable]})
            assert (cluster.num_ps, cluster.num_reducers, cluster.num_workers) == (0, 4, 4)
            assert set(cluster.tf_config["cluster"]) == {"chief", "worker"}
            from trainer.runtime import strategy

            assert strategy.choose("auto", cluster) == "multi_worker_mirrored"
    for environment in reducers:
        for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
            with pytest.raises(Exception, match="is a Reduction Server reducer"):
                resolve({variable: environment[variable]})
