"""Zero-shot classification sets, read from a local folder in one of two layouts:

* CLIP_benchmark's WebDataset layout (its ``wds/NAME`` datasets, read as ``build_wds_dataset`` of CLIP_benchmark
  1.6 reads them)::

      DIR/classnames.txt                           one class name per line (label i = line i)
      DIR/zeroshot_classification_templates.txt    one prompt per line, ``{c}`` where the class name goes
      DIR/<split>/nshards.txt                      the number of shards N
      DIR/<split>/0.tar ... N-1.tar                samples: <key>.webp|png|jpg|jpeg + <key>.cls (the label)

* an ImageFolder (torchvision's): ``DIR/<class folder>/<image>``, classes in sorted folder order, with the class
  names in ``DIR/classnames.txt`` (one per folder, in that order; absent: the folder names) and the prompts in
  ``DIR/zeroshot_classification_templates.txt``.

``classnames`` / ``templates`` arguments name other files for either layout. Lines are stripped, as CLIP_benchmark
reads them. A problem (a missing file, an empty class list, a label out of range) is a
:class:`ClassificationFormatError` naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.errors import InputError
from halsift.corpus.shards import ShardFormatError, shard_parts

CLASSNAMES_FILE = "classnames.txt"
TEMPLATES_FILE = "zeroshot_classification_templates.txt"
WDS_IMAGE_EXTS = ("webp", "png", "jpg", "jpeg")  # CLIP_benchmark's to_tuple order: the first present is the image
FOLDER_IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's


class ClassificationFormatError(InputError):
    """A classification set that cannot be read; the message names the file."""


@dataclass
class ClassificationSet:
    """Class names, prompt templates and where the labelled images are (read lazily by :meth:`iter_items`)."""

    root: Path
    layout: str  # "wds" | "imagefolder"
    classnames: list[str]
    templates: list[str]
    shards: list[Path]  # wds: the split's shards, in order
    files: list[tuple[Path, int]]  # imagefolder: (image, label)

    @property
    def name(self) -> str:
        return self.root.name or "classification"

    def prompts(self, classname: str) -> list[str]:
        """The templates filled with ``classname`` (``template.format(c=classname)``, as CLIP_benchmark does)."""
        return [t.format(c=classname) for t in self.templates]

    def iter_items(self) -> Iterator[tuple[str, bytes | Path, int]]:
        """``(name, image bytes or path, label)`` in dataset order; a bad sample raises, naming shard and key."""
        if self.layout == "imagefolder":
            for path, label in self.files:
                yield str(path), path, label
            return
        for shard in self.shards:
            for key, members in _tar_samples(shard):
                where = f"{shard}: sample {key!r}"
                ext = next((e for e in WDS_IMAGE_EXTS if e in members), None)
                if ext is None:
                    raise ClassificationFormatError(f"{where}: no image (expected one of "
                                                    f".{', .'.join(WDS_IMAGE_EXTS)})")
                if "cls" not in members:
                    raise ClassificationFormatError(f"{where}: no .cls label")
                try:
                    label = int(members["cls"].decode("utf-8").strip())
                except ValueError:
                    raise ClassificationFormatError(f"{where}: .cls is not an integer label") from None
                if not 0 <= label < len(self.classnames):
                    raise ClassificationFormatError(f"{where}: label {label} is not in [0, {len(self.classnames)}) "
                                                    f"(the classes of {CLASSNAMES_FILE})")
                yield f"{shard.name}/{key}.{ext}", members[ext], label


def _tar_samples(shard: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Samples of a webdataset shard (the shard reader's grouping: :func:`~halsift.corpus.shards.shard_parts`)."""
    try:
        yield from shard_parts(shard)
    except (ShardFormatError, OSError) as e:
        raise ClassificationFormatError(str(e) if isinstance(e, ShardFormatError)
                                        else f"{shard}: not a readable tar ({e})") from None


def read_lines(path: Path, what: str) -> list[str]:
    """The stripped lines of ``path`` (``what`` names the file's role in the error)."""
    if not path.is_file():
        raise ClassificationFormatError(f"{path}: missing ({what}, one per line)")
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise ClassificationFormatError(f"{path}: cannot read ({e})") from None
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise ClassificationFormatError(f"{path}: empty (expected {what}, one per line)")
    if "" in lines:
        raise ClassificationFormatError(f"{path}:{lines.index('') + 1}: empty line (expected {what}, one per line)")
    return lines


