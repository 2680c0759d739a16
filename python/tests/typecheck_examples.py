"""Type-checks the Python examples of README.md and docs/python.md, and
the package's stubs, with `mypy --strict`: what the documents show must be
what the stubs accept.

Usage: typecheck_examples.py SOURCE_DIR PACKAGE_DIR
PACKAGE_DIR is the folder holding the built package (cubert/ with its
__init__.pyi). Exits 0 when mypy finds nothing, 77 (a skip) when mypy or
NumPy is not installed, 1 otherwise.
"""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
DOCUMENTS = ("README.md", "docs/python.md")


def mypy_command():
    if importlib.util.find_spec("mypy") is not None:
        return [sys.executable, "-m", "mypy"]
    found = shutil.which("mypy")
    return [found] if found else None


def main():
    source, package = (pathlib.Path(a).resolve() for a in sys.argv[1:3])
    mypy = mypy_command()
    if mypy is None:
        print("skipped: mypy is not installed (pip install mypy)")
        return SKIP
    if importlib.util.find_spec("numpy") is None:
        print("skipped: the stubs' NumPy types need NumPy installed")
        return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for doc in DOCUMENTS:
            text = (source / doc).read_text()
            blocks = re.findall(r"```python\n(.*?)```", text, re.S)
            for i, block in enumerate(blocks):
                path = pathlib.Path(tmp, f"{doc.replace('/', '_')}_{i}.py")
                path.write_text(block)
                files.append(str(path))
        if not files:
            print("no Python examples found")
            return 1
        env = dict(os.environ, MYPYPATH=str(package))
        # Imports followed from the stubs (cubert.errors, untyped at run
        # time) are not what is checked: only the examples and the stubs.
        out = subprocess.run(
            mypy + ["--strict", "--follow-imports=silent", "--cache-dir",
                    os.path.join(tmp, "cache"), "--python-executable",
                    sys.executable, str(package / "cubert" / "__init__.pyi")]
            + files, capture_output=True, text=True, env=env, cwd=tmp,
            timeout=600)
        print(out.stdout + out.stderr)
        if out.returncode == 0:
            return 0
        for f in files:  # the line numbers above are these files'
            print(f"--- {f}\n{pathlib.Path(f).read_text()}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
