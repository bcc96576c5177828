"""Scenes render deterministically and their captions name what is drawn."""

from __future__ import annotations

import random

import numpy as np

from lait.testkit.scenes import COLORS, POSITIONS, SHAPES, TEXTURES, Scene, Shape, describe, random_scene, render_scene

_CENTER_XY = {"left": (0.19, 0.5), "right": (0.81, 0.5), "top": (0.5, 0.19),
              "bottom": (0.5, 0.81), "center": (0.5, 0.5)}


def test_random_scene_is_valid_and_seeded():
    scenes = [random_scene(random.Random(i)) for i in range(300)]
    assert scenes[:20] == [random_scene(random.Random(i)) for i in range(20)]
    for scene in scenes:
        assert 1 <= len(scene.shapes) <= 3
        assert len({s.position for s in scene.shapes}) == len(scene.shapes)
        assert scene.texture in TEXTURES and scene.background in COLORS
        for s in scene.shapes:
            assert s.kind in SHAPES and s.color in COLORS and s.position in POSITIONS
            assert s.color != scene.background
    # the vocabulary is actually used
    assert {s.kind for sc in scenes for s in sc.shapes} == set(SHAPES)
    assert {sc.texture for sc in scenes} == set(TEXTURES)


def test_render_is_deterministic_rgb_and_seed_dependent():
    scene = random_scene(random.Random(3))
    a = render_scene(scene, 384, 320, seed=1)
    assert a.mode == "RGB" and a.size == (384, 320)
    assert a.tobytes() == render_scene(scene, 384, 320, seed=1).tobytes()
    assert a.tobytes() != render_scene(scene, 384, 320, seed=2).tobytes()


def test_shape_colour_is_visible_at_its_position():
    for kind in ("circle", "square", "triangle", "hexagon", "diamond", "cross", "star"):
        for pos in POSITIONS:
            scene = Scene((Shape(kind, "red", "large", pos),), "blue", "plain")
            img = np.asarray(render_scene(scene, 384, 320, seed=0), np.float32)
            fx, fy = _CENTER_XY[pos]
            patch = img[int(fy * 320) - 3:int(fy * 320) + 4, int(fx * 384) - 3:int(fx * 384) + 4]
            r, g, b = patch.reshape(-1, 3).mean(0)
            assert r > 140 and b < 110, (kind, pos, (r, g, b))


def test_describe_names_every_shape_and_the_background():
    scene = Scene((Shape("circle", "red", "large", "left"),
                   Shape("triangle", "blue", "small", "top")), "yellow", "stripes")
    assert describe(scene) == ("a large red circle on the left and a small blue triangle at "
                               "the top, on a striped yellow background")
    rng = random.Random(0)
    variants = {describe(scene, rng) for _ in range(40)}
    assert len(variants) > 2
    for text in variants:
        for word in ("large red circle on the left", "small blue triangle at the top",
                     "striped", "yellow"):
            assert word in text
    de = describe(scene, lang="de")
    assert "großer roter Kreis links" in de and "gestreiften gelben" in de
    fr = describe(scene, lang="fr")
    assert "grand cercle rouge à gauche" in fr and "fond jaune rayé" in fr
