#!/usr/bin/env bash
# One call on the lent H200 (device tool `run`, carry=[".whl", ".carry"]): train sixbit-mini from
# scratch (or continue from the tar parts in .carry/ with INIT=1, or from a pipeline folder of the working
# tree with INIT_FROM=assets/sixbit-mini), export, evaluate. Everything the call
# returns lands in $OUT: sixbit-mini.tar.NN (the pipeline folder, tar split in 15 MB parts, refreshed
# during training), train_log.json, log.txt, eval.json, samples.png.
#   MIN      wall-clock minutes for training (default 7.2)
#   TRAIN_ARGS / EVAL_ARGS   extra arguments
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
# run from an isolated copy of this package (other, in-progress parts of the repo stay out of the way)
rm -rf /tmp/iso && mkdir -p /tmp/iso/sixbit && touch /tmp/iso/sixbit/__init__.py && cp -r sixbit/mini /tmp/iso/sixbit/
INIT_ARGS=""
if [ -n "${INIT_FROM:-}" ]; then INIT_ARGS="--init-from $PWD/$INIT_FROM"; fi  # a pipeline folder in the tree
if [ "${INIT:-0}" = "1" ]; then
  mkdir -p /tmp/init && cat .carry/sixbit-mini.tar.* | tar -x -C /tmp/init && INIT_ARGS="--init-from /tmp/init/pipeline"
fi
REPO=$PWD
cd /tmp/iso
export PYTHONPATH=/tmp/iso:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee "$OUT/log.txt"
python3 -m sixbit.mini.train --out /tmp/run --device cuda --minutes "${MIN:-7.2}" --vae-minutes 1.6 \
  --pool-deadline-minutes 2.3 --tar-to "$OUT" $INIT_ARGS ${TRAIN_ARGS:-} 2>&1 | tee -a "$OUT/log.txt"
timeout "${EVAL_TIMEOUT:-110}" python3 -m sixbit.mini.evaluate --model /tmp/run/pipeline --out "$OUT/eval.json" \
  --device cuda --tune-guidance 3,4.5,6,8 --sheet "$OUT/samples.png" ${EVAL_ARGS:-} 2>&1 | tee -a "$OUT/log.txt"
cd "$REPO"; ls -la "$OUT"
