#!/usr/bin/env bash
# The checks a CPU machine cannot make, in one short GPU run: at most 560 s (GPU_CHECK_TOTAL_S) on an H100 or H200,
# each stage under its own time limit, so that the script ends in time whatever a stage does (what a limit cut is in
# the log). Two phases:
#   1. side by side, sharing the GPU (GPU_CHECK_SIDE_S, 200 s):
#      tests   tests/test_cuda.py (FlexAttention's gradient checks through the real kernel among them), 6 workers
#      memory  evaluation memory at 8L and 16L (L = 1024) of every scheme, model=paper: each process's own peak
#              allocation, which its neighbours do not change
#      ddp     the paper preset (experiment=paper, shortened) for a few hundred steps under torchrun with one process
#              and as a plain run: the same loss curve (ddp.json)
#   2. alone on the GPU, one after the other (the timings):
#      bench   python -m alibi_lm.bench --device cuda --model paper (bf16 autocast), once per L (512, then 1024; each
#              GPU_CHECK_BENCH_S, 150 s, about 130 s on an H200): every scheme's training tokens/s against NoPE, SDPA
#              with attention dropout against FlexAttention without (the "(dropout 0)" rows), each scheme's
#              attention path and why
#      mfu     training through torch.compile (--compile) for alibi and nope at L = 1024: MFU, and the ratio
#              compiled, in the time left; with less than GPU_CHECK_MFU_MIN_S (150 s) left it is deferred (not a
#              failure) to a run of its own: GPU_CHECK_TOTAL_S=200 bash scripts/gpu_check.sh run "$OUT" --stages mfu
#              (four compiles of the paper's model did not finish in 179 s on an H200; it compiles two now)
#
#   scripts/gpu_check.sh pack
#       here, where the project is installed: copies into .gpu/ (git-ignored) what the GPU machine lacks (hydra-core,
#       omegaconf and antlr4 from this .venv, pure Python; WikiText-2 from $ALIBI_LM_DATA), about 15 MB
#   scripts/gpu_check.sh run OUT [--quick] [--device cuda|cpu] [--stages tests,bench,memory,mfu,ddp] [--steps N]
#                                [--schemes a,b] [--lengths 512,1024]
#       on the GPU machine (carry .gpu): under OUT at most 8 files (what the device tool returns): gpu_check.log (when
#       each stage ran and its status, pytest's summary), gpu_check.tar.gz (every stage's own log, and bench-L<L>/,
#       memory/ and mfu/, each the bench's <host>.md and .csv: the tables to commit under results/bench/), the .md
#       tables and ddp.json beside it. --quick: tiny sizes (a dry run; on the CPU too, where the CUDA tests skip).
#   scripts/gpu_check.sh tasks OUT [--minutes M] [--jobs N] [--allow-cpu] [-- scripts/tasks.py arguments]
#       on the GPU machine (carry .gpu): a part of the task suite, not a check: scripts/tasks.py --keep-committed
#       --precision fp32 (rows comparable with the CPU's), N runs at a time (12), none started after M minutes (4),
#       the whole part stopped by SIGTERM GPU_TASKS_S seconds after this script started (540; give the device time
#       left minus a minute: the runs under way are lost, the finished ones kept); then OUT/tasks.log,
#       OUT/tasks-results.tar.gz (results/<name>/ as it stands there: the committed rows it started from and the new
#       ones), which docs/tasks.md "A part of the suite on a GPU" takes in, and OUT/tasks-logs.tar.gz (each step's
#       output). Refused unless the code was committed when packed and is the packed code (.gpu/CODE_DIGEST): its
#       rows name that commit (.gpu/COMMIT, $ALIBI_LM_COMMIT). --allow-cpu: a dry run without a GPU.
# The device tool's commands:
#   bash scripts/gpu_check.sh run "$OUT"          with carry [".gpu"], timeout_s 600
#   bash scripts/gpu_check.sh tasks "$OUT"        with carry [".gpu"], timeout_s 600
set -uo pipefail
cd "$(dirname "$0")/.."

die() { echo "error: $*" >&2; exit 2; }

