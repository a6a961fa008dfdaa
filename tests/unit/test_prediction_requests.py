"""serving.instances, serving.images, serving.answers and serving.server's settings: what a
prediction request must hold for the model's own inputs, what an image's header declares before
anything decodes it, how outputs become JSON, and how Vertex AI's variables become settings."""

from __future__ import annotations

import base64
import json
import math
import struct
import zlib

import numpy as np
import pytest

from serving import answers, images, instances, server
from serving.model import Tensor

LIMITS = instances.Limits(max_instances=4, max_image_pixels=1_000_000)
# cassava's export: one string of encoded image bytes per instance.
IMAGE_MODEL = {"image_bytes": Tensor("string", ())}
# fares' export: one 1-D tensor per column of the table.
TABLE_MODEL = {"distance_km": Tensor("float32", ()), "hour": Tensor("int64", ()), "passengers": Tensor("int64", ()),
               "payment_type": Tensor("string", ())}
TRIP = {"distance_km": 3.5, "hour": 8, "passengers": 2, "payment_type": "card"}


def png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x00" * 3 * width for _ in range(min(height, 2)))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def jpeg(width: int, height: int, sof: int = 0xC0) -> bytes:
    """The segments a JPEG starts with (APP0, a quantisation table, the frame header), then EOI."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + bytes(65)
    frame = bytes([0xFF, sof]) + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + dqt + frame + b"\xff\xda" + struct.pack(">H", 12) + bytes(10) + b"\x00\xff\xd9"


def gif(width: int, height: int, frames: int) -> bytes:
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x4c\x01\x00"
    extension = b"\x21\xf9\x04\x00\x00\x00\x00\x00"
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + bytes(6) + (extension + image) * frames + b"\x3b"


def bmp(width: int, height: int) -> bytes:
    """A BMP's file header, then a BITMAPINFOHEADER (40 bytes: its size first) with the width and height."""
    return b"BM" + bytes(12) + struct.pack("<Iii", 40, width, height) + bytes(28)


def body(*encoded: bytes, **extra) -> bytes:
    return json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(i).decode()}} for i in encoded],
                       **extra}).encode()


def parse_images(raw: bytes) -> list[bytes]:
    return [read["image_bytes"].item() for read in instances.parse(raw, IMAGE_MODEL, LIMITS)]


@pytest.mark.parametrize("image, expected", [
    (png(640, 480), 640 * 480), (jpeg(600, 450), 600 * 450), (jpeg(4000, 3000, sof=0xC2), 12_000_000),
    (gif(10, 20, 1), 200), (gif(10, 20, 30), 6000), (bmp(30, -40), 1200)])
def test_the_header_declares_the_pixels_a_decode_would_make(image, expected):
    assert images.pixels(image) == expected


@pytest.mark.parametrize("image", [
    b"", b"hello world", png(64, 64)[:-12], jpeg(64, 64)[:-2], gif(4, 4, 2)[:-1], gif(4, 4, 0), b"BM\x00",
    jpeg(0, 64), b"\xff\xd8\xff\xda\x00\x0c" + bytes(20) + b"\xff\xd9"])
def test_what_is_not_a_whole_image_declares_nothing(image):
    assert images.pixels(image) is None


@pytest.mark.parametrize("data, kind", [(png(2, 2), "png"), (jpeg(2, 2), "jpeg"), (gif(2, 2, 1), "gif"), (bmp(2, 2), "bmp"),
                                        (b"BMW 320d, 2019", None), (b"GIF87 but not a picture", None), (b"\x0a\x05hello", None)])
def test_bytes_are_taken_for_an_image_only_when_they_start_as_one(data, kind):
    assert images.kind(data) == kind


def test_a_request_gives_its_instances_in_order_and_ignores_parameters():
    encoded = [png(8, 8), jpeg(16, 16)]
    assert parse_images(body(*encoded, parameters={"top_k": 1})) == encoded


