"""Image files for tests and the hostile-image family: valid PNG and JPEG files, and hostile ones (bombs,
truncated files, wrong signatures, huge dimensions), built in memory from their format's structure."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def image_file(width: int, height: int, mode: str = "RGB", file_format: str = "PNG", seed: int = 0) -> bytes:
    """A random image of this size and mode saved as ``file_format`` (JPEG keeps L and RGB, else RGB)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGBA").convert(mode)
    if file_format == "JPEG" and mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format=file_format)
    return buffer.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(width: int = 100_000, height: int = 100_000, compressed_rows: int = 64) -> bytes:
    """A well-formed grey PNG header claiming ``width`` × ``height`` pixels, whose data (all zero rows,
    highly compressible) is a few kilobytes: decoding it would allocate ``width × height`` bytes."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * ((width + 1) * compressed_rows), 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", rows) + _chunk(b"IEND", b"")


def truncated(data: bytes, keep: float = 0.5) -> bytes:
    """The first ``keep`` of a file (its header intact, its pixel data cut)."""
    return data[: max(64, int(len(data) * keep))]


def wrong_signature(data: bytes) -> bytes:
    """A PNG file behind a JPEG signature."""
    return b"\xff\xd8\xff" + data[3:]


def gif_file() -> bytes:
    """A valid 8×8 GIF (a format this server does not read)."""
    buffer = io.BytesIO()
    Image.new("P", (8, 8)).save(buffer, format="GIF")
    return buffer.getvalue()
