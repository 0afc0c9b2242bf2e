"""weft's PEP 517 build backend: `pip install .` from a checkout builds the Python package
with Bazel (offline, as ./tools/weft.sh does) and packs it into a wheel. It needs nothing
from PyPI (pyproject.toml declares no build requirements), so pip's isolated build works
without a network.

    python3 -m venv --system-site-packages env && env/bin/pip install .

The wheel holds the package as Bazel built it (bindings/python/BUILD.bazel): the pure
Python modules, the two SWIG extensions and libweft.so.0 and libweft_trainer.so.0, which
the extensions find next to them ($ORIGIN). It is for this machine's Python and for the
MPI, abseil and LibTorch libraries it was built against (Debian's).

Also a command, which packs an already built package directory (the tests use it):

    python3 bindings/python/build_backend.py PACKAGE_DIR WHEEL_DIR
"""

import base64
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SUMMARY = "Communication-efficient distributed training: decentralized averaging, " \
           "collectives, windows, elastic pipelines"


def _in_package(file_name):
    """The package's files among Bazel's outputs: the modules, the SWIG extensions (*.so)
    and the libraries under their sonames (*.so.0), not the linker's leftovers."""
    return file_name.endswith((".py", ".so")) or re.fullmatch(r".*\.so\.\d+", file_name)


def _version(root=_ROOT):
    with open(os.path.join(root, "capi", "include", "weft", "weft.h"), encoding="utf-8") as f:
        text = f.read()
    parts = [re.search(r"#define WEFT_VERSION_%s (\d+)" % p, text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _tag():
    py = "cp%d%d" % sys.version_info[:2]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (py, py, platform)


def _metadata(version):
    return ("Metadata-Version: 2.1\n"
            "Name: weft\n"
            "Version: %s\n"
            "Summary: %s\n"
            "Requires-Python: >=3.11\n"
            "Requires-Dist: numpy\n"
            "Provides-Extra: torch\n"
            "Requires-Dist: torch; extra == \"torch\"\n"
            "Requires-Dist: networkx; extra == \"torch\"\n" % (version, _SUMMARY))


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d\n" % (name, digest, len(data))


def pack(package_dir, wheel_directory, version=None):
    """Writes the wheel of a built package directory; returns its file name."""
    version = version or _version()
    names = sorted(f for f in os.listdir(package_dir) if _in_package(f))
    if not any(f.endswith(".so") for f in names):
        raise FileNotFoundError("%s holds no extension: build //bindings/python:weft"
                                % package_dir)
    info = "weft-%s.dist-info" % version
    wheel = "weft-%s-%s.whl" % (version, _tag())
    os.makedirs(wheel_directory, exist_ok=True)
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w",
                         zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data, mode):
            entry = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
            entry.external_attr = mode << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
            record.append(_record_line(arcname, data))

        for name in names:
            with open(os.path.join(package_dir, name), "rb") as f:
                add("weft/" + name, f.read(), 0o755 if ".so" in name else 0o644)
        add(info + "/METADATA", _metadata(version).encode(), 0o644)
        add(info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: weft build_backend\n"
                              "Root-Is-Purelib: false\nTag: %s\n" % _tag()).encode(), 0o644)
        add(info + "/top_level.txt", b"weft\n", 0o644)
        record.append(info + "/RECORD,,\n")
        z.writestr(info + "/RECORD", "".join(record))
    return wheel


def _bazel_build(root):
    """Builds the package with Bazel as ./tools/weft.sh does (offline, the same disk
    cache); returns the built package directory."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                         os.path.join(os.environ.get("HOME", "/tmp"), ".cache"), "weft")
    startup = []
    if os.environ.get("WEFT_PIP_BAZEL_OUTPUT_ROOT"):  # a separate Bazel server (tests)
        startup = ["--output_user_root=" + os.environ["WEFT_PIP_BAZEL_OUTPUT_ROOT"],
                   "--max_idle_secs=30"]
    flags = ["--disk_cache=" + os.path.join(cache, "bazel-disk"), "-c", "opt",
             "--symlink_prefix=/"]
    subprocess.run(["bazel"] + startup + ["build"] + flags + ["//bindings/python:weft"],
                   cwd=root, check=True, stdout=sys.stderr)
    bin_dir = subprocess.run(["bazel"] + startup + ["info"] + flags + ["bazel-bin"], cwd=root,
                             check=True, capture_output=True, text=True).stdout.strip()
    return os.path.join(bin_dir, "bindings", "python", "weft")


# ---- PEP 517 hooks -----------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = "weft-%s.dist-info" % _version()
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w") as f:
        f.write(_metadata(_version()))
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return pack(_bazel_build(os.getcwd()), wheel_directory, _version(os.getcwd()))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: build_backend.py PACKAGE_DIR WHEEL_DIR")
    print(os.path.join(sys.argv[2], pack(sys.argv[1], sys.argv[2])))
