import pytest

from parallel import run_root


@pytest.fixture(scope="session")
def data_root(request):
    """One synthetic-data cache for the whole run, every worker's: each dataset is generated once
    (cassava.synthetic writes it under a temporary name and renames it whole, so two jobs that
    generate the same one at once leave one complete copy) and read by every later run."""
    root = run_root(request.config) / "data"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def resnet50_two_worker_job(once, request, data_root) -> dict:
    """One MultiWorkerMirrored job of the real ResNet50 (RESNET50_TWO_WORKERS) on 2 workers through
    trainer.launch, run once per run for the tests that read it and change nothing in it:
    test_input_wait's healthy job (its input lines) and test_mwms's ResNet50 job (its strategy line,
    its export, the worker's emptied tmp). Each ran a job of its own before (issue 53: the same
    multi-worker training twice to check two things). Returns its exit code, output and folders."""
    from helpers import RESNET50_TWO_WORKERS, launch_cassava

    def make() -> dict:
        root = run_root(request.config) / "resnet50-two-workers"
        # 4 CPU-min of two processes: at the load of a whole run on 2 cores (7 and more) that is
        # 8 min of wall time and more, which launch_cassava's default guard left too little room.
        result = launch_cassava(root, "--data-dir", str(data_root), *RESNET50_TWO_WORKERS, timeout=1200)
        return {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
                "work": str(root / "work"), "model_dir": str(root / "out" / "model")}

    return once("resnet50 two-worker job", make)
