#!/usr/bin/env bash
# Builds tests/consumer, a workspace that depends on @weft by local_repository and loads
# nothing else from weft but deps.bzl (no .bazelrc of weft's), then runs its programs on
# 2 ranks: C++ against @weft//comm, C against libweft.so and against libweft.a.
#
# The nested Bazel keeps its output base and disk cache in CONSUMER_BAZEL_CACHE (default
# ~/.cache/weft/consumer), so later runs only rebuild what changed. It reads the checkout
# itself (this script's real location), not Bazel's runfiles: tests/consumer is a
# workspace of its own, outside weft's packages (.bazelignore).
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/consumer"
cache=${CONSUMER_BAZEL_CACHE:-${HOME:-/tmp}/.cache/weft/consumer}
mkdir -p "$cache"
startup=(--output_user_root="$cache/root" --max_idle_secs=30)
trap 'bazel "${startup[@]}" shutdown >/dev/null 2>&1 || true' EXIT
bazel "${startup[@]}" build --disk_cache="$cache/disk" --symlink_prefix=/ \
  --spawn_strategy=processwrapper-sandbox :all 2>&1 | tail -n 20
bin=$(bazel "${startup[@]}" info bazel-bin 2>/dev/null)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
for prog in cxx_consumer c_consumer_shared c_consumer_static; do
  out=$(timeout 120 mpirun --oversubscribe -np 2 --mca btl self,vader,tcp \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$bin/$prog" 2>&1) || status=1
  printf '%s\n' "$out"
  [[ $(grep -c ': ok (' <<<"$out") == 2 ]] || { echo "FAIL: $prog did not sum right on 2 ranks"; status=1; }
done
exit "$status"
