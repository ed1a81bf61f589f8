"""Options declared on a config dataclass's fields: a field made with `option(...)` carries its
command-line spelling, type, choices and help. The click options of the command
(`declared_options`) and the words that set a value (`option_args`, `changed_args`: what the build
driver puts in a step's command) are derived from it, so an option is written once. A config turns
its fields' spellings into their Choice members with `parse_declared_choices`, and a command that maps
onto several runs refuses an option its run does not read with `refuse_options_not_read`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import click

from chattts_forge.choices import Choice, plain
from chattts_forge.errors import BadInput

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class OptionSpec:
    """How one config field is spelled on a command line.

    `flags`: "--block-size", or "--on/--off" for a boolean pair; `kind`: the value's type on the
    command line (int, float, str, "path", "file": a path that must not be a folder); `choices`: a
    Choice subclass or the spellings (the CLI reads a spelling, `convert` turns it into the field's
    value); `is_flag`: a lone switch; `multiple`: repeatable, the field a tuple; `required`: the command
    refuses to run without it (its field's default, None, is never a value); `envvar`: the environment
    variable click reads when the option is not given; `switch_default`: a lone switch's default is
    given to click (recorded as False, where a switch without one has none); `spell`: how a field value
    is written on the command line where the two differ (its default and `option_args`' words; `convert`
    reads it back; a value spelled None is the option left out); `hidden`: left out of `--help` (a hook
    for tests); `parsed_as`: the Choice a value declared without `choices` becomes in the config (the
    command line takes any text, so a bad one is the project's one-line error, not click's usage
    block); `noun`: what a bad spelling's error calls the value (default: the flag's words)."""

    flags: str
    help: str | None = None
    kind: Any = str
    choices: type[Choice] | tuple[str, ...] | None = None
    convert: Callable[[Any], Any] | None = None
    show_default: bool = False
    is_flag: bool = False
    multiple: bool = False
    metavar: str | None = None
    required: bool = False
    envvar: str | None = None
    switch_default: bool = False
    spell: Callable[[Any], Any] | None = None
    hidden: bool = False
    parsed_as: type[Choice] | None = None
    noun: str | None = None

    def spelled(self, value: Any) -> Any:
        """`value` as the command line writes it."""
        return plain(value if self.spell is None else self.spell(value))

    @property
    def names(self) -> list[str]:
        return self.flags.split("/") if self.flags.count("--") == 2 else [self.flags]

    @property
    def spellings(self) -> tuple[str, ...] | None:
        if self.choices is None:
            return None
        return self.choices.values() if isinstance(self.choices, type) else tuple(self.choices)

    @property
    def choice_type(self) -> type[Choice] | None:
        """The Choice the field's value is a member of (declared as `choices` or `parsed_as`), if any."""
        return self.choices if isinstance(self.choices, type) else self.parsed_as

    @property
    def value_noun(self) -> str:
        """What an error calls the value: `noun`, else the flag's words ("--calibrate-method": "calibrate method")."""
        return self.noun if self.noun is not None else self.names[0].removeprefix("--").replace("-", " ")


def option(default: Any, flags: str, help: str | None = None, kw_only: Any = MISSING, **spec: Any) -> Any:
    """A dataclass field (default `default`) declared as the command-line option `flags`; with
    `dataclasses.MISSING` the field has no default and the option is required. `kw_only`: as
    `dataclasses.field`'s (a subclass re-declaring a keyword-only field of its base keeps it one)."""
    if default is MISSING:
        spec["required"] = True
    return field(default=default, kw_only=kw_only, metadata={"option": OptionSpec(flags, help, **spec)})


def declared_fields(cls: Any) -> list[Field[Any]]:
    """The fields of a config dataclass (or of one of its instances) declared with `option`."""
    return [f for f in fields(cls) if "option" in f.metadata]


def option_spec(f: Field[Any]) -> OptionSpec:
    """How declared field `f` is spelled on the command line."""
    spec: OptionSpec = f.metadata["option"]
    return spec


def parse_declared_choices(config: Any) -> None:
    """Turn each declared Choice field of `config` (a frozen dataclass, from its `__post_init__`) from
    a spelling into its member; an unknown spelling: `Choice.parse`'s one-line BadInput naming the
    field's noun. None stays None where it is the field's default (the option left out)."""
    for f in declared_fields(config):
        spec = option_spec(f)
        kind = spec.choice_type
        value = getattr(config, f.name)
        if kind is None or (value is None and f.default is None):
            continue
        object.__setattr__(config, f.name, kind.parse(value, spec.value_noun))


