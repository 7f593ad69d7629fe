"""Command-line flags generated from a config dataclass: one flag per field, its help the field's docstring.

So each setting has one source: the dataclass holds its default and its documentation; the flags default
to None (not given), so that the dataclass's defaults stay the only ones.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from dataclasses import fields


def field_docs(cls) -> dict[str, str]:
    """Each dataclass field's docstring (the string right under it in the class source), on one line."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: " ".join(d.value.value.split()) for a, d in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(d, ast.Expr) and isinstance(d.value, ast.Constant)}


def _int_list(text: str) -> list[int]:
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, not {text!r}") from None


FLAG_TYPES = {"str": str, "int": int, "float": float, "float | None": float, "list[int] | None": _int_list}


def add_config_flags(parser: argparse.ArgumentParser, cls) -> None:
    """`--field-name VALUE` per field (`--flag` / `--no-flag` for a bool, after its default), default None."""
    docs = field_docs(cls)
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool" and f.default:
            parser.add_argument(f"--no-{flag[2:]}", dest=f.name, action="store_false", default=None,
                                help=docs[f.name])
        elif f.type == "bool":
            parser.add_argument(flag, action="store_true", default=None, help=docs[f.name])
        else:
            shown = "" if f.default is None else f" (default: {f.default})"
            parser.add_argument(flag, type=FLAG_TYPES[f.type], default=None, help=docs[f.name] + shown)


def given_flags(args: argparse.Namespace, cls) -> dict:
    """The fields whose flags were given on the command line."""
    return {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name) is not None}
