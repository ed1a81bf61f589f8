"""Imports run one way (docs/architecture.md): no module of an installed package imports a layer above it.

Every module of every package the project installs (pyproject.toml `[tool.setuptools] packages`,
located through the installed import system) is parsed, never imported: `import x`, `from x import y`
and relative imports anywhere in the file (function-local ones too) and `importlib.import_module("x")`
with a literal name. A failure names the file and line of each upward import.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli is a dependency of pytest there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# layer -> (the packages in it, the layers it may import besides itself). Keep in step with
# docs/architecture.md. `chattts_forge` itself holds the core's top-level modules; `chattts_forge.cli`
# is the command line, which loads every stage (lazily, by name), so it sits with the build driver.
LAYERS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "core": (("chattts_forge", "chattts_forge.checkpoint"), frozenset()),
    # chattts_forge.compat: the drop-in ChatTTS API, a re-export of chattts_forge.runtime.compat
    # chattts_forge.runtime.serve: the HTTP server (`chattts-forge serve`) over the runtime's scheduler
    "runtime": (("chattts_forge.runtime", "chattts_forge.runtime.serve", "chattts_forge.compat"), frozenset({"core"})),
    # the torch export side: uses quantize's fused-graph builder (quantize.fast_gpt_graph) and the
    # runtime's parity driver; only the command line and the build driver import it, so no
    # torch-free stage depends on it.
    # the PyTorch side: ChatTTS's own code (the reference, the parity oracle) and its timed engine,
    # which counts with the runtime's definitions; the torch-free layers import it only inside functions.
    "torch": (("chattts_forge.torch_ref",), frozenset({"core", "runtime"})),
    "convert": (("chattts_forge.convert",), frozenset({"core", "runtime", "torch", "calibration", "gate", "quantize"})),
    "calibration": (("chattts_forge.calibration_data",), frozenset({"core", "runtime"})),
    # the quality gate: the one judge (and gate-file parser) quantize's auto search, evaluate and its
    # length buckets share; it reads the runtime's length buckets
    "gate": (("chattts_forge.gate",), frozenset({"core", "runtime"})),
    "quantize": (("chattts_forge.quantize",), frozenset({"core", "runtime", "calibration", "gate"})),
    "evaluate": (("chattts_forge.evaluate",), frozenset({"core", "runtime", "torch", "calibration", "gate", "quantize"})),
    "publish": (("chattts_forge.publish",),
                frozenset({"core", "runtime", "calibration", "gate", "quantize", "evaluate"})),
    "build": (
        ("chattts_forge.cli", "chattts_forge.driver"),
        frozenset({"core", "runtime", "torch", "convert", "calibration", "gate", "quantize", "evaluate", "publish"}),
    ),
}
PACKAGE_LAYER = {pkg: layer for layer, (pkgs, _) in LAYERS.items() for pkg in pkgs}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Upward:
    path: Path
    line: int
    module: str
    layer: str
    target: str
    target_layer: str

    def __str__(self) -> str:
        allowed = ", ".join(sorted(LAYERS[self.layer][1]))
        rule = f"{self.layer} may import only {allowed}" if allowed else f"{self.layer} may import no other layer"
        return f"{self.path}:{self.line}: {self.module} (layer {self.layer}) imports {self.target} (layer {self.target_layer}); {rule}"


def installed_packages() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["setuptools"]["packages"])


def installed_modules() -> dict[str, Module]:
    """Every module of the installed packages, by name (located by the import system, not imported)."""
    modules: dict[str, Module] = {}
    for pkg in installed_packages():
        spec = importlib.util.find_spec(pkg)  # imports the parent package only, never `pkg` itself
        assert spec is not None and spec.submodule_search_locations, f"package {pkg} is not installed"
        folder = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(folder.glob("*.py")):
            is_package = path.stem == "__init__"
            name = pkg if is_package else f"{pkg}.{path.stem}"
            modules[name] = Module(name, path, is_package)
    return modules


def layer_of(name: str) -> str | None:
    """The layer of a dotted module name (its longest listed package prefix); None outside the project."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in PACKAGE_LAYER:
            return PACKAGE_LAYER[prefix]
    return None


def imported_names(module: Module, source: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, module name) of every import in `source`, relative ones resolved."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=str(module.path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                child = f"{parent}.{alias.name}"
                out.append((node.lineno, child if child in known else parent))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append((node.lineno, node.args[0].value))
    return out


def upward_imports(module: Module, source: str, known: set[str]) -> list[Upward]:
    layer = layer_of(module.name)
    assert layer is not None, f"{module.name} has no layer: add its package to LAYERS (and docs/architecture.md)"
    found = []
    for line, target in dict.fromkeys(imported_names(module, source, known)):  # `from x import a, b`: once
        target_layer = layer_of(target)
        if target_layer is None or target_layer == layer or target_layer in LAYERS[layer][1]:
            continue
        found.append(Upward(module.path, line, module.name, layer, target, target_layer))
    return found


# torch and the chattts package: only the torch side (torch_ref, convert) imports them at import time.
TORCH_MODULES = ("torch", "torchaudio", "ChatTTS", "transformers", "vocos", "chattts_forge.torch_ref")
TORCH_FREE_LAYERS = ("runtime", "calibration", "gate", "quantize", "evaluate", "publish")


