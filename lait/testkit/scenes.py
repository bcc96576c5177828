"""Synthetic photo-like scenes with exact captions.

A :class:`Scene` is a few coloured shapes at named positions on a textured background.
:func:`render_scene` draws it as a noisy, shaded RGB image and :func:`describe` writes an
English (or German / French) caption naming every shape's size, colour, kind and position
and the background. Because the caption is exact, a tiny CLIP or ImageBERT trained on these
pairs can learn colour, shape and position, and every pipeline stage can be checked against
the truth.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SHAPES: tuple[str, ...] = (
    "circle", "square", "triangle", "star", "ring", "cross", "diamond", "hexagon",
)
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (214, 40, 40),
    "blue": (40, 80, 210),
    "green": (40, 160, 60),
    "yellow": (240, 215, 40),
    "orange": (245, 135, 20),
    "purple": (130, 50, 170),
    "pink": (245, 140, 190),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "brown": (120, 75, 35),
    "gray": (130, 130, 130),
    "cyan": (40, 200, 215),
}
SIZES: tuple[str, ...] = ("small", "large")
POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom", "center")
TEXTURES: tuple[str, ...] = ("plain", "stripes", "dots", "grid", "noise", "checks", "gradient")

# Shape centres as fractions of (width, height); radii as fractions of the short side.
# Chosen so that two large shapes at neighbouring positions do not overlap at 384x320.
_CENTERS = {
    "left": (0.19, 0.5), "right": (0.81, 0.5), "top": (0.5, 0.19),
    "bottom": (0.5, 0.81), "center": (0.5, 0.5),
}
_RADIUS = {"small": 0.085, "large": 0.15}


@dataclass(frozen=True)
class Shape:
    """One coloured shape of a scene."""

    kind: str
    color: str
    size: str
    position: str


@dataclass(frozen=True)
class Scene:
    """A background with 1-3 shapes at distinct positions."""

    shapes: tuple[Shape, ...]
    background: str
    texture: str


def random_scene(rng: random.Random) -> Scene:
    """Draw a scene: 1-3 shapes at distinct positions, none coloured like the background."""
    background = rng.choice(list(COLORS))
    texture = rng.choice(TEXTURES)
    n = rng.choice((1, 1, 2, 2, 2, 3))
    positions = rng.sample(POSITIONS, n)
    shape_colors = [c for c in COLORS if c != background]
    shapes = tuple(
        Shape(rng.choice(SHAPES), rng.choice(shape_colors), rng.choice(SIZES), pos)
        for pos in positions
    )
    return Scene(shapes, background, texture)


# ---------------------------------------------------------------------------------------
# Rendering


def _scene_seed(scene: Scene, width: int, height: int, seed: int) -> int:
    # repr() of frozen dataclasses of str is stable across processes, unlike hash().
    return zlib.crc32(f"{scene!r}|{width}|{height}|{seed}".encode())


def _shade(rgb: tuple[int, int, int]) -> np.ndarray:
    """A contrasting shade of a colour for texture strokes (darker on light, lighter on dark)."""
    c = np.asarray(rgb, np.float32)
    lum = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
    return c * 0.72 if lum > 110 else c + (255 - c) * 0.3


def _background(scene: Scene, w: int, h: int, rs: np.random.Generator) -> np.ndarray:
    base = np.asarray(COLORS[scene.background], np.float32)
    alt = _shade(COLORS[scene.background])
    yy, xx = np.ogrid[0:h, 0:w]
    yy, xx = yy.astype(np.float32), xx.astype(np.float32)
    period = float(rs.integers(18, 30))
    angle = float(rs.uniform(0, math.pi))
    t = scene.texture
    if t == "stripes":
        u = xx * math.cos(angle) + yy * math.sin(angle)
        mask = (u % period) < period / 2
    elif t == "dots":
        mask = ((xx % period) - period / 2) ** 2 + ((yy % period) - period / 2) ** 2 < (period / 4) ** 2
    elif t == "grid":
        mask = ((xx % period) < 3) | ((yy % period) < 3)
    elif t == "checks":
        mask = ((xx // period + yy // period) % 2) == 1
    else:
        mask = np.zeros((h, w), bool)
    img = np.where(np.broadcast_to(mask, (h, w))[..., None], alt, base)
    if t == "noise":
        img = img + rs.standard_normal((h, w, 1), dtype=np.float32) * 28
    if t == "gradient":
        g = (xx * math.cos(angle) + yy * math.sin(angle)) / max(w, h)
        img = base + (alt - base) * np.clip(g, 0, 1)[..., None]
    return img


def _polygon(kind: str, cx: float, cy: float, r: float, rot: float) -> list[tuple[float, float]]:
    def ring(n: int, radius: float, offset: float) -> list[tuple[float, float]]:
        return [
            (cx + radius * math.cos(offset + rot + 2 * math.pi * k / n),
             cy + radius * math.sin(offset + rot + 2 * math.pi * k / n))
            for k in range(n)
        ]

    if kind == "square":
        return ring(4, r * 1.2, math.pi / 4)
    if kind == "triangle":
        return ring(3, r * 1.15, -math.pi / 2)
    if kind == "diamond":
        return [(cx, cy - r * 1.2), (cx + r * 0.8, cy), (cx, cy + r * 1.2), (cx - r * 0.8, cy)]
    if kind == "hexagon":
        return ring(6, r * 1.05, 0.0)
    if kind == "star":
        outer, inner = ring(5, r * 1.2, -math.pi / 2), ring(5, r * 0.5, -math.pi / 2 + math.pi / 5)
        return [p for pair in zip(outer, inner) for p in pair]
    if kind == "cross":
        a, b = r, r * 0.36
        pts = [(-b, -a), (b, -a), (b, -b), (a, -b), (a, b), (b, b), (b, a), (-b, a), (-b, b),
               (-a, b), (-a, -b), (-b, -b)]
        return [(cx + x, cy + y) for x, y in pts]
    raise ValueError(f"not a polygon shape: {kind}")


def _draw_shape(draw: ImageDraw.ImageDraw, shape: Shape, w: int, h: int, rng: random.Random) -> None:
    fx, fy = _CENTERS[shape.position]
    r = _RADIUS[shape.size] * min(w, h)
    # Small jitter so that equal scenes still look like different photos per seed.
    cx = fx * w + rng.uniform(-0.02, 0.02) * w
    cy = fy * h + rng.uniform(-0.02, 0.02) * h
    fill = COLORS[shape.color]
    outline = tuple(int(v) for v in _shade(fill))
    box = (cx - r, cy - r, cx + r, cy + r)
    width = max(2, int(r * 0.08))
    if shape.kind == "circle":
        draw.ellipse(box, fill=fill, outline=outline, width=width)
    elif shape.kind == "ring":
        draw.ellipse(box, outline=fill, width=max(4, int(r * 0.35)))
    else:
        rot = rng.uniform(-0.12, 0.12) if shape.kind != "cross" else 0.0
        draw.polygon(_polygon(shape.kind, cx, cy, r, rot), fill=fill, outline=outline, width=width)


def render_scene(scene: Scene, width: int = 384, height: int = 320, seed: int = 0) -> Image.Image:
    """Render a scene as a photo-like RGB image, deterministic for (scene, size, seed).

    The background carries the texture, a lighting gradient and a vignette; the whole
    image gets sensor-like noise so that re-encodes differ a little, as real photos do.
    """
    s = _scene_seed(scene, width, height, seed)
    rs = np.random.default_rng(s)
    rng = random.Random(s)
    bg = _background(scene, width, height, rs)
    img = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for shape in scene.shapes:
        _draw_shape(draw, shape, width, height, rng)
    arr = np.asarray(img, np.float32)
    yy, xx = np.ogrid[0:height, 0:width]
    yy, xx = yy.astype(np.float32), xx.astype(np.float32)
    lx, ly = rs.uniform(0, width), rs.uniform(0, height)
    dist = np.sqrt((xx - lx) ** 2 + (yy - ly) ** 2) / math.hypot(width, height)
    light = 1.08 - 0.25 * dist  # a soft light source somewhere in the frame
    # Luminance noise plus a little per-channel noise: photo-like and cheap to draw.
    noise = rs.standard_normal((height, width, 1), dtype=np.float32) * 5
    arr *= light[..., None]
    arr += noise
    arr += rs.integers(-3, 4, arr.shape, dtype=np.int8)
    np.clip(arr, 0, 255, out=arr)
    return Image.fromarray(arr.astype(np.uint8), "RGB")


# ---------------------------------------------------------------------------------------
# Captions

_EN_POS = {"left": "on the left", "right": "on the right", "top": "at the top",
           "bottom": "at the bottom", "center": "in the center"}
_EN_TEX = {"plain": "plain", "stripes": "striped", "dots": "dotted", "grid": "grid-patterned",
           "noise": "speckled", "checks": "checkered", "gradient": "shaded"}
_EN_TEMPLATES = (
    "{shapes}, on a {tex} {bg} background",
    "a {tex} {bg} background with {shapes}",
    "photo of {shapes} against a {tex} {bg} backdrop",
    "{shapes} on a {bg} {tex} background",
)

# German nouns with gender (m/f/n) drive the adjective endings.
_DE_SHAPES = {"circle": ("Kreis", "m"), "square": ("Quadrat", "n"), "triangle": ("Dreieck", "n"),
              "star": ("Stern", "m"), "ring": ("Ring", "m"), "cross": ("Kreuz", "n"),
              "diamond": ("Raute", "f"), "hexagon": ("Sechseck", "n")}
_DE_COLORS = {"red": "rot", "blue": "blau", "green": "grün", "yellow": "gelb",
              "orange": "orangefarben", "purple": "violett", "pink": "rosafarben",
              "white": "weiß", "black": "schwarz", "brown": "braun", "gray": "grau",
              "cyan": "türkis"}
_DE_SIZES = {"small": "klein", "large": "groß"}
_DE_POS = {"left": "links", "right": "rechts", "top": "oben", "bottom": "unten",
           "center": "in der Mitte"}
_DE_TEX = {"plain": "einfarbig", "stripes": "gestreift", "dots": "gepunktet",
           "grid": "gerastert", "noise": "gesprenkelt", "checks": "kariert",
           "gradient": "schattiert"}
_DE_TEMPLATES = ("{shapes}, auf einem {tex}en {bg}en Hintergrund",
                 "Foto: {shapes} vor einem {tex}en {bg}en Hintergrund")

_FR_SHAPES = {"circle": ("cercle", "m"), "square": ("carré", "m"), "triangle": ("triangle", "m"),
              "star": ("étoile", "f"), "ring": ("anneau", "m"), "cross": ("croix", "f"),
              "diamond": ("losange", "m"), "hexagon": ("hexagone", "m")}
_FR_COLORS = {"red": ("rouge", "rouge"), "blue": ("bleu", "bleue"), "green": ("vert", "verte"),
              "yellow": ("jaune", "jaune"), "orange": ("orange", "orange"),
              "purple": ("violet", "violette"), "pink": ("rose", "rose"),
              "white": ("blanc", "blanche"), "black": ("noir", "noire"),
              "brown": ("marron", "marron"), "gray": ("gris", "grise"), "cyan": ("cyan", "cyan")}
_FR_SIZES = {"small": ("petit", "petite"), "large": ("grand", "grande")}
_FR_POS = {"left": "à gauche", "right": "à droite", "top": "en haut", "bottom": "en bas",
           "center": "au centre"}
_FR_TEX = {"plain": "uni", "stripes": "rayé", "dots": "à pois", "grid": "quadrillé",
           "noise": "moucheté", "checks": "à damier", "gradient": "dégradé"}
_FR_TEMPLATES = ("{shapes}, sur un fond {bg} {tex}", "photo : {shapes} sur un fond {bg} {tex}")


def _join(parts: list[str], conj: str) -> str:
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + f" {conj} " + parts[-1]


def _en_shape(s: Shape) -> str:
    return f"a {s.size} {s.color} {s.kind} {_EN_POS[s.position]}"


def _de_shape(s: Shape) -> str:
    noun, g = _DE_SHAPES[s.kind]
    art, end = {"m": ("ein", "er"), "f": ("eine", "e"), "n": ("ein", "es")}[g]
    return f"{art} {_DE_SIZES[s.size]}{end} {_DE_COLORS[s.color]}{end} {noun} {_DE_POS[s.position]}"


def _fr_shape(s: Shape) -> str:
    noun, g = _FR_SHAPES[s.kind]
    i = 0 if g == "m" else 1
    art = "un" if g == "m" else "une"
    return f"{art} {_FR_SIZES[s.size][i]} {noun} {_FR_COLORS[s.color][i]} {_FR_POS[s.position]}"


def describe(scene: Scene, rng: random.Random | None = None, lang: str = "en") -> str:
    """Caption a scene: every shape's size, colour, kind and position, then the background.

    Without ``rng`` the wording is fixed (the first template, shapes in scene order); with
    ``rng`` the template and shape order vary while the content stays the same. ``lang`` is
    "en", "de" or "fr".
    """
    shapes = list(scene.shapes)
    template_index = 0
    if rng is not None:
        rng.shuffle(shapes)
    if lang == "en":
        templates = _EN_TEMPLATES
        if rng is not None:
            template_index = rng.randrange(len(templates))
        text = templates[template_index].format(
            shapes=_join([_en_shape(s) for s in shapes], "and"),
            tex=_EN_TEX[scene.texture], bg=scene.background)
    elif lang == "de":
        templates = _DE_TEMPLATES
        if rng is not None:
            template_index = rng.randrange(len(templates))
        text = templates[template_index].format(
            shapes=_join([_de_shape(s) for s in shapes], "und"),
            tex=_DE_TEX[scene.texture], bg=_DE_COLORS[scene.background])
    elif lang == "fr":
        templates = _FR_TEMPLATES
        if rng is not None:
            template_index = rng.randrange(len(templates))
        text = templates[template_index].format(
            shapes=_join([_fr_shape(s) for s in shapes], "et"),
            tex=_FR_TEX[scene.texture], bg=_FR_COLORS[scene.background][0])
    else:
        raise ValueError(f"unsupported caption language: {lang!r}")
    return text[0].upper() + text[1:] if lang == "de" else text