def _templates(path: Path) -> list[str]:
    """The templates of ``path``; each field must be the plain ``{c}`` (a format spec such as ``{c:>8}`` is fine):
    no other name, no attribute access (``{c.__class__}``) or index (``{c[0]}``), so that a template file can only
    place the class name."""
    import string

    lines = read_lines(path, "prompt templates with {c} where the class name goes")
    for i, t in enumerate(lines, 1):
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(t) if f is not None]
            bad = next((f for f in fields if f != "c"), None)
            if bad is not None:
                raise ValueError(f"the field {{{bad}}}: only {{c}} is allowed, no other name, attribute or index")
            t.format(c="x")
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
            why = e.args[0] if isinstance(e, ValueError) and e.args else repr(e)
            raise ClassificationFormatError(f"{path}:{i}: template {t!r} does not format with {{c}} ({why})") from None
    return lines


def read_classification(data: str | os.PathLike, split: str = "test", classnames: str | os.PathLike = "",
                        templates: str | os.PathLike = "") -> ClassificationSet:
    """The classification set in folder ``data`` (wds when ``data/<split>`` holds shards, else an ImageFolder)."""
    root = Path(data)
    if not root.is_dir():
        raise ClassificationFormatError(f"{root}: not a folder (expected a CLIP_benchmark wds folder or an "
                                        "ImageFolder)")
    names_file = Path(classnames) if classnames else root / CLASSNAMES_FILE
    tpl = _templates(Path(templates) if templates else root / TEMPLATES_FILE)
    split_dir = root / split
    if split_dir.is_dir() and ((split_dir / "nshards.txt").exists() or any(split_dir.glob("*.tar"))):
        names = read_lines(names_file, "class names")
        nfile = split_dir / "nshards.txt"
        try:
            n = int(nfile.read_text(encoding="utf-8").strip())
        except FileNotFoundError:
            raise ClassificationFormatError(f"{nfile}: missing (the number of shards)") from None
        except ValueError:
            raise ClassificationFormatError(f"{nfile}: expected the number of shards") from None
        shards = [split_dir / f"{i}.tar" for i in range(n)]
        missing = [s for s in shards if not s.is_file()]
        if n < 1 or missing:
            raise ClassificationFormatError(f"{missing[0] if missing else nfile}: missing (nshards.txt says {n})")
        return ClassificationSet(root, "wds", names, tpl, shards, [])
    folders = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not folders:
        raise ClassificationFormatError(f"{root}: neither CLIP_benchmark's wds layout ({split}/nshards.txt) nor an "
                                        "ImageFolder (one folder of images per class)")
    names = read_lines(names_file, "class names") if names_file.is_file() or classnames else folders
    if len(names) != len(folders):
        raise ClassificationFormatError(f"{names_file}: {len(names)} class names for {len(folders)} class folders "
                                        f"of {root}")
    files = []
    for label, folder in enumerate(folders):
        for dirpath, _, fnames in sorted(os.walk(root / folder, followlinks=True)):
            files += [(Path(dirpath) / f, label) for f in sorted(fnames) if f.lower().endswith(FOLDER_IMAGE_EXTS)]
    if not files:
        raise ClassificationFormatError(f"{root}: no images in its class folders")
    return ClassificationSet(root, "imagefolder", names, tpl, [], files)


def open_image(item: bytes | Path, name: str):
    """The RGB image of an item of :meth:`ClassificationSet.iter_items` (halsift's decoder; errors name it)."""
    from halsift.corpus.images import ImageDecodeError, decode_image, load_image_file

    try:
        return load_image_file(item) if isinstance(item, Path) else decode_image(item, name)
    except ImageDecodeError as e:
        raise ClassificationFormatError(f"{name}: cannot read image ({e.reason})") from None


__all__ = ["CLASSNAMES_FILE", "TEMPLATES_FILE", "ClassificationFormatError", "ClassificationSet", "open_image",
           "read_classification", "read_lines"]
