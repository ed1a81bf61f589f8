"""Counts issue 51's closing note reports before and after: plain ForgeError raises, string-key
lookups in evaluate/ and publish/, hand-written click options, imports inside functions, modules
over 600 lines. Run from the project root: python scripts/contract_counts.py [--json]."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

PACKAGES = (
    "chattts_forge",
    "convert",
    "calibration_data",
    "quantize",
    "evaluate",
    "publish",
    "runtime",
    "driver",
)
REPORT_READERS = ("evaluate", "publish")
LONG_MODULE_LINES = 600


def _sources(root: Path) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def _typed_error_names(sources: list[Path]) -> set[str]:
    """Every class defined in the project that derives from ForgeError, ForgeError itself aside."""
    bases: dict[str, set[str]] = {}
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                bases.setdefault(node.name, set()).update(names)
    typed = {"ForgeError"}
    while True:
        grown = typed | {name for name, parents in bases.items() if parents & typed}
        if grown == typed:
            return typed - {"ForgeError"}
        typed = grown


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    if isinstance(exc, ast.Name):
        return exc.id
    if isinstance(exc, ast.Attribute):
        return exc.attr
    return None


def _is_click_option(node: ast.Call) -> bool:
    func = node.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "option"
        and (isinstance(func.value, ast.Name) and func.value.id == "click")
    )


def _str_key_lookups(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            count += 1
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            count += 1
    return count


def _imports_in_functions(tree: ast.AST) -> tuple[int, int]:
    """Import statements with a function among their ancestors, all and those of the project's own
    modules (relative imports included)."""
    total = own = 0

    def visit(node: ast.AST, in_function: bool) -> None:
        nonlocal total, own
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                else:
                    names = [child.module or ""] if child.level == 0 else ["."]
                total += 1
                own += any(n == "." or n.split(".")[0] in PACKAGES for n in names)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return total, own


def count(root: Path) -> dict:
    sources = _sources(root)
    typed = _typed_error_names(sources)
    plain = typed_raises = options = lookups = inner = inner_own = 0
    long_modules: dict[str, int] = {}
    for path in sources:
        text = path.read_text()
        tree = ast.parse(text)
        rel = path.relative_to(root).as_posix()
        lines = text.count("\n")
        if lines > LONG_MODULE_LINES:
            long_modules[rel] = lines
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise):
                name = _raised_name(node)
                if name == "ForgeError":
                    plain += 1
                elif name in typed:
                    typed_raises += 1
            elif isinstance(node, ast.Call) and _is_click_option(node):
                options += 1
        if rel.split("/")[0] in REPORT_READERS:
            lookups += _str_key_lookups(tree)
        total, own = _imports_in_functions(tree)
        inner += total
        inner_own += own
    return {
        "plain_forge_error_raises": plain,
        "typed_error_raises": typed_raises,
        "str_key_lookups_evaluate_publish": lookups,
        "click_option_calls_written": options,
        "imports_inside_functions": inner,
        "imports_inside_functions_own_modules": inner_own,
        "modules_over_600_lines": long_modules,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = count(args.root)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}: {len(value)}")
            for name, lines in sorted(value.items(), key=lambda kv: -kv[1]):
                print(f"  {name}: {lines}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
