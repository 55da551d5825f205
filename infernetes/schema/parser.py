"""``infernetes serve`` argument parsing with all of ``vllm serve``'s conventions.

The pipeline: ``--help=...`` forms -> spelling normalization (underscores) -> ``--config`` YAML
-> dotted JSON keys (``--hf-overrides.rope_theta 1e6``) -> argparse -> deprecations ->
``validate`` (types, choices, ranges, cross-field rules). Values from the command line beat values
from the config file, which beat the defaults. Any bad input exits 2 with an argparse message.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from infernetes.schema.args import ARGS, BY_DEST, BY_NAME, GROUPS, Arg, get_arg
from infernetes.schema.config import ConfigError, ServeConfig, validate
from infernetes.schema.convert import convert
from infernetes.schema.deprecations import apply_deprecations
from infernetes.schema.values import parse_bool, parse_scalar

PROG = "infernetes serve"
GROUP_TITLES = {
    "frontend": "frontend: the HTTP server",
    **{group: group for group in GROUPS if group != "frontend"},
}


class ServeArgumentParser(argparse.ArgumentParser):
    """argparse with the exit-2 error that names the argument, as every CLI error should."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            message += _suggestion(message.split(": ", 1)[1].split())
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _suggestion(unknown: list[str]) -> str:
    flags = [spelling for arg in ARGS for spelling in (arg.flag, *arg.aliases)]
    for token in unknown:
        if token.startswith("-"):
            close = difflib.get_close_matches(token.split("=")[0], flags, n=1, cutoff=0.75)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def build_parser(prog: str = PROG) -> ServeArgumentParser:
    """The argparse parser for the schema. Every option defaults to 'absent' so the caller knows
    exactly what the user gave; defaults come from the schema in ``validate``."""
    parser = ServeArgumentParser(
        prog=prog,
        usage=f"{prog} [model_tag] [options]",
        description="Start the OpenAI-compatible API server. Use --help=listgroup, --help=<group>, "
        "--help=<argument> or --help=<keyword> to look around.",
        add_help=False,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model_tag", nargs="?", help="The model to serve (same as --model).")
    parser.add_argument(
        "-h",
        "--help",
        action="store_true",
        help="Show this help; --help=<group|argument|keyword|listgroup|all> narrows it.",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="Read arguments from a YAML file; command-line values win over the file's.",
    )
    sections = {group: parser.add_argument_group(GROUP_TITLES[group]) for group in GROUPS}
    for arg in ARGS:
        _add(sections[arg.group], arg)
    return parser


def _add(section: argparse._ArgumentGroup, arg: Arg) -> None:
    spellings = [arg.flag, *arg.aliases]
    help_text = _help_text(arg)
    if arg.kind == "bool":
        section.add_argument(
            *spellings,
            dest=arg.dest,
            action=_BoolAction,
            negation=_NEGATION_OF.get(arg.name),
            help=help_text,
        )
        return
    kwargs: dict[str, Any] = {"dest": arg.dest, "help": help_text, "metavar": _metavar(arg)}
    if arg.kind == "token":
        kwargs.update(nargs="?", const=True)
    elif arg.nargs == "*":  # repeatable: --middleware a --middleware b adds both
        kwargs.update(nargs="*", action="extend")
    elif arg.is_list:
        kwargs.update(nargs=arg.nargs)
    section.add_argument(*spellings, **kwargs)


def _negation(name: str) -> str | None:
    """vLLM turns ``--enable-x`` off with ``--disable-x`` and ``--disable-x`` off with
    ``--enable-x`` (besides ``--no-x``)."""
    for word, opposite in (("enable-", "disable-"), ("disable-", "enable-")):
        if name.startswith(word):
            return opposite + name.removeprefix(word)
    return None


# The opposite spelling of each boolean, where no argument of its own is named so (the deprecated
# --disable-log-requests keeps its own meaning beside --enable-log-requests).
_NEGATION_OF = {
    arg.name: negation
    for arg in ARGS
    if arg.kind == "bool" and (negation := _negation(arg.name)) and negation not in BY_NAME
}
_NEGATED = {negation: BY_NAME[name] for name, negation in _NEGATION_OF.items()}


class _BoolAction(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``, and the opposite ``--enable-x``/``--disable-x`` spelling if any."""

    def __init__(self, option_strings: list[str], negation: str | None = None, **kwargs: Any):
        super().__init__(option_strings, **kwargs)
        self.negation = negation
        if negation is not None:
            self.option_strings = [*self.option_strings, f"--{negation}"]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        off = option_string is not None and (
            option_string.startswith("--no-") or option_string == f"--{self.negation}"
        )
        setattr(namespace, self.dest, not off)


def _metavar(arg: Arg) -> str:
    if arg.choices is not None and len(arg.choices) <= 8:
        return "{" + ",".join(str(c) for c in arg.choices) + "}"
    return arg.dest.upper()


def _help_text(arg: Arg) -> str:
    text = arg.help
    if arg.deprecated:
        text = f"[deprecated: {arg.deprecated}] {text}"
    elif arg.choices is not None and len(arg.choices) > 8:
        text += " Choices: " + ", ".join(str(c) for c in arg.choices) + "."
    if not arg.deprecated and arg.default not in (None, False, "", [], {}):
        text += f" (default: {arg.default})"
    return text.replace("%", "%%")


def parse_serve_args(argv: Sequence[str] | None = None, *, prog: str = PROG) -> ServeConfig:
    """Parses ``serve`` arguments into a validated ServeConfig; prints deprecations to stderr.

    Exits 0 after printing help, and 2 with a message naming the argument on bad input.
    """
    config, notices = parse_with_notices(argv, prog=prog)
    for notice in notices:
        print(f"WARNING: {notice}", file=sys.stderr)
    return config


def parse_with_notices(
    argv: Sequence[str] | None = None, *, prog: str = PROG
) -> tuple[ServeConfig, list[str]]:
    """Like ``parse_serve_args`` but returns the deprecation notices instead of printing them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    topic = _help_topic(argv)
    if topic is not None:
        from infernetes.schema.help import print_help

        print_help(parser, topic)
        parser.exit(0)
    argv = _bool_values([normalize_token(token) for token in argv], parser)
    argv, config_file = _take_config_file(argv, parser)
    argv, dotted = _take_dotted(argv, parser)
    namespace = parser.parse_args(argv)
    given = _given(namespace, parser)
    file_given = _read_config_file(config_file, parser) if config_file else {}
    try:
        file_values, file_notices = apply_deprecations(file_given)
        cli_values, cli_notices = apply_deprecations(given)
        values = {**file_values, **cli_values}
        for dest, path, raw in dotted:
            current = (
                convert(BY_DEST[dest], values[dest]) if dest in values else BY_DEST[dest].default
            )
            values[dest] = _set_path(current, path, parse_scalar(raw))
        return validate(values), file_notices + cli_notices
    except ConfigError as exc:
        parser.error(str(exc))


def _help_topic(argv: list[str]) -> str | None:
    """'' for plain --help/-h, the topic for --help=<topic>, None when no help was asked for."""
    for token in argv:
        if token == "--":
            return None
        if token in ("-h", "--help"):
            return ""
        if token.startswith(("--help=", "-h=")):
            return token.split("=", 1)[1]
    return None


def normalize_token(token: str) -> str:
    """``--max_model_len=5`` -> ``--max-model-len=5``; the part after a dot is a JSON key, kept."""
    if not token.startswith("--"):
        return token
    flag, eq, value = token.partition("=")
    name, dot, key = flag[2:].partition(".")
    return f"--{name.replace('_', '-')}{dot}{key}{eq}{value}"


_BOOL_WORDS = {"true": True, "false": False}


def _bool_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Older releases took ``--enable-chunked-prefill False`` and ``--flag=true``; rewrite those
    to ``--flag`` / ``--no-flag`` (a bare word is taken only when it is true or false)."""
    out: list[str] = []
    for token in argv:
        flag, eq, raw = token.partition("=")
        arg = _bool_arg(flag) if eq else None
        if arg is not None:
            try:
                value = parse_bool(raw)
            except ValueError:
                parser.error(f"argument {flag}: expected true or false, got {raw!r}")
        elif token.lower() in _BOOL_WORDS and out and (arg := _bool_arg(out[-1])) is not None:
            flag, value = out[-1], _BOOL_WORDS[token.lower()]
            out.pop()
        else:
            out.append(token)
            continue
        on = value != _negates(flag)
        out.append(arg.flag if on else f"--no-{arg.name}")
    return out


def _bool_arg(flag: str) -> Arg | None:
    """The boolean argument a spelling (``--x``, ``--no-x``, the opposite enable/disable) sets."""
    if not flag.startswith("--"):
        return None
    name = flag[2:]
    arg = BY_NAME.get(name) or (
        BY_NAME.get(name[3:]) if name.startswith("no-") else _NEGATED.get(name)
    )
    return arg if arg is not None and arg.kind == "bool" else None


def _negates(flag: str) -> bool:
    return flag[2:] not in BY_NAME


def _take_config_file(
    argv: list[str], parser: argparse.ArgumentParser
) -> tuple[list[str], str | None]:
    rest, path = [], None
    tokens = iter(argv)
    for token in tokens:
        if token == "--config":
            path = next(tokens, None)
            if path is None:
                parser.error("argument --config: expected a YAML file path")
        elif token.startswith("--config="):
            path = token.split("=", 1)[1]
        else:
            rest.append(token)
    return rest, path


def _take_dotted(
    argv: list[str], parser: argparse.ArgumentParser
) -> tuple[list[str], list[tuple[str, list[str], str]]]:
    """Pulls ``--json-arg.key.sub value`` (or ``=value``) out of argv as (dest, path, raw)."""
    rest: list[str] = []
    dotted: list[tuple[str, list[str], str]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        flag = token.partition("=")[0]
        if token.startswith("-") and "." in flag and not _is_number(flag):
            name, _, path = flag.lstrip("-").partition(".")
            arg = _json_arg(("--" if token.startswith("--") else "-") + name)
            if arg is None:
                parser.error(f"argument {flag}: only JSON arguments take dotted keys")
            if "=" in token:
                raw = token.partition("=")[2]
            elif i + 1 < len(argv):
                i += 1
                raw = argv[i]
            else:
                parser.error(f"argument {flag}: expected a value")
            if not all(path.split(".")):
                parser.error(f"argument {flag}: empty key")
            dotted.append((arg.dest, path.split("."), raw))
        else:
            rest.append(token)
        i += 1
    return rest, dotted


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _json_arg(spelling: str) -> Arg | None:
    try:
        arg = get_arg(spelling)
    except KeyError:
        return None
    return arg if arg.kind == "json" else None


def _set_path(current: Any, path: list[str], value: Any) -> dict:
    root = dict(current) if isinstance(current, dict) else {}
    node = root
    for key in path[:-1]:
        child = node.get(key)
        node[key] = dict(child) if isinstance(child, dict) else {}
        node = node[key]
    node[path[-1]] = value
    return root


def _given(namespace: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    given = {k: v for k, v in vars(namespace).items() if k not in ("help", "model_tag", "config")}
    tag = getattr(namespace, "model_tag", None)
    if tag is not None:
        if "model" in given and given["model"] != tag:
            parser.error(
                f"argument --model: {given['model']!r} conflicts with the positional model_tag {tag!r}"
            )
        given["model"] = tag
    return given


def _read_config_file(path: str, parser: argparse.ArgumentParser) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        parser.error(f"argument --config: cannot read {path}: {exc.strerror}")
    except yaml.YAMLError as exc:
        parser.error(f"argument --config: {path} is not valid YAML: {exc}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        parser.error(f"argument --config: {path} must hold a mapping of argument names to values")
    given: dict[str, Any] = {}
    for key, value in data.items():
        name = "model" if key == "model_tag" else str(key)
        try:
            arg = get_arg(name)
        except KeyError:
            parser.error(f"argument --config: unknown argument {key!r} in {path}")
        given[arg.dest] = value
    return given
