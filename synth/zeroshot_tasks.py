"""Zero-shot classification tasks of the synthetic world, from its scene graphs: each image shows one object group
(the *main object*, no other group; a sign may stand beside it) whose shape, colour or count is the class. Written in
CLIP_benchmark's wds layout (``zeroshot/<task>/``: ``test/0.tar`` ..., ``classnames.txt``,
``zeroshot_classification_templates.txt``), so ``halsift eval zeroshot`` and ``clip_benchmark eval --dataset
wds/<task>`` read them alike. Labels are drawn uniformly, so chance is 1 / classes."""

from __future__ import annotations

import random
from pathlib import Path

from halsift.corpus.clip_benchmark_wds import write_wds_split
from .render import png_bytes, render
from .scene import COLOURS, SHAPES, Scene, sample_scene

# task -> (class values, class names, prompt templates); the templates use the words of the world's captions
TASKS: dict[str, tuple[tuple, tuple[str, ...], tuple[str, ...]]] = {
    "shape": (SHAPES, SHAPES, ("a {c}.", "a photo of a {c}.", "a picture with a {c} in it.", "a {c} on a background.")),
    "colour": (tuple(COLOURS), tuple(COLOURS), ("a {c} shape.", "a {c} object.", "a photo of a {c} shape.",
                                                "a picture with something {c} in it.")),
    "count": ((1, 2, 3), ("one shape", "two shapes", "three shapes"), ("{c}.", "a photo of {c}.",
                                                                       "a picture with {c} in it.")),
}


def zeroshot_scene(seed: int, task: str, index: int) -> tuple[Scene, int, random.Random]:
    """The ``index``-th image of ``task``: a one-group scene whose ``task`` attribute is class ``label``."""
    rng = random.Random(f"{seed}/zeroshot-{task}/{index}")
    scene = sample_scene(rng, n_groups=(1, 1), sign_p=0.3)
    values = TASKS[task][0]
    label = rng.randrange(len(values))
    g = scene.groups[0]
    if task == "shape":
        g.shape = values[label]
    elif task == "colour":
        g.colour = values[label]
    else:
        g.size, g.count = "small", values[label]
    return scene, label, rng


def write_zeroshot_tasks(out: Path, seed: int, n: int, image_size: int, bar=None) -> dict[str, int]:
    """Write every task of :data:`TASKS` with ``n`` images under ``out/<task>``; returns images per task."""
    for task, (_, names, templates) in TASKS.items():
        def samples(task=task):
            for i in range(n):
                scene, label, rng = zeroshot_scene(seed, task, i)
                img = png_bytes(render(scene, image_size, seed=rng.randrange(2**31)))
                if bar is not None:
                    bar.update()
                yield {"__key__": f"s{i:07d}", "png": img, "cls": str(label).encode()}

        write_wds_split(out / task, "test", samples(), "classification")
        (out / task / "classnames.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
        (out / task / "zeroshot_classification_templates.txt").write_text("\n".join(templates) + "\n",
                                                                          encoding="utf-8")
    return {task: n for task in TASKS}