def import_time_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of the absolute imports that run when the module is imported (not inside a function)."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import):
                out.extend((child.lineno, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                out.append((child.lineno, child.module))
            visit(child)

    visit(ast.parse(source))
    return out


def test_torch_free_layers_import_torch_only_lazily() -> None:
    found = [
        f"{m.path}:{line}: {m.name} imports {name} at import time (import it inside the function that needs it)"
        for m in installed_modules().values()
        if layer_of(m.name) in TORCH_FREE_LAYERS
        for line, name in import_time_imports(m.path.read_text(encoding="utf-8"))
        if any(name == t or name.startswith(t + ".") for t in TORCH_MODULES)
    ]
    assert not found, "\n".join(found)


# The runtime loads and runs graphs; building them is convert's and quantize's (issue 35): no runtime
# module calls onnx.helper's graph builders, except the provider probe's one-node Identity graph
# (runtime/providers.py: whether CUDA runs at all).
GRAPH_BUILDERS = ("make_graph", "make_model")
GRAPH_PROBES = {"chattts_forge.runtime.providers"}


def graph_building_calls(source: str) -> list[int]:
    """The lines of `source` that call onnx.helper.make_graph/make_model (by attribute or name)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in GRAPH_BUILDERS:
                lines.append(node.lineno)
    return lines


def test_the_runtime_builds_no_graphs() -> None:
    modules = installed_modules()
    assert graph_building_calls(modules["chattts_forge.quantize.fast_gpt_graph"].path.read_text(encoding="utf-8"))
    found = [
        f"{m.path}:{line}: {m.name} builds an ONNX graph (graph builders belong to convert or quantize)"
        for m in modules.values()
        if layer_of(m.name) == "runtime" and m.name not in GRAPH_PROBES
        for line in graph_building_calls(m.path.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def test_every_installed_package_has_a_layer() -> None:
    missing = [pkg for pkg in installed_packages() if pkg not in PACKAGE_LAYER]
    assert not missing, f"packages without a layer: {missing}; add them to LAYERS and docs/architecture.md"


def test_imports_run_one_way() -> None:
    modules = installed_modules()
    assert "chattts_forge.runtime.loaded_artifact" in modules and "chattts_forge.quantize.fidelity" in modules
    known = set(modules)
    found = [
        str(up)
        for m in modules.values()
        for up in upward_imports(m, m.path.read_text(encoding="utf-8"), known)
    ]
    assert not found, "upward imports:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # a function-local absolute import from the runtime into quantize
        ("chattts_forge.runtime.loaded_artifact", "def f():\n    from chattts_forge.quantize import dynamic\n",
         [(2, "chattts_forge.quantize.dynamic", "quantize")]),
        # the old cycle: quantize importing convert
        ("chattts_forge.quantize.x", "import chattts_forge.convert.export\n",
         [(1, "chattts_forge.convert.export", "convert")]),
        # a relative import climbing out of the package, and import_module with a literal
        ("chattts_forge.calibration_data.recorder",
         "from ..evaluate import gate\nimport importlib\nimportlib.import_module('chattts_forge.publish.cli')\n",
         [(1, "chattts_forge.evaluate.gate", "evaluate"), (3, "chattts_forge.publish.cli", "publish")]),
        # the torch-free runtime may not reach for the PyTorch side, not even inside a function
        ("chattts_forge.runtime.timed_engine", "def f():\n    from chattts_forge.torch_ref.engine import TorchEngine\n",
         [(2, "chattts_forge.torch_ref.engine", "torch")]),
        # core may not import a stage, not even the command line
        ("chattts_forge.fsutil", "from chattts_forge import cli\n", [(1, "chattts_forge.cli", "build")]),
        # the gate sits below quantize and evaluate: it may not import them (they import it)
        ("chattts_forge.gate", "from chattts_forge.evaluate import report\nfrom chattts_forge.runtime import router\n",
         [(1, "chattts_forge.evaluate.report", "evaluate")]),
        # downward and same-layer imports, and third-party ones, are fine
        ("chattts_forge.evaluate.gate", "from chattts_forge.runtime import Pipeline\nfrom . import report\nimport numpy\n", []),
    ],
)
def test_checker_finds_upward_imports(module: str, source: str, expected: list[tuple[int, str, str]]) -> None:
    known = set(installed_modules()) | {"chattts_forge.quantize.dynamic", "chattts_forge.evaluate.gate"}
    mod = Module(module, Path(module.replace(".", "/") + ".py"), is_package=False)
    got = [(up.line, up.target, up.target_layer) for up in upward_imports(mod, source, known)]
    assert got == expected


def test_import_time_imports_skip_function_bodies() -> None:
    source = "import numpy\ntry:\n    import torch\nexcept ImportError:\n    pass\ndef f():\n    import torchaudio\n"
    assert import_time_imports(source) == [(1, "numpy"), (3, "torch")]


def test_artifact_names_one_thing() -> None:
    """One name per concept: `artifact` is the contract module (artifact.json as `ArtifactMeta`); a folder
    opened for inference is `runtime.loaded_artifact.LoadedArtifact`; no class is named plain `Artifact`."""
    modules = installed_modules()
    named_artifact = sorted(name for name in modules if name.rsplit(".", 1)[-1] == "artifact")
    assert named_artifact == ["chattts_forge.artifact"]
    plain = [f"{m.path}:{node.lineno}" for m in modules.values()
             for node in ast.walk(ast.parse(m.path.read_text(encoding="utf-8")))
             if isinstance(node, ast.ClassDef) and node.name == "Artifact"]
    assert not plain, f"classes named Artifact: {plain}"
