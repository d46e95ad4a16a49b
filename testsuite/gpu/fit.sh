# fit_flags SPEC [FLAGS...] (sourced by ptxas.sh, start.sh and apps.sh): the xmixc build flags
# that make SPEC's bundle fit this machine's card. The shipped Llama-3.1-8B spec's KV pool
# (524288 tokens, 64 GiB of bf16 KV) and weights need 79.84 GiB, more than an 80 GB H100 has
# free, so on a card of less than 100 GiB it is built with a pool of KV_TOKENS_80GB tokens
# (default 294912, what sessions 63-64 ran there; xmix's out-of-memory error names the largest
# pool that fits). Nothing for other specs, on larger cards, without nvidia-smi (the CPU smoke
# runs) or where FLAGS already set --kv-cache-tokens. The card's memory is read once, here.
fit_card_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 || true)
fit_flags() {
  local spec=$1
  shift
  case $spec in *llama-3.1-8b.yaml) ;; *) return 0 ;; esac
  case " $* " in *" --kv-cache-tokens"*) return 0 ;; esac
  [[ $fit_card_mib =~ ^[0-9]+$ ]] && [ "$fit_card_mib" -lt 102400 ] && echo "--kv-cache-tokens ${KV_TOKENS_80GB:-294912}"
  return 0
}
