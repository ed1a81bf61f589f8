"""The import graph of chattts-forge's own code, read from the source (nothing is imported).

The build driver keys each step on the files its code actually runs: the import closure of the
step's entry modules. `CodeGraph.closure(entries)` follows every `chattts_forge.*` import
transitively (absolute and relative, module-level and function-local, `TYPE_CHECKING` blocks
included: over-approximating costs a rebuild, under-approximating leaves stale outputs), and
`CodeGraph.files(modules)` maps the modules to their files plus the package data of every package
they live in. `CodeGraph.imports_of(module)` gives one module's direct edges (a layering test can
walk them).

Modules map to files through the package-dir layout: the stages live in top-level folders
(`convert/` is `chattts_forge.convert`, ...) as declared in pyproject.toml's
`[tool.setuptools.package-dir]`; an installed wheel nests them all under `chattts_forge/`.
`Layout.installed()` finds whichever applies to the running toolchain; `Layout.from_pyproject(root)`
reads any source tree (a copy of it, in tests).

Not followed: imports spelled as strings (`importlib.import_module(name)`, code passed to
`python -c`); the CLI loads its subcommands that way on purpose, so a caller names the subcommand's
module as an entry itself. Code reached only through such a string must also be imported normally
by something in the closure to be part of a key.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from chattts_forge.errors import BadInput, ForgeError
from chattts_forge.fsutil import read_toml

TOP_PACKAGE = "chattts_forge"
# Files in a package folder that are not package data.
_NOT_DATA_SUFFIXES = (".py", ".pyc", ".pyo")
_NOT_DATA_DIRS = ("__pycache__",)


@dataclass(frozen=True)
class Layout:
    """Where each package's folder is: the longest declared prefix of a module name wins."""

    package_dirs: dict[str, Path]

    @classmethod
    def from_pyproject(cls, root: str | Path) -> Layout:
        """The layout of a source tree, from its pyproject.toml ([tool.setuptools.package-dir])."""
        root = Path(root).resolve()
        config = read_toml(root / "pyproject.toml", "project file")
        declared = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
        dirs = {name: root / folder for name, folder in declared.items() if name}
        dirs.setdefault(TOP_PACKAGE, root / TOP_PACKAGE)
        return cls(dirs)

    @classmethod
    def installed(cls) -> Layout:
        """The running toolchain's layout: its source tree's pyproject.toml when it is an editable
        install of a checkout, else the installed nesting (every package under chattts_forge/)."""
        spec = importlib.util.find_spec(TOP_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise ForgeError(f"package {TOP_PACKAGE} is not installed")
        top = Path(next(iter(spec.submodule_search_locations))).resolve()
        if (top.parent / "pyproject.toml").is_file():
            layout = cls.from_pyproject(top.parent)
            if layout.package_dirs.get(TOP_PACKAGE) == top:
                return layout
        return cls({TOP_PACKAGE: top})

    def module_file(self, module: str) -> Path | None:
        """The file that defines `module` (a .py file or a package's __init__.py), if it exists."""
        parts = module.split(".")
        for n in range(len(parts), 0, -1):
            base = self.package_dirs.get(".".join(parts[:n]))
            if base is None:
                continue
            path = base.joinpath(*parts[n:])
            for candidate in (path / "__init__.py", path.with_suffix(".py")):
                if candidate.is_file():
                    return candidate
            return None
        return None

    def package_data(self, package_init: Path) -> list[Path]:
        """Data files of the package whose __init__.py is given: every non-Python file in its folder
        and in sub-folders that are not packages themselves (corpora, gate toml, release json)."""
        files: list[Path] = []
        pending = [package_init.parent]
        while pending:
            folder = pending.pop()
            for p in sorted(folder.iterdir()):
                if p.name.startswith("."):  # editor and OS leftovers are never package data
                    continue
                if p.is_dir():
                    if p.name not in _NOT_DATA_DIRS and not (p / "__init__.py").is_file():
                        pending.append(p)
                elif p.is_file() and p.suffix not in _NOT_DATA_SUFFIXES:
                    files.append(p)
        return files


class CodeGraph:
    """Import edges between chattts_forge modules, parsed from source on demand and memoized."""

    def __init__(self, layout: Layout | None = None) -> None:
        self.layout = layout if layout is not None else Layout.installed()
        self._edges: dict[str, frozenset[str]] = {}
        self._module_files: dict[str, Path | None] = {}
        self._package_data: dict[Path, list[Path]] = {}

    def module_file(self, module: str) -> Path | None:
        """Layout.module_file, memoized (the graph asks for the same names many times)."""
        if module not in self._module_files:
            self._module_files[module] = self.layout.module_file(module)
        return self._module_files[module]

    def _file(self, module: str) -> Path:
        path = self.module_file(module)
        if path is None:
            raise ForgeError(f"module {module} has no source file in the layout ({self.layout.package_dirs})")
        return path

    def imports_of(self, module: str) -> frozenset[str]:
        """The chattts_forge modules `module` imports directly (anywhere in its body), each import's
        parent packages included (importing a.b.c runs a/__init__ and a/b/__init__)."""
        if module not in self._edges:
            self._edges[module] = self._parse_imports(module)
        return self._edges[module]

    def _parse_imports(self, module: str) -> frozenset[str]:
        path = self._file(module)
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError as e:
            raise BadInput(f"cannot parse {path}: {e.msg} (line {e.lineno})") from None
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for node in _statements(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(module, is_package, node.module, node.level)
                found.add(base)
                # `from pkg import name`: name is a submodule when it has a file of its own.
                found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        edges: set[str] = set()
        for name in found:
            if name != TOP_PACKAGE and not name.startswith(TOP_PACKAGE + "."):
                continue
            parts = name.split(".")
            for n in range(1, len(parts) + 1):
                prefix = ".".join(parts[:n])
                if self.module_file(prefix) is not None:
                    edges.add(prefix)
        edges.discard(module)
        return frozenset(edges)

    @staticmethod
    def _absolute(module: str, is_package: bool, target: str | None, level: int) -> str:
        if level == 0:
            return target or ""
        package = module.split(".") if is_package else module.split(".")[:-1]
        if level - 1 > len(package) - 1:
            raise ForgeError(f"relative import beyond the top package in {module}")
        base = package[: len(package) - (level - 1)]
        return ".".join([*base, *([target] if target else [])])

    def closure(self, entries: Iterable[str]) -> frozenset[str]:
        """Every chattts_forge module reachable from `entries` (which are included, with their parents)."""
        seen: set[str] = set()
        pending: list[str] = []
        for entry in entries:
            self._file(entry)  # an entry that does not exist is a caller's error
            parts = entry.split(".")
            pending += [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        while pending:
            module = pending.pop()
            if module in seen or self.module_file(module) is None:
                continue
            seen.add(module)
            pending.extend(self.imports_of(module) - seen)
        return frozenset(seen)

    def files(self, modules: Iterable[str]) -> dict[str, Path]:
        """The source files of `modules` and the data files of their packages, by a stable name
        (the file's path relative to its package folder, prefixed by the package's dotted name)."""
        out: dict[str, Path] = {}
        for module in modules:
            path = self._file(module)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            out[f"{package}:{path.name}"] = path
            init = self.module_file(package)
            if init is not None:
                if init not in self._package_data:
                    self._package_data[init] = self.layout.package_data(init)
                for data in self._package_data[init]:
                    out[f"{package}:{data.relative_to(init.parent).as_posix()}"] = data
        return dict(sorted(out.items()))


def _statements(tree: ast.Module) -> Iterator[ast.AST]:
    """Every statement in the tree, nested ones included (function bodies, if/try/with blocks).
    Imports are statements, so expressions need not be visited: ~10x fewer nodes than ast.walk."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        yield node
        for _, value in ast.iter_fields(node):
            if isinstance(value, list):
                pending.extend(v for v in value if isinstance(v, (ast.stmt, ast.excepthandler, ast.match_case)))
