#!/usr/bin/env bash
# The CUDA half of the checks, in one prepared run for a lent GPU (each step time-boxed, none stops the others):
# the CUDA tests, the tree / k-best / smoothed-LP benchmarks on CUDA (JSON), every learner trained on the GPU
# (emotions; $MODELS), the structure steps' profile at delicious's size (scripts/profile_structure.py), the tree
# learners on the large sets side by side ($BIG_DATA, $BIG_MODELS, $BIG_BUDGET), then the whole suite in parallel
# (until $DEADLINE). The fused CPU kernels (a GPU run's CPU parts: Independent's start, CRANK's refit) are built
# first, once. TREE=1 adds bench_tree on CUDA; BENCH=0 leaves out bench_smoothed and bench_kbest.
#
#     OUT=/tmp/cuda bash scripts/cuda_checks.sh       # results: $OUT/*.json, $OUT/cuda_checks.log, $OUT/big.log
#
# A machine without hydra / liac-arff / torch-struct / the Mulan cache gets them from .devcarry/ (site/, data/).
set -u
OUT=${OUT:-/tmp/cuda_checks}
mkdir -p "$OUT"
here=$(pwd)
[ -d .devcarry/site ] && export PYTHONPATH="$here/.devcarry/site:$here${PYTHONPATH:+:$PYTHONPATH}"
[ -d .devcarry/data ] && export STRUCTTORCH_DATA="$here/.devcarry/data"
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
PY=${PY:-python3}
log="$OUT/cuda_checks.log"

DEADLINE=${DEADLINE:-560}  # seconds for the whole script: a step gets at most what is left
step() {  # step <seconds> <name> <command...>
    local secs=$1 name=$2
    shift 2
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$secs" ] && secs=$left
    [ "$secs" -lt 5 ] && { echo "=== $name: skipped (deadline)" | tee -a "$log"; return; }
    echo "=== $name (limit ${secs}s) $(date +%T)" | tee -a "$log"
    local t0=$SECONDS
    timeout -s INT -k 10 "$secs" "$@" >>"$log" 2>&1
    echo "=== $name: rc $? in $((SECONDS - t0)) s" | tee -a "$log"
}

step 20 env $PY -c "import torch, lightning, hydra, torchmetrics; print(torch.__version__, torch.version.cuda,
torch.cuda.get_device_name(), lightning.__version__, hydra.__version__, torchmetrics.__version__)"
step 150 build-kernels $PY -c "from structtorch.inference import fused; fused.kernels(); print(fused.build_directory())"
step 80 cuda-tests $PY -m pytest -q -p no:cacheprovider -rfE tests -k "cuda or gpu"
[ -n "${TREE:-}" ] && step 90 bench-tree $PY scripts/bench_tree.py --device cuda --out "$OUT/bench_tree_cuda.json"
if [ "${BENCH:-1}" != 0 ]; then
    step 45 bench-smoothed $PY scripts/bench_smoothed.py --device cuda --quick --out "$OUT/bench_smoothed_cuda.json"
    step 40 bench-kbest $PY scripts/bench_kbest.py --device cuda --quick --out "$OUT/bench_kbest_cuda.json"
fi
step 100 profile-structure $PY scripts/profile_structure.py --devices cuda --iterations 2 \
    --out "$OUT/profile_structure_cuda.json"
models=${MODELS:-independent,fixed_tree,full,crank,greedy,mst,project,rta,mam,tree_crf}
step 100 train-emotions $PY -m structtorch.train -m "model=$models" data=mulan data.name=emotions trainer=gpu \
    trainer.time_budget=6 logger=none hydra.sweep.dir=/tmp/cuda_runs/emotions
# the large sets' learners side by side on the one GPU (their own processes), each with budget $BIG_BUDGET s
big() {
    local d m
    for d in ${BIG_DATA:-delicious}; do for m in ${BIG_MODELS:-independent fixed_tree mst rta tree_crf}; do
        mkdir -p "/tmp/cuda_runs/$d"
        $PY -m structtorch.train model=$m data=mulan data.name=$d trainer=gpu trainer.time_budget=${BIG_BUDGET:-120} \
            logger=none hydra.run.dir=/tmp/cuda_runs/$d/$m >"/tmp/cuda_runs/$d/$m.log" 2>&1 &
    done; done
    wait
}
export -f big
export PY OUT
step $(( ${BIG_BUDGET:-120} + 60 )) train-big bash -c big
pkill -INT -f "structtorch.train model=" && sleep 5
for f in /tmp/cuda_runs/*/*.log; do { echo "##### $f"; cat "$f"; } >>"$OUT/big.log"; done
step 600 suite $PY -m pytest -q -p no:cacheprovider -rfE -n 12 tests
grep -h "^=== .*rc" "$log"
