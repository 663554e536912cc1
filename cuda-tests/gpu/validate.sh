#!/usr/bin/env bash
# Real-GPU validation of gpuslice: proves the slice on an NVIDIA GPU with the real driver,
# nvidia-smi, PyTorch, CuPy and an nvcc-built kernel. Run from the repository root:
#
#   bash cuda-tests/gpu/validate.sh              # every check (about 4-5 minutes on an H200;
#                                                # the budget leaves check 9 to a second call)
#   bash cuda-tests/gpu/validate.sh --dry-run    # explain what would run; runs nothing
#   bash cuda-tests/gpu/validate.sh --only 1,7   # chosen checks only (7 and 8 need no nvidia-smi)
#
# Needs target/release/libgpuslice.so (cargo build --release -p gpuslice-shim -p gpuslice-ctl),
# or GPUSLICE_LIB=path (--only 8 does not). Writes $OUT/report.json, $OUT/report.md and
# $OUT/validate.log (OUT defaults to ./gpu-report) and prints a PASS/FAIL table last. Exit: 0 no
# FAIL, 1 a FAIL, 2 bad usage or no shim. Without nvidia-smi on PATH it behaves as --dry-run.
# Each check SKIPs (never FAILs) when its tool is absent; every GPU step runs under `timeout`,
# and a total budget (GPUSLICE_VALIDATE_BUDGET_S, default 330 s) skips what would not fit.
# cuda-tests/gpu/README.md says what each check proves.
# shellcheck disable=SC2317  # functions run through "check_$id" and traps look unreachable to shellcheck
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-./gpu-report}
SHIM=${GPUSLICE_LIB:-$REPO/target/release/libgpuslice.so}
CLI=${GPUSLICE_BIN:-$REPO/target/release/gpuslice}
PY=${PYTHON:-python3}
CAP_MIB=${GPUSLICE_VALIDATE_CAP_MIB:-8192}
TOL=${GPUSLICE_VALIDATE_TOL:-0.10}
MIN_RATIO=${GPUSLICE_VALIDATE_MIN_RATIO:-0.80}
BUDGET_S=${GPUSLICE_VALIDATE_BUDGET_S:-330}
MEASURE_S=${GPUSLICE_VALIDATE_MEASURE_S:-4}
POINTS=${GPUSLICE_VALIDATE_POINTS:-5}

DRY_RUN=0
ONLY=""
usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --only)
            [ $# -ge 2 ] || { usage >&2; exit 2; }
            ONLY=",$2,"
            shift
            ;;
        -h | --help) usage; exit 0 ;;
        *) echo "validate.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

mkdir -p "$OUT" || { echo "validate.sh: cannot create OUT=$OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/validate.log
: >"$LOG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpuslice-validate.XXXXXX") || exit 2
RESULTS=$WORK/results.tsv
ENVTSV=$WORK/env.tsv
: >"$RESULTS"
: >"$ENVTSV"
BG_PIDS=()

cleanup() {
    local pid
    for pid in "${BG_PIDS[@]+"${BG_PIDS[@]}"}"; do
        kill "$pid" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { printf '%s\n' "$*" | tee -a "$LOG" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }
py_has() { have "$PY" && timeout 60 "$PY" -c "import $1" >/dev/null 2>&1; }
envinfo() { printf '%s\t%s\n' "$1" "$2" >>"$ENVTSV"; }

# record ID NAME STATUS NUMBERS_JSON DETAIL
record() {
    local numbers=${4:-}
    [ -n "$numbers" ] || numbers='{}'
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$numbers" "$(printf '%s' "${5:-}" | tr '\t\n' '  ')" >>"$RESULTS"
    log "== [$1] $2: $3 ${5:-}"
}
# record_eval ID NAME < "STATUS<TAB>NUMBERS<TAB>DETAIL" (one line from evaluate.py)
record_eval() {
    local line status numbers detail
    line=$(cat)
    IFS=$'\t' read -r status numbers detail <<<"$line"
    case "${status:-}" in
        PASS | FAIL | SKIP) record "$1" "$2" "$status" "$numbers" "$detail" ;;
        *) record "$1" "$2" FAIL '{}' "evaluate.py gave no verdict: ${line:-nothing}" ;;
    esac
}
selected() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }
# budget_ok SECONDS_NEEDED: false (and a SKIP is the caller's) when the rest would not fit.
budget_ok() { [ $((SECONDS + $1)) -le "$BUDGET_S" ]; }
num() { [[ ${1:-} =~ ^-?[0-9]+(\.[0-9]+)?$ ]] && printf '%s' "$1" || printf 'null'; }

