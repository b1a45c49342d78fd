#!/usr/bin/env bash
# One call on the lent H200 (device tool `run`, carry=[".whl"]): train sixbit-mini from scratch with the
# committed recipe, or continue it (RESUME=1: from /tmp/run/ckpt.pt and the cached latent pool, which
# survive between calls while the machine stays warm), export, and evaluate when training is done.
# The recipe runs as three such calls (the issue's "several runs of at most 10 minutes each"):
#   bash sixbit/mini/run_h200.sh                 # VAE, latent pool, denoiser to ~step 3,000
#   RESUME=1 bash sixbit/mini/run_h200.sh        # twice more: denoiser to step 8,800, then evaluation
# Everything the call returns lands in $OUT: sixbit-mini.tar.NN (the pipeline folder, tar split in 15 MB
# parts, refreshed during training), train_log.json, log.txt, eval.json, samples.png.
#   MIN         wall-clock minutes for this call's training process (default 9.2)
#   RECIPE      the training arguments (default: the committed model's; the same in every call)
#   TRAIN_ARGS / EVAL_ARGS   extra arguments;  SKIP_EVAL=1 never evaluates
#   INIT_FROM   warm-start from a pipeline folder of the working tree instead (e.g. assets/sixbit-mini)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
# run from an isolated copy of this package (other, in-progress parts of the repo stay out of the way)
rm -rf /tmp/iso && mkdir -p /tmp/iso/sixbit && touch /tmp/iso/sixbit/__init__.py && cp -r sixbit/mini /tmp/iso/sixbit/
RECIPE=${RECIPE:-"--seed 0 --compile default --pool-cache \
  --vae-steps 900 --vae-batch 32 --vae-video-every 2 --vae-image-batch 64 --vae-minutes 4 \
  --pool 131072 --pool-deadline-minutes 6 \
  --dit-steps 8800 --batch 256 --lr 5e-4 --warmup 200 --decay-frac 0.5 --object-weight 4"}
EXTRA=""
if [ -n "${INIT_FROM:-}" ]; then EXTRA="--init-from $PWD/$INIT_FROM"; fi  # a pipeline folder in the tree
if [ "${RESUME:-0}" = "1" ]; then
  if [ ! -f /tmp/run/ckpt.pt ]; then echo "RESUME=1 but no /tmp/run/ckpt.pt (a fresh machine?)" | tee "$OUT/log.txt"; exit 3; fi
  EXTRA="--resume"
else
  rm -rf /tmp/run
fi
REPO=$PWD
cd /tmp/iso
export PYTHONPATH=/tmp/iso:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee -a "$OUT/log.txt"
python3 -m sixbit.mini.train --out /tmp/run --device cuda --minutes "${MIN:-9.2}" --tar-to "$OUT" \
  $RECIPE $EXTRA ${TRAIN_ARGS:-} 2>&1 | grep --line-buffered -v -i "warn" | tee -a "$OUT/log.txt"
if [ "${SKIP_EVAL:-0}" != "1" ] && python3 -c "import json,sys; sys.exit(json.load(open('/tmp/run/pipeline/training.json'))['dit_steps'] < int(sys.argv[1]))" \
     "$(python3 -c "import sys; a=sys.argv[1].split(); print(a[a.index('--dit-steps')+1])" "$RECIPE")"; then
  timeout "${EVAL_TIMEOUT:-110}" python3 -m sixbit.mini.evaluate --model /tmp/run/pipeline --out "$OUT/eval.json" \
    --device cuda --tune-guidance 3,4.5,6,8 --sheet "$OUT/samples.png" ${EVAL_ARGS:-} 2>&1 | tee -a "$OUT/log.txt"
fi
cd "$REPO"; ls -la "$OUT"
