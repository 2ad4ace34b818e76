"""The icon's pixels: the fill level follows VRAM use, the colour follows the state."""

from __future__ import annotations

from pathlib import Path

import pytest

from tray.icon import COLOURS, RADIUS, SIZE, gauge_box, render, tile_box
from tray.view import STATES, IconView

DOCS = Path(__file__).resolve().parents[2] / "docs" / "icons"


def pixels(image) -> list[tuple[int, int, int, int]]:
    width, height = image.size
    return [image.getpixel((x, y)) for y in range(height) for x in range(width)]


def filled_rows(image, colour) -> int:
    """Rows of the centre column, counted up from the bottom, in the state's colour."""
    left, top, right, bottom = gauge_box()
    x = (left + right) // 2
    rows = 0
    for y in range(bottom - 1, top - 1, -1):
        if image.getpixel((x, y)) != colour:
            break
        rows += 1
    return rows


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9])
def test_fill_level_is_proportional_to_vram_use(fraction):
    image = render(IconView("ready", fraction, 0))
    _, top, _, bottom = gauge_box()
    assert filled_rows(image, COLOURS["ready"]) == round((bottom - top) * fraction)


def test_a_full_gauge_fills_the_tile_up_to_the_stripe():
    image = render(IconView("busy", 1.0, 0))
    _, top, _, bottom = gauge_box()
    assert filled_rows(image, COLOURS["busy"]) == bottom - top


@pytest.mark.parametrize("state", STATES)
def test_colour_follows_the_state(state, request):
    image = render(IconView(state, 0.6, 2 if state in ("busy", "overloaded") else 0))
    left, top, right, bottom = tile_box()
    assert image.getpixel(((left + right) // 2, top + 2)) == COLOURS[state]  # the stripe
    assert image.getpixel((left + RADIUS, bottom - 3)) == COLOURS[state]  # the level
    others = {c for s, c in COLOURS.items() if s != state}
    assert not others & set(pixels(image))
    if request.config.getoption("--update-docs"):
        DOCS.mkdir(parents=True, exist_ok=True)
        image.save(DOCS / f"{state}.png")


def test_queued_count_is_drawn_in_white():
    empty = render(IconView("busy", 0.5, 0))
    queued = render(IconView("busy", 0.5, 7))
    white = (255, 255, 255, 255)
    assert white not in set(pixels(empty))
    assert pixels(queued).count(white) > 20


def test_corners_stay_transparent_and_size_is_fixed():
    image = render(IconView("ready", 1.0, 0))
    assert image.size == (SIZE, SIZE) and image.mode == "RGBA"
    assert image.getpixel((0, 0))[3] == 0 and image.getpixel((SIZE - 1, SIZE - 1))[3] == 0
