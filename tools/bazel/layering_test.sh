#!/usr/bin/env bash
# The layering the module READMEs state, checked on the dependency graph of the targets
# other workspaces may use (their visibility is public, so it cannot enforce it). Each
# *_deps file is `bazel query 'kind(rule, deps(...))'` of one module (tools/bazel/BUILD.bazel).
set -uo pipefail
dir=tools/bazel
failed=0

# check MODULE FORBIDDEN-REGEX WHY
check() {
  local file="$dir/$1_deps" bad
  if ! grep -q . "$file"; then
    echo "FAIL $1: the dependency query is empty"
    failed=1
    return
  fi
  bad=$(grep -E "$2" "$file")
  if [[ -n $bad ]]; then
    echo "FAIL $1 must not depend on $3, but depends on:"
    printf '  %s\n' $bad
    failed=1
  else
    echo "ok   $1 ($(wc -l <"$file") rules): nothing from $3"
  fi
}

check core '^//(comm|optim|pipe|capi|bindings)[/:]|^@(mpi|torch|ucx|cuda)//' \
  "comm/, optim/, pipe/, capi/, bindings/, MPI, LibTorch, UCX or CUDA"
check comm '^//(optim|pipe|capi|bindings)[/:]|^@torch//' \
  "optim/, pipe/, capi/, bindings/ or LibTorch (only comm/torch knows LibTorch)"
check comm_torch '^//(optim|pipe|capi|bindings)[/:]' "optim/, pipe/, capi/ or bindings/"
check optim '^//(pipe|capi|bindings)[/:]' "pipe/, capi/ or bindings/"
check pipe_algorithms '^//(comm|optim|capi|bindings|pipe/runtime)[/:]|^@(mpi|torch|ucx|cuda)//' \
  "comm/, optim/, capi/, bindings/, pipe/runtime, MPI, LibTorch, UCX or CUDA (they are pure)"
check pipe_placement '^//(comm|optim|capi|bindings)[/:]|^@(mpi|torch|ucx|cuda)//' \
  "comm/, optim/, capi/, bindings/, MPI, LibTorch, UCX or CUDA (the runtime's pure plan helpers)"
check pipe_runtime '^//(capi|bindings)[/:]' "capi/ or bindings/"
check capi '^//optim:optim$|^//(pipe/runtime|pipe/cache|bindings)[/:]|^@torch//' \
  "the optimizers (their step counter aside), pipe/ internals (runtime, cache), bindings/ or LibTorch (libweft.so has no LibTorch)"
check capi_trainer '^//bindings[/:]' "bindings/"
exit $failed
