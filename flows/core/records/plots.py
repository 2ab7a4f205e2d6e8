"""Learning curves as a PNG, with no plotting library: panels of lines drawn into an indexed
bitmap (Bresenham lines, a 5x7 bitmap font) and written with zlib. No Prefect, no torch.

    png = render_png([Panel("reward", "cycle", [Line("reward_mean", [(0, 0.1), (1, 0.4)])])])

Panels go two to a row; each has its own axes (the range of its points, with the extremes
written on the axes), a title and a legend. Points are drawn as small squares joined by lines,
so a series with gaps (an evaluation every few cycles) still shows. The same points give the
same bytes.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PANEL_WIDTH, PANEL_HEIGHT = 480, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 108, 16, 56, 44
LEGEND_ROW = 18
"""Pixels between legend rows: a legend wraps at the panel's right edge."""
SCALE = 2
"""Text is the 5x7 font at twice its size."""
PALETTE = (
    (255, 255, 255),  # 0 background
    (40, 40, 40),  # 1 text and axes
    (225, 225, 225),  # 2 grid
    (31, 119, 180),  # 3.. the lines, in order
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
)
INK, GRID, FIRST_LINE = 1, 2, 3


@dataclass(frozen=True)
class Line:
    """One series: its legend label and its (x, y) points."""

    label: str
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Panel:
    """One chart: a title, the x axis's label, and its lines (those with no point are left out)."""

    title: str
    x_label: str
    lines: Sequence[Line]


GLYPHS: dict[str, tuple[str, ...]] = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
    "a": (".....", ".....", ".###.", "....#", ".####", "#...#", ".####"),
    "b": ("#....", "#....", "#.##.", "##..#", "#...#", "#...#", "####."),
    "c": (".....", ".....", ".###.", "#....", "#....", "#...#", ".###."),
    "d": ("....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"),
    "e": (".....", ".....", ".###.", "#...#", "#####", "#....", ".###."),
    "f": ("..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..."),
    "g": (".....", ".####", "#...#", "#...#", ".####", "....#", ".###."),
    "h": ("#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"),
    "i": ("..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."),
    "j": ("...#.", ".....", "..##.", "...#.", "...#.", "#..#.", ".##.."),
    "k": ("#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."),
    "l": (".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "m": (".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#"),
    "n": (".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"),
    "o": (".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."),
    "p": (".....", ".....", "####.", "#...#", "####.", "#....", "#...."),
    "q": (".....", ".....", ".##.#", "#..##", ".####", "....#", "....#"),
    "r": (".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."),
    "s": (".....", ".....", ".###.", "#....", ".###.", "....#", "####."),
    "t": (".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."),
    "u": (".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"),
    "v": (".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."),
    "w": (".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."),
    "x": (".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"),
    "y": (".....", ".....", "#...#", "#...#", ".####", "....#", ".###."),
    "z": (".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"),
    " ": (".....",) * 7,
    ".": (".....", ".....", ".....", ".....", ".....", ".##..", ".##.."),
    ",": (".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."),
    "-": (".....", ".....", ".....", "#####", ".....", ".....", "....."),
    "_": (".....", ".....", ".....", ".....", ".....", ".....", "#####"),
    ":": (".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."),
    "+": (".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."),
    "=": (".....", ".....", "#####", ".....", "#####", ".....", "....."),
    "@": (".###.", "#...#", "#.###", "#.#.#", "#.###", "#....", ".####"),
    "(": ("...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."),
    ")": (".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."),
    "%": ("##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"),
    "/": (".....", "....#", "...#.", "..#..", ".#...", "#....", "....."),
    "?": (".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."),
}
"""A 5x7 bitmap font: lowercase (text is lowered), digits and a few signs; `?` otherwise."""
GLYPH_ADVANCE = 6 * SCALE


class Canvas:
    """An indexed bitmap: one palette index per pixel."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(width * height)

    def dot(self, x: int, y: int, color: int, size: int = 1) -> None:
        """A `size` x `size` square whose top-left corner is (x, y), clipped to the canvas."""
        for row in range(max(y, 0), min(y + size, self.height)):
            start = row * self.width
            for column in range(max(x, 0), min(x + size, self.width)):
                self.pixels[start + column] = color

    def line(self, x0: int, y0: int, x1: int, y1: int, color: int, size: int = 1) -> None:
        """Bresenham's line from (x0, y0) to (x1, y1), `size` pixels thick."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        while True:
            self.dot(x0 - size // 2, y0 - size // 2, color, size)
            if x0 == x1 and y0 == y1:
                return
            doubled = 2 * error
            if doubled >= dy:
                error += dy
                x0 += sx
            if doubled <= dx:
                error += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: int = INK) -> int:
        """`text` with its top-left corner at (x, y); the x after its last glyph."""
        for character in text.lower():
            glyph = GLYPHS.get(character, GLYPHS["?"])
            for row, bits in enumerate(glyph):
                for column, bit in enumerate(bits):
                    if bit == "#":
                        self.dot(x + column * SCALE, y + row * SCALE, color, SCALE)
            x += GLYPH_ADVANCE
        return x

    def png(self) -> bytes:
        """The bitmap as a PNG (8-bit indexed color)."""
        rows = b"".join(
            b"\x00" + bytes(self.pixels[row * self.width : (row + 1) * self.width])
            for row in range(self.height)
        )
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 3, 0, 0, 0)
        palette = bytes(value for color in PALETTE for value in color)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"PLTE", palette)
            + chunk(b"IDAT", zlib.compress(rows, 9))
            + chunk(b"IEND", b"")
        )