# step NAME TIMEOUT CMD...: CMD's stdout/stderr in $WORK/NAME.out/.err, both appended to the log.
step() {
    local name=$1 limit=$2 rc
    shift 2
    timeout -k 5 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
    rc=$?
    {
        printf -- '--- step %s (rc %s, limit %ss): %s\n' "$name" "$rc" "$limit" "$*"
        sed 's/^/  out| /' "$WORK/$name.out"
        sed 's/^/  err| /' "$WORK/$name.err"
    } >>"$LOG"
    [ "$rc" -eq 124 ] && log "   step $name timed out after ${limit}s"
    return "$rc"
}
# spawn NAME TIMEOUT CMD...: like step, in the background; its pid in BG_LAST.
spawn() {
    local name=$1 limit=$2
    shift 2
    timeout -k 5 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    BG_LAST=$!
    BG_PIDS+=("$BG_LAST")
    printf -- '--- background %s (pid %s, limit %ss): %s\n' "$name" "$BG_LAST" "$limit" "$*" >>"$LOG"
}
bg_wait() {
    local name=$1 pid=$2 rc
    wait "$pid"
    rc=$?
    {
        printf -- '--- background %s ended (rc %s)\n' "$name" "$rc"
        sed 's/^/  out| /' "$WORK/$name.out"
        sed 's/^/  err| /' "$WORK/$name.err"
    } >>"$LOG"
    return "$rc"
}
# wait_files SECONDS PID FILE...: true once every FILE exists; false at the deadline or when
# PID (the producer, 0 = none) has died.
wait_files() {
    local deadline=$((SECONDS + $1)) pid=$2 f missing
    shift 2
    while :; do
        missing=0
        for f in "$@"; do [ -e "$f" ] || missing=1; done
        [ "$missing" -eq 0 ] && return 0
        [ "$SECONDS" -ge "$deadline" ] && return 1
        if [ "$pid" != 0 ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        sleep 0.05
    done
}

# write_config NAME MEMORY COMPUTE [POLICY [PRIORITY]]: a limit file (and its own region) for
# device 0; "" = unset; POLICY defaults to cap, PRIORITY is written only when given.
write_config() {
    local name=$1 mem=$2 compute=$3 policy=${4:-cap} priority=${5:-} dev='"index":0' top
    [ -n "$mem" ] && dev="$dev,\"memory\":\"$mem\""
    [ -n "$compute" ] && dev="$dev,\"compute\":$compute"
    top="\"policy\":\"$policy\""
    [ -n "$priority" ] && top="$top,\"priority\":\"$priority\""
    printf '{"version":1,"region":"%s",%s,"devices":[{%s}]}\n' \
        "$WORK/$name.region" "$top" "$dev" >"$WORK/$name.json"
    printf '%s' "$WORK/$name.json"
}
# "$IN_SLICE" CONFIG CMD...: CMD under the shim with that limit file (HAMi env cleared, so the
# file is the only source). "$OUTSIDE" CMD...: the host's view, no shim at all. Both are small
# executables (not functions) so that `timeout` can run them.
IN_SLICE=$WORK/in-slice
OUTSIDE=$WORK/outside
cat >"$IN_SLICE" <<EOF
#!/usr/bin/env bash
config=\$1
shift
exec env -u CUDA_DEVICE_MEMORY_LIMIT -u CUDA_DEVICE_SM_LIMIT -u CUDA_DEVICE_MEMORY_SHARED_CACHE \\
    LD_PRELOAD="$SHIM" GPUSLICE_CONFIG="\$config" "\$@"
EOF
cat >"$OUTSIDE" <<'EOF'
#!/usr/bin/env bash
exec env -u LD_PRELOAD -u GPUSLICE_CONFIG "$@"
EOF
chmod +x "$IN_SLICE" "$OUTSIDE"

# ---------------------------------------------------------------------------------------------
# Plan (printed by --dry-run, and logged on a real run)
# ---------------------------------------------------------------------------------------------
CHECK_IDS=(1 2 3 4 5 6 7 8 9 10 11 12)
declare -A TITLE=(
    [1]="nvidia-smi shows the slice"
    [2]="PyTorch memory cap"
    [3]="CuPy memory cap"
    [4]="two processes share one cap"
    [5]="compute share"
    [6]="shim overhead"
    [7]="non-CUDA processes unaffected"
    [8]="driver facts the shim relies on"
    [9]="compute share matrix"
    [10]="nvidia-smi lists only the slice's processes"
    [11]="the driver's own memory is charged within the bound"
    [12]="oversubscription holds the card to the physical share"
)
declare -A PLAN=(
    [1]="nvidia-smi (table, --query-gpu=memory.total,memory.used, -q -d MEMORY) with and without the shim under a ${CAP_MIB} MiB limit: ${CAP_MIB}MiB inside, the whole card outside"
    [2]="torch_cap.py default and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate): mem_get_info total = cap; 256 MiB then 16 MiB allocations until torch.cuda.OutOfMemoryError, refused within one allocation of the cap; nvidia-smi (no shim) process memory sampled while held <= cap"
    [3]="cupy_cap.py with cupy.cuda.MemoryPool and cupy.cuda.MemoryAsyncPool (cuMemAllocAsync/FromPoolAsync): same criteria as 2"
    [4]="one process holds 5 GiB of the ${CAP_MIB} MiB slice; a second one in the same slice sees it as used, is refused 5 GiB and granted 1 GiB"
    [5]="compute_share.py (bf16 8192^3 matmul loop) and spin (nvcc, full-GPU spin kernels) alone at 100% without the shim, then at 25/50/100% under the shim: throughput ratio and NVML process utilisation (pynvml, outside the shim) vs target +-${TOL}; then 25% beside an unthrottled neighbour"
    [6]="spin launch (empty kernels/s) and alloc (cudaMalloc+cudaFree pairs/s): bare, shim with no limit file, shim with limits (memory cap, compute 100); ratios >= ${MIN_RATIO}"
    [7]="python3, bash and ls (exit codes 3/5/2, stdout and stderr) bare vs under the shim with a valid, a missing and an invalid limit file: byte-identical"
    [9]="spin kernels of ~10 us, 1 ms and 10 ms (cycles calibrated on this GPU) alone without the shim, then each at 10/50/90% in one process; four processes of one 50% slice; one 50% slice mixing the three lengths; two burst slices 30% + 20% (split 3:2 +-20%, >= 75% used); burst 30% high + 30% low (high >= low + 10 points): each process's kernels/s over its length's solo rate, summed per slice, within +-${POINTS} points"
    [10]="a process holding 512 MiB in each of two slices: nvidia-smi (--query-compute-apps and the table, which read NVML's private export table) in slice A lists A's process alone, in B B's alone, both without the shim; the shim must know the driver's table layout (GPUSLICE_LOG=debug says when it does not)"
    [11]="driver_growth.py under a ${CAP_MIB} MiB limit: fills the slice to 256 MiB below the cap, loads a PTX module with 128 MiB of static data (fits), looks up a kernel whose local memory for every resident thread needs 64 MiB more than is left (refused with CUDA_ERROR_OUT_OF_MEMORY, the handle taken back, the driver's figure unchanged), then looks up and launches one whose local memory fits (charged before the driver places it: the slice covers the driver's per-process figure, nvidia-smi outside the shim, within the 64 MiB bound from the first sample); the card never shows the process past the cap"
    [12]="oversubscribe.py (PyTorch) under memory ${CAP_MIB} MiB, virtual ${CAP_MIB} MiB + 4 GiB: mem_get_info total = the virtual size; 256 MiB tensors fill past the cap; nvidia-smi (no shim) samples the process's memory while held: <= the cap; a read of host-placed memory is slower than one on the card"
    [8]="driver_facts.py without the shim (ctypes on libcuda.so.1, libnvidia-ml.so.1): cuGetProcAddress_v2 at 12080 and the driver's version, default and per-thread stream, returns dlsym of every export the shim hooks; primary context active 0/1/0/1/1/0 over retain, reset, retain, release, release; reports the context's NVML cost, the VMM granularity and a 1-byte cuMemAlloc's cost"
)

detect_tools() {
    HAVE_SMI=0 HAVE_PY=0 HAVE_TORCH=0 HAVE_CUPY=0 HAVE_NVCC=0 HAVE_PYNVML=0
    have nvidia-smi && HAVE_SMI=1
    have "$PY" && HAVE_PY=1
    if [ "$HAVE_PY" -eq 1 ]; then
        py_has torch && HAVE_TORCH=1
        py_has cupy && HAVE_CUPY=1
        py_has pynvml && HAVE_PYNVML=1
    fi
    have nvcc && HAVE_NVCC=1
    HAVE_SHIM=0
    # The front (libgpuslice.so) loads its core from its own directory at the first CUDA
    # call, and without it fails closed: every check would fail, for want of a file.
    [ -f "$SHIM" ] && [ -f "$(dirname "$SHIM")/libgpuslice_core.so" ] && HAVE_SHIM=1
}

print_plan() {
    local id
    log "gpuslice real-GPU validation: plan (cap ${CAP_MIB} MiB, tolerance ${TOL}, budget ${BUDGET_S}s)"
    log "  shim:        $SHIM ($([ "$HAVE_SHIM" -eq 1 ] && echo "found, with libgpuslice_core.so beside it" || echo "MISSING, or no libgpuslice_core.so beside it: cargo build --release -p gpuslice-shim -p gpuslice-ctl, and carry both"))"
    log "  gpuslice:    $CLI ($([ -x "$CLI" ] && echo found || echo 'missing: optional, used for gpuslice check'))"
    log "  nvidia-smi:  $([ "$HAVE_SMI" -eq 1 ] && command -v nvidia-smi || echo absent)"
    log "  python3:     $([ "$HAVE_PY" -eq 1 ] && command -v "$PY" || echo absent)  torch: $HAVE_TORCH  cupy: $HAVE_CUPY  pynvml: $HAVE_PYNVML  nvcc: $HAVE_NVCC"
    log "  report:      $OUT/report.json, $OUT/report.md, $OUT/validate.log"
    for id in "${CHECK_IDS[@]}"; do
        selected "$id" || continue
        log "  check $id, ${TITLE[$id]}: ${PLAN[$id]}"
    done
}

# ---------------------------------------------------------------------------------------------
# Checks. Each records one or more rows: PASS/FAIL/SKIP with numbers.
# ---------------------------------------------------------------------------------------------

smi_mem() { # smi_mem NAME PREFIX...: "total used" MiB of GPU 0
    local name=$1
    shift
    step "$name" 30 "$@" nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits -i 0 || return 1
    tr -d ' ' <"$WORK/$name.out" | head -1 | tr ',' ' '
}

check_1() {
    local id=1 name=${TITLE[1]} cfg card slice card_total slice_total slice_used table_ok=0 q_total bad=""
    cfg=$(write_config smi "${CAP_MIB}MiB" "")
    card=$(smi_mem smi-card "$OUTSIDE") || { record "$id" "$name" FAIL '{}' "nvidia-smi failed without the shim"; return; }
    slice=$(smi_mem smi-slice "$IN_SLICE" "$cfg") || { record "$id" "$name" FAIL '{}' "nvidia-smi failed under the shim (rc in validate.log)"; return; }
    read -r card_total _ <<<"$card"
    read -r slice_total slice_used <<<"$slice"
    if step smi-table 30 "$IN_SLICE" "$cfg" nvidia-smi && grep -Eq "/ *${CAP_MIB}MiB" "$WORK/smi-table.out"; then
        table_ok=1
    fi
    q_total=""
    if step smi-q 30 "$IN_SLICE" "$cfg" nvidia-smi -q -d MEMORY -i 0; then
        q_total=$(awk '/FB Memory Usage/{fb=1} fb && /Total/{print $3; exit}' "$WORK/smi-q.out")
    fi
    [ "$(num "$slice_total")" = "$CAP_MIB" ] || bad="$bad; --query-gpu total under the shim is ${slice_total:-?} MiB"
    [ "$table_ok" -eq 1 ] || bad="$bad; the nvidia-smi table does not show /${CAP_MIB}MiB"
    [ "$(num "$q_total")" = "$CAP_MIB" ] || bad="$bad; nvidia-smi -q FB total is ${q_total:-?} MiB"
    if [ "$(num "$card_total")" = null ] || [ "$card_total" -le "$CAP_MIB" ]; then
        bad="$bad; without the shim the card shows ${card_total:-?} MiB (want more than the cap)"
    fi
    if [ "$(num "$slice_used")" != null ] && [ "$(num "$slice_total")" != null ] && [ "$slice_used" -gt "$slice_total" ]; then
        bad="$bad; used ${slice_used} > total under the shim"
    fi
    local numbers
    numbers=$(printf '{"cap_mib":%s,"card_total_mib":%s,"slice_total_mib":%s,"slice_used_mib":%s,"smi_q_total_mib":%s,"table_shows_cap":%s}' \
        "$CAP_MIB" "$(num "$card_total")" "$(num "$slice_total")" "$(num "$slice_used")" "$(num "$q_total")" \
        "$([ "$table_ok" -eq 1 ] && echo true || echo false)")
    if [ -n "$bad" ]; then
        record "$id" "$name" FAIL "$numbers" "${bad#; }"
    else
        record "$id" "$name" PASS "$numbers" "slice ${slice_total} MiB inside (table, query, -q), card ${card_total} MiB outside"
    fi
}

# smi_pids NAME PREFIX...: the PIDs nvidia-smi's compute-apps query lists, sorted, one line.
smi_pids() {
    local name=$1
    shift
    step "$name" 30 "$@" nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0 || return 1
    tr -d ' ' <"$WORK/$name.out" | grep -E '^[0-9]+$' | sort -n | tr '\n' ' ' | sed 's/ $//'
}
# table_pids FILE: the PIDs in the Processes box of a saved nvidia-smi table.
table_pids() {
    sed -n '/Processes:/,$p' "$1" | awk -F'|' 'NF > 2 { split($2, c, " "); if (c[1] ~ /^[0-9]+$/ && c[4] ~ /^[0-9]+$/) print c[4] }' |
        sort -n | tr '\n' ' ' | sed 's/ $//'
}

check_10() {
    local id=10 name=${TITLE[10]} helper cfg_a cfg_b pid_a pid_b hold_a hold_b a b both table_a bad="" layout=""
    if [ "$HAVE_TORCH" -eq 1 ]; then helper=torch_cap.py
    elif [ "$HAVE_CUPY" -eq 1 ]; then helper=cupy_cap.py
    else record "$id" "$name" SKIP '{}' "neither torch nor cupy for $PY"; return; fi
    budget_ok 60 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    cfg_a=$(write_config smi-a "${CAP_MIB}MiB" "")
    cfg_b=$(write_config smi-b "${CAP_MIB}MiB" "")
    spawn smi-hold-a 120 "$IN_SLICE" "$cfg_a" "$PY" "$HERE/$helper" --mode hold --hold-mib 512 \
        --ready "$WORK/smi-a.ready" --release "$WORK/smi.release"
    hold_a=$BG_LAST
    spawn smi-hold-b 120 "$IN_SLICE" "$cfg_b" "$PY" "$HERE/$helper" --mode hold --hold-mib 512 \
        --ready "$WORK/smi-b.ready" --release "$WORK/smi.release"
    hold_b=$BG_LAST
    if ! wait_files 90 0 "$WORK/smi-a.ready" "$WORK/smi-b.ready"; then
        touch "$WORK/smi.release"
        bg_wait smi-hold-a "$hold_a"
        bg_wait smi-hold-b "$hold_b"
        record "$id" "$name" FAIL '{}' "the holders never held 512 MiB (see validate.log)"
        return
    fi
    pid_a=$(grep -o '"pid": *[0-9]*' "$WORK/smi-hold-a.out" | grep -o '[0-9]*$' | head -1)
    pid_b=$(grep -o '"pid": *[0-9]*' "$WORK/smi-hold-b.out" | grep -o '[0-9]*$' | head -1)
    a=$(smi_pids smi-pids-a "$IN_SLICE" "$cfg_a") || bad="$bad; nvidia-smi failed in slice A"
    b=$(smi_pids smi-pids-b "$IN_SLICE" "$cfg_b") || bad="$bad; nvidia-smi failed in slice B"
    both=$(smi_pids smi-pids-card "$OUTSIDE") || bad="$bad; nvidia-smi failed without the shim"
    if step smi-table-a 30 "$IN_SLICE" "$cfg_a" env GPUSLICE_LOG=debug nvidia-smi; then
        table_a=$(table_pids "$WORK/smi-table-a.out")
        layout=$(grep -o 'unknown layout ([0-9]* bytes)' "$WORK/smi-table-a.err" | head -1)
    else
        bad="$bad; the nvidia-smi table failed in slice A"
    fi
    touch "$WORK/smi.release"
    bg_wait smi-hold-a "$hold_a"
    bg_wait smi-hold-b "$hold_b"
    [ -n "$layout" ] && bad="$bad; the shim does not know this driver's table: $layout"
    [ "$a" = "$pid_a" ] || bad="$bad; slice A lists '${a}', want '${pid_a}'"
    [ "$b" = "$pid_b" ] || bad="$bad; slice B lists '${b}', want '${pid_b}'"
    [ "${table_a:-}" = "$pid_a" ] || bad="$bad; slice A's table lists '${table_a:-}', want '${pid_a}'"
    [ "$both" = "$(printf '%s\n%s\n' "$pid_a" "$pid_b" | sort -n | tr '\n' ' ' | sed 's/ $//')" ] ||
        bad="$bad; without the shim nvidia-smi lists '${both}', want both holders"
    local numbers
    numbers=$(printf '{"pid_a":%s,"pid_b":%s,"slice_a":"%s","slice_b":"%s","card":"%s","table_a":"%s"}' \
        "$(num "$pid_a")" "$(num "$pid_b")" "$a" "$b" "$both" "${table_a:-}")
    if [ -n "$bad" ]; then
        record "$id" "$name" FAIL "$numbers" "${bad#; }"
    else
        record "$id" "$name" PASS "$numbers" "each slice lists its own process alone (query and table), the card both"
    fi
}

cap_run() { # cap_run ID NAME HELPER VARIANT [ENV=VAL...]
    local id=$1 name=$2 helper=$3 variant=$4 cfg tag
    shift 4
    tag=cap-$id
    budget_ok 45 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    cfg=$(write_config "$tag" "${CAP_MIB}MiB" "")
    step "$tag" 150 "$IN_SLICE" "$cfg" env "$@" "$PY" "$HERE/$helper" --mode fill --variant "$variant" --cap-mib "$CAP_MIB"
    "$PY" "$HERE/evaluate.py" cap "$WORK/$tag.out" --cap-mib "$CAP_MIB" | record_eval "$id" "$name"
}

check_2() {
    if [ "$HAVE_TORCH" -eq 0 ]; then
        record 2a "PyTorch cap (caching allocator)" SKIP '{}' "no torch for $PY"
        record 2b "PyTorch cap (expandable segments)" SKIP '{}' "no torch for $PY"
        return
    fi
    cap_run 2a "PyTorch cap (caching allocator)" torch_cap.py default PYTORCH_CUDA_ALLOC_CONF=
    cap_run 2b "PyTorch cap (expandable segments)" torch_cap.py expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
}

check_3() {
    if [ "$HAVE_CUPY" -eq 0 ]; then
        record 3a "CuPy cap (MemoryPool)" SKIP '{}' "no cupy for $PY"
        record 3b "CuPy cap (MemoryAsyncPool)" SKIP '{}' "no cupy for $PY"
        return
    fi
    cap_run 3a "CuPy cap (MemoryPool)" cupy_cap.py default
    cap_run 3b "CuPy cap (MemoryAsyncPool)" cupy_cap.py async
}

check_4() {
    local id=4 name=${TITLE[4]} helper cfg hold_pid
    if [ "$HAVE_TORCH" -eq 1 ]; then helper=torch_cap.py
    elif [ "$HAVE_CUPY" -eq 1 ]; then helper=cupy_cap.py
    else record "$id" "$name" SKIP '{}' "neither torch nor cupy for $PY"; return; fi
    budget_ok 60 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    cfg=$(write_config shared "${CAP_MIB}MiB" "")
    local hold_mib=$((CAP_MIB * 5 / 8 / 256 * 256)) try_mib=$((CAP_MIB * 5 / 8)) small_mib=$((CAP_MIB / 8))
    spawn two-hold 120 "$IN_SLICE" "$cfg" "$PY" "$HERE/$helper" --mode hold --hold-mib "$hold_mib" \
        --ready "$WORK/two.ready" --release "$WORK/two.release"
    hold_pid=$BG_LAST
    if ! wait_files 90 "$hold_pid" "$WORK/two.ready"; then
        touch "$WORK/two.release"
        bg_wait two-hold "$hold_pid"
        record "$id" "$name" FAIL '{}' "the first process never held ${hold_mib} MiB (see validate.log)"
        return
    fi
    step two-try 90 "$IN_SLICE" "$cfg" "$PY" "$HERE/$helper" --mode try --try-mib "$try_mib" --small-mib "$small_mib"
    touch "$WORK/two.release"
    bg_wait two-hold "$hold_pid"
    "$PY" "$HERE/evaluate.py" two "$WORK/two-hold.out" "$WORK/two-try.out" --cap-mib "$CAP_MIB" | record_eval "$id" "$name"
}

# share_series KIND CMD...: baseline (no shim) and 25/50/100% runs of one workload, each with an
# outside NVML sampler over the measured interval. Files: $WORK/share-KIND-{base,25,50,100}.out
share_series() {
    local kind=$1 share cfg pid sampler go ready
    shift
    for share in base 25 50 100; do
        go=$WORK/share-$kind-$share.go ready=$WORK/share-$kind-$share.ready
        if [ "$share" = base ]; then
            spawn "share-$kind-$share" 90 "$OUTSIDE" "$@" --ready "$ready" --go "$go"
        else
            cfg=$(write_config "share-$kind-$share" "" "$share")
            spawn "share-$kind-$share" 90 "$IN_SLICE" "$cfg" "$@" --ready "$ready" --go "$go"
        fi
        pid=$BG_LAST
        spawn "nvml-$kind-$share" 120 "$OUTSIDE" "$PY" "$HERE/nvml_sample.py" --wait "$go" \
            --seconds "$((MEASURE_S - 1))" --interval 0.5
        sampler=$BG_LAST
        wait_files 80 "$pid" "$ready" || log "   $kind $share: the workload never got ready"
        touch "$go"
        bg_wait "share-$kind-$share" "$pid"
        bg_wait "nvml-$kind-$share" "$sampler"
    done
}

share_verdict() { # share_verdict ID NAME KIND RATE_KEY
    local id=$1 name=$2 kind=$3 key=$4 args=() share
    for share in 25 50 100; do
        args+=(--run "$share:$WORK/share-$kind-$share.out:$WORK/nvml-$kind-$share.out")
    done
    "$PY" "$HERE/evaluate.py" share --baseline "$WORK/share-$kind-base.out" "${args[@]}" \
        --rate-key "$key" --tol "$TOL" | record_eval "$id" "$name"
}

build_spin() {
    SPIN=""
    [ "$HAVE_NVCC" -eq 1 ] || return 1
    [ -n "${SPIN_BUILT:-}" ] && { SPIN=$SPIN_BUILT; return 0; }
    local cc arch=()
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader -i 0 2>/dev/null | head -1 | tr -d ' .')
    [[ $cc =~ ^[0-9]+$ ]] && arch=(-arch="sm_$cc")
    if step nvcc-spin 180 nvcc -O2 "${arch[@]+"${arch[@]}"}" -o "$WORK/spin" "$HERE/spin.cu"; then
        SPIN_BUILT=$WORK/spin
        SPIN=$SPIN_BUILT
        envinfo spin_build "nvcc -O2 ${arch[*]+"${arch[*]}"}"
        return 0
    fi
    envinfo spin_build "nvcc failed (see validate.log)"
    return 1
}

