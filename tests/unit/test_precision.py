"""trainer.precision: which dtype policy each machine trains in."""

import pytest

from trainer import precision
from trainer.precision import Devices

V100, T4, P100 = (7, 0), (7, 5), (6, 0)
NO_FLAGS = frozenset({"sse4_2", "avx2"})


def test_auto_uses_float16_when_every_gpu_has_tensor_cores():
    choice = precision.choose("auto", Devices((V100, T4), NO_FLAGS))
    assert (choice.policy, choice.warning) == ("mixed_float16", None)


def test_auto_stays_float32_when_one_gpu_is_older_than_volta():
    assert precision.choose("auto", Devices((T4, P100), frozenset({"avx512_bf16"}))).policy == "float32"


AVX512_BF16 = NO_FLAGS | {"avx512_bf16"}


@pytest.mark.parametrize("flags", [AVX512_BF16, NO_FLAGS | {"amx_bf16", "amx_tile", "avx512_bf16"}])
@pytest.mark.parametrize("float32_ms, bfloat16_ms, policy", [
    (40.0, 25.0, "mixed_bfloat16"),   # x1.60: an AMD EPYC (family 26) measured 1.3-1.9x
    (40.0, 52.0, "float32"),          # x0.77: a Cooper Lake class CPU measured 0.74-0.8x
    (40.0, 36.0, "float32"),          # x1.11: inside the margin, not worth it
])
def test_auto_on_a_cpu_with_bfloat16_instructions_follows_the_measurement(flags, float32_ms, bfloat16_ms, policy):
    choice = precision.choose("auto", Devices((), flags), precision.Speeds(float32_ms, bfloat16_ms))
    assert choice.policy == policy
    # The log line gives both figures and the ratio that decided.
    assert f"{float32_ms:.1f} ms in float32, {bfloat16_ms:.1f} ms in bfloat16 (x{float32_ms / bfloat16_ms:.2f}" in choice.reason


def test_auto_without_a_measurement_stays_float32():
    choice = precision.choose("auto", Devices((), AVX512_BF16))
    assert choice.policy == "float32" and "AVX512-BF16 but no AMX" in choice.reason


def test_a_gpu_machine_is_never_measured_on_its_cpu():
    choice = precision.choose("auto", Devices((T4,), AVX512_BF16), precision.Speeds(40.0, 10.0))
    assert choice.policy == "mixed_float16"


def raise_if_called():
    raise AssertionError("measured although the policy was named")


@pytest.mark.parametrize("requested, policy", [("off", "float32"), ("bfloat16", "mixed_bfloat16"),
                                               ("float16", "mixed_float16")])
def test_a_named_policy_is_never_measured_over(monkeypatch, requested, policy):
    import trainer  # noqa: F401
    import tensorflow as tf

    monkeypatch.setattr(precision, "local_devices", lambda: Devices((), AVX512_BF16))
    try:
        assert precision.apply(requested, agree=raise_if_called, measure=raise_if_called) == policy
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_auto_decides_on_the_speeds_every_task_agreed_on(monkeypatch):
    """Each task measures; the job's mean decides, so a task whose own figure says otherwise
    still trains in the job's policy."""
    import trainer  # noqa: F401
    import tensorflow as tf

    monkeypatch.setattr(precision, "local_devices", lambda: Devices((), AVX512_BF16))
    local = precision.Speeds(40.0, 52.0)  # this task alone would keep float32
    try:
        sent = []
        job_mean = lambda values: sent.append(values) or [40.0, 25.0]  # noqa: E731
        assert precision.apply("auto", agree=job_mean, measure=lambda: local) == "mixed_bfloat16"
        assert sent == [[40.0, 52.0]]  # this task's own figures went into the all-reduce
        assert precision.apply("auto", measure=lambda: local) == "float32"
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_auto_stays_float32_on_a_plain_cpu():
    assert precision.choose("auto", Devices((), NO_FLAGS)).policy == "float32"


def test_float16_without_tensor_cores_warns_and_still_uses_it():
    choice = precision.choose("float16", Devices((), frozenset({"amx_bf16"})))
    assert choice.policy == "mixed_float16"
    assert "no fast path" in choice.warning and "\n" not in choice.warning


def test_bfloat16_on_a_gpu_machine_warns():
    choice = precision.choose("bfloat16", Devices((T4,), frozenset({"avx512_bf16"})))
    assert choice.policy == "mixed_bfloat16" and choice.warning


def test_asked_for_and_fast_gives_no_warning():
    assert precision.choose("float16", Devices((T4,), NO_FLAGS)).warning is None
    assert precision.choose("bfloat16", Devices((), frozenset({"amx_bf16"}))).warning is None
    assert precision.choose("off", Devices((T4,), NO_FLAGS)) == precision.Choice("float32", "--mixed-precision off")


def test_unknown_request_is_refused():
    with pytest.raises(ValueError, match="one of auto, float16, bfloat16, off"):
        precision.choose("fp8", Devices((), NO_FLAGS))


def test_cpu_flags_come_from_the_first_processor():
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse avx512_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert precision.cpu_flags(cpuinfo) == frozenset({"fpu", "sse", "avx512_bf16", "amx_tile"})
    assert precision.cpu_flags("") == frozenset()


@pytest.mark.parametrize("reported, expected", [((8, 6), (8, 6)), ("7.5", (7, 5)), ("9", (9, 0)), (None, (0, 0))])
def test_compute_capability_in_either_form(reported, expected):
    assert precision.parse_capability(reported) == expected
