"""What a Vertex AI prediction request holds, read without TensorFlow: the images it carries, or
one line saying what is wrong with it.

A request body is `{"instances": [{"image_bytes": {"b64": "..."}}, ...]}` (Vertex AI's custom
container contract; the `_bytes` suffix is the convention its prebuilt TensorFlow containers
decode base64 for, kept so that one client serves both routes). Other top-level keys, such as
Vertex's `parameters`, are allowed and ignored.

Before any image reaches the model's decoder, its header says what it would cost to decode:
`pixels` reads the width and height (and a GIF's frame count) from the first bytes of a JPEG, PNG,
GIF or BMP. A 100 KB PNG can declare 30,000 x 30,000 pixels, 2.7 GB once decoded: the server
refuses such an image by its header, and decodes nothing.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import struct

INPUT = "image_bytes"  # the serving_default signature's input (cassava.signature.BYTES_INPUT)
SHAPE = '{"instances": [{"image_bytes": {"b64": "..."}}]}'


class BadRequest(ValueError):
    """What is wrong with a request, in one line for the client; `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Limits:
    max_instances: int  # images per request
    max_image_pixels: int  # width x height (x frames) of one image, from its header


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def parse(body: bytes, limits: Limits) -> list[bytes]:
    """The encoded images of a request body, in order; raises BadRequest naming the first problem."""
    try:
        request = json.loads(body)
    except UnicodeDecodeError:
        raise BadRequest("request body is not JSON: it is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise BadRequest(f"request body is not JSON: {error}") from None
    except RecursionError:
        raise BadRequest("request body is not JSON this server reads: it is nested too deeply") from None
    if not isinstance(request, dict):
        raise BadRequest(f"request body is {_kind(request)}; expected {SHAPE}")
    if "instances" not in request:
        raise BadRequest(f"request has no \"instances\"; expected {SHAPE}")
    instances = request["instances"]
    if not isinstance(instances, list):
        raise BadRequest(f"\"instances\" is {_kind(instances)}; expected a list of {{\"image_bytes\": {{\"b64\": ...}}}}")
    if not instances:
        raise BadRequest("\"instances\" is empty: send at least one image")
    if len(instances) > limits.max_instances:
        raise BadRequest(f"\"instances\" holds {len(instances)} images; this server takes at most "
                         f"{limits.max_instances} per request (--max-instances)")
    return [_image(index, instance, limits) for index, instance in enumerate(instances)]


def _image(index: int, instance, limits: Limits) -> bytes:
    where = f"instances[{index}]"
    encoded = instance.get(INPUT) if isinstance(instance, dict) else None
    text = encoded.get("b64") if isinstance(encoded, dict) else None
    if not isinstance(text, str):
        raise BadRequest(f"{where} is not {{\"image_bytes\": {{\"b64\": \"...\"}}}} (got {_kind(instance)}"
                         f"{' with keys ' + ', '.join(sorted(map(str, instance))) if isinstance(instance, dict) else ''})")
    try:
        # Line breaks are allowed: `base64 FILE` wraps its output at 76 characters.
        image = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}.image_bytes.b64 is not base64") from None
    size = pixels(image)
    if size is None:
        raise BadRequest(f"{where}: not a whole JPEG, PNG, GIF or BMP image")
    if size > limits.max_image_pixels:
        raise BadRequest(f"{where}: its header declares {size:,} pixels; this server decodes at most "
                         f"{limits.max_image_pixels:,} per image (--max-image-pixels)")
    return image


def pixels(image: bytes) -> int | None:
    """Width x height (x frames, for a GIF) declared by an image's header; None when the bytes are
    not a JPEG, PNG, GIF or BMP whose header can be read, or the file is cut short."""
    try:
        if image[:3] == b"\xff\xd8\xff":
            return _jpeg(image)
        if image[:8] == b"\x89PNG\r\n\x1a\n":
            return _png(image)
        if image[:4] == b"GIF8":
            return _gif(image)
        if image[:2] == b"BM":
            return _bmp(image)
    except (IndexError, struct.error):
        return None
    return None


# JPEG start-of-frame markers (every SOFn: C0-CF except DHT C4, JPG C8 and DAC CC).
_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(image: bytes) -> int | None:
    # A whole JPEG ends with its end-of-image marker, within its last KiB (some cameras append
    # metadata): cassava.data.looks_decodable's rule, so a truncated upload is refused, not decoded grey.
    if b"\xff\xd9" not in image[-1024:]:
        return None
    at = 2
    while at + 4 <= len(image):
        if image[at] != 0xFF:
            return None
        marker = image[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", image[at + 2:at + 4])
        if marker in _SOF:
            height, width = struct.unpack(">HH", image[at + 5:at + 9])
            return width * height if width and height else None
        if marker == 0xDA or length < 2:  # image data before any frame header
            return None
        at += 2 + length
    return None


def _png(image: bytes) -> int | None:
    if image[12:16] != b"IHDR" or image[-8:] != b"IEND\xaeB`\x82":
        return None
    width, height = struct.unpack(">II", image[16:24])
    return width * height if width and height else None


def _gif(image: bytes) -> int | None:
    """The canvas times its frames: a GIF decodes to one full canvas per frame."""
    width, height, flags = struct.unpack("<HHB", image[6:11])
    at = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    frames = 0
    while True:
        block = image[at]
        if block == 0x3B:  # trailer
            return width * height * frames if width and height and frames else None
        if block == 0x21:  # extension: label, then sub-blocks
            at = _skip_sub_blocks(image, at + 2)
        elif block == 0x2C:  # image descriptor, optional local colour table, LZW code size, data
            local = image[at + 9]
            at += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0)
            at = _skip_sub_blocks(image, at + 1)
            frames += 1
        else:
            return None


def _skip_sub_blocks(image: bytes, at: int) -> int:
    while image[at]:
        at += 1 + image[at]
    return at + 1


def _bmp(image: bytes) -> int | None:
    width, height = struct.unpack("<ii", image[18:26])
    return abs(width * height) or None
