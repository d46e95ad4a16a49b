#!/usr/bin/env bash
# What an app costs a batch's prefill and decode, offline, in one device call: MODEL's bundle
# (default llama-3.1-8b) built with the app specs APPS, then ROUNDS (default 3) rounds of
# `xmix bench --prompts PROMPTS --prompt-len PROMPT_LEN --new-tokens NEW_TOKENS` (defaults 32,
# 1000 and 8: the prompts fill max_batched_tokens' steps, as the paper's online workload's
# first second does) with no app and then with each set of ENABLE (comma-separated app names;
# every request enabling them), the order reversed every other round. Each bench's prefill
# seconds and mean decode step go to the summary, with each set's change against no app.
# trace.sh's ENABLE does the same for one decode graph, kernel by kernel. Build first (bash
# testsuite/gpu/build.sh), then:
#   run(command="OUT=\$OUT APPS=specs/apps/app3-conditional-refusal.yaml ENABLE=conditional-refusal bash testsuite/gpu/app_prefill.sh", carry=[...])
# Writes $OUT/app_prefill.json ({variant: [{prefill_s, decode_step_ms}, ...]}) and
# $OUT/summary.txt.
APPS=${APPS:?set APPS}
ENABLE=${ENABLE:?set ENABLE}
. "$(dirname "$0")/start.sh"
m=${MODEL:-llama-3.1-8b}
# shellcheck disable=SC2086 # APPS is a list
"$B/xmixc" build specs/models/$m.yaml $APPS -q -o "$W/$m.xmb" || { echo "build of $m failed" | tee -a "$S"; exit 1; }
: > "$W/raw.tsv"
vs=(none $ENABLE)
for r in $(seq ${ROUNDS:-3}); do
  round_order "$r" "${vs[@]}"
  for v in "${order[@]}"; do
    apps=()
    [ "$v" != none ] && apps=(--apps "$v" --app-fraction 1)
    timeout 300 "$B/xmix" bench "$W/$m.xmb" --backend cuda --prompts ${PROMPTS:-32} --prompt-len ${PROMPT_LEN:-1000} \
      --new-tokens ${NEW_TOKENS:-8} "${apps[@]}" --json -q > "$W/b.json" 2> "$W/e.txt"
    rc=$?
    line=$(python3 -c "import json; o=json.load(open('$W/b.json'))['offline']; print(o['prefill_seconds'], o['decode_step_ms'])" 2>/dev/null || echo "null null")
    echo "$m $v round $r rc=$rc prefill_s/decode_step_ms $line" | tee -a "$S"
    [ $rc = 0 ] || tail -3 "$W/e.txt" | tee -a "$S"
    printf '%s\t%s\n' "$v" "$line" >> "$W/raw.tsv"
  done
done
python3 - "$W/raw.tsv" "$OUT/app_prefill.json" <<'PY' | tee -a "$S"
import json, sys
out = {}
for line in open(sys.argv[1]):
    v, pre, dec = line.split()
    num = lambda x: None if x == "null" else float(x)
    out.setdefault(v, []).append({"prefill_s": num(pre), "decode_step_ms": num(dec)})
json.dump(out, open(sys.argv[2], "w"), indent=1)
def mean(v, k):
    xs = [x[k] for x in out[v]]
    return None if None in xs else sum(xs) / len(xs)
for v in out:
    cells = []
    for k in ("prefill_s", "decode_step_ms"):
        m, b = mean(v, k), mean("none", k)
        cells.append(f"{k} {m:.4f}" + (f" ({100 * (m / b - 1):+.2f}%)" if m and b and v != "none" else "") if m else f"{k} failed")
    print(v, " | ".join(cells))
PY