def chunk(kind: bytes, data: bytes) -> bytes:
    """A PNG chunk: length, type, data, CRC of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def number(value: float) -> str:
    """A short label for an axis value."""
    return f"{value:.3g}" if value != 0 else "0"


def span(values: Sequence[float]) -> tuple[float, float]:
    """A range holding `values`, never empty."""
    low, high = min(values), max(values)
    if high - low < 1e-12:
        pad = max(abs(low) * 0.1, 0.5)
        return low - pad, high + pad
    return low, high


def draw_panel(canvas: Canvas, left: int, top: int, panel: Panel) -> None:
    """One panel into its PANEL_WIDTH x PANEL_HEIGHT cell at (left, top)."""
    lines = [line for line in panel.lines if line.points]
    canvas.text(left + 8, top + 6, panel.title)
    legend_x, legend_y = left + 8, top + 30
    for index, line in enumerate(lines):
        color = FIRST_LINE + index % (len(PALETTE) - FIRST_LINE)
        width = 14 + GLYPH_ADVANCE * (len(line.label) + 1)
        if legend_x + width > left + PANEL_WIDTH and legend_x > left + 8:
            legend_x, legend_y = left + 8, legend_y + LEGEND_ROW
        canvas.dot(legend_x, legend_y + 2, color, 10)
        legend_x = canvas.text(legend_x + 14, legend_y, line.label) + GLYPH_ADVANCE
    x0, y0 = left + MARGIN_LEFT, legend_y + MARGIN_TOP - 30
    x1, y1 = left + PANEL_WIDTH - MARGIN_RIGHT, top + PANEL_HEIGHT - MARGIN_BOTTOM
    for tick in range(5):
        y = y0 + round(tick * (y1 - y0) / 4)
        canvas.line(x0, y, x1, y, GRID)
    canvas.line(x0, y0, x0, y1, INK)
    canvas.line(x0, y1, x1, y1, INK)
    if not lines:
        canvas.text(x0 + 12, (y0 + y1) // 2, "no data yet")
        return
    xs = span([x for line in lines for x, _ in line.points])
    ys = span([y for line in lines for _, y in line.points])
    for value, y in ((ys[1], y0), (ys[0], y1)):
        label = number(value)
        canvas.text(x0 - 6 - GLYPH_ADVANCE * len(label), y - 7, label)
    for value, x in ((xs[0], x0), (xs[1], x1)):
        label = number(value)
        canvas.text(x - GLYPH_ADVANCE * len(label) // 2, y1 + 6, label)
    canvas.text((x0 + x1) // 2 - GLYPH_ADVANCE * len(panel.x_label) // 2, y1 + 26, panel.x_label)

    def at(point: tuple[float, float]) -> tuple[int, int]:
        x = x0 + (point[0] - xs[0]) / (xs[1] - xs[0]) * (x1 - x0)
        y = y1 - (point[1] - ys[0]) / (ys[1] - ys[0]) * (y1 - y0)
        return round(x), round(y)

    for index, line in enumerate(lines):
        color = FIRST_LINE + index % (len(PALETTE) - FIRST_LINE)
        pixels = [at(point) for point in line.points if all(map(math.isfinite, point))]
        for (ax, ay), (bx, by) in zip(pixels, pixels[1:], strict=False):
            canvas.line(ax, ay, bx, by, color, 2)
        for x, y in pixels:
            canvas.dot(x - 3, y - 3, color, 7)


def render_png(panels: Sequence[Panel]) -> bytes:
    """The panels, two to a row, as one PNG."""
    rows = max(1, math.ceil(len(panels) / 2))
    columns = 1 if len(panels) <= 1 else 2
    canvas = Canvas(columns * PANEL_WIDTH, rows * PANEL_HEIGHT)
    for index, panel in enumerate(panels):
        draw_panel(canvas, (index % 2) * PANEL_WIDTH, (index // 2) * PANEL_HEIGHT, panel)
    return canvas.png()


def picture_beside(metrics_path: Path) -> Path:
    """Where a run's learning curves go beside its metrics file: `metrics.jsonl` ->
    `metrics.png`."""
    if metrics_path.suffix == ".png":
        return metrics_path.with_name(metrics_path.name + ".png")
    return metrics_path.with_suffix(".png")
