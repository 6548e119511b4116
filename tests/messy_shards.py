"""A shard with one sample per way a shard goes wrong (tests of the one reader and of the training stream)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from PIL import Image


def _image(fmt: str, mode: str = "RGB") -> bytes:
    img = Image.new(mode, (24, 24), (200, 40, 40, 128) if mode == "RGBA" else (200, 40, 40))
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


JPG = _image("JPEG")
BROKEN_JPG = JPG[:len(JPG) // 2]
META = b'{"captioner": "c", "source": "i2t"}'


def _messy_members(p: str) -> list[tuple[str, bytes]]:
    """One sample per way a shard goes wrong; ``p`` prefixes the keys (the caption names its key)."""
    def sample(i: str, image: bytes | None = JPG, ext: str = "jpg", txt: bytes | None | str = "default",
               meta: bytes | None = META) -> list[tuple[str, bytes]]:
        txt = f"A red square {p}{i} on grey.".encode() if txt == "default" else txt
        parts = [(f"{p}{i}.{ext}", image), (f"{p}{i}.txt", txt), (f"{p}{i}.json", meta)]
        return [(name, blob) for name, blob in parts if blob is not None]  # None: no such member

    return [*sample("00"),  # valid, first (the training stream's epochs start here)
            *sample("01", image=BROKEN_JPG),  # corrupt JPEG
            *sample("02", image=_image("PNG", "RGBA"), ext="png"),  # valid PNG with alpha
            *sample("03", txt=b"   "),  # blank caption
            *sample("04", txt=None),  # no .txt member
            *sample("05", meta=b"{not json"),  # bad .json
            *sample("06", image=None),  # no image member
            *sample("07", txt=b"..."),  # a caption without a sentence
            *sample("08", txt=f"A blue \xff circle {p}08.".encode("latin-1")),  # not UTF-8: skipped, bad_caption
            *sample("09", meta=None),  # no .json: allowed
            *sample("00", txt=f"A second copy of {p}00.".encode()),  # the key again
            *sample("10", meta=b"[1, 2]"),  # .json not an object
            *sample("11"),  # valid
            *sample("12")]  # cut short by the truncated tail


def messy_shard(path: Path, p: str = "k") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, blob in _messy_members(p):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            t.addfile(info, io.BytesIO(blob))
    with tarfile.open(path) as t:
        cut = next(m for m in t.getmembers() if m.name == f"{p}12.jpg").offset_data + 100
    with open(path, "r+b") as f:
        f.truncate(cut)
    return path
