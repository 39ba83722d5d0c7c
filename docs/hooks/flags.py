"""mkdocs hook: the CLI reference (docs/cli.md) written from radixkv's own argparse parser.

Every flag is defined once, in `radixkv/cli.py` (and `radixkv/plan_cli.py`, which it calls); this
hook walks `build_parser()`'s subcommands and their argument groups and replaces the
`<!-- flags -->` marker of docs/cli.md with one table per group: the flag, its default, its
choices and its help. A group several subcommands share (the engine options, the sampling flags)
is written once and linked from each of them.
"""

from __future__ import annotations

import argparse
import re

from mkdocs.exceptions import PluginError

MARKER = "<!-- flags -->"
PAGE = "cli.md"


def _escape(text: str) -> str:
    """Plain help text as a Markdown table cell (backticks in it stay code)."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")
            .replace("\n", " "))


def _code(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _help(action: argparse.Action, prog: str) -> str:
    """The help text with argparse's %(default)s-style fields filled in, as `--help` prints it."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    text = action.help % params
    # the table has a default column: drop a trailing "(default: X)" that only repeats it
    shown = {str(action.default), "None", ""}
    while (m := re.search(r"\s*\(default: ([^()]*)\)$", text)) and m.group(1) in shown:
        text = text[:m.start()]
    return text


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:  # a positional argument
        return _code(action.metavar or action.dest)
    takes_value = action.nargs != 0
    metavar = ""
    if takes_value:
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        if action.nargs in ("+", "*"):
            metavar = f"{metavar} [{metavar} ...]"
        elif isinstance(action.nargs, int) and action.nargs > 1:
            metavar = " ".join([metavar] * action.nargs)
    return ", ".join(_code(f"{s} {metavar}".strip()) for s in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if not action.option_strings:
        return "-"
    if action.nargs == 0:  # store_true, store_const, count
        return "off"
    if action.default is None or action.default is argparse.SUPPRESS or action.default == []:
        return "-"
    if isinstance(action.default, (list, tuple)):
        return _code(" ".join(map(str, action.default)))
    return _code(str(action.default))


def _choices(action: argparse.Action) -> str:
    return ", ".join(_code(str(c)) for c in action.choices) if action.choices else ""


def _actions(group) -> list[argparse.Action]:
    return [a for a in group._group_actions
            if a.help is not argparse.SUPPRESS and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _table(actions: list[argparse.Action], prog: str) -> str:
    rows = ["| flag | default | choices | what it does |", "|---|---|---|---|"]
    for a in actions:
        rows.append(f"| {_flag(a)} | {_default(a)} | {_choices(a)} | {_escape(_help(a, prog))} |")
    return "\n".join(rows) + "\n"


def _usage(p: argparse.ArgumentParser) -> str:
    """`radixkv NAME [options] POSITIONAL ...`: the full usage line of a command with forty flags
    is a wall; the tables below list them."""
    positionals = [a.metavar or a.dest for a in p._actions if not a.option_strings]
    required = [f"{a.option_strings[0]} {a.metavar or a.dest.upper()}" for a in p._actions
                if a.option_strings and a.required]
    return " ".join([p.prog, *required, "[options]", *positionals])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """{name: (parser, one-line help)} in the order `radixkv --help` lists them."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    return {name: (p, helps.get(name, "")) for name, p in sub.choices.items()}


def render(parser: argparse.ArgumentParser) -> str:
    subs = subcommands(parser)
    # a group is shared when several subcommands hold the same flags under the same title
    seen: dict[tuple, list[str]] = {}
    for name, (p, _) in subs.items():
        for g in p._action_groups:
            acts = _actions(g)
            if acts:
                seen.setdefault((g.title, tuple(a.dest for a in acts)), []).append(name)
    shared = {key: users for key, users in seen.items() if len(users) > 1}

    out = ["| command | what it does |", "|---|---|"]
    out += [f"| [`radixkv {name}`](#{_slug('radixkv ' + name)}) | {_escape(h)} |" for name, (_, h) in subs.items()]
    top = [a for g in parser._action_groups for a in _actions(g)]
    out += ["", "Options of `radixkv` itself:", "", _table(top, parser.prog)]
    for name, (p, h) in subs.items():
        out += [f"## radixkv {name}", "", _escape(p.description or h), "",
                "```text", _usage(p), "```", ""]
        for g in p._action_groups:
            acts = _actions(g)
            if not acts:
                continue
            key = (g.title, tuple(a.dest for a in acts))
            if key in shared:
                out += [f"Plus the flags under [{g.title[:1].upper()}{g.title[1:]}](#{_slug(g.title)}), shared with "
                        + ", ".join(f"`{u}`" for u in shared[key] if u != name) + ".", ""]
                continue
            out += [f"### {g.title[:1].upper()}{g.title[1:]}" if g.title else "### Options", "",
                    _table(acts, p.prog)]
    for (title, _), users in shared.items():
        p = subs[users[0]][0]
        g = next(g for g in p._action_groups if g.title == title)
        out += [f"## {title[:1].upper()}{title[1:]}", "",
                "Taken by " + ", ".join(f"[`radixkv {u}`](#{_slug('radixkv ' + u)})" for u in users) + ".", "",
                _table(_actions(g), p.prog)]
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} lost its {MARKER} marker: the flag reference has nowhere to go")
    from radixkv.cli import build_parser

    return markdown.replace(MARKER, render(build_parser()))
