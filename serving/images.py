"""What an encoded image's header declares, read before anything decodes it.

A 100 KB PNG can declare 30,000 x 30,000 pixels, 2.7 GB once decoded. The prediction server
reads the width and height (and a GIF's frame count) from the first bytes of a JPEG, PNG, GIF or
BMP, and refuses such an image by its header (serving/instances.py), whatever model it serves.

A binary value is taken for an image when it starts as one of those formats does (`kind`): the
JPEG and PNG signatures, "GIF87a"/"GIF89a", and "BM" followed by one of the sizes a BMP's
information header has. Other bytes (a serialized tf.Example, audio) are no image and are not
read here.
"""

from __future__ import annotations

import struct

# A BMP's information header sizes (BITMAPCOREHEADER, INFOHEADER, V2, V3, V4, V5): "BM" alone is
# two bytes that text can begin with.
_BMP_HEADER_SIZES = (12, 40, 52, 56, 108, 124)


def kind(data: bytes) -> str | None:
    """"jpeg", "png", "gif" or "bmp" when `data` starts as that format does, else None."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM" and len(data) >= 18 and struct.unpack("<I", data[14:18])[0] in _BMP_HEADER_SIZES:
        return "bmp"
    return None


def pixels(image: bytes) -> int | None:
    """Width x height (x frames, for a GIF) declared by an image's header; None when the bytes are
    not a JPEG, PNG, GIF or BMP whose header can be read, or the file is cut short."""
    reader = {"jpeg": _jpeg, "png": _png, "gif": _gif, "bmp": _bmp}.get(kind(image))
    try:
        return reader(image) if reader else None
    except (IndexError, struct.error):
        return None


# JPEG start-of-frame markers (every SOFn: C0-CF except DHT C4, JPG C8 and DAC CC).
_SOF = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(image: bytes) -> int | None:
    # A whole JPEG ends with its end-of-image marker, within its last KiB (some cameras append
    # metadata): a truncated upload is refused, not decoded grey.
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
