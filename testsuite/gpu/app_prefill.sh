#!/usr/bin/env bash
# What an app costs a batch's prefill and decode, offline, in one device call: MODEL's bundle
# (default llama-3.1-8b) built with the app specs APPS, then ROUNDS (default 3) rounds of
# `xmix bench --prompts PROMPTS --prompt-len PROMPT_LEN --new-tokens NEW_TOKENS` (defaults 32,
# 1000 and 8: the prompts fill max_batched_tokens' steps, as the paper's online workload's
# first second does) with no app and then with each set of ENABLE (comma-separated app names;
# every request enabling them), the order reversed every other round: offline_ab.sh with the
# variants "none" and one per set. Each bench's prefill seconds and mean decode step go to the
# summary, with each set's change against no app. trace.sh's ENABLE does the same for one
# decode graph, kernel by kernel. Build first (bash testsuite/gpu/build.sh), then:
#   run(command="OUT=\$OUT APPS=specs/apps/app3-conditional-refusal.yaml ENABLE=conditional-refusal bash testsuite/gpu/app_prefill.sh", carry=[...])
# Writes $OUT/offline_ab.json ({"MODEL": {variant: [{prefill_s, decode_step_ms}, ...]}}) and
# $OUT/summary.txt.
: "${APPS:?set APPS}" "${ENABLE:?set ENABLE}"
variants="none="
for set in $ENABLE; do variants="$variants;$set=--apps $set --app-fraction 1"; done
MODELS=${MODEL:-llama-3.1-8b} ROUNDS=${ROUNDS:-3} VARIANTS=$variants exec bash "$(dirname "$0")/offline_ab.sh"
