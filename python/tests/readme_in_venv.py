"""The README's Python example as a new user runs it: a fresh virtual
environment, `pip install` of the source tree, then the example taken from
README.md itself (so the README cannot drift from what the package
declares it needs).

Usage: readme_in_venv.py SOURCE_DIR WORK_DIR

Exits 0 when the example printed what its comments say, 77 (a skip) when
pip reaches no package index here or no virtual environment can be made,
1 otherwise. WORK_DIR keeps the CMake build between runs (scikit-build-core's
build-dir), so a second run rebuilds only what changed.
"""

import os
import pathlib
import re
import subprocess
import sys

SKIP = 77


def example(readme):
    """The README's Python block and the outputs its `# ...` comments
    after print() calls promise, in order."""
    block = re.search(r"## From Python.*?```python\n(.*?)```", readme, re.S)
    if not block:
        sys.exit("README.md has no Python example under '## From Python'")
    code = block.group(1)
    expected = re.findall(r"print\(.*\)\s*#\s*(.+)$", code, re.M)
    if not expected:
        sys.exit("the README's Python example promises no output")
    return code, [e.strip() for e in expected]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    source, work = (pathlib.Path(a).resolve() for a in sys.argv[1:3])
    code, expected = example((source / "README.md").read_text())
    work.mkdir(parents=True, exist_ok=True)
    venv = work / "venv"
    made = run([sys.executable, "-m", "venv", "--clear", str(venv)])
    if made.returncode != 0:
        print("skipped: no virtual environment can be made here "
              f"(python3-venv?):\n{made.stderr}")
        return SKIP
    python = str(venv / "bin" / "python")
    # The example must see the installed package only, not a build tree.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["CUBERT_CACHE_DIR"] = str(work / "kernel-cache")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    probe = run([python, "-m", "pip", "download", "--no-deps", "--timeout",
                 "15", "--retries", "1", "--dest", str(work / "probe"),
                 "scikit-build-core"], env=env, timeout=300)
    if probe.returncode != 0:
        print("skipped: pip reaches no package index here:\n"
              + probe.stderr[-2000:])
        return SKIP
    install = run([python, "-m", "pip", "install", "--timeout", "30",
                   "--config-settings=build-dir=" + str(work / "build"),
                   str(source)], env=env, timeout=1200)
    if install.returncode != 0:
        print("pip install of the source tree failed:\n"
              + install.stdout[-4000:] + install.stderr[-4000:])
        return 1
    where = run([python, "-c", "import cubert; print(cubert.__file__)"],
                env=env, cwd=str(work), timeout=120)
    if where.returncode != 0 or str(venv) not in where.stdout:
        print(f"cubert is not imported from the venv: {where.stdout}"
              f"{where.stderr}")
        return 1
    # The example reads examples/scale_add.cube: run it from the tree.
    out = run([python, "-c", code], env=env, cwd=str(source), timeout=300)
    got = out.stdout.split("\n")[:len(expected)]
    if out.returncode != 0 or [g.strip() for g in got] != expected:
        print(f"the README's example printed {out.stdout!r} (expected "
              f"{expected!r}), exit {out.returncode}:\n{out.stderr}")
        return 1
    print(f"README example in a fresh venv printed {expected!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
