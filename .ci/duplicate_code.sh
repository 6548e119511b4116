#!/usr/bin/env bash
# CI: no repeated block of 6+ lines in the package (pylint's duplicate-code check, R0801; imports, docstrings and
# comments ignored). Exit 0 when none, else pylint's report of each repeated block and a non-zero exit.
# Needs the test extra (pip install -e '.[test]', which brings pylint).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --ignore-imports=yes \
    --ignore-docstrings=yes --ignore-comments=yes --score=no \
    api corpus filtering training eval launch recipes synth
