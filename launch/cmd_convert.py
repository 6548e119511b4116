"""``halsift convert FORMAT SRC --out OUT``: public layouts into halsift's bench, retrieval and shard formats."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import config_from_args, field
from halsift.launch.describe import add_format_command_arguments

HELP = "convert AlignBench/HalDec, COCO, Flickr, img2dataset/WebDataset, tables, HF datasets, image folders"

# format -> (what SRC is, what OUT is)
FORMATS = {
    "alignbench": ("the AlignBench table (halcap_bench.jsonl / .csv / .parquet)", "bench.jsonl"),
    "haldec": ("the HalDec-Bench (HalCap-Bench) table, same columns as AlignBench", "bench.jsonl"),
    "coco": ("COCO captions_*.json, or Karpathy's dataset_coco.json with --karpathy", "retrieval.jsonl"),
    "flickr": ("Flickr8k.token.txt / Flickr30k results.csv / captions.txt", "retrieval.jsonl"),
    "img2dataset": ("an img2dataset output folder (or any WebDataset shards)", "shard folder"),
    "webdataset": ("WebDataset shards: folder, brace pattern, pipe:CMD, s3://... (fsspec)", "shard folder"),
    "table": ("a .parquet / .jsonl / .csv table with image (path or bytes) and caption columns", "shard folder"),
    "hf": ("a Hugging Face datasets folder written by save_to_disk", "shard folder"),
    "folder": ("an image folder with <name>.txt captions (and optional <name>.json)", "shard folder"),
}
SPLIT_FORMATS = ("alignbench", "haldec", "coco", "hf")  # the formats --split means something to


@dataclass
class ConvertConfig:
    """``halsift convert``'s settings."""

    format: str = field("", help="the layout of SRC (see below)", cli={"positional": True, "choices": sorted(FORMATS)})
    src: str = field("", help="the input file, folder or URL", cli={"positional": True})
    out: str = field("", help="bench.jsonl / retrieval.jsonl path, or a new shard folder", cli={"required": True})
    images: str | None = field(None, help="image root: alignbench/haldec local mirror (images/... and COCO/CC12M "
                                          "files by image_name), coco/flickr image folder, table image paths "
                                          "(default: the table's folder)")
    split: str | None = field(None, help="alignbench/haldec: split written to rows (default test); coco --karpathy: "
                                         "keep these splits, e.g. test; hf: convert only these splits of a "
                                         "DatasetDict (default all; each sample's json records its split)")
    karpathy: bool = field(False, help="coco: SRC is Karpathy's dataset_coco.json")
    split_file: str | None = field(None, help="flickr: keep the images listed in this file")
    image_col: str = field("image", help="table/hf: image column (path, bytes or {bytes, path})")
    caption_col: str = field("caption", help="table/hf: caption column")
    key_col: str | None = field(None, help="table/hf: key column (default: the row number)")
    captioner: str | None = field(None, help="shards: captioner for samples whose json has none (default unknown)")
    source: Literal["i2t", "t2i"] | None = field(None, help="shards: source for samples whose json has none "
                                                            "(default i2t)")
    maxcount: int = field(1000, range="[1, inf)", help="shards: samples per output shard")


CONFIG = ConvertConfig  # the settings (docs/config.md, --describe)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_format_command_arguments(p, ConvertConfig, FORMATS, width=12)


def _convert(args: ConvertConfig) -> dict:
    from pathlib import Path

    from halsift.corpus import convert as cv

    shard_opts = {"captioner": args.captioner, "source": args.source, "maxcount": args.maxcount}
    fmt = args.format
    if args.split and fmt not in SPLIT_FORMATS:
        raise cv.ConvertError(f"--split: not used by {fmt} (only by {', '.join(SPLIT_FORMATS)})")
    if fmt in ("alignbench", "haldec"):
        from halsift.corpus.alignbench import convert_alignbench

        return convert_alignbench(args.src, args.out, images_dir=args.images, split=args.split or "test")
    if fmt in ("coco", "flickr") and not args.images:
        raise cv.ConvertError(f"--images: required for {fmt} (the folder holding the images)")
    if fmt == "coco":
        from halsift.corpus.retrieval import from_coco

        if args.karpathy:
            return from_coco(None, args.images, args.out, split=args.split, karpathy_json=args.src)
        if args.split:
            raise cv.ConvertError("--split: COCO captions files carry no split; give Karpathy's file with --karpathy")
        return from_coco(args.src, args.images, args.out)
    if fmt == "flickr":
        from halsift.corpus.retrieval import from_flickr

        return from_flickr(args.src, args.images, args.out, split_file=args.split_file)
    if fmt in ("img2dataset", "webdataset"):
        return cv.webdataset_to_shards(args.src, args.out, **shard_opts)
    if fmt == "table":
        return cv.table_to_shards(args.src, args.out, image_col=args.image_col, caption_col=args.caption_col,
                                  key_col=args.key_col, image_root=args.images, **shard_opts)
    if fmt == "hf":
        return cv.hf_to_shards(args.src, args.out, image_col=args.image_col, caption_col=args.caption_col,
                               key_col=args.key_col, split=args.split, **shard_opts)
    return cv.folder_to_shards(Path(args.src), args.out, **shard_opts)


def run(args: argparse.Namespace) -> int:
    from halsift.corpus.alignbench import AlignBenchFormatError
    from halsift.corpus.convert import ConvertError
    from halsift.launch.cli import UsageError

    cfg = config_from_args(ConvertConfig, args)
    try:
        summary = _convert(cfg)
    except (ConvertError, AlignBenchFormatError) as e:
        raise UsageError(str(e)) from e
    print(json.dumps(summary, sort_keys=True))
    print(f"converted {args.format} {args.src} -> {args.out}")
    return 0
