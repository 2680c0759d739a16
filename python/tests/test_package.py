"""The package as a whole: the README's example, the exception table
against the C header, the type stubs against the module."""

import pathlib
import re
import subprocess
import sys

import cubert

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_python_example_runs_and_prints_21():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## From Python.*?```python\n(.*?)```", text, re.S)
    assert block, "README has a Python example"
    out = subprocess.run([sys.executable, "-c", block.group(1)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "21.0"


def test_every_code_of_the_header_has_its_class():
    header = (ROOT / "include" / "cubert" / "error.h").read_text()
    codes = dict((int(n), name) for name, n in
                 re.findall(r"(CUBE_ERR_[A-Z_]+) = (\d+)", header))
    assert len(codes) >= 20
    for code, name in codes.items():
        cls = cubert.errors._BY_CODE.get(code)
        assert cls is not None, f"no class for {name}"
        assert issubclass(cls, cubert.Error)
        e = cubert.errors._from_c(code, "x", "m", None, [])
        assert type(e) is cls and e.code == code and e.code_name == name


def test_stubs_name_every_public_name():
    stub = (ROOT / "python" / "cubert" / "__init__.pyi")
    if not stub.exists():
        return
    text = stub.read_text()
    for name in cubert.__all__:
        assert re.search(rf"\b{name}\b", text), f"{name} missing from stubs"
