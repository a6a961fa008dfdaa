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


def test_auto_uses_bfloat16_on_a_cpu_with_amx():
    choice = precision.choose("auto", Devices((), NO_FLAGS | {"amx_bf16", "amx_tile", "avx512_bf16"}))
    assert choice.policy == "mixed_bfloat16" and "AMX" in choice.reason


def test_auto_stays_float32_with_avx512_bf16_but_no_amx():
    """Measured on such a CPU: a ResNet50 step ran slower in bfloat16 than in float32."""
    choice = precision.choose("auto", Devices((), NO_FLAGS | {"avx512_bf16"}))
    assert choice.policy == "float32" and "AVX512-BF16 but no AMX" in choice.reason


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