pack() {
    local site data
    site=$(.venv/bin/python -c "import omegaconf, os; print(os.path.dirname(os.path.dirname(omegaconf.__file__)))") \
        || die "no .venv with omegaconf here: run make setup first"
    data=${ALIBI_LM_DATA:-data}/wikitext-2
    [ -f "$data/wiki.train.tokens" ] || die "no WikiText-2 at $data: set ALIBI_LM_DATA=<folder that holds wikitext-2/>"
    rm -rf .gpu && mkdir -p .gpu/site .gpu/data
    for pkg in hydra omegaconf antlr4; do cp -r "$site/$pkg" .gpu/site/; done
    find .gpu/site -name __pycache__ -prune -exec rm -rf {} +
    cp -r "$data" .gpu/data/
    # the commit the copy sent to the GPU machine is (it has no .git): its rows name it; and the digest of the code
    # files that travel with it, which `tasks` checks there (the tree is copied at the device call, not now)
    .venv/bin/python -c "import alibi_lm.provenance as p; print(p.head_commit())" > .gpu/COMMIT \
        || die "cannot read the commit (alibi_lm.provenance)"
    git ls-files -co --exclude-standard -- alibi_lm configs scripts tests pyproject.toml Makefile > .gpu/CODE_FILES
    code_digest > .gpu/CODE_DIGEST || die "cannot digest the code files"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info && echo '/.gpu/' >> .git/info/exclude; }
    du -sh .gpu
    echo "packed at $(cat .gpu/COMMIT)"
}

# one digest of the files .gpu/CODE_FILES lists, their paths and contents
code_digest() {
    local file
    while IFS= read -r file; do
        [ -f "$file" ] || { echo "missing: $file"; continue; }
        printf '%s %s\n' "$file" "$(sha256sum < "$file" | cut -d' ' -f1)"
    done < .gpu/CODE_FILES | sha256sum | cut -d' ' -f1
}

# the python; this copy's package (ahead of any installed one: scripts/ import it too) and Hydra from .gpu/site
# where carried; the packed commit for the rows and tables where this is the packed code. The copy on the GPU machine
# may carry a .git of another commit (the device tool sends the one its session started from, ff643d5 with
# "uncommitted changes" in the fourth GPU run's tables): git is pointed at nothing then, so that provenance reads
# $ALIBI_LM_COMMIT
environment() {
    PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    [ -d .gpu/site ] && export PYTHONPATH="$PWD/.gpu/site:$PYTHONPATH"
    [ -d .gpu/data ] && export ALIBI_LM_DATA="$PWD/.gpu/data"
    if [ -f .gpu/COMMIT ] && [ "$(code_digest)" = "$(cat .gpu/CODE_DIGEST 2>/dev/null)" ]; then
        export ALIBI_LM_COMMIT="$(cat .gpu/COMMIT)" GIT_DIR="$PWD/.gpu/no-git"
    fi
    export WANDB_MODE=disabled PYTHONUNBUFFERED=1
}

