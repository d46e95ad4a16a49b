#!/usr/bin/env bash
# The issue-4 figures: what the seven apps and the nnsight grid rows cost on the GPU. Run on the
# GPU machine from the repository root with .dev/gpu carried (testsuite/gpu/build.sh first):
#   run(command="bash testsuite/gpu/apps.sh", carry=[".dev/gpu"])
# Writes $OUT/apps.json and $OUT/APPS.md (testsuite/gpu/apps_assemble.py), and $OUT/raw.tgz:
# when one device call cannot hold everything, run the phases or models in several calls
# (PHASES, LLAMA=0, MIXTRAL=0) and join them with
#   python3 testsuite/gpu/apps_assemble.py merge WORK OUT call1.tgz:offline,grid call2.tgz:online ...
# Three phases:
#  1 offline graph replay (low noise): bare replays of decode buckets 1 and 8 (CUDA events),
#    per variant: bundle with no apps, apps 1-6 deployed and none enabled, each app enabled on
#    every row, all six; app 7 likewise on Mixtral-8x7B.
#  2 nnsight grid rows (specs/apps/grid/, all deployed in one Llama-3.1-8B bundle): graph replay
#    at batch 1 and 8 with each row's app enabled alone, vs the bundle with no apps.
#  3 the paper's method: `xmix bench --online` (all requests at once by default, or Poisson
#    arrivals at RATE; ShareGPT-like prompts, 128 output tokens) for the same variants as
#    phase 1, interleaved round by round (bare, deployed, app1..app6, all six, Mixtral's
#    three; then again) so drift hits every variant alike. One process per variant per round, --warmup 0 --runs 1: every variant goes through
#    the same process life cycle, and the GPU is warm from phases 1-2 and the probes.
# Time: everything is fitted into TIME_BUDGET_S (whole script). Phase 3 first runs two short
# requests and then one probe per model (PROBE_REQUESTS arriving at once: the engine's
# capacity in requests/s, and a run's fixed cost), then picks
# the request count so that every round fits what is left: every variant gets the same arrival
# window, requests = window x min(rate, capacity) (capacity at rate 0), capped at REQUESTS. When even MIN_REQUESTS
# do not fit, it sheds warm-up rounds, then measured rounds (down to one), then Mixtral's
# online runs; a round that would end past the budget (estimate, or the last round's real
# length if longer) is skipped, and a round still running GRACE_S past it is cut short. Every
# such cut is written into the results ("notes"). Time left after the planned rounds goes to
# up to EXTRA_ROUNDS more measured rounds, each only if it fits.
# Knobs (env): TIME_BUDGET_S (480), REQUESTS (250), RATE (0, Llama req/s), MX_RATE (0),
# OUTPUT_LEN (128), RUNS (2 measured rounds), WARMUP (1 discarded round: the paper discards its
# first runs too), MIN_REQUESTS (12),
# PROBE_REQUESTS (64, Llama), MX_PROBE_REQUESTS (64; 12 under-read dense Mixtral 3x), SEED (1), BUCKETS ("1 8"), GRAPH_ITERS (100), PROMPT_LEN (128, phase 1),
# GRID_PROMPT_LEN (512, the nnsight grid's prompt), NEW_TOKENS (32), LLAMA (1: Llama-3.1-8B with
# apps 1-6 and the grid; 0 runs Mixtral alone), MIXTRAL (1), ALL6 (1),
# MX_BUILD ("", extra xmixc build flags for the Mixtral bundles, e.g. "--moe grouped"),
# L8_BUILD ("", the same for the Llama-3.1-8B bundles, e.g. "--mi-preload-coherent"),
# PHASES ("offline grid online"), ONLINE_MODELS ("l8 mx": whose online runs), GRACE_S (30), EXTRA_ROUNDS (3), BIN (.dev/gpu), OUT, WORK.
# Rate 0 (the default) makes every request arrive at once, as vLLM's bench at request rate
# inf, which the paper's figures used (their TTFTs are seconds). The runs are then saturated
# and their schedule no longer depends on wall-clock timing, so the ratios between variants
# repeat to about 0.1-0.3%. At a finite rate (RATE=16, Poisson) a run is bound by its
# arrivals: the throughput is the arrivals', and two runs of identical GPU work were seen to
# differ by up to 1.2% in mean ITL.
# SMOKE=1 runs the same pipeline on the CPU backend with tiny (specs/models/tiny.yaml +
# specs/apps/tiny/*.yaml), a small Mixtral written here, the grid specs scaled down to tiny,
# and small counts, to check the script and the tables anywhere (BIN=/path/to/binaries).
set -uo pipefail
. "$(dirname "$0")/fit.sh"
cd "$(dirname "$0")/../.."
T0=$(date +%s.%N)
SMOKE=${SMOKE:-0}
bin=${BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-gpu-out}
work=${WORK:-/tmp/xmix-apps}
rm -rf "$work"
mkdir -p "$OUT" "$work/r"
: > "$work/notes.txt"
: > "$work/runs.tsv"
: > "$work/variants.tsv"

