# Sourced by the GPU scripts and checks (tools/gpu/host-env.sh,
# tests/gpu/gpu_check.sh): what a process holds and whether it runs.

# The MiB nvidia-smi lists for process $1 (0 when it lists none).
held() {
  local m
  m=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
      awk -F', ' -v p="$1" '$1 == p {print $2}')
  echo "${m:-0}"
}

# Whether process $1 runs (an exited child is a zombie until waited for).
alive() {
  local s
  s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
  [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]
}
