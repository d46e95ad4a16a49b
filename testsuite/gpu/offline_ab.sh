#!/usr/bin/env bash
# One bundle's offline batch (prefill and decode) under several run-time settings, side by
# side, in one device call: VARIANTS="NAME=FLAGS;..." (the first is the base; FLAGS are xmix
# bench flags, may be empty), e.g. "f32=--gu-f32;bf16=". For each model of MODELS (default
# llama-3.1-8b; its bundle built by $BIN/xmixc with BUILD_FLAGS and the app specs APPS, if
# any, whose apps a variant's "--apps NAME --app-fraction 1" enables), ROUNDS (default 2) rounds of
# `xmix bench --prompts PROMPTS --prompt-len PROMPT_LEN --new-tokens NEW_TOKENS` (defaults 32,
# 1000 and 8, as app_prefill.sh: the prompts fill max_batched_tokens' steps) under each
# variant, the order reversed every other round. Build first (bash testsuite/gpu/build.sh):
#   run(command="OUT=\$OUT VARIANTS='f32=--gu-f32;bf16=' bash testsuite/gpu/offline_ab.sh", carry=[...])
# Writes $OUT/offline_ab.json ({"model": {variant: [{prefill_s, decode_step_ms}, ...]}}) and
# $OUT/summary.txt (each variant's means and their change against the base).
VARIANTS=${VARIANTS:?set VARIANTS}
. "$(dirname "$0")/start.sh"
IFS=';' read -ra vs <<< "$VARIANTS"
names=()
for v in "${vs[@]}"; do names+=("${v%%=*}"); done
: > "$W/raw.tsv"
for m in ${MODELS:-llama-3.1-8b}; do
  # shellcheck disable=SC2086 # BUILD_FLAGS and APPS are lists
  "$B/xmixc" build specs/models/$m.yaml ${APPS:-} -q ${BUILD_FLAGS:-} $(fit_flags specs/models/$m.yaml ${BUILD_FLAGS:-}) -o "$W/$m.xmb" || { echo "build of $m failed" | tee -a "$S"; exit 1; }
  for r in $(seq "${ROUNDS:-2}"); do
    round_order "$r" "${names[@]}"
    for name in "${order[@]}"; do
      flags=
      for v in "${vs[@]}"; do [ "${v%%=*}" = "$name" ] && flags=${v#*=}; done
      # shellcheck disable=SC2086 # flags is a list
      timeout 300 "$B/xmix" bench "$W/$m.xmb" --backend cuda --prompts "${PROMPTS:-32}" --prompt-len "${PROMPT_LEN:-1000}" \
        --new-tokens "${NEW_TOKENS:-8}" $flags --json -q > "$W/b.json" 2> "$W/e.txt"
      rc=$?
      line=$(python3 -c "import json; o=json.load(open('$W/b.json'))['offline']; print(o['prefill_seconds'], o['decode_step_ms'])" 2>/dev/null || echo "null null")
      echo "$m $name round $r rc=$rc prefill_s/decode_step_ms $line" | tee -a "$S"
      [ $rc = 0 ] || tail -3 "$W/e.txt" | tee -a "$S"
      printf '%s\t%s\t%s\n' "$m" "$name" "$line" >> "$W/raw.tsv"
    done
  done
done
python3 - "$W/raw.tsv" "$OUT/offline_ab.json" "${names[0]}" <<'PY' | tee -a "$S"
import json, sys
out = {}
for line in open(sys.argv[1]):
    m, v, pre, dec = line.split()
    num = lambda x: None if x == "null" else float(x)
    out.setdefault(m, {}).setdefault(v, []).append({"prefill_s": num(pre), "decode_step_ms": num(dec)})
json.dump(out, open(sys.argv[2], "w"), indent=1)
base = sys.argv[3]
for m, runs in out.items():
    def mean(v, k):
        xs = [x[k] for x in runs[v]]
        return None if None in xs else sum(xs) / len(xs)
    for v in runs:
        cells = []
        for k in ("prefill_s", "decode_step_ms"):
            x, b = mean(v, k), mean(base, k)
            cells.append(f"{k} {x:.4f}" + (f" ({100 * (x / b - 1):+.2f}%)" if x and b and v != base else "") if x else f"{k} failed")
        print(m, v, " | ".join(cells))
PY
