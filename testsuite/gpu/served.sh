#!/usr/bin/env bash
# Issue 15's figures: what serving over HTTP costs. On the GPU machine, from the repository
# root, with the binaries carried (testsuite/gpu/build.sh first):
#   run(command="bash testsuite/gpu/served.sh", carry=[".dev/gpu"])
# Builds the Llama-3.1-8B bundle (real dimensions, synthetic weights), then per round runs
#   served:     xmix serve, and xmix bench --url against it (streaming, client-side times),
#   in-process: xmix bench --online on the same bundle,
# both with the paper's workload (REQUESTS at once, OUTPUT_LEN new tokens, ignore_eos, the same
# ShareGPT-like prompts and seed), one after the other so each has the GPU alone. Rounds
# alternate which goes first, so drift hits both alike. Writes $OUT/served.json (every run,
# the means, the ratios served / in-process) and $OUT/SERVED.md (a short table), plus the
# server's log. Targets (issue 15): served throughput >= 97% of in-process, mean ITL within 2%.
# Knobs (env): BIN (.dev/gpu), OUT (/tmp/xmix-served-out), WORK (/tmp/xmix-served),
# REQUESTS (250), OUTPUT_LEN (128), RATE (0: all at once), WARMUP (1), RUNS (3), ROUNDS (2),
# IGNORE_EOS (1), SEED (1), PORT (18080), BACKEND (cuda), MODEL (specs/models/llama-3.1-8b.yaml),
# SERVE_FLAGS (extra xmix serve flags), TIME_BUDGET_S (540: a round that would end past it
# is skipped and noted).
# SMOKE=1 runs the same pipeline on the CPU backend with the embedded tiny model and small
# counts, to check the script anywhere (BIN=/path/to/binaries).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
bin=${BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-served-out}
work=${WORK:-/tmp/xmix-served}
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  BACKEND=${BACKEND:-cpu} MODEL=${MODEL:-specs/models/tiny.yaml}
  REQUESTS=${REQUESTS:-4} OUTPUT_LEN=${OUTPUT_LEN:-4} WARMUP=${WARMUP:-0} RUNS=${RUNS:-1} ROUNDS=${ROUNDS:-2} VOCAB=${VOCAB:-258}
  BUILD_FLAGS=--embed-weights
else
  BACKEND=${BACKEND:-cuda} MODEL=${MODEL:-specs/models/llama-3.1-8b.yaml} VOCAB=${VOCAB:-32000} BUILD_FLAGS=
fi
REQUESTS=${REQUESTS:-250} OUTPUT_LEN=${OUTPUT_LEN:-128} RATE=${RATE:-0} WARMUP=${WARMUP:-1} RUNS=${RUNS:-3}
ROUNDS=${ROUNDS:-2} IGNORE_EOS=${IGNORE_EOS:-1} SEED=${SEED:-1} PORT=${PORT:-18080} TIME_BUDGET_S=${TIME_BUDGET_S:-540}
export REQUESTS OUTPUT_LEN RATE WARMUP RUNS ROUNDS IGNORE_EOS SEED BACKEND MODEL
rm -rf "$work"
mkdir -p "$OUT" "$work"
: > "$work/notes.txt"
log() { echo "[$(date +%T)] $*" >&2; }
note() { log "$*"; echo "$*" >> "$work/notes.txt"; }

eos=()
[ "$IGNORE_EOS" = 1 ] && eos=(--ignore-eos)
workload=(--requests "$REQUESTS" --rate "$RATE" --output-len "$OUTPUT_LEN" --warmup "$WARMUP" --runs "$RUNS" --seed "$SEED" "${eos[@]}" --json -q)

log "bundle: $MODEL"
"$bin/xmixc" build "$MODEL" -q $BUILD_FLAGS -o "$work/model.xmb" || { note "xmixc build failed"; exit 1; }
"$bin/xmix" --version > "$work/version.txt"

served() { # $1: round
  local out="$work/served-$1.json" pid
  "$bin/xmix" serve "$work/model.xmb" --backend "$BACKEND" --addr "127.0.0.1:$PORT" --max-queue 0 --log-requests ${SERVE_FLAGS:-} \
    2>> "$work/serve.log" &
  pid=$!
  for _ in $(seq 600); do # loading the bundle and instantiating the graphs
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; then
    "$bin/xmix" bench --url "http://127.0.0.1:$PORT" --vocab "$VOCAB" "${workload[@]}" > "$out" 2>> "$work/bench.log" ||
      { note "round $1: xmix bench --url failed (bench.log)"; rm -f "$out"; }
    curl -s "http://127.0.0.1:$PORT/metrics" > "$work/metrics-$1.txt" 2>/dev/null
  else
    note "round $1: xmix serve did not come up (serve.log)"
  fi
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null || note "round $1: xmix serve exited with status $? (serve.log)"
}

