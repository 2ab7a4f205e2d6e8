"""Learning curves: the PNG writer's bytes decode (by a decoder written here) to the picture
computed by hand; `whitney-flows run` without --metrics-out leaves the PNG in the adapter
directory and says where. (The summary artifact's picture is the PNG beside the metrics
file: tests/flows/rl/test_inline_eval.py.)"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from flows.cli.main import main
from flows.core.records.plots import PALETTE, Line, Panel, picture_beside, render_png
from whitney.local import EmbeddedWhitney

BLUE, INK, WHITE = (31, 119, 180), (40, 40, 40), (255, 255, 255)


def decode(png: bytes) -> list[list[tuple[int, int, int]]]:
    """An 8-bit indexed PNG as rows of RGB pixels (filter type 0 only), every CRC checked."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(png):
        (length,) = struct.unpack(">I", png[position : position + 4])
        kind = png[position + 4 : position + 8]
        data = png[position + 8 : position + 8 + length]
        (crc,) = struct.unpack(">I", png[position + 8 + length : position + 12 + length])
        assert crc == zlib.crc32(kind + data), kind
        chunks.append((kind, data))
        position += 12 + length
    assert [kind for kind, _ in chunks][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, color, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color) == (8, 3)
    palette_bytes = next(data for kind, data in chunks if kind == b"PLTE")
    palette = [tuple(palette_bytes[i : i + 3]) for i in range(0, len(palette_bytes), 3)]
    raw = zlib.decompress(b"".join(data for kind, data in chunks if kind == b"IDAT"))
    rows = []
    for row in range(height):
        line = raw[row * (width + 1) : (row + 1) * (width + 1)]
        assert line[0] == 0
        rows.append([palette[index] for index in line[1:]])
    return rows


def test_a_panel_is_drawn_where_the_hand_computation_puts_it() -> None:
    image = decode(render_png([Panel("1", "cycle", [Line("a", [(0.0, 0.0), (1.0, 1.0)])])]))
    assert (len(image[0]), len(image)) == (480, 300)  # one panel, alone in its row
    # the plot area: x from 108 to 480 - 16, y from 30 + 26 (one legend row) to 300 - 44
    assert image[256][108] == BLUE and image[56][464] == BLUE  # (0, 0) and (1, 1)
    assert image[156][286] == BLUE  # the line between them, half way
    assert image[200][300] == WHITE
    # the title "1" at (8, 6), twice the 5x7 glyph: its top row is ..#.. -> x = 8 + 2 * 2
    assert image[6][12] == INK and image[6][8] == WHITE
    assert {pixel for row in image for pixel in row} <= set(PALETTE)


def test_panels_go_two_to_a_row_and_the_bytes_are_deterministic() -> None:
    panels = [Panel(f"p{n}", "x", [Line("y", [(n, n * n)])]) for n in range(3)]
    png = render_png(panels)
    assert png == render_png(panels)
    image = decode(png)
    assert (len(image[0]), len(image)) == (960, 600)
    assert picture_beside(Path("run/metrics.jsonl")) == Path("run/metrics.png")


def test_the_cli_leaves_the_picture_in_the_adapter_directory(
    whitney: EmbeddedWhitney,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    wide_terminal: None,
) -> None:
    adapters = tmp_path / "adapters"
    arguments = ["--cycles", "2", "--base-model", "local/nano", "--api-url", whitney.url]
    assert main(["run", "rl", *arguments, "--adapter-dir", str(adapters)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "Learning curves:" in line]
    picture = Path(line.split("Learning curves: ", 1)[1].strip())
    assert picture.parent == adapters.resolve() and picture.name.endswith("-learning-curves.png")
    assert len(decode(picture.read_bytes())) == 300
