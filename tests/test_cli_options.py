"""Every option of every command keeps its name and default (issue 35's acceptance).

Each `chattts-forge` subcommand (nested groups included, e.g. `checkpoint verify`) and the build
driver's alias (`python -m chattts_forge.driver`, the same command as `chattts-forge build`) is read for the options its `--help` lists: their spellings,
default, whether it is a flag or repeatable, and its closed set of choices. The result is compared
with `tests/data/cli_options.json`, recorded from the code before issue 35's refactor; a deliberate
change re-records it (`python tests/test_cli_options.py --record`) and says so in the README.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

RECORD = Path(__file__).parent / "data" / "cli_options.json"
NO_DEFAULT = getattr(click.core, "UNSET", None)  # how click >= 8.3 marks an option given no default


def _plain(value: Any) -> Any:
    """A default as JSON writes it (paths and tuples as their text and lists; a callable by name)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(value):
        return f"<callable {getattr(value, '__name__', type(value).__name__)}>"
    return str(value)


def _click_option(param: click.Option) -> dict[str, Any]:
    default = None if param.default is NO_DEFAULT else param.default
    if default is not None and not callable(default) and param.multiple:
        default = list(default)
    entry: dict[str, Any] = {
        "names": sorted(param.opts),
        "off": sorted(param.secondary_opts),
        "default": _plain(default),
        "flag": bool(param.is_flag),
        "multiple": bool(param.multiple),
    }
    if isinstance(param.type, click.Choice):
        entry["choices"] = sorted(str(c) for c in param.type.choices)
    return entry


def _click_commands(cmd: click.Command, path: str, ctx: click.Context) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    options = [_click_option(p) for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
    found[path] = sorted(options, key=lambda o: o["names"])
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, f"{path} {name}: no command"
            found.update(
                _click_commands(sub, f"{path} {name}", click.Context(sub, parent=ctx, info_name=name))
            )
    return found


def _driver_options() -> list[dict[str, Any]]:
    """`python -m chattts_forge.driver`'s options: `chattts-forge build`'s (the alias runs it), spelled as
    the record of the argparse driver it replaced spelled them (a flag pair's both names in `names`)."""
    from chattts_forge.driver.cli import build

    options = []
    for entry in _click_commands(build, "build", click.Context(build, info_name="build"))["build"]:
        entry = dict(entry)
        pair = entry.pop("off")
        entry["names"] = sorted(entry["names"] + pair)
        # click leaves these unset, meaning what argparse wrote out: nothing repeated, a switch off
        if entry["default"] is None and entry["multiple"]:
            entry["default"] = []
        elif entry["default"] is None and entry["flag"] and not pair:
            entry["default"] = False
        options.append(entry)
    return sorted(options, key=lambda o: o["names"])


def current_option_sets() -> dict[str, list[dict[str, Any]]]:
    from chattts_forge.cli import main

    found = _click_commands(main, "chattts-forge", click.Context(main, info_name="chattts-forge"))
    found["python -m chattts_forge.driver"] = _driver_options()
    return dict(sorted(found.items()))


def test_every_command_keeps_its_options_names_and_defaults() -> None:
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    current = current_option_sets()
    assert sorted(current) == sorted(recorded), "commands added or removed"
    changed = {}
    for command, options in recorded.items():
        now = {tuple(o["names"]): o for o in current[command]}
        was = {tuple(o["names"]): o for o in options}
        diff = {
            " ".join(k): (was.get(k), now.get(k))
            for k in sorted(set(now) | set(was))
            if now.get(k) != was.get(k)
        }
        if diff:
            changed[command] = diff
    assert not changed, json.dumps(changed, indent=1)[:4000]


def test_the_record_covers_every_subcommand() -> None:
    from chattts_forge.cli import SUBCOMMANDS

    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    for name in SUBCOMMANDS:
        assert f"chattts-forge {name}" in recorded
    assert sum(len(v) for v in recorded.values()) > 200  # every command's options, not a few


def _recorded_text(option_sets: dict[str, list[dict[str, Any]]]) -> str:
    """One command a block, one option a line, so a changed option is a one-line diff."""
    blocks = []
    for command, options in option_sets.items():
        lines = ",\n".join(f"  {json.dumps(o, ensure_ascii=False)}" for o in options)
        blocks.append(f" {json.dumps(command)}: [\n{lines}\n ]")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    RECORD.write_text(_recorded_text(current_option_sets()), encoding="utf-8")
    print(f"wrote {RECORD}")
