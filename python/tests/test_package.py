"""The package as a whole: the README's and docs/python.md's examples,
the exception table against the C header, the type stubs and
docs/python.md against the module's names, signatures and reprs."""

import inspect
import pathlib
import re
import subprocess
import sys

import cubert

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "python.md"


def test_readme_python_example_runs_and_prints_21():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## From Python.*?```python\n(.*?)```", text, re.S)
    assert block, "README has a Python example"
    out = subprocess.run([sys.executable, "-c", block.group(1)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "21.0"


def test_docs_python_examples_run_and_print_what_they_say():
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        expected = re.findall(r"print\(.*\)\s*#\s*(.+)$", block, re.M)
        out = subprocess.run([sys.executable, "-c", block], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:len(expected)] == expected


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


# --- the document against the package ------------------------------------------

CLASSES = ("Client", "Buffer", "Kernel", "Graph", "Profile", "Stream",
           "Event")


def _code_spans(text):
    """Inline code spans and fenced blocks of a Markdown text."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    # An inline span may run over a line break.
    return fenced + [" ".join(span.split())
                     for span in re.findall(r"`([^`]+)`", text)]


def _public_members(cls):
    names = [n for n in vars(cls) if not n.startswith("_")]
    return names + [n for n in ("__dlpack__", "__dlpack_device__")
                    if n in vars(cls)]


def test_docs_name_every_public_name():
    """Every public name of the package (cubert.__all__, each public
    class's members, cubert.memviz's names) is in docs/python.md as code,
    as tests/unit/test_api_error_docs.c keeps the C headers honest."""
    spans = _code_spans(DOC.read_text())
    words = set()
    for span in spans:
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span))
    missing = [n for n in cubert.__all__ if n not in words]
    for cls_name in CLASSES:
        cls = getattr(cubert, cls_name)
        missing += [f"{cls_name}.{n}" for n in _public_members(cls)
                    if n not in words]
    import cubert.memviz as memviz
    missing += [f"memviz.{n}" for n in memviz.__all__ if n not in words]
    assert missing == [], f"docs/python.md does not name {missing}"


def _documented_calls(spans, name):
    """The spans that spell a call of `name`: `name(...)`."""
    return [s for s in spans if re.search(rf"(^|[.\s]){re.escape(name)}\(", s)]


def test_docs_spell_every_parameter():
    """Each public function and method is written out in docs/python.md
    with every parameter inspect.signature gives it (a keyword the
    document leaves out, such as launch's validate=, fails here)."""
    spans = _code_spans(DOC.read_text())
    calls = [("", n, getattr(cubert, n)) for n in cubert.__all__
             if callable(getattr(cubert, n))
             and not isinstance(getattr(cubert, n), type)]
    calls += [("", n, getattr(cubert, n)) for n in CLASSES
              if n in ("Client", "Kernel")]
    for cls_name in CLASSES:
        cls = getattr(cubert, cls_name)
        for n in _public_members(cls):
            member = getattr(cls, n)
            if callable(member) and not isinstance(member, property):
                calls.append((cls_name + ".", n, member))
    problems = []
    for owner, name, fn in calls:
        params = [p for p in inspect.signature(fn).parameters
                  if p not in ("self",)]
        written = _documented_calls(spans, name)
        if not written:
            problems.append(f"{owner}{name}: no `{name}(...)` in the document")
            continue
        if not any(all(re.search(rf"\b{p}\b", s) for p in params)
                   for s in written):
            problems.append(f"{owner}{name}{inspect.signature(fn)}: no "
                            f"`{name}(...)` names all of {params}")
    assert problems == [], "\n".join(problems)


def test_every_method_has_a_signature():
    """inspect.signature works on every function and method the package
    has, C ones included (their docstrings carry text signatures)."""
    members = [(n, getattr(cubert, n)) for n in dir(cubert)
               if not n.startswith("_")
               and not isinstance(getattr(cubert, n), type)]
    members += [("Client", cubert.Client), ("Kernel", cubert.Kernel)]
    for cls_name in CLASSES:
        cls = getattr(cubert, cls_name)
        members += [(f"{cls_name}.{n}", getattr(cls, n)) for n in vars(cls)
                    if not n.startswith("__") or n in (
                        "__enter__", "__exit__", "__dlpack__",
                        "__dlpack_device__")]
    failed = []
    for name, member in members:
        if not callable(member):
            continue
        try:
            inspect.signature(member)
        except (TypeError, ValueError) as e:
            failed.append(f"{name}: {e}")
    assert failed == []


def test_reprs_say_what_an_object_is(client):
    assert repr(client) == f"<cubert.Client {client.device}>"
    client.graph_prepare()
    g = client.capture()
    assert "not recorded" in repr(g) and client.device in repr(g)
    p = client.profile()
    assert "not started" in repr(p)
    with p:
        pass
    assert "host_clock" in repr(p) and "0 launches" in repr(p)
    with client.profile() as q:
        assert "open" in repr(q)
    with client.capture() as g:
        assert "recording" in repr(g)
    assert f"<cubert.Graph {g.id} of {client.device}>" == repr(g)
    g.destroy()
    assert "destroyed" in repr(g)


def test_compile_error_message_carries_the_log_lines():
    log = ("f.cube.c: In function 'f':\n"
           "f.cube.c:4:42: error: 'aa' undeclared; did you mean 'a'?\n"
           "    4 |   y = aa;\n"
           "f.cube.c:4:42: note: each undeclared identifier is reported once\n")
    e = cubert.errors._from_c(6, "compile", "compiler 'cc' exited with "
                              "status 1", log, [])
    text = str(e)
    assert text.startswith("CUBE_ERR_COMPILE: compiler 'cc' exited")
    assert "f.cube.c:4:42: error: 'aa' undeclared; did you mean 'a'?" in text
    assert "(3 more lines in .log)" in text
    assert e.message == "compiler 'cc' exited with status 1"  # as from C
    # A log naming no error: its first lines.
    e = cubert.errors._from_c(6, "compile", "m", "one\ntwo\n", [])
    assert str(e).endswith("\n  one\n  two")