def test_a_table_row_becomes_one_array_per_column_of_the_models_types():
    read = instances.parse(json.dumps({"instances": [TRIP, {**TRIP, "passengers": 3.0}]}).encode(), TABLE_MODEL, LIMITS)
    assert [row["passengers"].item() for row in read] == [2, 3]
    assert read[0]["distance_km"].dtype == np.float32 and read[0]["hour"].dtype == np.int64
    assert read[0]["payment_type"].item() == b"card" and read[0]["payment_type"].shape == ()


def test_a_model_of_one_input_takes_the_value_alone_as_tensorflow_serving_does():
    image = png(4, 4)
    alone = {"instances": [{"b64": base64.b64encode(image).decode()}]}
    assert [read["image_bytes"].item() for read in instances.parse(json.dumps(alone).encode(), IMAGE_MODEL, LIMITS)] == [image]
    vector = {"x": Tensor("float32", (3,))}
    read = instances.parse(b'{"instances": [[1, 2, 3], [4, 5, 6.5]]}', vector, LIMITS)
    assert [row["x"].tolist() for row in read] == [[1, 2, 3], [4, 5, 6.5]]


@pytest.mark.parametrize("raw, message", [
    (b"{\"instances\": \"\x80\"}", "request body is not JSON: it is not UTF-8 text"),
    (b'{"instances": [', "request body is not JSON: Expecting value: line 1 column 16 (char 15)"),
    (b"[1, 2]", 'request body is a list; expected {"instances": [{"image_bytes": {"b64": "..."}}]}'),
    (b'{"images": []}', 'request has no "instances"; expected {"instances": [{"image_bytes": {"b64": "..."}}]}'),
    (b'{"instances": "x"}', '"instances" is a string; expected {"instances": [{"image_bytes": {"b64": "..."}}]}'),
    (b'{"instances": []}', '"instances" is empty: send at least one instance'),
    (b'{"instances": [{"bytes": "AAAA"}]}', 'instances[0] is an object; expected a string or {"b64": "..."} (got keys bytes)'),
    (b'{"instances": [{"image_bytes": {"b64": "not base64!"}}]}', "instances[0].image_bytes.b64 is not base64"),
    (b'{"instances": [{"image_bytes": 7}]}', 'instances[0].image_bytes is a number; expected a string or {"b64": "..."}'),
    (b'{"instances": [{"image_bytes": {"b64": "AAAA"}}], "signature_name": "serving_pixels"}',
     '"signature_name" is "serving_pixels"; this server serves "serving_default" only'),
])
def test_each_bad_request_is_one_line_naming_what_is_wrong(raw, message):
    with pytest.raises(instances.BadRequest) as raised:
        instances.parse(raw, IMAGE_MODEL, LIMITS, "serving_default")
    assert str(raised.value) == message and raised.value.status == 400
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("change, message", [
    ({"passengers": "two"}, "instances[0].passengers is not int64 (got text)"),
    ({"passengers": 1.5}, "instances[0].passengers is not int64 (got a fraction)"),
    ({"passengers": True}, "instances[0].passengers is not int64 (got true/false)"),
    ({"passengers": 2 ** 64}, "instances[0].passengers is not int64 (got not numbers)"),
    ({"passengers": [2]}, "instances[0].passengers has shape [1]; the model takes int64"),
    ({"distance_km": None}, "instances[0].distance_km is not float32 (got not numbers)"),
    ({"distance_km": "far"}, "instances[0].distance_km is not float32 (got text)"),
    ({"payment_type": 3}, 'instances[0].payment_type is a number; expected a string or {"b64": "..."}'),
    ({"tip": 1.0}, "instances[0].tip is no input of the model; its inputs: distance_km, hour, passengers, payment_type"),
])
def test_a_table_row_of_the_wrong_types_is_one_line_naming_the_column(change, message):
    with pytest.raises(instances.BadRequest) as raised:
        instances.parse(json.dumps({"instances": [{**TRIP, **change}]}).encode(), TABLE_MODEL, LIMITS)
    assert str(raised.value) == message


