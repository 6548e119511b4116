#!/bin/bash
# One run of the GPU suite on a bare CUDA machine (Python 3.12 + torch/torchvision/transformers installed, no internet),
# from the repository root, everything written under $OUT as it goes (about 5 minutes on one H100):
#
#   OUT=/some/folder bash benchmarks/gpu_device_run.sh
#
# 1. installs the wheels in $WHL (default .whl/: cp312 manylinux wheels of what such a machine lacks, fetched where
#    pip works with `pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl open_clip_torch ftfy
#    wcwidth webdataset==0.2.86 braceexpand simplejpeg pydantic pydantic_core annotated-types typing-inspection`)
#    and halsift itself into a temporary --target folder (no dependencies resolved: none can be downloaded there);
# 2. checks that the score/select command path imports, and prints the card;
# 3. runs `python3 benchmarks/gpu_suite.py --quick --out $OUT/gpu_suite.json` under a hard limit: every part's
#    figures land in $OUT/gpu_suite_parts/ the moment they are measured, and $OUT/gpu_suite.json as each part ends.
#
# SUITE_ARGS replaces "--quick" (e.g. SUITE_ARGS="--smoke --only clip product" checks the plumbing on a CPU);
# LIMIT_S (default 330) caps the suite's wall time.
set -u
OUT=${OUT:-$PWD/gpu_out}
WHL=${WHL:-.whl}
SUITE_ARGS=${SUITE_ARGS:---quick}
LIMIT_S=${LIMIT_S:-330}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_run.log") 2>&1
echo "== $(date -u +%FT%TZ) gpu_device_run: OUT=$OUT SUITE_ARGS=$SUITE_ARGS LIMIT_S=$LIMIT_S"
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1

S=$(mktemp -d)
t0=$SECONDS
if compgen -G "$WHL/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$S" "$WHL"/*.whl \
    || echo "WARNING: some wheels of $WHL did not install"
else
  echo "WARNING: no wheels in $WHL (see this script's header); going on with what the machine has"
fi
export PYTHONPATH=$S${PYTHONPATH:+:$PYTHONPATH} PATH=$S/bin:$PATH
if ! $PY -m pip install -q --no-index --no-deps --no-build-isolation --target "$S" .; then
  # no wheel builder there: the package as pyproject.toml maps it (api/ is halsift, each stage folder a subpackage)
  echo "WARNING: pip could not build halsift; linking the source folders as the package instead"
  cp -r api "$S/halsift"
  for d in corpus filtering training eval launch recipes synth; do ln -s "$PWD/$d" "$S/halsift/$d"; done
fi
$PY -c "import halsift.launch.cli" || { echo "FATAL: halsift does not import"; exit 3; }
echo "== installed into $S in $((SECONDS - t0)) s"

cd "$S" > /dev/null  # import the installed halsift, not the source tree
$PY - <<'EOF' 2>&1 | tee "$OUT/imports.txt"
import importlib, sys
mods = ["halsift.launch.cli", "halsift.launch.cmd_score", "halsift.launch.cmd_select", "halsift.filtering.detectors.clip",
        "halsift.filtering.detectors.vlm", "halsift.filtering.scoring.workers", "open_clip", "simplejpeg", "webdataset",
        "torchvision.io"]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001 - report every missing piece at once
        bad.append(f"{m}: {type(e).__name__}: {e}")
import torch, torchvision
print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print("imports:", "all ok" if not bad else "MISSING\n  " + "\n  ".join(bad))
EOF
cd - > /dev/null
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader

echo "== $(date -u +%FT%TZ) suite: $PY benchmarks/gpu_suite.py $SUITE_ARGS --out $OUT/gpu_suite.json"
# shellcheck disable=SC2086
timeout -k 10 "$LIMIT_S" $PY benchmarks/gpu_suite.py $SUITE_ARGS --out "$OUT/gpu_suite.json"
rc=$?
echo "== $(date -u +%FT%TZ) suite exit $rc after $((SECONDS - t0)) s in all; figures in $OUT/gpu_suite.json and $OUT/gpu_suite_parts/"
rm -rf "$S"
exit $rc