def flag_spelling(cls: Any, name: str, value: Any) -> str:
    """How option `name` of `cls` reads on the command line at `value` (`--no-smooth` for
    smooth=False); a name `cls` does not declare: itself."""
    spec = next((option_spec(f) for f in declared_fields(cls) if f.name == name), None)
    if spec is None:
        return name
    names = spec.names
    return names[1] if len(names) == 2 and value is False else names[0]


def refuse_options_not_read(cls: Any, given: Mapping[str, Any], read_by: Mapping[str, Collection[str]],
                            chosen: str, chosen_as: str | None = None) -> None:
    """The one rule for an option given to a run that does not read it (a quantize method, one of
    bench's runs): `given` (field -> value) checked against `read_by` (run -> the fields it reads);
    the first option `chosen` does not read is a BadInput naming it (as `cls` spells it), the chosen
    run (`chosen_as`, default `chosen`) and the runs that read it. An option no run reads is the
    caller's to refuse."""
    for name, value in given.items():
        readers = [run for run, names in read_by.items() if name in names]
        if readers and name not in read_by[chosen]:
            raise BadInput(f"{flag_spelling(cls, name, value)} does not apply to {chosen_as or chosen} "
                           f"(it applies to: {', '.join(readers)})", param=name)


def _click_option(f: Field[Any]) -> Callable[[F], F]:
    spec = option_spec(f)
    kwargs: dict[str, Any] = {"help": spec.help, "show_default": spec.show_default}
    default = None if f.default is MISSING else spec.spelled(f.default)
    if spec.multiple or spec.is_flag:
        default = None  # click's own: an empty tuple, False
    if spec.multiple:
        kwargs["multiple"] = True
    if spec.metavar:
        kwargs["metavar"] = spec.metavar
    if spec.required:
        kwargs["required"] = True
    if spec.envvar:
        kwargs["envvar"] = spec.envvar
    if spec.hidden:
        kwargs["hidden"] = True
    if spec.is_flag:
        kwargs["is_flag"] = True
        if spec.switch_default:
            kwargs["default"] = f.default
    elif spec.spellings is not None:
        kwargs["type"] = click.Choice(spec.spellings)
        default = None if default is None else str(default)
    elif spec.kind in ("path", "file"):
        kwargs["type"] = click.Path(path_type=Path, **({"dir_okay": False} if spec.kind == "file" else {}))
    elif spec.flags.count("--") < 2:
        kwargs["type"] = spec.kind
    if spec.convert is not None:
        convert = spec.convert
        kwargs["callback"] = lambda _ctx, _param, value: convert(value)
    # a required option has no default at all (click >= 8.3 takes an explicit None as a given value)
    if not (spec.multiple or spec.is_flag or spec.required):
        kwargs["default"] = default
    return click.option(spec.flags, f.name, **kwargs)


def declared_options(cls: Any) -> Callable[[F], F]:
    """A decorator adding the click options of `cls`'s declared fields, in declaration order; the
    command receives each as the keyword of its field."""

    def add(f: F) -> F:
        for declared in reversed(declared_fields(cls)):
            f = _click_option(declared)(f)
        return f

    return add


def option_args(cls: Any, values: dict[str, Any], spell_defaults: bool = False) -> list[str]:
    """The command-line words that set `values` (field name -> value, in that order) on the command
    whose options `cls` declares; a value equal to the field's default is left out unless
    `spell_defaults` (a command line that names what it means whatever the defaults), an unset switch
    and an empty repeated option always."""
    declared = {f.name: f for f in declared_fields(cls)}
    args: list[str] = []
    for name, value in values.items():
        f = declared[name]
        spec = option_spec(f)
        if (spec.multiple and not value) or (spec.is_flag and not value):
            continue
        if plain(value) == plain(f.default) and not spell_defaults:
            continue
        names = spec.names
        spelled = spec.spelled(value)
        if spelled is None and spec.spell is not None:
            continue
        if len(names) == 2:
            args.append(names[0] if value else names[1])
        elif spec.is_flag:
            args.append(names[0])
        elif spec.multiple:
            for item in value:
                args += [names[0], str(item)]
        else:
            args += [names[0], str(spelled)]
    return args


def changed_args(config: Any) -> list[str]:
    """The command-line words that make the command's options `config`'s (its declared fields that
    differ from their defaults, in declaration order)."""
    return option_args(type(config), {f.name: getattr(config, f.name) for f in declared_fields(config)})
