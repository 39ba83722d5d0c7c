"""CLI flags generated from the config dataclasses: one flag per option, with its help, in one
argparse group per config group; `radixkv serve`'s own flags from ServerConfig the same way."""

from dataclasses import fields

import pytest

from radixkv.cli import build_parser
from radixkv.cli_flags import ENGINE_GROUP_TITLES, router_config, server_config
from radixkv.config import GROUPS, RouterConfig, ServerConfig
from radixkv.errors import ConfigError


def subcommand(name: str):
    parser = build_parser()
    return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]


@pytest.mark.parametrize("command", ["serve", "generate", "chat"])
def test_every_option_has_exactly_one_flag_with_help(command):
    parser = subcommand(command)
    classes = [*GROUPS.values(), *([ServerConfig] if command == "serve" else [])]
    for config_class in classes:
        for option in fields(config_class):
            actions = [a for a in parser._actions if a.dest == option.name]
            assert len(actions) == 1, option.name
            assert "--" + option.name.replace("_", "-") in actions[0].option_strings
            assert actions[0].help and actions[0].help.strip(), option.name
            assert actions[0].default == option.default, option.name


def test_serve_help_shows_every_group(run_cli):
    out = run_cli("serve", "--help")
    assert out.returncode == 0
    for title in [*ENGINE_GROUP_TITLES.values(), "server"]:
        assert f"\n{title}:\n" in out.stdout, title
    assert "--tp TP_SIZE" in out.stdout.replace("--tp-size TP_SIZE, --tp TP_SIZE", "--tp TP_SIZE")


def test_server_flags_keep_their_forms():
    server = server_config(subcommand("serve").parse_args(["--api-key", "a", "--api-key", "b"]))
    assert server.api_keys == ("a", "b")
    server = server_config(subcommand("serve").parse_args(["--api-key", "a", "--router", "sglang", "--dp", "2"]))
    assert server.api_keys == ("a",) and (server.router, server.dp, server.port) == ("sglang", 2, 30000)
    assert server_config(subcommand("serve").parse_args([])) == ServerConfig()
    with pytest.raises(SystemExit):
        subcommand("serve").parse_args(["--router", "nginx"])


@pytest.mark.parametrize("options,named", [
    ({"port": 0}, "--port 0"),
    ({"dp": 0}, "--dp 0"),
    ({"dp": 17}, "--dp 17"),
    ({"dp": 2, "api_key": ("a", "b")}, "--dp takes one --api-key"),
    ({"dp": 4, "port": 65533}, "--port 65533"),
    ({"router": "sglang"}, "--dp"),
    ({"api_key": ("",)}, "--api-key"),
    ({"max_body_bytes": 10}, "--max-body-bytes 10"),
    ({"shutdown_timeout": -1.0}, "--shutdown-timeout"),
    ({"responses_store_size": -1}, "--responses-store-size"),
    ({"responses_store_ttl": 0.0}, "--responses-store-ttl"),
])
def test_server_config_refuses_a_bad_value_naming_the_flag(options, named):
    with pytest.raises(ConfigError, match=named):
        ServerConfig(**options)


def test_router_flags_are_generated_from_router_config():
    parser = subcommand("router")
    for option in fields(RouterConfig):
        actions = [a for a in parser._actions if a.dest == option.name]
        assert len(actions) == 1 and actions[0].help, option.name
    config = router_config(parser.parse_args(["--worker", "http://a:1/", "--worker", "http://b:2", "--policy",
                                               "least_load"]))
    assert config.workers == ("http://a:1", "http://b:2") and config.policy == "least_load"
    with pytest.raises(ConfigError, match="--worker"):
        router_config(parser.parse_args([]))  # --worker is required (or --pd-disaggregation's servers)
    pd = router_config(parser.parse_args(["--pd-disaggregation", "--prefill", "http://p:1", "9000", "--prefill",
                                          "http://q:1", "none", "--prefill", "http://r:1/", "--decode", "http://d:2"]))
    assert pd.prefill_servers == (("http://p:1", 9000), ("http://q:1", None), ("http://r:1", None))
    assert pd.decode_servers == ("http://d:2",)


@pytest.mark.parametrize("options,named", [
    ({"worker": None}, "--worker"),
    ({"worker": ("localhost:1",)}, "--worker 'localhost:1'"),
    ({"worker": ("http://a:1", "http://a:1/")}, "twice"),
    ({"policy": "random"}, "--policy random"),
    ({"port": 70000}, "--port 70000"),
    ({"health_interval": 0.0}, "--health-interval"),
    ({"api_key": ""}, "--api-key"),
])
def test_router_config_refuses_a_bad_value_naming_the_flag(options, named):
    """(and the prefill/decode pairs below)"""
    with pytest.raises(ConfigError, match=named):
        RouterConfig(**{"worker": ("http://a:1",), **options})


@pytest.mark.parametrize("options,named", [
    ({"prefill": (("http://p:1",),)}, "--pd-disaggregation: give at least one --prefill URL and one --decode"),
    ({"prefill": (("http://p:1", "99999"),), "decode": ("http://d:1",)}, "bootstrap port must be in 1..65535"),
    ({"prefill": (("http://p:1", "1", "2"),), "decode": ("http://d:1",)}, "optionally a bootstrap port"),
    ({"prefill": (("p:1",),), "decode": ("http://d:1",)}, "--prefill 'p:1'"),
    ({"prefill": (("http://p:1",),), "decode": ("http://p:1",)}, "twice"),
    ({"prefill": (("http://p:1",),), "decode": ("http://d:1",), "worker": ("http://w:1",)}, "--prefill and --decode instead"),
])
def test_pd_router_config_refuses_a_bad_pair_naming_the_flag(options, named):
    with pytest.raises(ConfigError, match=named):
        RouterConfig(**{"pd_disaggregation": True, **options})


def test_prefill_and_decode_need_pd_disaggregation():
    with pytest.raises(ConfigError, match="need --pd-disaggregation"):
        RouterConfig(worker=("http://a:1",), decode=("http://d:1",))
