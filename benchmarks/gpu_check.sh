#!/usr/bin/env bash
# The GPU check, in one go (under 8 minutes on one modern GPU node):
#   1. the GPU-gated tests (tests/integration/test_gpu.py): the model on CUDA == CPU logits,
#      nccl step 3 with replica_spread 0, step 4's snapshot resume on the GPU, CUDA_VISIBLE_DEVICES=
#      forcing gloo, and more processes than GPUs stopped by torch's own CUDA error;
#   2. the GPU figures: step 3 with the defaults (all of B3DB, 12 epochs) on
#      min(2, GPUs) GPUs, and on 1 GPU at the same global batch: wall time,
#      training samples/s, heldout ROC AUC (the scripts pick nccl whenever CUDA is available);
#   3. with --notebooks: every solution notebook executed top to bottom on this
#      node (a copy; nothing stored), to prove they run where CUDA exists.
#
#   bash benchmarks/gpu_check.sh [--notebooks]
#
# Writes benchmarks/results/gpu/gpu.md (put its table in the README, naming the
# GPU) and the logs next to it. Exits non-zero when a test or a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${GPU_CHECK_OUT:-benchmarks/results/gpu}
mkdir -p "$out"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [[ "$gpus" -lt 1 ]]; then
    echo "error: no CUDA GPU visible (torch.cuda.device_count() == 0); run this on a GPU node" >&2
    exit 2
fi
n=$(( gpus < 2 ? gpus : 2 ))
python - > "$out/machine.txt" <<'EOF'
import platform, torch
names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
print(f"{torch.cuda.device_count()} x {', '.join(names)}; torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}; {platform.platform()}")
EOF
echo "machine: $(cat "$out/machine.txt")"

echo "== 1. GPU tests"
timeout 420 python -m pytest tests/integration/test_gpu.py -q -rs -p no:cacheprovider 2>&1 | tee "$out/tests.log"

echo "== 2. GPU figures"
run_step3() {  # name nproc [flags...]
    local name=$1 nproc=$2
    shift 2
    rm -rf "$out/$name"
    local start=$SECONDS
    timeout 240 torchrun --standalone --nproc_per_node="$nproc" solutions/step3_ddp.py \
        --out "$out/$name" --no-tensorboard "$@" > "$out/$name.log" 2>&1
    echo "$(( SECONDS - start ))" > "$out/$name/wall_seconds"
    tail -3 "$out/$name.log"
}
run_step3 "step3-${n}gpu" "$n"
if [[ "$n" -gt 1 ]]; then
    run_step3 "step3-1gpu" 1 --batch-size $(( 64 * n ))
fi

python - "$out" "$n" <<'EOF'
import json, statistics, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
rows = ["| run | GPUs | global batch | wall s (start to exit) | training samples/s (median, epochs 2+) | heldout ROC AUC |",
        "|---|---|---|---|---|---|"]
for name in [f"step3-{n}gpu"] + (["step3-1gpu"] if n > 1 else []):
    m = json.loads((out / name / "metrics.json").read_text())
    sps = statistics.median(r["samples_per_second"] for r in m["history"][1:])
    wall = (out / name / "wall_seconds").read_text().strip()
    rows.append(f"| `{name}` | {m['world_size']} | {m['global_batch_size']} | {wall} | {sps:,.0f} | "
                f"{m['heldout_roc_auc']:.3f} |")
text = f"# GPU check\n\nMachine: {(out / 'machine.txt').read_text().strip()}\n\n" + "\n".join(rows) + "\n"
(out / "gpu.md").write_text(text)
print(text)
EOF

if [[ "${1:-}" == "--notebooks" ]]; then
    echo "== 3. notebooks, top to bottom on this node"
    for nb in notebooks/0*_*.ipynb; do
        timeout 600 python - "$nb" <<'EOF'
import sys, time, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
start = time.perf_counter()
NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": "notebooks"}}).execute()
print(f"{path}: ran top to bottom in {time.perf_counter() - start:.0f} s")
EOF
    done 2>&1 | tee "$out/notebooks.log"
fi
echo "wrote $out/gpu.md"