inprocess() { # $1: round
  local out="$work/inprocess-$1.json"
  "$bin/xmix" bench "$work/model.xmb" --backend "$BACKEND" --online "${workload[@]}" > "$out" 2>> "$work/bench.log" ||
    { note "round $1: xmix bench --online failed (bench.log)"; rm -f "$out"; }
}

last=0
for r in $(seq "$ROUNDS"); do
  now=$(date +%s)
  if [ $((now - T0 + last)) -gt "$TIME_BUDGET_S" ]; then
    note "round $r skipped: the last round took ${last}s and ${TIME_BUDGET_S}s would be passed"
    break
  fi
  if [ $((r % 2)) = 1 ]; then
    log "round $r: served, then in-process"; served "$r"; inprocess "$r"
  else
    log "round $r: in-process, then served"; inprocess "$r"; served "$r"
  fi
  last=$(($(date +%s) - now))
done

python3 - "$work" "$OUT" <<'PY'
import json, os, sys, glob
work, out = sys.argv[1], sys.argv[2]
def load(kind):
    runs = []
    for p in sorted(glob.glob(f"{work}/{kind}-*.json")):
        with open(p) as f:
            runs += json.load(f)["online"]["runs"]
    return runs
keys = ["mean_itl_ms", "p50_itl_ms", "p99_itl_ms", "mean_ttft_ms", "total_tok_per_s", "output_tok_per_s", "seconds", "output_tokens"]
served, inproc = load("served"), load("inprocess")
mean = lambda runs: {k: sum(r.get(k, 0) for r in runs) / len(runs) for k in keys} if runs else {}
ms, mi = mean(served), mean(inproc)
ratio = {k: ms[k] / mi[k] for k in keys if ms and mi and mi.get(k)}
notes = open(f"{work}/notes.txt").read().split("\n")
res = {"version": open(f"{work}/version.txt").read().strip(), "env": {k: os.environ.get(k) for k in
       ["REQUESTS", "OUTPUT_LEN", "RATE", "WARMUP", "RUNS", "ROUNDS", "IGNORE_EOS", "SEED", "BACKEND", "MODEL"]},
       "served_runs": served, "inprocess_runs": inproc, "served": ms, "inprocess": mi, "served_over_inprocess": ratio,
       "failed_requests": sum(r.get("failed", 0) for r in served), "notes": [n for n in notes if n]}
with open(f"{out}/served.json", "w") as f:
    json.dump(res, f, indent=2)
rows = [("mean ITL (ms)", "mean_itl_ms"), ("P50 ITL (ms)", "p50_itl_ms"), ("P99 ITL (ms)", "p99_itl_ms"),
        ("mean TTFT (ms)", "mean_ttft_ms"), ("throughput, total tok/s", "total_tok_per_s"),
        ("throughput, output tok/s", "output_tok_per_s"), ("output tokens per run", "output_tokens")]
lines = ["| | served (`bench --url`) | in-process (`bench --online`) | served / in-process |", "|---|---|---|---|"]
for name, k in rows:
    if ms and mi:
        lines.append(f"| {name} | {ms[k]:.2f} | {mi[k]:.2f} | {ratio.get(k, 0):.4f} |")
head = (f"{res['env']['MODEL']} on {res['env']['BACKEND']}, {res['env']['REQUESTS']} requests at rate {res['env']['RATE']} "
        f"(0: all at once), {res['env']['OUTPUT_LEN']} new tokens, ignore_eos {res['env']['IGNORE_EOS']}; "
        f"{len(served)} served and {len(inproc)} in-process measured runs; {res['failed_requests']} failed requests; {res['version']}")
with open(f"{out}/SERVED.md", "w") as f:
    f.write(head + "\n\n" + "\n".join(lines) + "\n" + "".join(f"\n- {n}" for n in res["notes"]) + "\n")
print(open(f"{out}/SERVED.md").read())
PY
cp "$work/serve.log" "$work/bench.log" "$OUT/" 2>/dev/null
tail -c 4000 "$work/serve.log" | grep -iv "POST /v1/completions 200" >&2 || true
