"""Build TorchServe's frontend to carry to a GPU machine that has Python and torch but no Java and no network.

    python -m scripts.gpu.serving_bundle [--out build/gpu-serving] [--no-pack]

The tree (build/gpu-serving/torchserve/):

- runtime/: a Java runtime made by jlink from this machine's OpenJDK 17 jmods, with only the modules the
  frontend's jar needs (jdeps on the slimmed jar, plus java.desktop: the frontend dies at start without it);
- python/ts/: a copy of the installed `ts` package, its model-server.jar slimmed (other platforms' natives,
  Groovy, the test frameworks and tools bundled in it removed). TorchServe puts `<ts>/frontend/*` on the
  frontend's class path, so with python/ first on PYTHONPATH the copy's jar is the one that runs;
- bin/wrk and lib/: the load generator of the benchmarks and the LuaJIT it links (the GPU machine has none);
- start.sh: checks the machine's glibc against what the runtime's binaries need, then runs TorchServe (or,
  after --exec, any command) with JAVA_HOME, PYTHONPATH and PATH pointing into the bundle.

Packed as torchserve.tar.xz beside the tree (what travels). A build is reused while its inputs are unchanged
(ensure_tree), so tests build it once.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import re
import shutil
import stat
import subprocess
import tarfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from scripts import cli
from scripts.errors import ConfigError
from scripts.layout import BUILD

DEFAULT_OUT = BUILD / "gpu-serving"
TREE = "torchserve"
PACKED = "torchserve.tar.xz"
JAR = Path("python/ts/frontend/model-server.jar")
# jdeps misses what the frontend loads by reflection or by name (log4j's XML config, java.util.logging bridges,
# the jar file system); java.desktop is in jdeps' list already (java.beans), and the frontend needs it.
EXTRA_MODULES = ("java.desktop", "java.xml", "java.logging", "jdk.zipfs")
# --compress=0, and the jar's entries stored: the tar.xz that travels compresses them itself, to 10 MB each
# where xz over jlink's zip (--compress=2) and the jar's deflate gets 22 MB each.
JLINK_OPTIONS = ("--strip-debug", "--no-header-files", "--no-man-pages", "--compress=0")
# Entries of model-server.jar a Linux x86-64 frontend never loads. Groovy serves only log4j's script filters
# (monitoring/log4j2.xml has none) and its own tools; the test frameworks, javaparser, xstream, jline, picocli
# and jQuery are bundled by the build's fat jar. module-info.class entries are dropped because jdeps fails on
# junit's and the class path ignores them.
JAR_DROPPED = (
    "META-INF/native/*windows*",
    "META-INF/native/*osx*",
    "META-INF/native/*macos*",
    "META-INF/native/*kqueue*",
    "META-INF/native/*aarch_64*",
    "META-INF/native/linux32/*",
    "groovy*",
    "org/codehaus/groovy/*",
    "org/apache/groovy/*",
    "org/junit/*",
    "org/testng/*",
    "org/opentest4j/*",
    "org/apiguardian/*",
    "com/beust/*",
    "bsh/*",
    "com/github/javaparser/*",
    "com/thoughtworks/*",
    "org/jline/*",
    "jline/*",
    "picocli/*",
    "META-INF/resources/webjars/*",
    "*module-info.class",
)
GLIBC_SYMBOL = re.compile(rb"GLIBC_(\d+)\.(\d+)")


class BundleError(ConfigError):
    """A tool the bundle needs (jlink, jdeps, wrk) is missing or failed."""


@dataclass(frozen=True)
class BundleInfo:
    key: str
    modules: list[str]
    glibc_needed: str
    runtime_bytes: int
    jar_bytes_before: int
    jar_bytes_after: int
    tree_bytes: int
    built_s: float


def java_home() -> Path:
    """The OpenJDK 17 with jmods (Debian's openjdk-17-jdk-headless)."""
    for candidate in sorted(glob.glob("/usr/lib/jvm/*17*")):
        home = Path(candidate).resolve()
        if (home / "jmods" / "java.base.jmod").exists() and (home / "bin" / "jlink").exists():
            return home
    raise BundleError("no JDK 17 with jmods under /usr/lib/jvm: `apt-get install openjdk-17-jdk-headless` (system-packages.sh)")


def installed_ts() -> Path:
    import ts

    return Path(ts.__file__).resolve().parent


def build_key(jdk: Path, ts_dir: Path) -> str:
    """What a built tree depends on: this builder, the JDK and the installed ts (its jar's size and mtime)."""
    jar = ts_dir / "frontend" / "model-server.jar"
    wrk = shutil.which("wrk")
    parts = [
        Path(__file__).read_bytes(),
        (jdk / "release").read_bytes(),
        f"{jar.stat().st_size}:{jar.stat().st_mtime_ns}".encode(),
        (ts_dir / "version.txt").read_bytes(),
        (wrk or "").encode(),
    ]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def dropped(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in JAR_DROPPED)


def slim_jar(source: Path, target: Path) -> None:
    """`source` without the JAR_DROPPED entries, the rest stored uncompressed (see JLINK_OPTIONS)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as jar, zipfile.ZipFile(target, "w") as out:
        for entry in jar.infolist():
            if dropped(entry.filename):
                continue
            out.writestr(entry, jar.read(entry), compress_type=zipfile.ZIP_STORED)


def jar_modules(jdk: Path, jar: Path) -> list[str]:
    completed = subprocess.run(
        [str(jdk / "bin" / "jdeps"), "--ignore-missing-deps", "--multi-release", "17", "--print-module-deps", str(jar)],
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise BundleError(f"jdeps failed on {jar}: {completed.stderr.strip()[-500:]}")
    modules = completed.stdout.strip().splitlines()[-1].split(",")
    return sorted(set(modules) | set(EXTRA_MODULES))


def jlink(jdk: Path, modules: list[str], target: Path) -> None:
    completed = subprocess.run(
        [str(jdk / "bin" / "jlink"), "--add-modules", ",".join(modules), *JLINK_OPTIONS, "--output", str(target)],
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise BundleError(f"jlink failed: {completed.stderr.strip()[-500:]}")


def copy_ts(ts_dir: Path, target: Path) -> None:
    """The ts package without its bytecode caches and without its jar (the slim one goes in its place)."""
    shutil.copytree(ts_dir, target, ignore=shutil.ignore_patterns("__pycache__", "model-server.jar"))


def copy_wrk(tree: Path) -> None:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise BundleError("wrk is missing (the GPU machine's load generator travels in the bundle): `apt-get install wrk`")
    (tree / "bin").mkdir()
    (tree / "lib").mkdir()
    shutil.copy2(wrk, tree / "bin" / "wrk")
    # Only LuaJIT: libssl and libc are the machine's own (the CUDA images have them).
    for line in subprocess.run(["ldd", wrk], capture_output=True, text=True, check=True).stdout.splitlines():
        if "libluajit" in line:
            shutil.copy2(line.split("=>")[1].split()[0], tree / "lib")


def glibc_needed(tree: Path) -> str:
    """The newest GLIBC_x.y symbol version any ELF file of the tree asks for."""
    newest = (2, 0)
    for path in tree.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        with open(path, "rb") as handle:
            if handle.read(4) != b"\x7fELF":
                continue
            handle.seek(0)
            data = handle.read()
        for major, minor in GLIBC_SYMBOL.findall(data):
            newest = max(newest, (int(major), int(minor)))
    return f"{newest[0]}.{newest[1]}"


START_SCRIPT = """#!/bin/sh
# TorchServe from this bundle: its jlinked Java, its slim jar, its ts package, its wrk.
#   start.sh [torchserve arguments]      python3 -m ts.model_server --start --foreground ...
#   start.sh --exec COMMAND [ARGS]       COMMAND inside the bundle's environment
NEED_GLIBC={need}
HAVE_GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{{print $2}}')
if [ -z "$HAVE_GLIBC" ] || [ "$(printf '%s\\n%s\\n' "$NEED_GLIBC" "$HAVE_GLIBC" | sort -V | head -n 1)" != "$NEED_GLIBC" ]; then
    echo "this bundle's Java runtime needs glibc $NEED_GLIBC or newer; this machine has ${{HAVE_GLIBC:-no glibc}}:" \
        "build the bundle on an older distribution" >&2
    exit 3
fi
HERE=$(cd "$(dirname "$0")" && pwd)
export JAVA_HOME="$HERE/runtime"
export PYTHONPATH="$HERE/python${{PYTHONPATH:+:$PYTHONPATH}}"
export PATH="$HERE/bin:$JAVA_HOME/bin:$PATH"
export LD_LIBRARY_PATH="$HERE/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
PYTHON=${{PYTHON:-python3}}
if [ "$1" = "--exec" ]; then
    shift
    exec "$@"
fi
exec "$PYTHON" -m ts.model_server --start --foreground "$@"
"""


def write_start_script(tree: Path, need: str) -> None:
    path = tree / "start.sh"
    path.write_text(START_SCRIPT.format(need=need))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build_tree(out: Path) -> BundleInfo:
    """Build out/torchserve (replacing any older one) and its bundle.json."""
    started = time.perf_counter()
    jdk, ts_dir = java_home(), installed_ts()
    tree = out / TREE
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    copy_ts(ts_dir, tree / "python" / "ts")
    original = ts_dir / "frontend" / "model-server.jar"
    slim_jar(original, tree / JAR)
    modules = jar_modules(jdk, tree / JAR)
    jlink(jdk, modules, tree / "runtime")
    copy_wrk(tree)
    need = glibc_needed(tree)
    write_start_script(tree, need)
    info = BundleInfo(
        key=build_key(jdk, ts_dir),
        modules=modules,
        glibc_needed=need,
        runtime_bytes=size_of(tree / "runtime"),
        jar_bytes_before=original.stat().st_size,
        jar_bytes_after=(tree / JAR).stat().st_size,
        tree_bytes=size_of(tree),
        built_s=round(time.perf_counter() - started, 1),
    )
    (out / "bundle.json").write_text(json.dumps(asdict(info), indent=2))
    return info


def ensure_tree(out: Path = DEFAULT_OUT) -> tuple[Path, BundleInfo]:
    """The built tree, rebuilt only when its inputs changed since the last build."""
    meta = out / "bundle.json"
    if meta.exists() and (out / TREE / "start.sh").exists():
        info = BundleInfo(**json.loads(meta.read_text()))
        if info.key == build_key(java_home(), installed_ts()):
            return out / TREE, info
    return out / TREE, build_tree(out)


def pack(out: Path) -> Path:
    """out/torchserve as one tar.xz (unpacked there by `python3 -m tarfile -e`: no xz tool needed)."""
    target = out / PACKED
    with tarfile.open(target, "w:xz", preset=9) as archive:
        archive.add(out / TREE, arcname=TREE)
    return target


def ensure_packed(out: Path = DEFAULT_OUT) -> Path:
    """The packed bundle, packed again only when the tree was built after it."""
    ensure_tree(out)
    packed = out / PACKED
    if packed.exists() and packed.stat().st_mtime >= (out / "bundle.json").stat().st_mtime:
        return packed
    return pack(out)


def main() -> int:
    parser = cli.parser_for(__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-pack", action="store_true", help="build the tree only (what the integration test uses)")
    args = parser.parse_args()
    tree, info = ensure_tree(args.out)
    mib = 2**20
    print(
        f"TorchServe bundle -> {tree}: runtime {info.runtime_bytes / mib:.1f} MiB ({len(info.modules)} modules), "
        f"jar {info.jar_bytes_before / mib:.1f} -> {info.jar_bytes_after / mib:.1f} MiB, tree {info.tree_bytes / mib:.1f} MiB, "
        f"needs glibc {info.glibc_needed}"
    )
    if not args.no_pack:
        packed = pack(args.out)
        print(f"packed -> {packed} ({packed.stat().st_size / mib:.1f} MiB)")
    return 0


if __name__ == "__main__":
    cli.run(main)
