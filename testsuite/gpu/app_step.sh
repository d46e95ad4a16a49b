#!/usr/bin/env bash
# An app's cost in a whole decode step (launch, copies, wait and the host's gap: what the
# online ITL sees) beside its cost in the same bucket's bare graph replay, in one process a
# variant: Llama-3.1-8B's bundle with apps 1-6, then for each of VARIANTS (default "bare
# refusal-ablation hallucination-probe"; bare enables nothing, any other name that app on
# every request, NAME:full the same run with --no-app-solo, on the graph of every deployed
# app's ops) ROUNDS (default 3) offline benches of PROMPTS (250) prompts of PROMPT_LEN
# (300) tokens and 128 new ones, the order reversed every other round, each timing the
# 256-row bucket's graph with the rows as the last step left them (--graph-buckets 256).
# The online workload's median ITL is such a step (apps.json: p50_itl_ms). Build first
# (bash testsuite/gpu/build.sh; bash testsuite/gpu/pack.sh .dev/gpu), then:
#   run(command="bash testsuite/gpu/pack.sh --unpack >/dev/null && OUT=\$OUT bash testsuite/gpu/app_step.sh", carry=[".dev/pack"])
# Writes $OUT/app_step.json ({variant: [{decode_step_ms, host_gap_us, graph_ms}, ...]}) and
# $OUT/summary.txt (means, and each variant's change against the first).
. "$(dirname "$0")/start.sh"
apps=$(ls specs/apps/app[1-6]-*.yaml | tr '\n' ' ')
m=specs/models/llama-3.1-8b.yaml
# shellcheck disable=SC2086 # apps is a list
"$B/xmixc" build $m $apps -q $(fit_flags $m) -o "$W/l8.xmb" || { echo "build failed" | tee -a "$S"; exit 1; }
read -ra names <<< "${VARIANTS:-bare refusal-ablation hallucination-probe}"
: > "$W/raw.tsv"
for r in $(seq "${ROUNDS:-3}"); do
  round_order "$r" "${names[@]}"
  for name in "${order[@]}"; do
    flags=
    [ "$name" = bare ] || flags="--apps ${name%:full} --app-fraction 1"
    [ "${name%:full}" = "$name" ] || flags="$flags --no-app-solo"
    # shellcheck disable=SC2086 # flags is a list
    timeout 300 "$B/xmix" bench "$W/l8.xmb" --backend cuda --prompts "${PROMPTS:-250}" --prompt-len "${PROMPT_LEN:-300}" \
      --new-tokens 128 --graph-buckets 256 $flags --json -q > "$W/b.json" 2> "$W/e.txt"
    rc=$?
    line=$(python3 -c "
import json; o = json.load(open('$W/b.json'))
g = [v for k, v in o.get('graph_ms', {}).items()]
print(o['offline']['decode_step_ms'], o['offline'].get('host_gap_us', 0), g[0] if len(g) == 1 else 'null')" 2>/dev/null || echo "null null null")
    echo "$name round $r rc=$rc decode_step_ms/host_gap_us/graph_ms $line" | tee -a "$S"
    [ $rc = 0 ] || tail -3 "$W/e.txt" | tee -a "$S"
    printf '%s\t%s\n' "$name" "$line" >> "$W/raw.tsv"
  done
done
python3 - "$W/raw.tsv" "$OUT/app_step.json" "${names[0]}" <<'PY' | tee -a "$S"
import json, sys
out = {}
for line in open(sys.argv[1]):
    name, vals = line.rstrip("\n").split("\t")
    step, gap, graph = (None if v == "null" else float(v) for v in vals.split())
    out.setdefault(name, []).append({"decode_step_ms": step, "host_gap_us": gap, "graph_ms": graph})
json.dump(out, open(sys.argv[2], "w"), indent=1)
def mean(name, key):
    xs = [r[key] for r in out[name] if r[key] is not None]
    return sum(xs) / len(xs) if xs else None
base = sys.argv[3]
for name in out:
    parts = []
    for key, unit in (("decode_step_ms", "ms"), ("host_gap_us", "us"), ("graph_ms", "ms")):
        m, b = mean(name, key), mean(base, key)
        if m is None:
            parts.append(f"{key} none")
        elif name == base or not b:
            parts.append(f"{key} {m:.4f}")
        else:
            parts.append(f"{key} {m:.4f} ({(m / b - 1) * 100:+.2f}%, {(m - b) * (1000 if unit == 'ms' else 1):+.1f} us)")
    print(name + ": " + " | ".join(parts))
PY