check_5() {
    local name=${TITLE[5]} pair_cmd=() key go cfg slow fast sampler
    if [ "$HAVE_TORCH" -eq 1 ] && budget_ok 70; then
        share_series torch "$PY" "$HERE/compute_share.py" --seconds "$MEASURE_S"
        share_verdict 5a "$name: torch matmul" torch matmuls_per_s
    elif [ "$HAVE_TORCH" -eq 0 ]; then
        record 5a "$name: torch matmul" SKIP '{}' "no torch for $PY"
    else
        record 5a "$name: torch matmul" SKIP '{}' "time budget (${BUDGET_S}s) spent"
    fi
    if ! build_spin; then
        record 5b "$name: nvcc spin kernel" SKIP '{}' "no nvcc, or spin.cu did not build (validate.log)"
    elif budget_ok 40; then
        share_series spin "$SPIN" spin --seconds "$MEASURE_S"
        share_verdict 5b "$name: nvcc spin kernel" spin kernels_per_s
    else
        record 5b "$name: nvcc spin kernel" SKIP '{}' "time budget (${BUDGET_S}s) spent"
    fi
    # The pair: 25% beside an unthrottled neighbour outside every slice, measured together.
    if [ -f "$WORK/share-torch-base.out" ] && grep -q '^RESULT .*matmuls_per_s' "$WORK/share-torch-base.out"; then
        key=torch pair_cmd=("$PY" "$HERE/compute_share.py" --seconds "$MEASURE_S")
    elif [ -n "${SPIN:-}" ] && grep -qs '^RESULT .*kernels_per_s' "$WORK/share-spin-base.out"; then
        key=spin pair_cmd=("$SPIN" spin --seconds "$MEASURE_S")
    else
        record 5c "$name: 25% beside a neighbour" SKIP '{}' "no solo baseline (torch or nvcc needed)"
        return
    fi
    budget_ok 30 || { record 5c "$name: 25% beside a neighbour" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    go=$WORK/pair.go
    cfg=$(write_config pair "" 25)
    spawn pair-slow 90 "$IN_SLICE" "$cfg" "${pair_cmd[@]}" --ready "$WORK/pair-slow.ready" --go "$go"
    slow=$BG_LAST
    spawn pair-fast 90 "$OUTSIDE" "${pair_cmd[@]}" --ready "$WORK/pair-fast.ready" --go "$go"
    fast=$BG_LAST
    spawn nvml-pair 120 "$OUTSIDE" "$PY" "$HERE/nvml_sample.py" --wait "$go" --seconds "$((MEASURE_S - 1))" --interval 0.5
    sampler=$BG_LAST
    wait_files 80 0 "$WORK/pair-slow.ready" "$WORK/pair-fast.ready" || log "   pair: a workload never got ready"
    touch "$go"
    bg_wait pair-slow "$slow"
    bg_wait pair-fast "$fast"
    bg_wait nvml-pair "$sampler"
    local rate=matmuls_per_s
    [ "$key" = spin ] && rate=kernels_per_s
    "$PY" "$HERE/evaluate.py" pair --baseline "$WORK/share-$key-base.out" --throttled "$WORK/pair-slow.out" \
        --neighbour "$WORK/pair-fast.out" --sample "$WORK/nvml-pair.out" --share 25 --rate-key "$rate" \
        --tol "$TOL" | record_eval 5c "$name: 25% beside a neighbour ($key)"
}

check_6() {
    local id=6 name=${TITLE[6]} cfg mode
    if ! build_spin; then
        record "$id" "$name" SKIP '{}' "no nvcc, or spin.cu did not build (validate.log)"
        return
    fi
    budget_ok 45 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    cfg=$(write_config overhead "${CAP_MIB}MiB" 100)
    for mode in launch alloc; do
        step "ovh-$mode-bare" 60 "$OUTSIDE" "$SPIN" "$mode"
        step "ovh-$mode-unconf" 60 "$IN_SLICE" "$WORK/no-such-limits.json" "$SPIN" "$mode"
        step "ovh-$mode-limited" 60 "$IN_SLICE" "$cfg" "$SPIN" "$mode"
    done
    "$PY" "$HERE/evaluate.py" overhead \
        --launch "$WORK/ovh-launch-bare.out" "$WORK/ovh-launch-unconf.out" "$WORK/ovh-launch-limited.out" \
        --alloc "$WORK/ovh-alloc-bare.out" "$WORK/ovh-alloc-unconf.out" "$WORK/ovh-alloc-limited.out" \
        --min-ratio "$MIN_RATIO" | record_eval "$id" "$name"
}

check_7() {
    local id=7 name=${TITLE[7]} valid invalid prog variant compared=0 diffs="" rcs=""
    valid=$(write_config plain "${CAP_MIB}MiB" 25)
    invalid=$WORK/invalid.json
    printf '{"version":1,"devices":[{"index":0,"memory":"8XB"}]}\n' >"$invalid"
    local -a progs=(
        "python3|$PY -c 'import hashlib,sys; print(sum(range(10**6))); print(hashlib.sha256(b\"gpuslice\").hexdigest()); sys.stderr.write(\"to stderr\\n\"); sys.exit(3)'"
        "bash|bash -c 'echo hello; printf \"%s\\n\" b a c | sort; echo oops >&2; exit 5'"
        "ls|ls -d / /nonexistent-gpuslice-path"
    )
    local entry label cmd
    for entry in "${progs[@]}"; do
        label=${entry%%|*} cmd=${entry#*|}
        if [ "$label" = python3 ] && [ "$HAVE_PY" -eq 0 ]; then continue; fi
        step "plain-$label-bare" 30 "$OUTSIDE" bash -c "$cmd"
        local base_rc=$?
        rcs="$rcs $label=$base_rc"
        for variant in valid missing invalid; do
            case $variant in
                valid) prog=$valid ;;
                missing) prog=$WORK/no-such-limits.json ;;
                invalid) prog=$invalid ;;
            esac
            step "plain-$label-$variant" 30 "$IN_SLICE" "$prog" bash -c "$cmd"
            local rc=$?
            compared=$((compared + 1))
            if [ "$rc" -ne "$base_rc" ] || ! cmp -s "$WORK/plain-$label-bare.out" "$WORK/plain-$label-$variant.out" ||
                ! cmp -s "$WORK/plain-$label-bare.err" "$WORK/plain-$label-$variant.err"; then
                diffs="$diffs; $label with $variant limit file: rc $rc vs $base_rc or output differs"
            fi
        done
    done
    local numbers
    numbers=$(printf '{"comparisons":%s,"differences":%s}' "$compared" "$(printf '%s' "$diffs" | grep -o ';' | wc -l)")
    if [ -n "$diffs" ]; then
        record "$id" "$name" FAIL "$numbers" "${diffs#; } (outputs in validate.log)"
    else
        record "$id" "$name" PASS "$numbers" "stdout, stderr and exit codes identical (bare rc:$rcs)"
    fi
}