tasks_part() {
    local out=$1 minutes=4 jobs=12 allow_cpu=0 limit=${GPU_TASKS_S:-540}
    shift
    while [ $# -gt 0 ]; do
        case $1 in
            --minutes) minutes=${2:?--minutes needs a number}; shift ;;
            --jobs) jobs=${2:?--jobs needs a number}; shift ;;
            --allow-cpu) allow_cpu=1 ;;
            --) shift; break ;;
            *) die "unknown option '$1' (scripts/tasks.py's own arguments go after --)" ;;
        esac
        shift
    done
    [[ $jobs =~ ^[0-9]+$ ]] && [ "$jobs" -ge 1 ] || die "--jobs takes a number >= 1, got '$jobs'"
    [[ $limit =~ ^[0-9]+$ ]] || die "GPU_TASKS_S takes whole seconds, got '$limit'"
    for arg in "$@"; do  # the GPU machine's copy has no git to commit into: its results come back as an archive
        [ "$arg" = --commit ] && die "--commit cannot run on the GPU machine (no git there); commit here after taking the archive in"
    done
    local commit
    commit=$(cat .gpu/COMMIT 2>/dev/null) || die "no .gpu/COMMIT: commit the code, then run scripts/gpu_check.sh pack here"
    [ -n "$commit" ] && [ "$commit" != unknown ] || die "packed without a commit ('$commit'): run pack in the checkout"
    [[ $commit == *uncommitted* ]] && die "packed with uncommitted changes ($commit): commit, then pack again"
    [ "$(code_digest)" = "$(cat .gpu/CODE_DIGEST 2>/dev/null)" ] \
        || die "the code here is not the code packed at $commit (changed or committed since): run pack again"
    mkdir -p "$out" || die "cannot create $out"
    out=$(cd "$out" && pwd)
    environment
    if [ "$allow_cpu" = 0 ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        die "torch sees no GPU here; --allow-cpu for a dry run on CPUs"
    fi
    # the results folder tasks.py writes to (tasks, tasks-custom or --name's), from its own parser
    local name
    name=$($PY -c "import sys; from alibi_lm.plans.task_suite import arguments; print(arguments(sys.argv[1:]).name)" "$@") \
        || die "scripts/tasks.py refuses these arguments: $*"
    limit=$((limit - SECONDS))  # the time limit counts from this script's start
    [ "$limit" -gt 60 ] || die "GPU_TASKS_S leaves ${limit}s after the start: give the device time left minus a minute"
    echo "[$(date -u +%H:%M:%S)] tasks part at $commit into results/$name: $jobs at a time, none started after $minutes min, stopped after ${limit}s" > "$out/tasks.log"
    timeout -k 15 "$limit" $PY scripts/tasks.py --jobs "$jobs" --keep-committed --precision fp32 \
        --stop-starting-after "$minutes" "$@" >> "$out/tasks.log" 2>&1
    local rc=$?
    echo "[$(date -u +%H:%M:%S)] scripts/tasks.py: exit $rc (0: the plan finished; 75: stopped starting, run the rest later; 124 or 137: its time limit)" >> "$out/tasks.log"
    [ -d "results/$name" ] || die "no results/$name after the part: see $out/tasks.log"
    tar czf "$out/tasks-results.tar.gz" "results/$name" || die "cannot pack results/$name"
    [ -d "logs/$name" ] && tar czf "$out/tasks-logs.tar.gz" "logs/$name"  # each step's own output (a failure's error)
    tail -n 3 "$out/tasks.log"
    case $rc in 0|75|124|137) return 0 ;; *) return "$rc" ;; esac
}

[ $# -ge 1 ] || die "usage: scripts/gpu_check.sh pack | run OUT [--quick] [--device cuda|cpu] [--stages tests,bench,ddp] [--steps N] [--schemes a,b] [--lengths 512,1024] | tasks OUT [--minutes M] [--jobs N] [--allow-cpu] [-- tasks.py args]"
command=$1; shift
[ "$command" = pack ] && { pack; exit; }
if [ "$command" = tasks ]; then
    [ $# -ge 1 ] || die "tasks needs the output folder: scripts/gpu_check.sh tasks OUT"
    tasks_part "$@"
    exit
fi
[ "$command" = run ] || die "unknown command '$command': use pack, run or tasks"
[ $# -ge 1 ] || die "run needs the output folder: scripts/gpu_check.sh run OUT"
OUT=$1; shift
QUICK=0; DEVICE=cuda; STAGES=tests,bench,memory,mfu,ddp; STEPS=200; LENGTHS=512,1024
SCHEMES=nope,alibi,t5,kerple_log,kerple_power,sandwich,fire,fox,cope,rope
while [ $# -gt 0 ]; do
    case $1 in
        --quick) QUICK=1 ;;
        --device) DEVICE=${2:?--device needs cuda or cpu}; shift ;;
        --stages) STAGES=${2:?--stages needs a list}; shift ;;
        --steps) STEPS=${2:?--steps needs a number}; shift ;;
        --schemes) SCHEMES=${2:?--schemes needs a list}; shift ;;
        --lengths) LENGTHS=${2:?--lengths needs a list}; shift ;;
        *) die "unknown option '$1'" ;;
    esac
    shift
done
case $DEVICE in cuda|cpu) ;; *) die "--device takes cuda or cpu, got '$DEVICE'" ;; esac
for stage in ${STAGES//,/ }; do
    case $stage in tests|bench|memory|mfu|ddp) ;; *) die "unknown stage '$stage': choose from tests, bench, memory, mfu, ddp" ;; esac
done
[[ $STEPS =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 20 ] || die "--steps takes a number >= 20, got '$STEPS'"
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)

