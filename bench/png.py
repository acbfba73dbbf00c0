"""A latency plot as a PNG, with numpy and zlib only (matplotlib is not a dependency).

Draws latency CDFs (x: milliseconds on a log scale, y: share of calls) with axes, ticks, a
legend and labels in a built-in 5x7 pixel font. Small on purpose: one chart type, no
antialiasing.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

Image = npt.NDArray[np.uint8]
Color = tuple[int, int, int]

PALETTE: tuple[Color, ...] = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
)

# 5x7 glyphs, one string of 7 rows of 5 bits (as 0/1) per character.
_GLYPHS: dict[str, str] = {
    " ": "00000" * 7,
    "0": "01110100011001110101110011000101110",
    "1": "00100011000010000100001000010001110",
    "2": "01110100010000100010001000100011111",
    "3": "11111000100010000010000011000101110",
    "4": "00010001100101010010111110001000010",
    "5": "11111100001111000001000011000101110",
    "6": "00110010001000011110100011000101110",
    "7": "11111000010001000100010000100001000",
    "8": "01110100011000101110100011000101110",
    "9": "01110100011000101111000010001001100",
    ".": "00000000000000000000000000110001100",
    ",": "00000000000000000000001100010001000",
    ":": "00000011000110000000011000110000000",
    "-": "00000000000000011111000000000000000",
    "_": "00000000000000000000000000000011111",
    "/": "00000000010001000100010001000000000",
    "%": "11000110010001000100010001001100011",
    "=": "00000000001111100000111110000000000",
    "(": "00010001000100001000010000010000010",
    ")": "01000001000001000010000100010001000",
    "<": "00010001000100010000010000010000010",
    ">": "01000001000001000001000100010001000",
}
_UPPER = {
    "A": "01110100011000111111100011000110001",
    "B": "11110100011000111110100011000111110",
    "C": "01110100011000010000100001000101110",
    "D": "11100100101000110001100011001011100",
    "E": "11111100001000011110100001000011111",
    "F": "11111100001000011110100001000010000",
    "G": "01110100011000010111100011000101111",
    "H": "10001100011000111111100011000110001",
    "I": "01110001000010000100001000010001110",
    "J": "00111000100001000010000101001001100",
    "K": "10001100101010011000101001001010001",
    "L": "10000100001000010000100001000011111",
    "M": "10001110111010110101100011000110001",
    "N": "10001100011100110101100111000110001",
    "O": "01110100011000110001100011000101110",
    "P": "11110100011000111110100001000010000",
    "Q": "01110100011000110001101011001001101",
    "R": "11110100011000111110101001001010001",
    "S": "01111100001000001110000010000111110",
    "T": "11111001000010000100001000010000100",
    "U": "10001100011000110001100011000101110",
    "V": "10001100011000110001100010101000100",
    "W": "10001100011000110101101011010101010",
    "X": "10001100010101000100010101000110001",
    "Y": "10001100010101000100001000010000100",
    "Z": "11111000010001000100010001000011111",
}
_GLYPHS.update(_UPPER)


def _glyph(ch: str) -> str:
    return _GLYPHS.get(ch, _GLYPHS.get(ch.upper(), _GLYPHS[" "]))


def text(img: Image, x: int, y: int, s: str, color: Color = (0, 0, 0), scale: int = 1) -> None:
    """Draw ``s`` with its top-left corner at (x, y); lower case is drawn as upper case."""
    for i, ch in enumerate(s):
        bits = _glyph(ch)
        for row in range(7):
            for col in range(5):
                if bits[row * 5 + col] == "1":
                    x0 = x + (i * 6 + col) * scale
                    y0 = y + row * scale
                    img[y0 : y0 + scale, x0 : x0 + scale] = color


def line(img: Image, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1) -> None:
    """Bresenham, thickened to ``width`` pixels; clipped to the image."""
    h, w = img.shape[:2]
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    err = dx + dy
    half = width // 2
    while True:
        ya, yb = max(0, y0 - half), min(h, y0 - half + width)
        xa, xb = max(0, x0 - half), min(w, x0 - half + width)
        if ya < yb and xa < xb:
            img[ya:yb, xa:xb] = color
        if x0 == x1 and y0 == y1:
            return
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x0 += sx
        if e2 <= dx:
            err += dx
            y0 += sy


def write_png(path: Path, img: Image) -> None:
    """An 8-bit RGB PNG: signature, IHDR, one zlib IDAT (filter 0 per row), IEND."""
    h, w = img.shape[:2]

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    raw = b"".join(b"\x00" + img[row].tobytes() for row in range(h))
    png = b"\x89PNG\r\n\x1a\n"
    png += chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9))
    png += chunk(b"IEND", b"")
    path.write_bytes(png)


def latency_cdf_png(
    path: Path,
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    width: int = 1000,
    height: int = 560,
) -> None:
    """One CDF curve per (label, latencies in ms). x: log scale from 0.5 ms; y: the share of
    calls on a tail-stretching scale (-log10(1 - p), so 0.9, 0.99, 0.999 are evenly spaced)."""
    img = np.full((height, width, 3), 255, dtype=np.uint8)
    left, right, top, bottom = 70, width - 300, 60, height - 50
    all_ms = [v for _, values in series for v in values if v > 0]
    lo = 0.5
    hi = max(10.0, max(all_ms, default=10.0) * 1.1)
    lo_log, hi_log = math.log10(lo), math.log10(hi)

    def px(ms: float) -> int:
        v = (math.log10(max(ms, lo)) - lo_log) / (hi_log - lo_log)
        return left + int(v * (right - left))

    y_max = 3.0  # p = 0.999

    def py(share: float) -> int:
        stretched = min(y_max, -math.log10(max(1e-9, 1.0 - share)))
        return bottom - int(stretched / y_max * (bottom - top))

    grey: Color = (210, 210, 210)
    for decade in range(math.floor(lo_log), math.ceil(hi_log) + 1):
        for mult in (1, 2, 5):
            ms = mult * 10.0**decade
            if lo <= ms <= hi:
                x = px(ms)
                line(img, x, top, x, bottom, grey)
                label = f"{ms:g}"
                text(img, x - len(label) * 3, bottom + 8, label)
    for share in (0.0, 0.5, 0.9, 0.99, 0.999):
        y = py(share)
        line(img, left, y, right, y, grey)
        label = f"{share:g}"
        text(img, left - 8 - len(label) * 6, y - 3, label)
    line(img, left, bottom, right, bottom, (0, 0, 0))
    line(img, left, top, left, bottom, (0, 0, 0))
    text(img, left, 12, title, scale=2)
    text(img, (left + right) // 2 - 60, bottom + 26, "LATENCY (MS, LOG)")
    text(img, 8, top - 16, "SHARE OF CALLS")
    for i, (label, values) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        ordered = sorted(v for v in values if v > 0)
        n = len(ordered)
        prev: tuple[int, int] | None = None
        for j, ms in enumerate(ordered):
            point = (px(ms), py((j + 1) / n))
            if prev is not None:
                line(img, prev[0], prev[1], point[0], point[1], color, width=2)
            prev = point
        ly = top + 10 + i * 18
        img[ly : ly + 8, right + 20 : right + 40] = color
        text(img, right + 48, ly, label[:40])
    write_png(path, img)
