#!/usr/bin/env bash
# Weight loading at real size (issue 14 item 4): a Llama-3.1-8B-shaped checkpoint written by
# transformers itself (random init, bf16, save_pretrained in 5 GB shards: ~16 GB) in local
# /tmp, then `xmix run` timed from the process start to the first token, from the page cache
# (target <= 3 s) and cold (the checkpoint's own pages evicted with posix_fadvise DONTNEED,
# no machine setting touched), with the default readers and a sweep of --load-readers.
#
# Run on the GPU machine from the repository root, the binaries of build.sh carried:
#   run(command="bash testsuite/gpu/load.sh", carry=[".dev/gpu"])
# Env: XMIX_BIN (binaries, default .dev/gpu), OUT (results, default /tmp/xmix-load-out),
#   LOAD_DIR (checkpoint and bundle, default /tmp/xmix-load; reused while the machine stays
#   warm), RUNS (timed page-cache runs with the default readers, default 3), READERS (the
#   --load-readers sweep, default "2 4 16"), COLD (cold runs, default 2; 0 skips), KEEP=1
#   keeps the 16 GB checkpoint afterwards (default: deleted at the end), APPS (app specs, e.g.
#   "specs/apps/app[1-6]-*.yaml": a second bundle with them deployed, timed after the bare
#   one's page-cache runs in RUNS runs named apps1.., for the graphs its one-app node lists add;
#   default none), EXTRA ("NAME=flags;...": after those, RUNS more runs of the last bundle timed,
#   named NAME1.., with these `xmix run` flags, e.g. "own=--cuda-own-thread"; default none).
# Writes $OUT/load.json, $OUT/load.md (the table) and $OUT/load.log (every step's output).
set -euo pipefail

bin=${XMIX_BIN:-.dev/gpu}
OUT=${OUT:-/tmp/xmix-load-out}
dir=${LOAD_DIR:-/tmp/xmix-load}
runs=${RUNS-3}
readers=${READERS-2 4 16}
cold=${COLD-2}
mkdir -p "$OUT" "$dir"
logf="$OUT/load.log"
: > "$logf"
log() { echo "[$(date +%T)] $*" | tee -a "$logf" >&2; }
die() { log "FAILED: $*"; exit 1; }

for f in xmix xmixc; do
  [ -x "$bin/$f" ] || die "$bin/$f is missing: run testsuite/gpu/build.sh and carry $bin (or set XMIX_BIN)"
done
[ -f specs/models/llama-3.1-8b.yaml ] || die "run from the repository root (specs/models/llama-3.1-8b.yaml not found)"
command -v python3 > /dev/null || die "python3 not found"

log "machine"
{
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
  else
    echo "nvidia-smi: not available"
  fi
  echo "cpus $(nproc), $(free -g | awk '/^Mem:/ {print $2 " GiB memory, " $7 " GiB available"}')"
  echo "$dir on $(stat -f -c %T "$dir") ($(df -h --output=avail "$dir" | tail -1 | tr -d ' ') free)"
} | tee "$OUT/machine.txt" | tee -a "$logf" >&2

ckpt="$dir/llama-3.1-8b-hf"
if [ -f "$ckpt/.complete" ]; then
  log "checkpoint: reusing $ckpt"
else
  avail=$(df -B1 --output=avail "$dir" | tail -1)
  [ "$avail" -gt $((20 * 1024 ** 3)) ] || die "$dir has $((avail / 1024 ** 3)) GiB free; the checkpoint needs ~16 GiB (set LOAD_DIR)"
  rm -rf "$ckpt"
  log "checkpoint: transformers writes a random Llama-3.1-8B (bf16, 5 GB shards) to $ckpt"
  timeout 420 python3 - "$ckpt" >> "$logf" 2>&1 <<'EOF' || die "creating the checkpoint (see $logf)"