environment
LOG=$OUT/gpu_check.log
# Two phases inside one deadline (GPU_CHECK_TOTAL_S, 560 s from this script's start):
#   1. side by side, the GPU shared: the CUDA tests, the memory stage (each process's own peak allocation, which
#      neighbours do not change) and the two DDP runs (a loss curve, not a timing)
#   2. alone on the GPU, one after the other: bench (its ratios) and mfu (compiled), the timings
# Each stage has its own limit too; a stage that ends early leaves its time to those after it.
TOTAL=${GPU_CHECK_TOTAL_S:-560}; T_SIDE=${GPU_CHECK_SIDE_S:-200}; T_BENCH=${GPU_CHECK_BENCH_S:-150}
for t in "$TOTAL" "$T_SIDE" "$T_BENCH"; do [[ $t =~ ^[0-9]+$ ]] || die "GPU_CHECK_*_S take whole seconds, got '$t'"; done
STATUS=$(mktemp -d)  # one file per stage: its exit status
TMPDIR_OUT=$(mktemp -d)
ORDER=()  # the stages' names in the order they started

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
stage_on() { [[ ",$STAGES," == *",$1,"* ]]; }
left() { echo $((TOTAL - SECONDS)); }
# run a stage's command under min(its limit, the time left); its output goes to OUT/<name>.log, its status (0, a
# failure, or 124 for a limit) to STATUS/<name>
timed() {
    local name=$1 limit=$2; shift 2
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    ORDER+=("$name")
    if [ "$limit" -lt 10 ]; then log "$name: not started (${limit}s left of ${TOTAL}s)"; echo 124 > "$STATUS/$name"; return; fi
    log "$name: $* (limit ${limit}s)"
    timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$rc" > "$STATUS/$name"
    log "$name: exit $rc$([ $rc = 124 ] && echo ' (its time limit)')"
}

log "gpu_check: device=$DEVICE quick=$QUICK stages=$STAGES; commit ${ALIBI_LM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; ${TOTAL}s in all"
if [ -f .gpu/COMMIT ] && [ -z "${ALIBI_LM_COMMIT:-}" ]; then
    log "WARNING: the code here is not the code packed at $(cat .gpu/COMMIT): its tables name git's commit; run pack again"