check_8() {
    local id=8 name=${TITLE[8]}
    budget_ok 20 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    # Its exit code (0 PASS, 1 FAIL, 2 could not run) repeats the verdict in its JSON.
    step facts 60 "$OUTSIDE" "$PY" "$HERE/driver_facts.py"
    "$PY" "$HERE/evaluate.py" facts "$WORK/facts.out" | record_eval "$id" "$name"
}

check_11() {
    local id=11 name=${TITLE[11]} cfg
    budget_ok 30 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    cfg=$(write_config growth "${CAP_MIB}MiB" "")
    step growth 60 "$IN_SLICE" "$cfg" "$PY" "$HERE/driver_growth.py"
    "$PY" "$HERE/evaluate.py" growth "$WORK/growth.out" --bound-mib 64 | record_eval "$id" "$name"
}

check_12() {
    local id=12 name=${TITLE[12]} cfg pid over_mib=$((CAP_MIB + 4096)) peak=0 used line numbers bad=""
    [ "$HAVE_TORCH" -eq 1 ] || { record "$id" "$name" SKIP '{}' "no torch for $PY"; return; }
    budget_ok 60 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    cfg=$(write_config over "${CAP_MIB}MiB" "")
    sed -i "s/\"memory\":\"${CAP_MIB}MiB\"/&,\"virtual\":\"${over_mib}MiB\"/" "$cfg"
    spawn over 150 "$IN_SLICE" "$cfg" "$PY" "$HERE/oversubscribe.py" --ready "$WORK/over.ready" --release "$WORK/over.release"
    pid=$BG_LAST
    if wait_files 120 "$pid" "$WORK/over.ready"; then
        for _ in 1 2 3 4 5; do
            used=$(timeout 30 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -i 0 2>>"$LOG" |
                awk -F', *' -v p="$pid" '$1 == p { print $2 }' | sort -n | tail -1)
            [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
            sleep 0.2
        done
    fi
    touch "$WORK/over.release"
    bg_wait over "$pid"
    line=$(tail -1 "$WORK/over.out")
    [ -n "$line" ] || line='{}'
    numbers=$("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); d["smi_peak_mib"]=int(sys.argv[2]); print(json.dumps(d))' "$line" "$peak" 2>/dev/null || echo '{}')
    "$PY" - "$numbers" "$CAP_MIB" "$over_mib" >"$WORK/over.verdict" <<'PY'
import json, sys
d, cap, over = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
bad = []
if d.get("total", 0) >> 20 != over: bad.append(f"mem_get_info total {d.get('total', 0) >> 20} MiB, want {over}")
if d.get("filled", 0) >> 20 <= cap: bad.append(f"filled only {d.get('filled', 0) >> 20} MiB: nothing past the cap")
if not 0 < d.get("smi_peak_mib", 0) <= cap: bad.append(f"nvidia-smi saw {d.get('smi_peak_mib')} MiB for the process, cap {cap}")
if not d.get("host_read_ms", 0) > d.get("card_read_ms", 0): bad.append("a host-placed read was not slower than a card read")
print("; ".join(bad))
PY
    bad=$(cat "$WORK/over.verdict")
    if [ -n "$bad" ]; then
        record "$id" "$name" FAIL "$numbers" "$bad"
    else
        record "$id" "$name" PASS "$numbers" "told ${over_mib} MiB, card peak ${peak} MiB <= ${CAP_MIB}"
    fi
}

# matrix_group TAG CASE KIND TARGETS SPEC...: runs every SPEC together (each waits on its
# --ready/--go pair, so all measure the same seconds) and appends the case to the manifest
# evaluate.py reads. SPEC = SLICE:LEN:CONFIG (CONFIG "-" = outside every slice, no shim);
# TARGETS = the JSON members of the slices' targets, e.g. '"a":50'.
matrix_group() {
    local tag=$1 case_name=$2 kind=$3 targets=$4 spec slice len cfg i=0 procs="" go=$WORK/$1.go
    local -a pids=() readies=()
    shift 4
    for spec in "$@"; do
        IFS=: read -r slice len cfg <<<"$spec"
        local runner=("$IN_SLICE" "$cfg")
        [ "$cfg" = - ] && runner=("$OUTSIDE")
        spawn "$tag-$i" 60 "${runner[@]}" "$SPIN" spin --seconds "$MEASURE_S" --cycles "${MATRIX_CYCLES[$len]}" \
            --ready "$WORK/$tag-$i.ready" --go "$go"
        pids+=("$BG_LAST")
        readies+=("$WORK/$tag-$i.ready")
        procs="$procs${procs:+,}{\"slice\":\"$slice\",\"len\":\"$len\",\"file\":\"$WORK/$tag-$i.out\"}"
        i=$((i + 1))
    done
    wait_files 50 0 "${readies[@]}" || log "   $tag: a workload never got ready"
    touch "$go"
    for i in "${!pids[@]}"; do bg_wait "$tag-$i" "${pids[$i]}"; done
    printf '{"case":"%s","kind":"%s","targets":{%s},"procs":[%s]}\n' "$case_name" "$kind" "$targets" "$procs" >>"$MATRIX"
}

check_9() {
    local id=9 name=${TITLE[9]} per_s cfg share len
    if ! build_spin; then
        record "$id" "$name" SKIP '{}' "no nvcc, or spin.cu did not build (validate.log)"
        return
    fi
    budget_ok 60 || { record "$id" "$name" SKIP '{}' "time budget (${BUDGET_S}s) spent"; return; }
    # Calibration: kernels/s at 2,000,000 cycles gives the cycles of a 10 us, 1 ms and 10 ms
    # kernel on this GPU (launch gaps included, which the solo runs measure too).
    step matrix-calibrate 60 "$OUTSIDE" "$SPIN" spin --seconds 1 --cycles 2000000
    per_s=$(sed -n 's/^RESULT .*"kernels_per_s":\([0-9.]*\).*/\1/p' "$WORK/matrix-calibrate.out" | tail -1)
    if [ "$(num "$per_s")" = null ]; then
        record "$id" "$name" FAIL '{}' "the calibration spin gave no kernels/s (see validate.log)"
        return
    fi
    declare -gA MATRIX_CYCLES=()
    for len in 10us:0.00001 1ms:0.001 10ms:0.01; do
        MATRIX_CYCLES[${len%%:*}]=$(awk -v r="$per_s" -v s="${len#*:}" 'BEGIN { c = 2000000 * r * s; printf "%d", (c < 1000 ? 1000 : c) }')
    done
    envinfo matrix_cycles "10us=${MATRIX_CYCLES[10us]} 1ms=${MATRIX_CYCLES[1ms]} 10ms=${MATRIX_CYCLES[10ms]}"
    MATRIX=$WORK/matrix.jsonl
    : >"$MATRIX"
    for len in 10us 1ms 10ms; do
        budget_ok 12 || break
        matrix_group "mx-base-$len" "solo $len" base '' "solo:$len:-"
    done
    for len in 10us 1ms 10ms; do
        for share in 10 50 90; do
            budget_ok 12 || break 2
            cfg=$(write_config "mx-$len-$share" "" "$share" cap normal)
            matrix_group "mx-$len-$share" "$len x1 at $share%" share "\"a\":$share" "a:$len:$cfg"
        done
    done
    if budget_ok 12; then
        cfg=$(write_config mx-four "" 50 cap normal)
        matrix_group mx-four "1ms x4 at 50%" share '"a":50' "a:1ms:$cfg" "a:1ms:$cfg" "a:1ms:$cfg" "a:1ms:$cfg"
    fi
    if budget_ok 12; then
        cfg=$(write_config mx-mixed "" 50 cap normal)
        matrix_group mx-mixed "mixed 10us+1ms+10ms at 50%" share '"a":50' "a:10us:$cfg" "a:1ms:$cfg" "a:10ms:$cfg"
    fi
    if budget_ok 12; then
        matrix_group mx-burst "burst 30% + 20%" burst '"a":30,"b":20' \
            "a:1ms:$(write_config mx-burst-a "" 30 burst normal)" "b:1ms:$(write_config mx-burst-b "" 20 burst normal)"
    fi
    if budget_ok 12; then
        matrix_group mx-priority "burst 30% high + 30% low" priority '"high":30,"low":30' \
            "high:1ms:$(write_config mx-high "" 30 burst high)" "low:1ms:$(write_config mx-low "" 30 burst low)"
    fi
    "$PY" "$HERE/evaluate.py" matrix "$MATRIX" --points "$POINTS" | record_eval "$id" "$name"
}

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
detect_tools
MODE=run
if [ "$DRY_RUN" -eq 1 ]; then
    MODE=dry-run
elif [ "$HAVE_SMI" -eq 0 ] && [ -z "$ONLY" ]; then
    MODE=dry-run
    log "validate.sh: no nvidia-smi on PATH: dry run (use --only 7 to run the checks that need no GPU)"
fi

envinfo date_utc "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
envinfo host "$(uname -n) $(uname -r) $(uname -m)"
envinfo mode "$MODE"
envinfo cap_mib "$CAP_MIB"
envinfo tolerance "$TOL"
envinfo shim "$SHIM"
if [ "$HAVE_SHIM" -eq 1 ]; then
    envinfo shim_sha256 "$(sha256sum "$SHIM" | cut -c1-16)"
fi
envinfo git_commit "$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"

print_plan
if [ "$MODE" = dry-run ]; then
    for id in "${CHECK_IDS[@]}"; do
        selected "$id" && record "$id" "${TITLE[$id]}" SKIP '{}' "dry run: nothing executed"
    done
    if have "$PY"; then
        "$PY" "$HERE/report.py" "$RESULTS" "$ENVTSV" "$OUT" "$MODE"
    fi
    printf '\nDRY RUN: nothing was executed. Report skeleton in %s. On a GPU machine:\n  bash cuda-tests/gpu/validate.sh\n' "$OUT"
    exit 0
fi

# Check 8 runs without the shim; every other check needs it.
NEEDS_SHIM=0
for id in "${CHECK_IDS[@]}"; do
    if [ "$id" != 8 ] && selected "$id"; then NEEDS_SHIM=1; fi
done
if [ "$HAVE_SHIM" -eq 0 ] && [ "$NEEDS_SHIM" -eq 1 ]; then
    log "validate.sh: $SHIM or libgpuslice_core.so beside it not found: build them (cargo build --release -p gpuslice-shim -p gpuslice-ctl) or set GPUSLICE_LIB"
    exit 2
fi
if [ "$HAVE_SMI" -eq 1 ]; then
    gpu=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader -i 0 2>>"$LOG" | head -1)
    envinfo gpu "${gpu:-unknown}"
    envinfo cuda_driver "$(timeout 30 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
fi
[ "$HAVE_NVCC" -eq 1 ] && envinfo nvcc "$(nvcc --version | tail -2 | head -1)"
[ "$HAVE_TORCH" -eq 1 ] && envinfo torch "$(timeout 60 "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null)"
[ "$HAVE_CUPY" -eq 1 ] && envinfo cupy "$(timeout 60 "$PY" -c 'import cupy; print(cupy.__version__)' 2>/dev/null)"
if [ -x "$CLI" ]; then
    step gpuslice-check 30 env GPUSLICE_CONFIG="$(write_config cli "${CAP_MIB}MiB" 25)" "$CLI" check
    envinfo gpuslice_check "rc $? $(head -1 "$WORK/gpuslice-check.out")"
