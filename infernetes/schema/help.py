"""The ``--help=<topic>`` forms: listgroup, a group, one argument, a keyword search, all."""

from __future__ import annotations

import argparse
import pydoc

from infernetes.schema.args import ARGS, GROUPS, get_arg


def print_help(parser: argparse.ArgumentParser, topic: str) -> None:
    if topic.strip() == "page":
        pydoc.pager(parser.format_help())
    else:
        print(render_help(parser, topic))


def render_help(parser: argparse.ArgumentParser, topic: str) -> str:
    topic = topic.strip()
    if topic in ("", "all", "page"):
        return parser.format_help()
    if topic == "listgroup":
        return "Argument groups (show one with --help=<group>):\n" + "\n".join(
            f"  {g}" for g in GROUPS
        )
    group = next((g for g in GROUPS if g.lower() == topic.lower()), None)
    if group is not None:
        return _format_group(parser, group)
    try:
        arg = get_arg(topic if topic.startswith("-") else topic.replace("_", "-"))
    except KeyError:
        arg = None
    if arg is not None:
        return _format_actions(parser, f"argument {arg.flag}", [_action(parser, arg.dest)])
    keyword = topic.lower().lstrip("-").replace("_", "-")
    matches = [a for a in ARGS if keyword in a.name or keyword in a.help.lower()]
    if not matches:
        return (
            f"No group or argument matches {topic!r}. Groups: {', '.join(GROUPS)}.\n"
            "Try --help=listgroup, or a shorter keyword."
        )
    return _format_actions(
        parser, f"arguments matching {topic!r}", [_action(parser, a.dest) for a in matches]
    )


def _action(parser: argparse.ArgumentParser, dest: str) -> argparse.Action:
    return next(action for action in parser._actions if action.dest == dest)


def _format_group(parser: argparse.ArgumentParser, group: str) -> str:
    section = next(g for g in parser._action_groups if g.title and g.title.split(":")[0] == group)
    return _format_actions(parser, section.title or group, section._group_actions)


def _format_actions(
    parser: argparse.ArgumentParser, title: str, actions: list[argparse.Action]
) -> str:
    formatter = parser._get_formatter()
    formatter.start_section(title)
    formatter.add_arguments(actions)
    formatter.end_section()
    return formatter.format_help()
