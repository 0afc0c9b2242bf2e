#!/usr/bin/env bash
# `pip install .` as a Python user runs it on a checkout: a fresh virtual environment that
# sees Debian's NumPy and torch, pip building the wheel through pyproject.toml's in-tree
# backend (Bazel, offline, no PyPI), then `pip show weft` and 2 ranks of the installed
# package.
#
# The backend's Bazel runs as its own server (WEFT_PIP_BAZEL_OUTPUT_ROOT, under
# CONSUMER_BAZEL_CACHE like the consumer test's) on the checkout itself (this script's real
# location): the test's own Bazel holds the workspace's lock.
set -euo pipefail
repo=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cache=${CONSUMER_BAZEL_CACHE:-${HOME:-/tmp}/.cache/weft/consumer}
mkdir -p "$cache"
export WEFT_PIP_BAZEL_OUTPUT_ROOT=$cache/pip-root
trap 'bazel --output_user_root="$WEFT_PIP_BAZEL_OUTPUT_ROOT" shutdown >/dev/null 2>&1 || true' EXIT
venv=${TEST_TMPDIR:-$(mktemp -d)}/env
/usr/bin/python3 -m venv --system-site-packages "$venv"
# Python's byte-code caches (ignored by git) aside.
files() {
  git -C "$repo" status --porcelain --ignored --untracked-files=all | grep -v '__pycache__/' |
    sort
}
before=$(files)
start=$(date +%s)
(cd "$repo" && "$venv/bin/pip" install --no-index --root-user-action=ignore . 2>&1 | tail -n 5)
echo "pip install . took $(($(date +%s) - start)) s"
"$venv/bin/pip" show weft
if [[ "$(files)" != "$before" ]]; then
  echo "FAIL: pip install . changed the checkout:"
  diff <(echo "$before") <(files) || true
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "${TEST_TMPDIR:-/tmp}"
out=$(timeout 120 mpirun --oversubscribe -np 2 --mca btl self,vader,tcp \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$venv/bin/python" -c "
import weft, numpy as np
assert weft.__file__.startswith('$venv/'), weft.__file__
weft.init()
n = weft.size()
y = weft.allreduce(np.full(3, weft.rank() + 1.0), average=False)
print('rank %d: %s' % (weft.rank(), 'ok' if (y == n * (n + 1) / 2).all() else 'WRONG'))
" 2>&1)
printf '%s\n' "$out"
[[ $(grep -c ': ok' <<<"$out") == 2 ]] || { echo "FAIL: the installed package on 2 ranks"; exit 1; }
echo "PASS: pip install . into a virtual environment, used on 2 ranks"