def test_a_missing_column_and_a_bare_value_name_the_models_inputs():
    row = {name: value for name, value in TRIP.items() if name != "hour"}
    with pytest.raises(instances.BadRequest, match=r'^instances\[0\] has no "hour"; the model\'s inputs: distance_km, hour, '):
        instances.parse(json.dumps({"instances": [row]}).encode(), TABLE_MODEL, LIMITS)
    with pytest.raises(instances.BadRequest, match=r"^instances\[0\] is a number; expected an object with the model's inputs"):
        instances.parse(b'{"instances": [3.5]}', TABLE_MODEL, LIMITS)
    with pytest.raises(instances.BadRequest, match=r'^request has no "instances"; expected \{"instances": \[\{"distance_km": 0.0, '
                                                   r'"hour": 0, "passengers": 0, "payment_type": "..."\}\]\}$'):
        instances.parse(b'{"inputs": {}}', TABLE_MODEL, LIMITS)


@pytest.mark.parametrize("raw, message", [
    (b'{"instances": [[1, 2], [3, 4, 5]]}', "instances[1].x has shape [3], instances[0].x [2]: one request's instances must agree"),
    (b'{"instances": [[[1], [2, 3]]]}', "instances[0] is not float32[?, 2]: its lists differ in length"),
    (b'{"instances": [[[1, 2, 3]]]}', "instances[0] has shape [1, 3]; the model takes float32[?, 2]"),
])
def test_arrays_must_have_the_models_shape_and_agree_within_a_request(raw, message):
    spec = {"x": Tensor("float32", (None,))} if b"[[1, 2], [3" in raw else {"x": Tensor("float32", (None, 2))}
    with pytest.raises(instances.BadRequest) as raised:
        instances.parse(raw, spec, LIMITS)
    assert str(raised.value) == message


def test_nested_strings_keep_their_shape_and_text_is_utf8():
    spec = {"words": Tensor("string", (None, 2))}
    read = instances.parse(json.dumps({"instances": [[["é", "b"], ["c", {"b64": "ZA=="}]]]}).encode(), spec, LIMITS)
    assert read[0]["words"].shape == (2, 2) and read[0]["words"].tolist() == [["é".encode(), b"b"], [b"c", b"d"]]


def test_wrapped_base64_is_read_and_a_deeply_nested_body_is_one_line():
    image = png(64, 64)
    wrapped = base64.encodebytes(image).decode()  # 76 characters a line, as `base64 FILE` prints
    assert wrapped.count("\n") >= 2
    assert parse_images(json.dumps({"instances": [{"image_bytes": {"b64": wrapped}}]}).encode()) == [image]
    with pytest.raises(instances.BadRequest) as raised:
        instances.parse(b"[" * 100_000 + b"]" * 100_000, IMAGE_MODEL, LIMITS)
    assert str(raised.value) == "request body is not JSON this server reads: it is nested too deeply"


def test_an_image_is_checked_by_its_header_whatever_input_carries_it_and_other_bytes_pass():
    spec = {"photo": Tensor("string", ()), "note_bytes": Tensor("string", ())}

    def instance(photo: bytes, note: bytes) -> bytes:
        return json.dumps({"instances": [{"photo": {"b64": base64.b64encode(photo).decode()},
                                          "note_bytes": {"b64": base64.b64encode(note).decode()}}]}).encode()

    assert instances.parse(instance(png(8, 8), b"\x00\x01 not an image"), spec, LIMITS)[0]["note_bytes"].item() == b"\x00\x01 not an image"
    with pytest.raises(instances.BadRequest, match=r"^instances\[0\]\.photo: not a whole PNG image$"):
        instances.parse(instance(png(8, 8)[:-12], b""), spec, LIMITS)
    with pytest.raises(instances.BadRequest, match=r"^instances\[0\]\.note_bytes: its header declares 30,000,000 pixels"):
        instances.parse(instance(png(8, 8), png(6000, 5000)), spec, LIMITS)


