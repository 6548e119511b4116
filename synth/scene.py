"""Scene graphs of the synthetic world: the ground truth that images are rendered from and captions are checked against.

A scene is a 3x3 grid holding 2-4 *object groups* (shape, colour, size, count, cell, facing direction), at most
one *sign* with a short word on it, and a background *domain* (plain, patterned, illustration, text-heavy).
Relations between groups follow from their cells. Every (shape, colour) pair is unique in a scene, so "the red
triangle" always names one group and a caption can be checked against the graph.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace

SHAPES = ("circle", "square", "triangle", "star", "diamond", "hexagon")
SHAPE_PLURALS = {s: s + "s" for s in SHAPES}
COLOURS = {  # saturated colours that stand out on every (light) background
    "red": (215, 38, 38), "green": (34, 160, 60), "blue": (35, 75, 215), "yellow": (240, 200, 20),
    "purple": (135, 45, 175), "orange": (245, 125, 20), "black": (25, 25, 25),
}
SIZES = ("small", "large")
DIRECTIONS = ("left", "right", "up", "down")
OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight",
                9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
# cell -> (preposition, location words); cells are numbered row-major, 0 = top left
CELLS = (("in the", "top left corner"), ("at the", "top"), ("in the", "top right corner"),
         ("on the", "left"), ("in the", "center"), ("on the", "right"),
         ("in the", "bottom left corner"), ("at the", "bottom"), ("in the", "bottom right corner"))
DOMAINS = ("plain", "patterned", "illustration", "text-heavy")
BACKGROUNDS = {  # light tones, never confused with an object colour
    "light grey": (214, 214, 214), "beige": (236, 226, 198), "pale blue": (200, 222, 240),
    "pale green": (208, 234, 206), "pale pink": (242, 214, 222), "white": (250, 250, 250),
}
PATTERNS = ("striped", "checkered")
SIGN_WORDS = ("OPEN", "STOP", "SALE", "EXIT", "CAFE", "BUS", "INN", "TAXI", "BAR", "ZOO", "PARK", "SHOP",
              "HOTEL", "BANK", "GATE", "FOOD")


@dataclass
class Group:
    """``count`` copies of one shape in one grid cell, all facing the same way."""

    shape: str
    colour: str
    size: str
    count: int
    cell: int
    facing: str
    id: int = 0  # stable identity: t2i generators keep it when they alter a group


@dataclass
class Sign:
    """A small sign with a word on it."""

    text: str
    cell: int


@dataclass
class Scene:
    """The ground truth of one image."""

    domain: str
    background: str  # key of BACKGROUNDS
    pattern: str = ""  # "striped" / "checkered" for the patterned domain
    groups: list[Group] = field(default_factory=list)
    sign: Sign | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["relations"] = [[i, rel, j] for i, rel, j in relations(self)]
        return d

    def copy(self) -> "Scene":
        return replace(self, groups=[replace(g) for g in self.groups],
                       sign=replace(self.sign) if self.sign else None)

    @property
    def n_shapes(self) -> int:
        return sum(g.count for g in self.groups)

    def used_cells(self) -> set[int]:
        cells = {g.cell for g in self.groups}
        if self.sign is not None:
            cells.add(self.sign.cell)
        return cells


def background_words(scene: Scene) -> str:
    """How a correct caption describes the background, e.g. 'plain pale blue' or 'text-covered'."""
    if scene.domain == "plain":
        return f"plain {scene.background}"
    if scene.domain == "patterned":
        return f"{scene.pattern} {scene.background}"
    if scene.domain == "illustration":
        return "painted gradient"
    return "text-covered"


def wrong_background_words(scene: Scene, rng: random.Random) -> str:
    """A background description that does not fit ``scene`` (an 'Other' hallucination)."""
    options = [f"plain {b}" for b in BACKGROUNDS] + [f"{p} {b}" for p in PATTERNS for b in BACKGROUNDS]
    options += ["painted gradient", "text-covered"]
    right = background_words(scene)
    # a wrong description must differ in kind, not only in a shade of the same domain
    kind = right.split()[0]
    return rng.choice([o for o in options if o.split()[0] != kind])


def cell_rc(cell: int) -> tuple[int, int]:
    return divmod(cell, 3)


def relation(a: Group, b: Group) -> str:
    """Where ``a`` is relative to ``b``: a horizontal relation wins over a vertical one."""
    (ra, ca), (rb, cb) = cell_rc(a.cell), cell_rc(b.cell)
    if ca != cb:
        return "to the left of" if ca < cb else "to the right of"
    return "above" if ra < rb else "below"


REL_OPPOSITE = {"to the left of": "to the right of", "to the right of": "to the left of",
                "above": "below", "below": "above"}


def relations(scene: Scene) -> list[tuple[int, str, int]]:
    """Pairwise relations between groups (index, relation, index) for i < j."""
    gs = scene.groups
    return [(i, relation(gs[i], gs[j]), j) for i in range(len(gs)) for j in range(i + 1, len(gs))]


def sample_scene(rng: random.Random, *, n_groups: tuple[int, int] = (2, 4), sign_p: float = 0.6,
                 domain: str | None = None) -> Scene:
    """Draw a random scene: unique (shape, colour) per group, distinct cells, 1-3 copies per small group."""
    domain = domain or rng.choice(DOMAINS)
    background = rng.choice(list(BACKGROUNDS))
    pattern = rng.choice(PATTERNS) if domain == "patterned" else ""
    n = rng.randint(*n_groups)
    cells = rng.sample(range(9), n + 1)
    pairs = rng.sample([(s, c) for s in SHAPES for c in COLOURS], n)
    groups = []
    for gid, ((shape, colour), cell) in enumerate(zip(pairs, cells)):
        size = rng.choice(SIZES)
        count = 1 if size == "large" else rng.choice((1, 2, 3))
        groups.append(Group(shape, colour, size, count, cell, rng.choice(DIRECTIONS), id=gid))
    sign = None
    if domain == "text-heavy" or rng.random() < sign_p:
        sign = Sign(rng.choice(SIGN_WORDS), cells[n])
    return Scene(domain, background, pattern, groups, sign)
