"""The tray icon, drawn with Pillow: a tile whose fill level is the VRAM in use, in the
colour of the server's state, with the number of waiting requests on top."""

from __future__ import annotations

from PIL import Image, ImageChops, ImageDraw, ImageFont

from tray.view import IconView

SIZE = 64
MARGIN = 2  # transparent border around the tile
RADIUS = 10
BACKGROUND = (40, 46, 54, 255)
TEXT = (255, 255, 255, 255)
COLOURS: dict[str, tuple[int, int, int, int]] = {
    "starting": (56, 139, 253, 255),
    "ready": (46, 160, 67, 255),
    "busy": (210, 153, 34, 255),
    "overloaded": (218, 54, 51, 255),
    "paused": (139, 148, 158, 255),
    "error": (163, 21, 87, 255),
}


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for name in ("DejaVuSans-Bold.ttf", "arialbd.ttf", "Arial Bold.ttf"):
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


def tile_box(size: int = SIZE) -> tuple[int, int, int, int]:
    """The rounded tile (left, top, right, bottom), exclusive of right and bottom."""
    return (MARGIN, MARGIN, size - MARGIN, size - MARGIN)


def stripe_height(size: int = SIZE) -> int:
    return size // 8


def gauge_box(size: int = SIZE) -> tuple[int, int, int, int]:
    """The part of the tile below the state stripe that the VRAM level fills."""
    left, top, right, bottom = tile_box(size)
    return (left, top + stripe_height(size) + 1, right, bottom)


def render(view: IconView, size: int = SIZE) -> Image.Image:
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = tile_box(size)
    colour = COLOURS.get(view.state, COLOURS["error"])
    draw.rounded_rectangle((left, top, right - 1, bottom - 1), RADIUS, fill=BACKGROUND)
    # A state stripe along the top, so the state shows even at an empty gauge.
    draw.rounded_rectangle(
        (left, top, right - 1, top + stripe_height(size)), RADIUS // 2, fill=colour
    )
    _, gauge_top, _, _ = gauge_box(size)
    level = round((bottom - gauge_top) * max(0.0, min(1.0, view.vram_fraction)))
    if level:
        # The level is a rectangle clipped to the tile's rounded shape.
        tile = Image.new("L", (size, size), 0)
        ImageDraw.Draw(tile).rounded_rectangle((left, top, right - 1, bottom - 1), RADIUS, fill=255)
        layer = Image.new("RGBA", (size, size), (0, 0, 0, 0))
        ImageDraw.Draw(layer).rectangle((left, bottom - level, right - 1, bottom - 1), fill=colour)
        layer.putalpha(ImageChops.multiply(layer.getchannel("A"), tile))
        image.alpha_composite(layer)
    if view.queued:
        _queued(draw, view.queued, size)
    return image


def _queued(draw: ImageDraw.ImageDraw, queued: int, size: int) -> None:
    label = str(queued) if queued < 100 else "99+"
    font = _font(size // 2 if len(label) < 3 else size // 3)
    box = draw.textbbox((0, 0), label, font=font, stroke_width=2)
    x = (size - (box[2] - box[0])) // 2 - box[0]
    y = (size - (box[3] - box[1])) // 2 - box[1] + size // 16
    draw.text((x, y), label, font=font, fill=TEXT, stroke_width=2, stroke_fill=(0, 0, 0, 255))
