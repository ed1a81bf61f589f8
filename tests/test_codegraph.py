"""chattts_forge.codegraph: import closures read from source, on a made-up tree and on the real one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chattts_forge.cli import SUBCOMMANDS
from chattts_forge.codegraph import CodeGraph, Layout
from chattts_forge.errors import ForgeError

REPO = Path(__file__).resolve().parent.parent


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    """A package `chattts_forge` with one stage in a top-level folder, mapped like the real project."""
    write(
        tmp_path,
        {
            "pyproject.toml": """
                [tool.setuptools.package-dir]
                "chattts_forge" = "core"
                "chattts_forge.stage" = "stage_src"
            """,
            "core/__init__.py": "",
            "core/cli.py": """
                import importlib
                from chattts_forge import errors
                def load(name):
                    return importlib.import_module("chattts_forge.unused")  # a string: not followed
            """,
            "core/errors.py": "import json\n",
            "core/unused.py": "",
            "core/lazy.py": "",
            "core/typed.py": "",
            "core/sub/__init__.py": "from .deep import thing\n",
            "core/sub/deep.py": "from ..errors import *\nthing = 1\n",
            "stage_src/__init__.py": "",
            "stage_src/cli.py": """
                from typing import TYPE_CHECKING
                from . import helper
                if TYPE_CHECKING:
                    from chattts_forge import typed
                def run():
                    from chattts_forge.sub.deep import thing  # function-local
                    import chattts_forge.lazy
            """,
            "stage_src/helper.py": "import numpy\nfrom chattts_forge.errors import json_error_that_is_a_name\n",
            "stage_src/rules.toml": "x = 1\n",
            "stage_src/corpora/v1/a.txt": "text\n",
            "stage_src/other.py": "from chattts_forge import cli\n",
        },
    )
    return tmp_path


def test_closure_follows_every_import_kind_through_the_package_dir_layout(fake_tree: Path) -> None:
    graph = CodeGraph(Layout.from_pyproject(fake_tree))
    closure = graph.closure(["chattts_forge.cli", "chattts_forge.stage.cli"])
    assert closure == {
        "chattts_forge",
        "chattts_forge.cli",
        "chattts_forge.errors",
        "chattts_forge.stage",
        "chattts_forge.stage.cli",
        "chattts_forge.stage.helper",  # relative `from . import helper`
        "chattts_forge.typed",  # TYPE_CHECKING blocks count (over-approximating is safe)
        "chattts_forge.sub",  # parent package of a function-local import
        "chattts_forge.sub.deep",
        "chattts_forge.lazy",  # `import a.b` inside a function
    }
    # Not reached: the module named only in a string, and a module nothing imports.
    assert "chattts_forge.unused" not in closure and "chattts_forge.stage.other" not in closure
    files = graph.files(closure)
    assert files["chattts_forge.stage:helper.py"] == fake_tree / "stage_src" / "helper.py"
    assert files["chattts_forge.sub:deep.py"] == fake_tree / "core" / "sub" / "deep.py"
    # The stage package's data (its toml and a corpus two folders down) is part of its files.
    assert files["chattts_forge.stage:rules.toml"] == fake_tree / "stage_src" / "rules.toml"
    assert files["chattts_forge.stage:corpora/v1/a.txt"] == fake_tree / "stage_src" / "corpora" / "v1" / "a.txt"
    # core/sub is a package of its own: its files are not the core package's data.
    assert not any(name.startswith("chattts_forge:sub/") for name in files)


def test_direct_edges_and_errors(fake_tree: Path) -> None:
    graph = CodeGraph(Layout.from_pyproject(fake_tree))
    assert graph.imports_of("chattts_forge.sub.deep") == {"chattts_forge", "chattts_forge.errors"}
    assert graph.imports_of("chattts_forge.stage.other") == {"chattts_forge", "chattts_forge.cli"}
    with pytest.raises(ForgeError, match="chattts_forge.nothing has no source file"):
        graph.closure(["chattts_forge.nothing"])
    (fake_tree / "core" / "broken.py").write_text("def f(:\n", encoding="utf-8")
    with pytest.raises(ForgeError, match=r"cannot parse .*broken.py"):
        graph.imports_of("chattts_forge.broken")
    with pytest.raises(ForgeError, match="project file .* does not exist"):
        Layout.from_pyproject(fake_tree / "core")


def test_the_running_toolchain_is_read_through_its_checkout_layout() -> None:
    installed = Layout.installed()
    assert installed == Layout.from_pyproject(REPO)
    assert installed.module_file("chattts_forge.runtime.fast_gpt") == REPO / "runtime" / "fast_gpt.py"


REAL = CodeGraph()  # the running toolchain's graph, parsed once for the tests below


def stage_closure(subcommand: str) -> frozenset[str]:
    return REAL.closure(["chattts_forge.cli", SUBCOMMANDS[subcommand][0]])


def test_stage_closures_hold_what_the_hand_kept_table_missed() -> None:
    """convert runs the fast GPT (its parity check); no stage runs publish or driver code."""
    assert "chattts_forge.runtime.fast_gpt" in stage_closure("convert")
    for stage in ("checkpoint", "convert", "calibrate", "quantize", "evaluate"):
        closure = stage_closure(stage)
        assert not [m for m in closure if m.startswith(("chattts_forge.publish", "chattts_forge.driver"))], stage
    assert not [m for m in stage_closure("checkpoint") if m.startswith("chattts_forge.runtime")]
    files = REAL.files(stage_closure("evaluate"))
    assert any(name.endswith(".toml") for name in files)  # the default gate
    assert any(":corpora/" in name for name in files)  # the built-in evaluation corpus
