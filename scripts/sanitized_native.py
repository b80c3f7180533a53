"""`make test-native`: the C extension built with AddressSanitizer and UndefinedBehaviorSanitizer,
and the tests that exercise it run against that build.

    .venv/bin/python scripts/sanitized_native.py [PYTEST OPTIONS] [TEST PATHS]

1. Every extension setup.py declares (names and sources from setup.py itself) is built with
   `-fsanitize=address,undefined` into build/sanitize/lib; the .venv's own build (in the
   source tree) is left as it is.
2. build/sanitize/python is a Python that imports those builds: a venv without packages of
   its own, whose startup adds the .venv's site-packages and puts a finder first on
   sys.meta_path that loads each extension from build/sanitize/lib. The tests start the CLI
   and workers with sys.executable, so they import the sanitized build too.
3. A probe in that Python, started as the tests start the CLI (PYTHONPATH=the repository),
   must import the sanitized file; the run fails if it does not.
4. pytest runs the tests that import tracestream._native or use the `backend` fixture (or
   the TEST PATHS given; the numpy half of a `backend` test is left out) with the ASan
   runtime preloaded, and with PYTHONMALLOC=malloc so that buffers from PyMem_Malloc are
   the sanitizer's allocations too. A sanitizer report (ASan's in any process are logged
   under build/sanitize/reports; UBSan's go to stderr) fails the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "sanitize"
LIB = OUT / "lib"
PYTHON_DIR = OUT / "python"
REPORTS = OUT / "reports"

SANITIZE = "-fsanitize=address,undefined"
CFLAGS = f"{SANITIZE} -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
"""The compile flags: in the environment they take the place of Python's own (so no -fwrapv:
a signed overflow is reported), and setup.py's -O2 comes after them."""

NATIVE_TESTS = re.compile(r"\b_native\b|\bbackend\b")
"""A test module that imports tracestream._native, or uses conftest's `backend` fixture
(each test once with the C extension, once with numpy)."""

STARTUP = '''\
"""Written by scripts/sanitized_native.py: load tracestream's C extensions from the
sanitized build (imported at startup by tracestream-sanitized.pth)."""
import importlib.util
import sys

BUILT = {built!r}


class SanitizedExtensions:
    """Finds exactly the extensions of BUILT, before any other finder."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        where = BUILT.get(fullname)
        return None if where is None else importlib.util.spec_from_file_location(fullname, where)


if SanitizedExtensions not in sys.meta_path:
    sys.meta_path.insert(0, SanitizedExtensions)
'''

PLUGIN = '''\
"""Written by scripts/sanitized_native.py, loaded by pytest (-p)."""


def pytest_configure(config):
    """The sanitized build is several times slower: hypothesis tests get no deadline."""
    from hypothesis import settings

    settings.register_profile("sanitized", deadline=None)
    settings.load_profile("sanitized")


def pytest_collection_modifyitems(config, items):
    """The numpy half of a test run with both backends (conftest's `backend`) runs no C."""
    keep, numpy = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        (numpy if params.get("backend") == "numpy" else keep).append(item)
    if numpy:
        config.hook.pytest_deselected(items=numpy)
        items[:] = keep
'''

PROBE = """\
import json
import tracestream._native as n
from tracestream._native import _speedups
print(json.dumps({"file": _speedups.__file__, "in_use": n.chosen is n.built}))
"""


def fail(message: str) -> None:
    print(f"make test-native: {message}", file=sys.stderr)
    sys.exit(2)


def runtimes() -> dict[str, str]:
    """GCC's ASan and UBSan runtimes; the ASan one is preloaded into every Python."""
    for tool, package in (("gcc", "gcc"), ("nm", "binutils")):
        if shutil.which(tool) is None:
            fail(f"needs {tool} (Debian: apt-get install {package})")
    found = {}
    for name, package in (("libasan.so", "libasan8"), ("libubsan.so", "libubsan1")):
        path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True,
                              text=True, check=True).stdout.strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            fail(f"gcc has no {name}: install GCC's sanitizer runtimes (Debian: apt-get "
                 f"install {package}; they come with the gcc package's libgcc-N-dev)")
        found[name] = path
    return found