def test_the_limits_name_the_flag_that_sets_them():
    with pytest.raises(instances.BadRequest, match=r'"instances" holds 5 instances; this server takes at most 4 per request \(--max-instances\)'):
        instances.parse(body(*[png(2, 2)] * 5), IMAGE_MODEL, LIMITS)
    with pytest.raises(instances.BadRequest, match=r"instances\[1\]\.image_bytes: its header declares 30,000,000 pixels; this server "
                                                   r"decodes at most 1,000,000 per image \(--max-image-pixels\)"):
        instances.parse(body(png(2, 2), png(6000, 5000)), IMAGE_MODEL, LIMITS)


def test_outputs_become_json_as_tensorflow_serving_writes_them():
    several = {"class_name": np.array(b"cmd", dtype=object), "class_index": np.int64(3),
               "probabilities": np.array([0.25, 0.75], np.float32), "mask_bytes": np.array(b"\xff\x00", dtype=object)}
    assert answers.prediction(several) == {"class_name": "cmd", "class_index": 3, "probabilities": [0.25, 0.75],
                                           "mask_bytes": {"b64": "/wA="}}
    assert answers.prediction({"fare": np.float32(12.5)}) == 12.5  # one output: its value alone
    assert answers.prediction({"raw": np.array(b"\xff", dtype=object)}) == {"b64": "/w=="}  # not UTF-8
    written = answers.body([float("nan"), float("inf")])
    assert written == b'{"predictions": [NaN, Infinity]}'
    assert math.isnan(json.loads(written)["predictions"][0])


def test_settings_come_from_vertex_variables_and_flags_override_them():
    environ = {"AIP_HTTP_PORT": "7080", "AIP_HEALTH_ROUTE": "/v1/endpoints/1/deployedModels/2",
               "AIP_PREDICT_ROUTE": "/v1/endpoints/1/deployedModels/2:predict", "AIP_STORAGE_URI": "gs://b/m"}
    settings = server.settings_from([], environ)
    assert (settings.port, settings.health_route, settings.predict_route, settings.model_dir) == (
        7080, "/v1/endpoints/1/deployedModels/2", "/v1/endpoints/1/deployedModels/2:predict", "gs://b/m")
    assert settings.host == "127.0.0.1"
    overridden = server.settings_from(["--port", "9000", "--model-dir", "/m", "--host", "0.0.0.0"], environ)
    assert (overridden.port, overridden.model_dir, overridden.host) == (9000, "/m", "0.0.0.0")
    plain = server.settings_from(["--model-dir", "/m"], {})
    assert (plain.port, plain.health_route, plain.predict_route) == (8080, "/health", "/predict")


@pytest.mark.parametrize("argv, environ, message", [
    ([], {}, "no model: Vertex AI sets AIP_STORAGE_URI from the Model's artifactUri; elsewhere pass --model-dir"),
    ([], {"AIP_STORAGE_URI": "gs://b/m", "AIP_HTTP_PORT": "http"}, "the port (--port, or AIP_HTTP_PORT) is 'http', not a number"),
    (["--port", "70000", "--model-dir", "m"], {}, "port 70000 is outside 1-65535"),
    (["--model-dir", "m", "--health-route", "health"], {}, "the health route 'health' must start with /"),
    (["--model-dir", "m", "--predict-route", "/health"], {}, "the health and predict routes are both '/health'"),
])
def test_a_setting_the_server_cannot_start_with_is_one_line(argv, environ, message):
    with pytest.raises(server.ConfigError) as raised:
        server.settings_from(argv, environ)
    assert str(raised.value) == message


def test_a_malformed_flag_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        server.settings_from(["--max-instances", "0", "--model-dir", "m"], {})
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m serving.server: error: argument --max-instances: must be positive, got 0 (--help lists the flags)"]
