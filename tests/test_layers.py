"""The package's layers (issue 37): the foundation (config, i18n, limits), models, the engine, then the app and the
bench on top. No module imports one above its layer, no two modules import each other, round about or not, and the
engine runs without gradio or plotly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdemo"
LAYER = {"config": 0, "i18n": 0, "limits": 1, "models": 1, "engine": 2, "app": 3, "bench": 3, "__main__": 4}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The specdemo modules a file imports, at its top or inside a function, leaving out the `if TYPE_CHECKING:`
    blocks (annotations only). `from pkg import name` counts as pkg.name where that is a module."""
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
            "TYPE_CHECKING" for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specdemo")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if not base.startswith("specdemo"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if known(sub) else base)
    return found


def known(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYER.get(parts[1], -1) if len(parts) > 1 else -1


def test_every_module_belongs_to_a_layer():
    assert sorted(m for m in graph() if layer(m) < 0 and m != "specdemo") == []


def test_no_module_imports_from_a_layer_above_its_own():
    up = sorted((m, d) for m, ds in graph().items() for d in ds
                if m != "specdemo" and d != "specdemo" and layer(d) > layer(m))
    assert not up


def test_there_are_no_import_circles():
    g = graph()
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(g.get(m, ())):
            visit(d)
        stack.pop()

    for m in sorted(g):
        visit(m)
    assert not cycles, cycles


def test_the_engine_runs_without_gradio_or_plotly():
    """In a fresh interpreter, the public API decodes a few tokens, and neither gradio nor plotly (nor the app) has
    been imported."""
    code = (
        "import sys, specdemo\n"
        "trace = specdemo.speculative_generate(specdemo.load_pair('shakespeare'), 'ROMEO:', "
        "specdemo.SamplingConfig(temperature=0.0), specdemo.SpecConfig(k=3, max_new_tokens=8))\n"
        "assert len(trace.output_ids) == 8, trace.output_ids\n"
        "print(sorted(m for m in ('gradio', 'plotly', 'specdemo.app', 'specdemo.bench') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


MODULE_LINES = 450  # issue 37's floors: no module of the package over this many lines,
FUNCTION_LINES = 80  # and no function anywhere in the project's code over this many (aim 60)


def test_no_module_of_the_package_is_longer_than_its_limit():
    long = {str(p.relative_to(ROOT)): n for p in [*PACKAGE.rglob("*.py"), ROOT / "app.py"]
            if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, long


def test_no_function_is_longer_than_its_limit():
    """Every function and method in the package, app.py, scripts/ and tests/, decorators left out."""
    files = [*PACKAGE.rglob("*.py"), ROOT / "app.py", *(ROOT / "scripts").rglob("*.py"), *(ROOT / "tests").glob("*.py")]
    long = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert not long, long


def test_every_kept_log_is_cited_and_every_cited_file_exists():
    """Issue 37: assets/benchmarks holds only the logs a page cites by name (git keeps the rest), and every relative
    link in the README and docs/ reaches a file."""
    import re

    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    text = {p: p.read_text() for p in pages}
    uncited = [f.name for f in (ROOT / "assets" / "benchmarks").iterdir()
               if not any(f.name in t for t in text.values())]
    assert not uncited, uncited
    broken = [(p.name, link) for p, t in text.items()
              for link in re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", t)
              if not (p.parent / link).exists()]
    assert not broken, broken