fi
$PY - >> "$LOG" 2>&1 <<'EOF' || die "python with torch and the project does not start: see $LOG"
import torch, alibi_lm.train  # noqa: F401  (the project, and Hydra from .gpu/site where carried)
print("torch", torch.__version__, "cuda", torch.version.cuda, "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
EOF
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    die "--device cuda but torch sees no GPU here; use --device cpu for a dry run"
fi

# the bench's arguments shared by its stages: the paper's model, or a tiny one with --quick
if [ "$QUICK" = 1 ]; then
    bench=(--quick --model tiny --no-peers); LENGTHS=32; LONGEST=32; SCHEMES=nope,alibi,fox; MFU=(--lengths 32)
    preset=(experiment=quick data=wikitext2 train.max_tokens=null "train.max_steps=$STEPS" train.batch_size=4
            train.eval_every=10 train.checkpoint_every=100000 train.eval_tokens=2048)
else
    # 16,384 tokens per step (the paper trained with 9,216 per GPU): 15 models of 247M and their optimizers fit an H100
    bench=(--model paper --no-peers --tokens-per-step 16384 --min-rounds 3 --max-rounds 3 --round-budget 20 --eval-reps 1)
    LONGEST=${LENGTHS##*,}
    MFU=(--lengths "$LONGEST")
    # the paper's model and optimizer at one GPU's batch; a tenth of its peak lr, as a few hundred steps cannot warm
    # up the way its 16,000 do
    preset=(experiment=paper data=wikitext2 "train.max_steps=$STEPS" train.grad_accum=1 train.batch_size=8
            train.lr=0.1 train.warmup_steps=50 train.eval_every=100 train.checkpoint_every=100000
            train.eval_tokens=32768 train.evaluate_after=false)
fi

# phase 1: side by side
runs=$(mktemp -d)
common=("${preset[@]}" "train.device=$DEVICE" "paths.runs=$runs" train.progress=false logger.wandb.mode=disabled)
workers=6; [ "$DEVICE" = cpu ] && workers=1
pytest=($PY -m pytest -q -rA -p no:randomly -n "$workers" -o addopts= --timeout 120)
stage_on tests && timed tests "$T_SIDE" "${pytest[@]}" tests/test_cuda.py &
stage_on memory && timed memory "$T_SIDE" $PY -m alibi_lm.bench --device "$DEVICE" "${bench[@]}" --lengths "$LONGEST" \
    --schemes "$SCHEMES" --mem-schemes "$SCHEMES" --mem-multipliers 8,16 --sections memory --out "$OUT/memory" &
stage_on ddp && timed ddp-plain "$T_SIDE" $PY -m alibi_lm.train "${common[@]}" name=plain &
stage_on ddp && timed ddp-torchrun "$T_SIDE" $PY -m torch.distributed.run --standalone --nproc_per_node=1 \
    -m alibi_lm.train "${common[@]}" name=torchrun &
wait
for name in tests memory ddp-plain ddp-torchrun; do stage_on "${name%%-*}" && ORDER+=("$name"); done
if stage_on ddp; then
    $PY - "$runs" "$OUT/ddp.json" >> "$LOG" 2>&1 <<'EOF'
import json, sys
from pathlib import Path

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
curves = {}
for name in ("plain", "torchrun"):
    logs = sorted(runs.glob(f"{name}/**/log.jsonl"))
    records = [json.loads(line) for line in logs[0].read_text().splitlines()] if logs else []
    curves[name] = {r["step"]: r["loss"] for r in records if "loss" in r}
steps = sorted(set(curves["plain"]) & set(curves["torchrun"]))
worst = max((abs(curves["torchrun"][s] - curves["plain"][s]) / abs(curves["plain"][s]) for s in steps), default=None)
# bf16 kernels are not bitwise deterministic across processes: the same curve within 2% at every step
verdict = "same curve" if steps and worst <= 0.02 else "DIFFERENT" if steps else "no common steps"
out.write_text(json.dumps(dict(steps=len(steps), max_relative_difference=worst, verdict=verdict,
                               first_last={n: [c.get(steps[0]), c.get(steps[-1])] if steps else None
                                           for n, c in curves.items()}), indent=1))
print("ddp:", verdict, f"over {len(steps)} steps, max relative difference {worst}")
sys.exit(verdict != "same curve")
EOF
    echo $? > "$STATUS/ddp-compare"
    ORDER+=(ddp-compare)
fi
grep -hE '^(FAILED|ERROR)|passed|failed|skipped|no tests ran|error' "$OUT/tests.log" 2>/dev/null | tail -n 40 >> "$LOG"

# phase 2: alone on the GPU
# one bench per L, each writing its table when it ends: a limit that cuts the last keeps the others
if stage_on bench; then
    for L in ${LENGTHS//,/ }; do
        timed "bench-L$L" "$T_BENCH" $PY -m alibi_lm.bench --device "$DEVICE" "${bench[@]}" --lengths "$L" \
            --schemes "$SCHEMES" --sections train --out "$OUT/bench-L$L"
    done
fi
# two compiled models (ALiBi and NoPE as the preset configures them): each compile of the paper's model takes minutes
# MFU compiles the paper's model twice: with less time left than GPU_CHECK_MFU_MIN_S it is deferred to a call of its
# own (not a failure), rather than cut by its limit half-way through a compile
MFU_MIN=${GPU_CHECK_MFU_MIN_S:-150}; [ "$QUICK" = 1 ] && MFU_MIN=10
if stage_on mfu && [ "$(left)" -lt "$MFU_MIN" ]; then
    log "mfu: deferred ($(left)s left, under GPU_CHECK_MFU_MIN_S=${MFU_MIN}): GPU_CHECK_TOTAL_S=200 bash scripts/gpu_check.sh run OUT --stages mfu"
    STAGES=${STAGES//mfu/}
    echo deferred > "$STATUS/mfu"
    ORDER+=(mfu)
fi
stage_on mfu && timed mfu "$(left)" $PY -m alibi_lm.bench --device "$DEVICE" "${bench[@]}" "${MFU[@]}" --compile \
    --no-dropout-rows --schemes alibi,nope --sections train --out "$OUT/mfu"

failed=0
summary=""
for name in "${ORDER[@]}"; do
    rc=$(cat "$STATUS/$name" 2>/dev/null || echo missing)
    summary+="$name=$rc "
    [ "$rc" = 0 ] || [ "$rc" = deferred ] || failed=1
done
log "summary: $summary"
# the device tool returns at most 8 files: everything in one archive, and beside it the log, ddp.json and the tables
if tar czf "$TMPDIR_OUT/gpu_check.tar.gz" -C "$OUT" . && mv "$TMPDIR_OUT/gpu_check.tar.gz" "$OUT/"; then
    find "$OUT" -type f \( -name '*.csv' -o -name '*.log' ! -name gpu_check.log \) -delete
else
    log "WARNING: could not archive the outputs: the stage logs stay (the device tool returns 8 files)"
fi
log "outputs: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
exit $failed
