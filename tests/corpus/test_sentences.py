"""Sentence splitter behaviour, pinned case by case, and the word tokenisation spans refer to."""

from __future__ import annotations

import pytest

from halsift.corpus.sentences import find_word_span, sentence_texts, split_sentences, words

CASES = [
    # plain
    ("A dog runs. The cat sleeps.", ["A dog runs.", "The cat sleeps."]),
    ("Is it red? Yes! It is.", ["Is it red?", "Yes!", "It is."]),
    ("No punctuation at the end", ["No punctuation at the end"]),
    ("  Leading and trailing spaces.   ", ["Leading and trailing spaces."]),
    ("", []),
    ("   \n\n ", []),
    # abbreviations
    ("Dr. Smith met Mr. Jones on St. Patrick's Day. They talked.",
     ["Dr. Smith met Mr. Jones on St. Patrick's Day.", "They talked."]),
    ("Mrs. Brown and Prof. Green wave. Ms. White smiles.", ["Mrs. Brown and Prof. Green wave.", "Ms. White smiles."]),
    ("Fruits, e.g. Apples and pears, are here. Vegetables, i.e. Carrots, too.",
     ["Fruits, e.g. Apples and pears, are here.", "Vegetables, i.e. Carrots, too."]),
    ("Kids vs. Adults is a game. It is fun.", ["Kids vs. Adults is a game.", "It is fun."]),
    ("Apples, pears, etc. The shop is red.", ["Apples, pears, etc.", "The shop is red."]),  # etc. may end one
    ("Apples, pears, etc. are sold here.", ["Apples, pears, etc. are sold here."]),
    ("Room No. 5 is here. No. It is not.", ["Room No. 5 is here.", "No.", "It is not."]),
    ("J. K. Rowling wrote it. The U.S. Army truck is green.",
     ["J. K. Rowling wrote it.", "The U.S. Army truck is green."]),
    ("The time is 5 p.m. The sun sets.", ["The time is 5 p.m.", "The sun sets."]),
    # decimals and numbers
    ("It is 3.5 meters tall. The pole is 2.75 m wide.", ["It is 3.5 meters tall.", "The pole is 2.75 m wide."]),
    ("The price is $4.99. 3 apples cost more.", ["The price is $4.99.", "3 apples cost more."]),
    ("Version 2.0.1 is shown on the screen.", ["Version 2.0.1 is shown on the screen."]),
    # quotes
    ('The sign reads "Open." A man stands nearby.', ['The sign reads "Open."', "A man stands nearby."]),
    ('"Hello!" she said. Then she left.', ['"Hello!" she said.', "Then she left."]),
    ("It says 'STOP'. A car waits.", ["It says 'STOP'.", "A car waits."]),
    ("He asked, “Why?” Nobody answered.", ["He asked, “Why?”", "Nobody answered."]),
    ('A poster says "Sale. Today only." in red.', ['A poster says "Sale.', 'Today only." in red.']),
    ("A dog (a beagle.) Sits here.", ["A dog (a beagle.)", "Sits here."]),
    # ellipses
    ("I wonder... Then the bus came.", ["I wonder...", "Then the bus came."]),
    ("It was late... really late.", ["It was late... really late."]),
    ("Wait… What is that?", ["Wait…", "What is that?"]),
    ("Hmm.... Okay.", ["Hmm....", "Okay."]),
    # lowercase after a period does not split
    ("The dog is brown. the cat is black.", ["The dog is brown. the cat is black."]),
    # newlines
    ("First line\nSecond line", ["First line", "Second line"]),
    ("The image shows\na dog on the grass. It is brown.", ["The image shows\na dog on the grass.", "It is brown."]),
    ("Para one ends here.\n\nPara two starts here.", ["Para one ends here.", "Para two starts here."]),
    ("A title\n\nthe body in lower case.", ["A title", "the body in lower case."]),
    ("Windows line.\r\nNext line.", ["Windows line.", "Next line."]),
    # lists
    ("Objects:\n- a red ball\n- two blue cubes\n* a sign\n• a tree",
     ["Objects:", "a red ball", "two blue cubes", "a sign", "a tree"]),
    ("1. The first item.\n2) Second item\n(3) Third item.\na) lettered item",
     ["The first item.", "Second item", "Third item.", "lettered item"]),
    ("Steps. 1. Open the box. 2. Close it.", ["Steps.", "Open the box.", "Close it."]),
    ("- item one continues\n  on the next line\n- item two", ["item one continues\n  on the next line", "item two"]),
    ("-5 degrees is cold. It snows.", ["-5 degrees is cold.", "It snows."]),
    # noise
    ("... . -", []),
]


@pytest.mark.parametrize("text, expected", CASES, ids=[c[0][:30] for c in CASES])
def test_split_cases(text, expected):
    got = split_sentences(text)
    assert [s.text for s in got] == expected
    assert [s.position for s in got] == list(range(len(expected)))
    for s in got:
        assert text[s.start:s.end] == s.text
    assert all(a.end <= b.start for a, b in zip(got, got[1:]))


def test_join_round_trip_of_simple_captions():
    sents = ["A red cube sits on the left.", "Two blue balls are behind it.", "The sign reads \"OPEN 24h.\"",
             "Dr. Who is 3.5 m tall.", "It faces right!"]
    assert sentence_texts(" ".join(sents)) == sents


def test_offsets_and_positions():
    text = "One.  Two!\nThree?"
    got = split_sentences(text)
    assert [(s.start, s.end, s.position) for s in got] == [(0, 4, 0), (6, 10, 1), (11, 17, 2)]


def test_words_is_whitespace_split():
    assert words("A  red,\tshiny car.\n") == ["A", "red,", "shiny", "car."]
    assert words("") == []


def test_find_word_span():
    s = "A Red, shiny car is near a red bike."
    assert find_word_span(s, "red shiny") == (1, 3)
    assert find_word_span(s, "red", start=2) == (7, 8)
    assert find_word_span(s, "bike") == (8, 9)
    assert find_word_span(s, "green") is None
    assert find_word_span(s, " ,. ") is None
