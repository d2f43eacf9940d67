"""llama.cpp's own C++ server, ``llama-server``, built from the llama.cpp sources that
llama-cpp-python's source distribution vendors (``vendor/llama.cpp``), once, into a cache folder.

PyPI has no ``llama-server`` binary, and llama-cpp-python's wheel holds only the library; its
sdist holds the whole llama.cpp tree at the commit it was released with (its git metadata too,
so the commit is known). :func:`llama_server` downloads that sdist with pip
(``pip download --no-binary :all: --no-deps llama-cpp-python==VERSION``), configures it with
cmake (Release, native CPU flags, the server only: no CURL, no OpenSSL, no web UI download,
static libraries) and builds the ``llama-server`` target with 2 jobs (several minutes on 2
cores), showing its progress with rich. A finished build, marked by its ``build.json``, is
reused: ``~/.cache/transformer-kit/llama-server/<llama-cpp-python version>/``
(``TRANSFORMER_KIT_CACHE`` moves the root). No llama.cpp code is kept in this repository.

    python -m testbed.llama_server [--version 0.3.36] [--jobs 2]  # build (or find) it, print its path
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

LLAMA_CPP_PYTHON = "0.3.36"  # the version benchmarks/serving_llama_cpp.py and gguf_llama_cpp.py measured
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")


def cache_root() -> Path:
    """Where builds are kept: ``$TRANSFORMER_KIT_CACHE/llama-server`` or
    ``~/.cache/transformer-kit/llama-server``."""
    base = os.environ.get("TRANSFORMER_KIT_CACHE") or Path.home() / ".cache" / "transformer-kit"
    return Path(base) / "llama-server"


def build_info(version: str = LLAMA_CPP_PYTHON) -> dict | None:
    """The finished build's record (its ``build.json``: binary, commit, options, build time) or
    None when there is none."""
    record = cache_root() / version / "build.json"
    if not record.is_file():
        return None
    info = json.loads(record.read_text())
    return info if Path(info["binary"]).is_file() else None


def _sdist(version: str, into: Path, console: Console) -> Path:
    """llama-cpp-python's sdist of ``version``, downloaded by pip into ``into`` (once)."""
    found = sorted(into.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    console.print(f"[bold]llama-server[/]: downloading llama-cpp-python {version}'s sdist with pip")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    "--disable-pip-version-check", "-d", str(into), f"llama-cpp-python=={version}"],
                   check=True, stdout=subprocess.DEVNULL)
    return next(into.glob(f"llama_cpp_python-{version}.tar.gz"))


def _commit(source: Path) -> str:
    """The llama.cpp commit the sdist vendors (its submodule's git HEAD; ``unknown`` without)."""
    try:
        return subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _run_with_progress(command: list[str], log: Path, progress: Progress, description: str) -> None:
    """Run ``command``, its output into ``log``, a progress bar fed by make's ``[ NN%]`` lines."""
    task = progress.add_task(description, total=100)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            out.write(line)
            out.flush()
            if match := re.match(r"\[\s*(\d+)%\]\s*(.*)", line):
                target = match.group(2).rsplit("/", 1)[-1][:60]
                progress.update(task, completed=int(match.group(1)), description=f"{description}: {target}")
        if process.wait() != 0:
            raise RuntimeError(f"{' '.join(command[:3])} failed; its output is in {log}")
    progress.update(task, completed=100, description=description)


def llama_server(version: str = LLAMA_CPP_PYTHON, jobs: int = 2, console: Console | None = None) -> dict:
    """The ``llama-server`` of llama-cpp-python ``version``'s vendored llama.cpp, built once.

    Returns its record: ``binary`` (the executable's path), ``llama_cpp_python`` (the version),
    ``llama_cpp_commit``, ``llama_cpp_version`` (what ``llama-server --version`` says),
    ``cmake_options``, ``build_s`` (the build's seconds) and ``built`` (a UTC date)."""
    console = console or Console(stderr=True)
    if (info := build_info(version)) is not None:
        return info
    folder = cache_root() / version
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    sdist = _sdist(version, folder, console)
    source_root = folder / f"llama_cpp_python-{version}"
    if not (source_root / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        console.print(f"[bold]llama-server[/]: unpacking {sdist.name}")
        with tempfile.TemporaryDirectory(dir=folder) as scratch, tarfile.open(sdist) as archive:
            archive.extractall(scratch, filter="data")
            shutil.rmtree(source_root, ignore_errors=True)
            (Path(scratch) / source_root.name).rename(source_root)
    source = source_root / "vendor" / "llama.cpp"
    build = folder / "build"
    log = folder / "build.log"
    log.write_text("")
    console.print(f"[bold]llama-server[/]: building {source} with {jobs} jobs (several minutes; "
                  f"output in {log})")
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        _run_with_progress(["cmake", "-S", str(source), "-B", str(build), *CMAKE_OPTIONS], log, progress,
                           "configure")
        _run_with_progress(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
                           log, progress, "build")
    binary = build / "bin" / "llama-server"
    said = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    info = {"binary": str(binary), "llama_cpp_python": version, "llama_cpp_commit": _commit(source),
            "llama_cpp_version": (said.stdout + said.stderr).strip(), "cmake_options": list(CMAKE_OPTIONS),
            "build_s": round(time.perf_counter() - start, 1),
            "built": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}
    (folder / "build.json").write_text(json.dumps(info, indent=1))
    console.print(f"[bold]llama-server[/]: built in {info['build_s']:.0f} s: {binary}")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=LLAMA_CPP_PYTHON, help="llama-cpp-python's version")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    print(json.dumps(llama_server(args.version, args.jobs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