def build() -> dict[str, str]:
    """Build setup.py's extensions with the sanitizers into LIB: {module name: file}."""
    import setuptools  # noqa: F401, I001  (first: distutils below is then setuptools' own)
    from distutils.core import run_setup

    shutil.rmtree(OUT, ignore_errors=True)
    flags = {"CC": "gcc", "CFLAGS": CFLAGS, "LDFLAGS": SANITIZE}
    saved = {key: os.environ.get(key) for key in flags}
    os.environ.update(flags)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        dist = run_setup("setup.py", ["build_ext", "--build-lib", str(LIB), "--build-temp",
                                      str(OUT / "temp"), "--force"])
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    command = dist.get_command_obj("build_ext")
    built = {ext.name: str(Path(command.get_ext_fullpath(ext.name)).resolve())
             for ext in dist.ext_modules}
    if not built:
        fail("setup.py declares no extension")
    for name, path in built.items():
        # setup.py marks the extension optional: a failed build is only a warning there
        if not os.path.exists(path):
            fail(f"{name} was not built (see the compiler's messages above)")
        undefined = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True,
                                   text=True, check=True).stdout
        if "__asan_" not in undefined or "__ubsan_" not in undefined:
            fail(f"{path} is not instrumented by ASan and UBSan")
    return built


def make_python(built: dict[str, str]) -> Path:
    """A venv whose startup adds the .venv's packages and the finder of the sanitized build."""
    venv.EnvBuilder(with_pip=False, clear=True, symlinks=True).create(PYTHON_DIR)
    python = PYTHON_DIR / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "_tracestream_sanitized.py").write_text(STARTUP.format(built=built))
    (site / "_tracestream_sanitized_pytest.py").write_text(PLUGIN)
    (site / "tracestream-sanitized.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in ours)
        + "import _tracestream_sanitized\n")
    # the console scripts (tests run `tracestream` from sys.executable's folder)
    for entry in metadata.distribution("tracestream").entry_points:
        if entry.group == "console_scripts":
            script = python.with_name(entry.name)
            script.write_text(f"#!{python}\nimport sys\nfrom {entry.module} import {entry.attr}"
                              f"\nsys.exit({entry.attr}())\n")
            script.chmod(0o755)
    return python


def sanitizer_env(asan: str) -> dict[str, str]:
    REPORTS.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "LD_PRELOAD": asan,
        # CPython leaks by design; ASan's reports go to files, so one from a CLI process
        # whose stderr a test captures is found too
        "ASAN_OPTIONS": f"detect_leaks=0:log_path={REPORTS}/asan",
        "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={REPORTS}/ubsan",
        "PYTHONMALLOC": "malloc",
    }


def probe(python: Path, built: dict[str, str], env: dict[str, str]) -> None:
    """The sanitized build is the one a test's CLI process imports, or the run stops."""
    result = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)})
    if result.returncode != 0:
        fail(f"the probe failed (exit {result.returncode}):\n{result.stderr}{reports()}")
    seen = json.loads(result.stdout.splitlines()[-1])
    expected = built["tracestream._native._speedups"]
    print(f"make test-native: tracestream._native._speedups.__file__ = {seen['file']}")
    if seen["file"] != expected or not seen["in_use"]:
        fail(f"the probe imported {seen['file']} (in use: {seen['in_use']}), not the "
             f"sanitized build {expected}")


def native_tests() -> list[str]:
    tests = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                   if NATIVE_TESTS.search(path.read_text()))
    if not tests:
        fail("found no test module that imports tracestream._native")
    return tests


def reports() -> str:
    return "".join(f"\n--- {path}\n{path.read_text()}" for path in sorted(REPORTS.glob("*")))


def run_tests(python: Path, tests: list[str], env: dict[str, str]) -> tuple[int, bool]:
    """pytest's exit code, and whether a sanitizer report went by in its output.

    UBSan writes to stderr whatever its log_path says (the preloaded ASan runtime takes
    its report path), so pytest captures only what Python writes (--capture=sys): a report
    from the pytest process itself, or from a worker forked from it, reaches this output
    even when the process dies with it. Its lines are passed through and looked for."""
    process = subprocess.Popen(
        [python, "-u", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys",
         "-p", "_tracestream_sanitized_pytest", *tests],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = False
    for line in process.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        seen = seen or any(mark in line for mark in SANITIZER_MARKS)
    return process.wait(), seen


SANITIZER_MARKS = (b"runtime error:", b"ERROR: AddressSanitizer", b"ERROR: LeakSanitizer")


def main(args: list[str]) -> int:
    asan = runtimes()["libasan.so"]
    built = build()
    python = make_python(built)
    env = sanitizer_env(asan)
    probe(python, built, env)
    # test paths given: those; else the native tests (with any pytest options given)
    tests = args if any(not arg.startswith("-") for arg in args) else [*native_tests(), *args]
    print(f"make test-native: {' '.join(tests)}", flush=True)
    code, seen = run_tests(python, tests, env)
    found = reports()
    if found or seen:
        where = "; their logs:" if found else " (in the output above)"
        print(f"make test-native: the sanitizers reported errors{where}{found}", file=sys.stderr)
        return code or 1
    if code != 0:
        print(f"make test-native: pytest exit {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
