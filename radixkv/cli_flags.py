"""CLI flags generated from config dataclasses, so an option is written once: its field's name is
the flag (`page_size` -> `--page-size`), its default the flag's, its `help` metadata the flag's
help, and `aliases`, `metavar`, `choices`, `action`, `default_in_help` metadata whatever else
the flag needs."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, fields
from typing import Any

from radixkv.config import GROUPS, OPTION_GROUPS, EngineConfig, RouterConfig, ServerConfig

ENGINE_GROUP_TITLES = {f.name: f.metadata["title"] for f in fields(EngineConfig)}
"""EngineConfig group attribute -> the title of its argparse group in `--help`."""

_TYPES = {"int": int, "int | None": int, "float": float}


def flag_names(option: Field) -> list[str]:
    return ["--" + option.name.replace("_", "-"), *option.metadata.get("aliases", [])]


def add_flag(group: argparse._ArgumentGroup, option: Field) -> None:
    """One flag for config field `option`. Its help ends with the default, unless the field's
    `default_in_help` metadata says the help text shows it (e.g. as `%(default)s`)."""
    default = None if option.default is MISSING else option.default
    help_text = option.metadata["help"]
    if not option.metadata.get("default_in_help"):
        help_text = f"{help_text} (default: {default})"
    kwargs: dict[str, Any] = {"default": default, "help": help_text, "dest": option.name}
    if option.metadata.get("required"):
        kwargs["required"] = True
    if option.type == "bool":
        kwargs["action"] = "store_true"
    elif "action" in option.metadata:
        kwargs.update(action=option.metadata["action"], metavar=option.metadata.get("metavar"))
        if "nargs" in option.metadata:
            kwargs["nargs"] = option.metadata["nargs"]
    else:
        kwargs["type"] = _TYPES.get(option.type, str)
        if "choices" in option.metadata:
            kwargs["choices"] = option.metadata["choices"]
        else:
            kwargs["metavar"] = option.metadata.get("metavar", option.name.upper())
    group.add_argument(*flag_names(option), **kwargs)


def add_config_flags(parser: argparse.ArgumentParser, config_class: type, title: str) -> None:
    """One argparse group titled `title` with a flag per field of `config_class`."""
    group = parser.add_argument_group(title)
    for option in fields(config_class):
        add_flag(group, option)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig option, in one argparse group per config group."""
    for name, config_class in GROUPS.items():
        add_config_flags(parser, config_class, ENGINE_GROUP_TITLES[name])


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, ServerConfig, "server")


def add_router_flags(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, RouterConfig, "router")


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flat engine options parsed from the flags (what `EngineConfig.from_kwargs` takes)."""
    return {name: getattr(args, name) for name in OPTION_GROUPS}


def config_from_flags(config_class: type, args: argparse.Namespace) -> Any:
    """The `config_class` (ServerConfig, RouterConfig) the flags ask for (repeated flags, parsed
    as lists, become tuples); it validates itself."""
    values = {option.name: getattr(args, option.name) for option in fields(config_class)}
    return config_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def server_config(args: argparse.Namespace) -> ServerConfig:
    return config_from_flags(ServerConfig, args)


def router_config(args: argparse.Namespace) -> RouterConfig:
    return config_from_flags(RouterConfig, args)