import os, sys, time
import torch, transformers
d = sys.argv[1]
t0 = time.time()
cfg = transformers.LlamaConfig(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
    max_position_embeddings=131072, tie_word_embeddings=False, bos_token_id=128000,
    eos_token_id=[128001, 128009],
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192))
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
dev = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(dev):  # random init on the GPU: seconds instead of minutes
    model = transformers.LlamaForCausalLM(cfg)
model = model.to("cpu")
print(f"init on {dev}: {time.time() - t0:.1f} s, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}e9 parameters", flush=True)
model.save_pretrained(d, max_shard_size="5GB")
for name in os.listdir(d):  # written through, so that eviction below can drop the pages
    fd = os.open(os.path.join(d, name), os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
print(f"saved in {time.time() - t0:.1f} s with transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
EOF
  touch "$ckpt/.complete"
fi
ls -l "$ckpt" | tee -a "$logf" >&2
gb=$(du -sb --exclude=.complete "$ckpt" | awk '{printf "%.2f", $1 / 1e9}')

log "bundle: hf: $ckpt with the shipped Llama-3.1-8B dtypes and serving section (an f32 KV cache of 128 x 4096 positions would not fit)"
spec="$dir/llama-3.1-8b-hf.yaml"
{
  printf 'hf: %s\nfamily: llama\ndtype: bf16\nkv_dtype: bf16\ntokenizer: bytes\nbos: 128000\n' "$ckpt"
  sed -n '/^serving:/,$p' specs/models/llama-3.1-8b.yaml
} > "$spec"
# The serving section is the shipped spec's: fit it to this card as fit.sh does that spec.
. testsuite/gpu/fit.sh
# shellcheck disable=SC2046 # fit_flags is a list of flags
timeout 300 "$bin/xmixc" build "$spec" -q $(fit_flags specs/models/llama-3.1-8b.yaml) -o "$dir/l8-hf.xmb" >> "$logf" 2>&1 || die "xmixc build (see $logf)"
# shellcheck disable=SC2086 # APPS is a list of specs (globs allowed)
apps=(${APPS:-})
if [ ${#apps[@]} -gt 0 ]; then
  for a in "${apps[@]}"; do [ -f "$a" ] || die "APPS: $a is not a file"; done
  log "bundle with ${#apps[@]} apps: ${apps[*]}"
  # shellcheck disable=SC2046
  timeout 300 "$bin/xmixc" build "$spec" "${apps[@]}" -q $(fit_flags specs/models/llama-3.1-8b.yaml) -o "$dir/l8-hf-apps.xmb" >> "$logf" 2>&1 ||
    die "xmixc build with APPS (see $logf)"
fi

# resident FILE...: the fraction of the files' pages in the page cache (mincore).
# evict FILE...: write the files' pages back and drop them from the page cache (fsync, then
# posix_fadvise DONTNEED); prints the fraction left.
pagecache() {
  python3 - "$@" <<'EOF'
import ctypes, mmap, os, sys
op, files = sys.argv[1], sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
page = os.sysconf("SC_PAGE_SIZE")
res = tot = 0
for f in files:
    fd = os.open(f, os.O_RDONLY)
    size = os.fstat(fd).st_size
    if op == "evict":  # dirty pages cannot be dropped: write them back first
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    n = (size + page - 1) // page
    p = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        sys.exit(f"mmap {f}: errno {ctypes.get_errno()}")
    vec = (ctypes.c_ubyte * n)()
    if libc.mincore(p, size, vec) != 0:
        sys.exit(f"mincore {f}: errno {ctypes.get_errno()}")
    res += sum(b & 1 for b in vec)
    tot += n
    libc.munmap(p, size)
    os.close(fd)
print(f"{res / max(tot, 1):.3f}")
EOF
}
shards=("$ckpt"/*.safetensors)

# timed NAME READERS [BUNDLE [FLAGS...]]: one `xmix run` to the first token (of l8-hf.xmb
# unless BUNDLE names another, with FLAGS added); appends a JSON line to $dir/runs.jsonl.
: > "$dir/runs.jsonl"
failures=0
timed() {
  local name=$1 nread=$2 bundle=${3:-$dir/l8-hf.xmb} rc=0 res t0 t1 err="$dir/run-$1.err"
  shift $(($# < 3 ? $# : 3))
  res=$(pagecache resident "${shards[@]}")
  local flags=(--backend cuda -p "Hello" -n 1 "$@")
  [ "$nread" != default ] && flags+=(--load-readers "$nread")
  t0=$(date +%s.%N)
  timeout 180 "$bin/xmix" run "$bundle" "${flags[@]}" > "$dir/run-$name.out" 2> "$err" || rc=$?
  t1=$(date +%s.%N)
  { echo "== run $name (readers $nread, page cache $res resident): rc $rc"; cat "$err"; } >> "$logf"
  [ "$rc" = 0 ] || { failures=$((failures + 1)); log "run $name failed (rc $rc): $(tail -2 "$err" | tr '\n' ' ')"; }
  python3 - "$name" "$nread" "$res" "$rc" "$t0" "$t1" "$err" >> "$dir/runs.jsonl" <<'EOF'
import json, re, sys
name, nread, res, rc, t0, t1, err = sys.argv[1:]
text = open(err, errors="replace").read()
def num(pat):
    m = re.search(pat, text)
    return float(m.group(1)) if m else None
row = {"run": name, "readers": nread, "resident_before": float(res), "rc": int(rc),
       "wall_s": round(float(t1) - float(t0), 3),
       "first_token_s": num(r"first token ([0-9.]+) s after start"),
       "weights_s": num(r"weights: [0-9.]+ GB in ([0-9.]+) s"),
       "weights_gbps": num(r"weights: [0-9.]+ GB in [0-9.]+ s \(([0-9.]+) GB/s"),
       "kernels_s": num(r"kernels compiled by the driver in ([0-9.]+) s"),
       "graphs_s": num(r"graphs instantiated for [0-9]+ templates in ([0-9.]+) s"),
       "graphs": num(r"cuda: ([0-9]+) graphs instantiated"),
       "loaded_s": num(r"loaded in ([0-9.]+)s")}
m = re.search(r"weights: [0-9.]+ GB in [0-9.]+ s \([0-9.]+ GB/s, ([0-9]+) readers", text)
if m:
    row["readers"] = int(m.group(1))
print(json.dumps(row))
EOF
  log "run $name: $(tail -1 "$dir/runs.jsonl")"
}

log "runs from the page cache (the first warms it and the driver's JIT cache, and is not counted)"
cat "${shards[@]}" > /dev/null
timed warmup default
for i in $(seq 1 "$runs"); do timed "cache$i" default; done
for r in $readers; do timed "cache-r$r" "$r"; done
last=$dir/l8-hf.xmb
if [ ${#apps[@]} -gt 0 ]; then
  last=$dir/l8-hf-apps.xmb
  for i in $(seq 1 "$runs"); do timed "apps$i" default "$last"; done
fi
IFS=';' read -ra extra <<< "${EXTRA:-}"
for e in "${extra[@]}"; do
  [ -n "$e" ] || continue
  name=${e%%=*}
  # shellcheck disable=SC2086 # the flags split into words
  for i in $(seq 1 "$runs"); do timed "$name$i" default "$last" ${e#*=}; done
done

cold_note="not run (COLD=0)"
if [ "$cold" -gt 0 ]; then
  left=$(pagecache evict "${shards[@]}")
  if python3 -c "import sys; sys.exit(0 if float('$left') < 0.05 else 1)"; then
    cold_note="checkpoint pages evicted with posix_fadvise(DONTNEED) before each run ($left resident after eviction)"
    log "cold runs: $cold_note"
    for i in $(seq 1 "$cold"); do
      pagecache evict "${shards[@]}" > /dev/null
      timed "cold$i" default
    done
  else
    cold_note="not possible here: $left of the checkpoint stayed in memory after posix_fadvise(DONTNEED) ($dir is on $(stat -f -c %T "$dir"); tmpfs or an overlay that keeps pages); dropping every cache would change the machine"
    log "cold runs: $cold_note"
  fi
fi

python3 - "$dir/runs.jsonl" "$OUT" "$gb" "$cold_note" "$(cat "$OUT/machine.txt")" <<'EOF'
import json, statistics, sys
runs_file, out, gb, cold_note, machine = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_file) if l.strip()]
ok = lambda prefix: [r for r in runs if r["run"].startswith(prefix) and r["rc"] == 0 and r["first_token_s"]]
default = [r for r in ok("cache") if not r["run"].startswith("cache-r")]
withapps = ok("apps")
coldr = [r for r in runs if r["run"].startswith("cold") and r["rc"] == 0 and r["first_token_s"]]
med = lambda rs, k: round(statistics.median(r[k] for r in rs), 3) if rs and all(r.get(k) is not None for r in rs) else None
summary = {
    "checkpoint_gb": float(gb), "target_first_token_s": 3.0,
    "page_cache_first_token_s_median": med(default, "first_token_s"),
    "page_cache_weights_gbps_median": med(default, "weights_gbps"),
    "cold_first_token_s_median": med(coldr, "first_token_s"),
    "cold_weights_gbps_median": med(coldr, "weights_gbps"),
    "apps_first_token_s_median": med(withapps, "first_token_s"),
    "apps_graphs_s_median": med(withapps, "graphs_s"), "bare_graphs_s_median": med(default, "graphs_s"),
    "cold": cold_note, "before_issue14": {"page_cache_first_token_s": 7.7, "cold_first_token_s": 15.8},
}
t = summary["page_cache_first_token_s_median"]
summary["target_met"] = t is not None and t <= 3.0
json.dump({"machine": machine, "summary": summary, "runs": runs}, open(f"{out}/load.json", "w"), indent=2)
f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"
lines = [f"# xmix run to first token, {gb} GB Llama-3.1-8B checkpoint (transformers, bf16)", "",
         machine, "",
         "| run | readers | resident | first token s | weights s | weights GB/s | kernels s | graphs | graphs s | wall s | rc |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for r in runs:
    lines.append(f"| {r['run']} | {r['readers']} | {r['resident_before']:.2f} | {f(r['first_token_s'])} | {f(r['weights_s'])} | "
                 f"{f(r['weights_gbps'], 1)} | {f(r['kernels_s'])} | {f(r.get('graphs'), 0)} | {f(r['graphs_s'])} | {f(r['wall_s'])} | {r['rc']} |")
lines += ["", f"Page cache, default readers: median first token {f(summary['page_cache_first_token_s_median'])} s "
          f"(target 3 s: {'met' if summary['target_met'] else 'missed'}; before issue 14: 7.7 s), "
          f"weights at {f(summary['page_cache_weights_gbps_median'], 1)} GB/s.",
          f"Cold: {cold_note}; median first token {f(summary['cold_first_token_s_median'])} s (before: 15.8 s)."]
if withapps:
    lines.append(f"With the apps deployed (apps runs): median first token {f(summary['apps_first_token_s_median'])} s, "
                 f"graphs instantiated in {f(summary['apps_graphs_s_median'])} s against {f(summary['bare_graphs_s_median'])} s bare.")
open(f"{out}/load.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

if [ "${KEEP:-0}" != 1 ]; then
  rm -rf "$ckpt"
  log "deleted $ckpt (KEEP=1 keeps it)"
fi
[ "$failures" = 0 ] || die "$failures runs failed (see $logf)"
log "done: $OUT/load.json, $OUT/load.md"
