"""Draw a scene graph with Pillow (no antialiasing, no fonts beyond PIL's default: fast and deterministic)."""

from __future__ import annotations

import io
import math
import random
from functools import lru_cache

from PIL import Image, ImageDraw, ImageFont

from .scene import BACKGROUNDS, COLOURS, Group, Scene, cell_rc

_DIR_VEC = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@lru_cache(maxsize=16)
def _font(px: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=px)


def _shade(rgb: tuple[int, int, int], d: int) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + d)) for c in rgb)


def _background(draw: ImageDraw.ImageDraw, scene: Scene, size: int, rng: random.Random) -> None:
    base = BACKGROUNDS[scene.background]
    draw.rectangle([0, 0, size, size], fill=base)
    if scene.domain == "patterned":
        step = max(4, size // 8)
        dark = _shade(base, -30)
        if scene.pattern == "striped":
            for y in range(0, size, step * 2):
                draw.rectangle([0, y, size, y + step - 1], fill=dark)
        else:
            for y in range(0, size, step):
                for x in range((y // step) % 2 * step, size, step * 2):
                    draw.rectangle([x, y, x + step - 1, y + step - 1], fill=dark)
    elif scene.domain == "illustration":
        top, bottom = (120, 190, 245), (150, 215, 140)
        for y in range(size):
            t = y / max(1, size - 1)
            draw.line([0, y, size, y], fill=tuple(int(a + (b - a) * t) for a, b in zip(top, bottom)))
    elif scene.domain == "text-heavy":
        font = _font(max(6, size // 10))
        step = max(6, size // 8)
        ink = _shade(base, -45)
        for y in range(0, size, step):
            line = "".join(rng.choice(_LETTERS) for _ in range(size // max(4, step // 2)))
            draw.text((0, y), line, fill=ink, font=font)


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.8, cy), (cx, cy + r), (cx - r * 0.8, cy)]
    if shape == "hexagon":
        return [(cx + r * math.cos(math.pi / 3 * k), cy + r * math.sin(math.pi / 3 * k)) for k in range(6)]
    if shape == "star":
        pts = []
        for k in range(10):
            rr = r if k % 2 == 0 else r * 0.45
            a = -math.pi / 2 + math.pi / 5 * k
            pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
        return pts
    return None


def _draw_one(draw: ImageDraw.ImageDraw, g: Group, cx: float, cy: float, r: float, outline) -> None:
    fill = COLOURS[g.colour]
    ink = (245, 245, 245) if g.colour == "black" else (20, 20, 20)
    dx, dy = _DIR_VEC[g.facing]
    # the facing pointer: a dark wedge sticking out of the shape in the facing direction
    tip = (cx + dx * r * 1.45, cy + dy * r * 1.45)
    base = r * 0.5
    b1 = (cx + dx * r * 0.7 - dy * base, cy + dy * r * 0.7 + dx * base)
    b2 = (cx + dx * r * 0.7 + dy * base, cy + dy * r * 0.7 - dx * base)
    draw.polygon([tip, b1, b2], fill=(20, 20, 20) if g.colour != "black" else (90, 90, 90))
    poly = _polygon(g.shape, cx, cy, r)
    if poly is not None:
        draw.polygon(poly, fill=fill, outline=outline)
    elif g.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill, outline=outline)
    else:  # square
        s = r * 0.85
        draw.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill, outline=outline)
    # an eye on the facing side makes the direction readable even on tiny shapes
    e = max(1.0, r * 0.2)
    ex, ey = cx + dx * r * 0.4, cy + dy * r * 0.4
    draw.ellipse([ex - e, ey - e, ex + e, ey + e], fill=ink)


_OFFSETS = {1: [(0.0, 0.0)], 2: [(-0.5, 0.0), (0.5, 0.0)], 3: [(-0.5, -0.45), (0.5, -0.45), (0.0, 0.5)]}


def _draw_group(draw: ImageDraw.ImageDraw, g: Group, cell_px: float, outline) -> None:
    row, col = cell_rc(g.cell)
    cx, cy = (col + 0.5) * cell_px, (row + 0.5) * cell_px
    r = cell_px * (0.3 if g.size == "large" else 0.17)
    offsets = _OFFSETS.get(g.count) or [((k % 3) * 0.6 - 0.6, (k // 3) * 0.6 - 0.3) for k in range(g.count)]
    for ox, oy in offsets:
        _draw_one(draw, g, cx + ox * cell_px * 0.5, cy + oy * cell_px * 0.5, r, outline)


def _draw_sign(draw: ImageDraw.ImageDraw, scene: Scene, cell_px: float, size: int) -> None:
    sign = scene.sign
    row, col = cell_rc(sign.cell)
    cx, cy = (col + 0.5) * cell_px, (row + 0.5) * cell_px
    font = _font(max(6, round(size * 0.13)))
    x0, y0, x1, y1 = draw.textbbox((0, 0), sign.text, font=font)
    w, h = x1 - x0 + 4, y1 - y0 + 4
    left = min(max(0, cx - w / 2), size - w - 1)
    top = min(max(0, cy - h / 2), size - h - 1)
    draw.rectangle([left, top, left + w, top + h], fill=(252, 252, 252), outline=(20, 20, 20))
    draw.text((left + 2 - x0, top + 2 - y0), sign.text, fill=(10, 10, 10), font=font)


def render(scene: Scene, size: int = 64, seed: int = 0) -> Image.Image:
    """Render ``scene`` as a ``size`` x ``size`` RGB image; ``seed`` only varies background texture."""
    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    _background(draw, scene, size, random.Random(seed))
    cell_px = size / 3
    outline = (15, 15, 15) if scene.domain == "illustration" else None
    for g in scene.groups:
        _draw_group(draw, g, cell_px, outline)
    if scene.sign is not None:
        _draw_sign(draw, scene, cell_px, size)
    return img


def png_bytes(img: Image.Image) -> bytes:
    """Deterministic PNG bytes (no metadata, fixed compression)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=6)
    return buf.getvalue()