if [ "$SMOKE" = 1 ]; then
  backend=cpu
  : "${TIME_BUDGET_S:=300}" "${RATE:=20}" "${MX_RATE:=20}" "${OUTPUT_LEN:=8}" "${MIN_REQUESTS:=3}"
  : "${PROBE_REQUESTS:=3}" "${MX_PROBE_REQUESTS:=3}" "${PROMPT_LEN:=16}" "${GRID_PROMPT_LEN:=32}" "${NEW_TOKENS:=4}" "${GRAPH_ITERS:=5}"
else
  backend=cuda
fi
: "${TIME_BUDGET_S:=480}" "${REQUESTS:=250}" "${RATE:=0}" "${MX_RATE:=0}" "${OUTPUT_LEN:=128}"
: "${RUNS:=2}" "${WARMUP:=1}" "${MIN_REQUESTS:=12}" "${PROBE_REQUESTS:=64}" "${MX_PROBE_REQUESTS:=64}" "${SEED:=1}"
: "${BUCKETS:=1 8}" "${GRAPH_ITERS:=100}" "${PROMPT_LEN:=128}" "${GRID_PROMPT_LEN:=512}" "${NEW_TOKENS:=32}"
: "${MX_BUILD:=}" "${L8_BUILD:=}" "${LLAMA:=1}" "${MIXTRAL:=1}" "${ALL6:=1}" "${PHASES:=offline grid online}" "${ONLINE_MODELS:=l8 mx}" "${GRACE_S:=30}" "${EXTRA_ROUNDS:=3}"
buckets_csv=$(echo $BUCKETS | tr ' ' ',')
max_bucket=$(echo $BUCKETS | tr ' ' '\n' | sort -n | tail -1)

now() { awk -v t0="$T0" -v t="$(date +%s.%N)" 'BEGIN { printf "%.1f", t - t0 }'; }
log() { echo "[$(date +%T) +$(now)s] $*" >&2; }
# note: a line that goes into the results (what was skipped, shortened or failed, and why).
note() { echo "$*" >> "$work/notes.txt"; log "$*"; }
# left: whole seconds of TIME_BUDGET_S still unspent.
left() { awk -v b="$TIME_BUDGET_S" -v e="$(now)" 'BEGIN { printf "%d", b - e }'; }
app_name() { sed -n 's/^app: *//p' "$1" | head -1; }

# The models and apps: Llama-3.1-8B with apps 1-6, Mixtral-8x7B with app 7, or their stand-ins.
if [ "$SMOKE" = 1 ]; then
  l_model=specs/models/tiny.yaml
  l_apps=(specs/apps/tiny/tiny-app[1-6]-*.yaml)
  mx_model=$work/small-mixtral.yaml
  cat > "$mx_model" <<'EOF'
model: small-mixtral
family: mixtral
dims: {hidden: 64, intermediate: 96, layers: 2, heads: 4, kv_heads: 2, head_dim: 32, vocab: 300,
       rope_theta: 1000000, rms_eps: 1.0e-5, tie_embeddings: false, experts: 8, experts_per_token: 2}
