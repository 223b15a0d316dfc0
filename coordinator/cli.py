"""Command line: ``rallypoint [serve flags]`` runs the broker; other tools are subcommands.

    rallypoint --host 127.0.0.1 --port 9092 --data-dir DIR --advertised-host H \
               [--control-port 9644] --config key=value ... [--log-format console|json] [--log-level info]
    rallypoint probe --host H --port P          # one ApiVersions round trip, exit 0/1
    rallypoint dump-log PATH [--json]           # print __consumer_offsets segments decoded
    rallypoint certs --out DIR [--host H ...]   # a throwaway CA and broker certificate (PEM)

Exit code 2 for bad arguments or configuration, before anything listens.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from . import config as config_mod
from . import logger

# subcommand -> "module:function" taking argv (list[str]) and returning an exit code.
SUBCOMMANDS: dict[str, str] = {
    "probe": "rallypoint.probe:main",
    "dump-log": "rallypoint.storage.dump:main",
    "report": "rallypoint.pipeline.job:main",
    "certs": "rallypoint.security.certs:main",
}


# Serve flags that are shorthands for settings: flag -> setting key.  Help texts and defaults
# come from the settings table (coordinator/config.py), which is where every default lives.
SETTING_FLAGS: dict[str, str] = {
    "--host": "host",
    "--port": "port",
    "--data-dir": "data.dir",
    "--advertised-host": "advertised.host",
    "--advertised-port": "advertised.port",
    "--control-port": "rallypoint.control.port",
    "--brokers": "rallypoint.brokers",
}


def _flag_help(key: str) -> str:
    s = config_mod.SETTINGS[key]
    shown = s.default_doc.strip("()") if s.default is None else s.default
    return f"{s.doc}; config {key}, default {shown}".replace("%", "%%")


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rallypoint",
        description="A Kafka-compatible test broker with a faithful consumer-group coordinator.",
        epilog="Subcommands: " + ", ".join(sorted(SUBCOMMANDS)) + " (rallypoint SUBCOMMAND --help).",
    )
    for flag, key in SETTING_FLAGS.items():
        p.add_argument(flag, dest=key, metavar=flag[2:].replace("-", "_").upper(), help=_flag_help(key))
    p.add_argument(
        "--config",
        "-c",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting by its Kafka property name (repeatable)",
    )
    p.add_argument("--log-format", choices=("console", "json"), default="console")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    return p


def parse_serve_args(argv: Sequence[str]) -> tuple[config_mod.Config, argparse.Namespace]:
    parser = _serve_parser()
    args = parser.parse_args(list(argv))
    overrides: dict[str, str] = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise config_mod.ConfigError(f"--config expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value
    for key in SETTING_FLAGS.values():
        v = getattr(args, key)
        if v is not None:
            overrides[key] = v
    return config_mod.load(overrides), args


async def serve(cfg: config_mod.Config) -> None:
    from .assemble import build_broker
    from .server import Server

    broker = build_broker(cfg)
    server = Server(broker, cfg["host"], cfg["port"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """asyncio.run, on uvloop when it is installed (RALLYPOINT_EVENT_LOOP=asyncio opts out)."""
    if os.environ.get("RALLYPOINT_EVENT_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(coro)
            return
    asyncio.run(coro)


def _run_subcommand(name: str, argv: list[str]) -> int:
    mod_name, func_name = SUBCOMMANDS[name].split(":")
    func: Callable[[list[str]], int] = getattr(importlib.import_module(mod_name), func_name)
    return func(argv)


def hide_hypothesis() -> None:
    """Keep kio from importing hypothesis in the broker process.

    kio registers hypothesis strategies for its primitive types at import time whenever
    hypothesis is installed (it is wherever the test extras are): ~250 ms of start-up spent
    on test tooling.  A ``None`` entry in ``sys.modules`` makes that optional import fail fast.
    """
    if "kio" not in sys.modules:
        sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    hide_hypothesis()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _run_subcommand(argv[0], argv[1:])
    try:
        cfg, args = parse_serve_args(argv)
    except config_mod.ConfigError as e:
        print(f"rallypoint: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse: --help (0) or usage error (2)
        return int(e.code or 0)
    logger.configure(args.log_format, args.log_level)
    from .storage.errors import OffsetsLogStartError
    from .topics.store import TopicStateError

    try:
        _run(serve(cfg))
    except (OSError, OffsetsLogStartError, TopicStateError) as e:
        print(f"rallypoint: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