fi

# Longest last, so the budget guard cuts the least; 8 first: the facts the others rest on.
for id in 8 1 10 2 3 4 11 12 7 6 5 9; do
    selected "$id" || continue
    # 7 needs no GPU; 8 needs only a libcuda.so.1 (it says so itself when there is none).
    if [ "$id" != 7 ] && [ "$id" != 8 ] && [ "$HAVE_SMI" -eq 0 ]; then
        record "$id" "${TITLE[$id]}" SKIP '{}' "no nvidia-smi: no NVIDIA GPU here"
        continue
    fi
    if [ "$id" != 7 ] && [ "$HAVE_PY" -eq 0 ] && [ "$id" != 1 ]; then
        record "$id" "${TITLE[$id]}" SKIP '{}' "no $PY"
        continue
    fi
    log "-- check $id: ${TITLE[$id]} (t=${SECONDS}s)"
    "check_$id"
done
envinfo elapsed_s "$SECONDS"

# Rows sorted by id for the table; the log keeps the execution order.
sort -t $'\t' -k1,1 -s "$RESULTS" -o "$RESULTS"
if have "$PY"; then
    "$PY" "$HERE/report.py" "$RESULTS" "$ENVTSV" "$OUT" "$MODE"
    exit $?
fi
cut -f1-3,5 "$RESULTS"
grep -q $'\tFAIL\t' "$RESULTS" && exit 1
exit 0
