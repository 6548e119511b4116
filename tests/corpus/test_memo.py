"""BudgetedMemo: results kept by key while they fit the byte budget, made anew past it; nbytes of a mapping."""

from __future__ import annotations

import torch

from halsift.corpus.memo import BudgetedMemo, nbytes


def test_results_are_kept_while_they_fit_and_made_anew_past_the_budget():
    made = []

    def make(key):
        def f():
            made.append(key)
            return torch.zeros(10)  # 40 bytes
        return f

    memo = BudgetedMemo(100)
    a = memo.get("a", make("a"))
    assert memo.get("a", make("a")) is a and made == ["a"]
    memo.get("b", make("b"))  # 80 of 100 bytes
    memo.get("c", make("c"))  # would be 120: not kept
    memo.get("c", make("c"))
    memo.get("b", make("b"))
    assert made == ["a", "b", "c", "c"] and memo.used == 80


def test_nbytes_counts_the_tensors_of_a_mapping_and_nothing_else():
    feats = {"pixel_values": torch.zeros(2, 3, dtype=torch.float16), "input_ids": torch.zeros(4, dtype=torch.int64),
             "n": 3, "names": ["a"]}
    assert nbytes(feats) == 2 * 3 * 2 + 4 * 8 and nbytes(torch.zeros(5)) == 20 and nbytes("text") == 0
