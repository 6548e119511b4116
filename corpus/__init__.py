"""Corpus formats: WebDataset shards, benchmark JSONL, retrieval sets, converters, sentence splitting, image decoding, the synthetic world."""
