"""Command-line flags generated from a config dataclass: one flag per field, its help the field's docstring.

So each setting has one source: the dataclass holds its default and its documentation; the flags default
to None (not given), so that the dataclass's defaults stay the only ones.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path


def field_docs(cls) -> dict[str, str]:
    """Each dataclass field's docstring (the string right under it in the class source), on one line. A field
    that a subclass declares again, to give it its own default, keeps its base's docstring unless it has one."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if is_dataclass(k)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        docs |= {a.target.id: " ".join(d.value.value.split()) for a, d in zip(body, body[1:])
                 if isinstance(a, ast.AnnAssign) and isinstance(d, ast.Expr) and isinstance(d.value, ast.Constant)}
    return docs


def _list_of(kind: type, what: str):
    def parse(text: str) -> list:
        try:
            return [kind(g) for g in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"comma-separated {what}, not {text!r}") from None
    return parse


FLAG_TYPES = {"str": str, "int": int, "float": float, "Path": Path, "list[int]": _list_of(int, "integers"),
              "list[float]": _list_of(float, "numbers")}


def _flag_type(annotation: str) -> tuple[type, tuple | None]:
    """(the parser of a field's values, its choices or None) from its annotation: a FLAG_TYPES name, optionally
    `| None`, or a Literal of the choices."""
    annotation = annotation.removesuffix(" | None")
    if annotation.startswith("Literal["):
        choices = ast.literal_eval(f"({annotation[len('Literal['):-1]},)")
        return type(choices[0]), choices
    return FLAG_TYPES[annotation], None


def add_config_flags(parser: argparse.ArgumentParser, cls, leave_out: tuple[str, ...] = ()) -> None:
    """`--field-name VALUE` per field (`--flag` / `--no-flag` for a bool, after its default, both for a `bool | None`;
    the choices of a Literal; comma-separated lists; required for a field without a default), default None; the
    fields in `leave_out` keep their default, for a stage that shares only part of a config. A field whose default is a
    config of its own (train.py's `reward`) gets that config's flags, under their own names."""
    docs = field_docs(cls)
    for f in fields(cls):
        if f.name in leave_out:
            continue
        if is_dataclass(f.default_factory):
            add_config_flags(parser, f.default_factory, leave_out)
            continue
        flag = "--" + f.name.replace("_", "-")
        doc = docs[f.name].replace("%", "%%")  # argparse %-formats help; a docstring's % is literal
        if f.type == "bool | None":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=doc)
        elif f.type == "bool" and f.default:
            parser.add_argument(f"--no-{flag[2:]}", dest=f.name, action="store_false", default=None, help=doc)
        elif f.type == "bool":
            parser.add_argument(flag, action="store_true", default=None, help=doc)
        else:
            kind, choices = _flag_type(f.type)
            required = f.default is MISSING and f.default_factory is MISSING
            default = None if required else f.default if f.default is not MISSING else f.default_factory()
            if isinstance(default, list):
                default = ",".join(map(str, default))
            shown = "" if default is None else f" (default: {default})"
            parser.add_argument(flag, type=kind, choices=choices, default=None, required=required, help=doc + shown)


def given_flags(args: argparse.Namespace, cls) -> dict:
    """The fields whose flags were given on the command line (a field left without a flag never is), and each nested
    config made of its own."""
    given = {}
    for f in fields(cls):
        if is_dataclass(f.default_factory):
            given[f.name] = f.default_factory(**given_flags(args, f.default_factory))
        elif getattr(args, f.name, None) is not None:
            given[f.name] = getattr(args, f.name)
    return given


def config_from(args: argparse.Namespace, cls):
    """`cls` made of the flags given over its defaults; a bad value (the ValueError of its checks) is a one-line
    `error: ...` exit. Every stage's config is made here."""
    try:
        return cls(**given_flags(args, cls))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def parse_config(parser: argparse.ArgumentParser, cls, argv=None):
    """`cls` made of the flags given on the command line (`config_from`)."""
    return config_from(parser.parse_args(argv), cls)


# Rules for `check`: (the rule in words, a predicate).
AT_LEAST_1 = ("be at least 1", lambda value: value >= 1)
NOT_NEGATIVE = ("not be negative", lambda value: value >= 0)
POSITIVE = ("be positive", lambda value: value > 0)
SHARE = ("be between 0 and 1", lambda value: 0 <= value <= 1)


def one_of(*choices) -> tuple[str, object]:
    return f"be one of {', '.join(map(str, choices))}", lambda value: value in choices


def check(config, rules: dict[str, tuple[str, object]]) -> None:
    """ValueError `--flag must RULE, got VALUE` for the first field that breaks its rule: name -> (the rule in
    words, a predicate). None is not checked: it stands for a default that the stage fills in later."""
    for name, (rule, ok) in rules.items():
        value = getattr(config, name)
        if value is not None and not ok(value):
            raise ValueError(f"--{name.replace('_', '-')} must {rule}, got {value}")
