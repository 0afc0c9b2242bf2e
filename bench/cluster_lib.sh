# Shared by the cluster benchmarks (sourced): builds a target with -c opt and copies the
# binary to $work under /tmp (every simulated host sees the same files, and a later build
# cannot replace it); `dir` holds the running cluster, which the exit trap takes down.
#
#   cluster_bench_prepare //bench:comm_bench bench/comm_bench   # sets work, dir
cluster_bench_prepare() {
  local target=$1 path=$2
  "${BAZEL:-bazel}" build -c opt "$target" >&2
  work=$(mktemp -d "/tmp/$(basename "$0" .sh).XXXXXX")
  cp "$("${BAZEL:-bazel}" info -c opt bazel-bin 2>/dev/null)/$path" "$work/"
  dir=""
  trap cluster_bench_cleanup EXIT
}

cluster_bench_cleanup() {
  [[ -z $dir ]] || tools/cluster down "$dir"
  rm -rf "$work"
}