weights: {synthetic: {seed: 8, std: 0.08}}
tokenizer: bytes
bos: 256
eos: [257]
serving: {decode_buckets: [1, 2, 4, 8], prefill_chunks: [64], max_seq_len: 512, max_seqs: 8, kv_block_size: 16}
EOF
  # The grid rows at tiny's size: layer 3 of 6, hidden 256.
  mkdir -p "$work/grid"
  for f in specs/apps/grid/*.yaml; do
    sed -e 's/layers: \[16\]/layers: [3]/' -e 's/\[4096\]/[256]/' -e 's/\[131072\]/[1536]/' -e 's/\[320\]/[60]/' \
      "$f" > "$work/grid/$(basename "$f")"
  done
  grid_apps=("$work"/grid/*.yaml)
  embed=(--embed-weights)
else
  l_model=specs/models/llama-3.1-8b.yaml
  l_apps=(specs/apps/app[1-6]-*.yaml)
  mx_model=specs/models/mixtral-8x7b.yaml
  grid_apps=(specs/apps/grid/*.yaml)
  embed=()
fi
mx_app=specs/apps/app7-steermoe.yaml
l_names=()
for f in "${l_apps[@]}"; do l_names+=("$(app_name "$f")"); done
all6=$(IFS=,; echo "${l_names[*]}")
mx_name=$(app_name "$mx_app")

if [ "$SMOKE" = 1 ]; then
  echo "cpu backend (SMOKE=1), $(nproc) cores" > "$work/device.txt"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$work/device.txt" 2>&1
fi
log "device: $(head -1 "$work/device.txt")"

log "bundles"
build() { # name model [apps...]
  local name=$1
  shift
  # shellcheck disable=SC2046 # fit_flags gives words
  "$bin/xmixc" build "$@" $(fit_flags "$1") -q "${embed[@]}" -o "$work/$name.xmb" 2> "$work/build-$name.err" ||
    note "build $name failed: $(tail -c 400 "$work/build-$name.err" | tr '\n' ' ')"
}
if [ "$LLAMA" = 1 ]; then
  build l8-bare "$l_model" $L8_BUILD
  build l8-apps "$l_model" "${l_apps[@]}" $L8_BUILD
  build l8-grid "$l_model" "${grid_apps[@]}" $L8_BUILD
fi
if [ "$MIXTRAL" = 1 ]; then
  build mx-bare "$mx_model" $MX_BUILD
  build mx-apps "$mx_model" "$mx_app" $MX_BUILD
fi

# variant PHASE NAME GROUP KIND BUNDLE [bench args]: declares one variant of a phase; GROUP
# names the model (l8, mx), KIND is bare | deployed | app | all (the assembler's baselines).
declare -A v_bundle v_args
variants=()
variant() {
  local phase=$1 name=$2 group=$3 kind=$4 bundle=$5
  shift 5
  printf '%s\t%s\t%s\t%s\t%s\n' "$phase" "$name" "$group" "$kind" "$*" >> "$work/variants.tsv"
  v_bundle[$phase/$name]=$bundle
  v_args[$phase/$name]="$*"
  variants+=("$phase/$name")
}
# xmix bench draws prompts and arrivals from a stream of their own, so every variant (with or
# without --apps) replays the same workload.
for phase in offline online; do
  if [ "$LLAMA" = 1 ]; then
    variant $phase bare l8 bare l8-bare
    variant $phase deployed l8 deployed l8-apps
    for a in "${l_names[@]}"; do variant $phase "$a" l8 app l8-apps --apps "$a" --app-fraction 1; done
    [ "$ALL6" = 1 ] && variant $phase all6 l8 all l8-apps --apps "$all6" --app-fraction 1
  fi
  if [ "$MIXTRAL" = 1 ]; then
    variant $phase mx-bare mx bare mx-bare
    variant $phase mx-deployed mx deployed mx-apps
    variant $phase "$mx_name" mx app mx-apps --apps "$mx_name" --app-fraction 1
  fi
done
if [ "$LLAMA" = 1 ]; then
  variant grid bare l8 bare l8-bare
  variant grid deployed l8 deployed l8-grid
  for f in "${grid_apps[@]}"; do
    a=$(app_name "$f")
    variant grid "$a" l8 app l8-grid --apps "$a" --app-fraction 1
  done
fi

# bench ID TIMEOUT BUNDLE [args]: one `xmix bench` into r/ID.json; its wall time and exit
# status go to runs.tsv. A failure is noted and the script goes on. TIMEOUT is capped so that
# no run ends later than GRACE_S + 30 s past the budget (the device call's own limit is 600 s).
bench() {
  local id=$1 to=$2 b=$3
  shift 3
  to=$(awk -v t="$to" -v l="$(left)" -v g="$GRACE_S" 'BEGIN { m = l + g + 30; if (m < t) t = m; if (t < 20) t = 20; printf "%d", t }')
  local t=$(date +%s.%N) rc
  if [ ! -f "$work/$b.xmb" ]; then
    note "skipped $id: bundle $b was not built"
    return 1
  fi
  timeout -k 10 "$to" "$bin/xmix" bench "$work/$b.xmb" --backend "$backend" --seed "$SEED" --json -q "$@" \
    > "$work/r/$id.json" 2> "$work/r/$id.err"
  rc=$?
  local wall=$(awk -v t0="$t" -v t="$(date +%s.%N)" 'BEGIN { printf "%.2f", t - t0 }')
  printf '%s\t%s\t%s\n' "$id" "$rc" "$wall" >> "$work/runs.tsv"
  if [ $rc != 0 ]; then
    note "failed: $id (exit $rc$([ $rc = 124 ] && echo ", timeout ${to}s"), ${wall}s): $(tail -c 300 "$work/r/$id.err" | tr '\n' ' ')"
    rm -f "$work/r/$id.json"
    return 1
  fi
}

# graph PHASE NAME PROMPT_LEN: bare replays of the decode buckets (and the per-node profile),
# after a short offline generate that leaves every row's control block with the variant's apps.
graph() {
  local v=$1/$2
  if [ "$(left)" -lt 20 ]; then
    note "skipped $1 $2: time budget spent"
    return
  fi
  bench "$1-$2" 240 "${v_bundle[$v]}" --prompts "$max_bucket" --prompt-len "$3" --new-tokens "$NEW_TOKENS" \
    --graph-buckets "$buckets_csv" --graph-iters "$GRAPH_ITERS" --profile ${v_args[$v]}
}

# assemble: $OUT/apps.json and $OUT/APPS.md from what $work holds so far.
assemble() {
  log "assemble"
  cat > "$work/config.json" <<EOF
{"smoke": $SMOKE, "backend": "$backend", "time_budget_s": $TIME_BUDGET_S, "requests": $REQUESTS,
 "rate": {"l8": $RATE, "mx": $MX_RATE}, "output_len": $OUTPUT_LEN, "runs": $RUNS, "warmup": $WARMUP,
 "min_requests": $MIN_REQUESTS, "probe_requests": {"l8": $PROBE_REQUESTS, "mx": $MX_PROBE_REQUESTS}, "seed": $SEED, "buckets": [$buckets_csv],
 "graph_iters": $GRAPH_ITERS, "prompt_len": $PROMPT_LEN, "grid_prompt_len": $GRID_PROMPT_LEN,
 "new_tokens": $NEW_TOKENS, "llama": $LLAMA, "mixtral": $MIXTRAL, "mx_build": "$MX_BUILD", "l8_build": "$L8_BUILD", "all6": $ALL6, "phases": "$PHASES",
 "grace_s": $GRACE_S, "extra_rounds": $EXTRA_ROUNDS,
 "models": {"l8": "$l_model", "mx": "$mx_model"}, "elapsed_s": $(now)}
EOF
  python3 testsuite/gpu/apps_assemble.py assemble "$work" "$OUT" || note "assemble failed"
  # The raw runs too, so that calls run with different PHASES can be assembled into one table.
  tar czf "$OUT/raw.tgz" -C "$work" --exclude='*.xmb' --exclude='build-*.err' . 2>/dev/null
}

for phase in $PHASES; do
  case $phase in
  offline)
    log "phase 1: offline graph replay, buckets $BUCKETS"
    for v in "${variants[@]}"; do [ "${v%%/*}" = offline ] && graph offline "${v#*/}" "$PROMPT_LEN"; done
    ;;
  grid)
    log "phase 2: nnsight grid rows, buckets $BUCKETS, prompts of $GRID_PROMPT_LEN tokens"
    for v in "${variants[@]}"; do [ "${v%%/*}" = grid ] && graph grid "${v#*/}" "$GRID_PROMPT_LEN"; done
    ;;
  online)
    log "phase 3: online, probes"
    groups=()
    for g in $ONLINE_MODELS; do
      { [ "$g" = mx ] && [ "$MIXTRAL" = 1 ]; } || { [ "$g" = l8 ] && [ "$LLAMA" = 1 ]; } && groups+=("$g")
    done
    declare -A rate=([l8]=$RATE [mx]=$MX_RATE) probe=([l8]=$PROBE_REQUESTS [mx]=$MX_PROBE_REQUESTS)
    for g in "${groups[@]}"; do
      # The first process on a fresh machine takes seconds longer than the next ones (we take
      # it to be the driver's PTX JIT, whose cache keeps the result), which the probe would
      # count as every run's load time: session 45's plan expected rounds of 137 s where they
      # took 33, and cut its runs to 152 requests. Two short requests take that cost first.
      probe_bundle=${v_bundle[online/$([ $g = mx ] && echo mx-bare || echo bare)]}
      bench "jit-$g" 300 "$probe_bundle" --online --requests 2 --rate 0 --output-len 2 --warmup 0 --runs 1
      bench "probe-$g" 300 "$probe_bundle" --online \
        --requests "${probe[$g]}" --rate 0 --output-len "$OUTPUT_LEN" --warmup 0 --runs 1
    done
    # group:variants:rate for each probed group; plan fits their rounds into what is left.
    probes=()
    for g in "${groups[@]}"; do
      [ -f "$work/r/probe-$g.json" ] || continue
      n=$(awk -F'\t' -v g="$g" '$1 == "online" && $3 == g' "$work/variants.tsv" | wc -l)
      probes+=("$g:$n:${rate[$g]}:${probe[$g]}")
    done
    # plan.sh sets WARMUP_ROUNDS, RUN_ROUNDS, ROUND_S (estimated seconds per round), and per
    # group N_<g> (requests, 0 = skipped) and RUN_S_<g> (estimated seconds per run).
    WARMUP_ROUNDS=0 RUN_ROUNDS=0 ROUND_S=0
    if [ ${#probes[@]} = 0 ]; then
      note "online skipped: no probe run succeeded"
    else
      python3 testsuite/gpu/apps_assemble.py plan "$work" --left "$(left)" --requests "$REQUESTS" \
        --min-requests "$MIN_REQUESTS" --output-len "$OUTPUT_LEN" \
        --warmup "$WARMUP" --runs "$RUNS" "${probes[@]}" > "$work/plan.sh" 2>> "$work/notes.txt"
      cat "$work/plan.sh" >&2
      source "$work/plan.sh"
    fi
    rounds=$((WARMUP_ROUNDS + RUN_ROUNDS))
    for ((r = 0; r < rounds + (rounds > 0 ? EXTRA_ROUNDS : 0); r++)); do
      # ROUND_S: the estimate, or the last round's real length when that was longer. The
      # planned rounds may end up to 15 s past the budget; an extra one must fit inside it.
      if [ $r -ge $rounds ]; then
        awk -v l="$(left)" -v s="$ROUND_S" 'BEGIN { exit !(s <= l) }' || break
        note "online: extra measured round $r ($(left)s of the budget left, a round takes about ${ROUND_S}s)"
      elif awk -v l="$(left)" -v s="$ROUND_S" 'BEGIN { exit !(s > l + 15) }'; then
        note "online rounds $r-$((rounds - 1)) skipped: a round needs about ${ROUND_S}s, $(left)s of the budget left"
        break
      fi
      log "online round $r of $rounds ($([ $r -lt "$WARMUP_ROUNDS" ] && echo warm-up || echo measured), about ${ROUND_S}s)"
      rstart=$(now)
      for v in "${variants[@]}"; do
        [ "${v%%/*}" = online ] || continue
        name=${v#*/}
        g=$(awk -F'\t' -v n="$name" '$1 == "online" && $2 == n { print $3 }' "$work/variants.tsv")
        nv=N_$g
        [ "${!nv:-0}" -gt 0 ] || continue
        # Past the budget by more than GRACE_S, the round is cut short: its runs so far stay
        # in the results, but ratios are only as good as the variants it reached.
        if [ "$(left)" -lt "-$GRACE_S" ]; then
          note "online round $r cut short at $name: budget exceeded by more than ${GRACE_S}s"
          break 2
        fi
        rs=RUN_S_$g
        to=$(awk -v s="${!rs}" 'BEGIN { printf "%d", s * 3 + 60 }')
        bench "online-r$r-$name" "$to" "${v_bundle[$v]}" --online --requests "${!nv}" --rate "${rate[$g]}" \
          --output-len "$OUTPUT_LEN" --warmup 0 --runs 1 ${v_args[$v]}
      done
      ROUND_S=$(awk -v a="$ROUND_S" -v s="$rstart" -v e="$(now)" 'BEGIN { d = e - s; printf "%d", (d > a ? d : a) }')
    done
    ;;
  *) note "unknown phase $phase (PHASES takes offline, grid, online)" ;;
  esac

  # Assembled after every phase, so that a call cut short still brings back what it measured.
  assemble
done
cp "$work/notes.txt" "$work/runs.tsv" "$OUT/" 2>/dev/null
cat "$OUT/APPS.md" >&2
log "done"
