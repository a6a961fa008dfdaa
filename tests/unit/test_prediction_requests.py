"""serving.instances and serving.server's settings: what a prediction request must hold, what an
image's header declares before anything decodes it, and how Vertex AI's variables become settings."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import pytest

from serving import instances, server

LIMITS = instances.Limits(max_instances=4, max_image_pixels=1_000_000)


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
    return b"BM" + bytes(16) + struct.pack("<ii", width, height) + bytes(28)


def body(*images: bytes, **extra) -> bytes:
    return json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(i).decode()}} for i in images],
                       **extra}).encode()


@pytest.mark.parametrize("image, expected", [
    (png(640, 480), 640 * 480), (jpeg(600, 450), 600 * 450), (jpeg(4000, 3000, sof=0xC2), 12_000_000),
    (gif(10, 20, 1), 200), (gif(10, 20, 30), 6000), (bmp(30, -40), 1200)])
def test_the_header_declares_the_pixels_a_decode_would_make(image, expected):
    assert instances.pixels(image) == expected


@pytest.mark.parametrize("image", [
    b"", b"hello world", png(64, 64)[:-12], jpeg(64, 64)[:-2], gif(4, 4, 2)[:-1], gif(4, 4, 0), b"BM\x00",
    jpeg(0, 64), b"\xff\xd8\xff\xda\x00\x0c" + bytes(20) + b"\xff\xd9"])
def test_what_is_not_a_whole_image_declares_nothing(image):
    assert instances.pixels(image) is None


def test_a_request_gives_its_images_in_order_and_ignores_parameters():
    images = [png(8, 8), jpeg(16, 16)]
    assert instances.parse(body(*images, parameters={"top_k": 1}), LIMITS) == images


@pytest.mark.parametrize("raw, message", [
    (b"{\"instances\": \"\x80\"}", "request body is not JSON: it is not UTF-8 text"),
    (b'{"instances": [', "request body is not JSON: Expecting value: line 1 column 16 (char 15)"),
    (b"[1, 2]", 'request body is a list; expected {"instances": [{"image_bytes": {"b64": "..."}}]}'),
    (b'{"images": []}', 'request has no "instances"; expected {"instances": [{"image_bytes": {"b64": "..."}}]}'),
    (b'{"instances": "x"}', '"instances" is a string; expected a list of {"image_bytes": {"b64": ...}}'),
    (b'{"instances": []}', '"instances" is empty: send at least one image'),
    (b'{"instances": [{"b64": "AAAA"}]}', 'instances[0] is not {"image_bytes": {"b64": "..."}} (got an object with keys b64)'),
    (b'{"instances": [{"image_bytes": {"b64": "not base64!"}}]}', "instances[0].image_bytes.b64 is not base64"),
    (b'{"instances": [{"image_bytes": {"b64": "aGVsbG8="}}]}', "instances[0]: not a whole JPEG, PNG, GIF or BMP image"),
])
def test_each_bad_request_is_one_line_naming_what_is_wrong(raw, message):
    with pytest.raises(instances.BadRequest) as raised:
        instances.parse(raw, LIMITS)
    assert str(raised.value) == message and raised.value.status == 400
    assert "\n" not in str(raised.value)


def test_wrapped_base64_is_read_and_a_deeply_nested_body_is_one_line():
    image = png(64, 64)
    wrapped = base64.encodebytes(image).decode()  # 76 characters a line, as `base64 FILE` prints
    assert wrapped.count("\n") >= 2
    assert instances.parse(json.dumps({"instances": [{"image_bytes": {"b64": wrapped}}]}).encode(), LIMITS) == [image]
    with pytest.raises(instances.BadRequest) as raised:
        instances.parse(b"[" * 100_000 + b"]" * 100_000, LIMITS)
    assert str(raised.value) == "request body is not JSON this server reads: it is nested too deeply"


def test_the_limits_name_the_flag_that_sets_them():
    with pytest.raises(instances.BadRequest, match=r'"instances" holds 5 images; this server takes at most 4 per request \(--max-instances\)'):
        instances.parse(body(*[png(2, 2)] * 5), LIMITS)
    with pytest.raises(instances.BadRequest, match=r"instances\[1\]: its header declares 30,000,000 pixels; this server "
                                                   r"decodes at most 1,000,000 per image \(--max-image-pixels\)"):
        instances.parse(body(png(2, 2), png(6000, 5000)), LIMITS)


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
