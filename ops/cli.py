"""The `mnemoflow` command line.

Each subcommand is one entry of `COMMANDS`: a function that adds its arguments and a handler
that gets the parsed arguments and the settings (read once, here) and returns the exit code.
Add a command by writing the two functions and one line in the table.

Failures end in one line on stderr and a non-zero exit code, never a traceback (`-v` adds it):
a bad setting or no target exits 2, a service that cannot be reached or does not answer
(`_service_problem`) exits 1. Run as a program (`main()` without arguments) the process ends
with the command's own exit code through `exit_without_finalising`: the Temporal client's
native threads must not meet the interpreter's finalisation.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from pydantic import ValidationError

from mnemoflow.worker.settings import Settings


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, its arguments and its handler."""

    help: str
    handler: Callable[[argparse.Namespace, Settings], int]
    arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None


def _dev_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="data directory (default: MNEMOFLOW_DATA_DIR)")
    for name, default in (("temporal", 7233), ("ui", 8233), ("redis", 6379), ("milvus", 19530)):
        parser.add_argument(
            f"--{name}-port",
            type=int,
            help=f"{name} port (default {default}, or a free one if {default} is busy)",
        )


def _dev(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from mnemoflow.devstack.embedded import DevPorts, main

    if args.data_dir:
        update = {"data_dir": Path(args.data_dir)}
        mnemoflow = settings.mnemoflow.model_copy(update=update)
        settings = settings.model_copy(update={"mnemoflow": mnemoflow})
    ports = DevPorts(args.temporal_port, args.ui_port, args.redis_port, args.milvus_port)
    exit_without_finalising(main(settings, ports))
    return 0  # not reached


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.worker.serve import StartupError, serve

    try:
        code = asyncio.run(serve(settings))
    except StartupError as err:
        print(f"mnemoflow: invalid configuration: {err}", file=sys.stderr)
        code = 2
    exit_without_finalising(code)


def exit_without_finalising(code: int) -> NoReturn:
    """End a process whose work has stopped and whose clients are closed, skipping the
    interpreter's finalisation.

    What is left then are native threads (the Temporal core's runtime, gRPC's pollers) that
    Python's finalisation can race: a worker that had stopped cleanly ("worker stopped" logged)
    sometimes aborted with SIGABRT ("PyGILState_Release: thread state ... must be current") in
    the SIGTERM drain test, so an orderly stop exited -6 instead of its code. Logs and standard
    streams are flushed first; nothing in this package relies on atexit.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _user_id(text: str) -> str:
    """A USER argument, checked as the middleware checks a user id (argparse reports the
    error with the usage line)."""
    from mnemoflow.models.ids import validate_user_id

    try:
        return validate_user_id(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _user_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("user", metavar="USER", type=_user_id, help="the user id")


def _target_arguments(parser: argparse.ArgumentParser) -> None:
    """The user, and where the services are (see mnemoflow.ops.target)."""
    _user_argument(parser)
    parser.add_argument(
        "--data-dir",
        help="talk to the `mnemoflow dev` stack running in this directory (default: "
        "TEMPORAL_ADDRESS when set, else a stack running in MNEMOFLOW_DATA_DIR)",
    )


def _targeted(args: argparse.Namespace, settings: Settings) -> Settings:
    """Settings pointed at the chosen services, said on stderr (NoTargetError if none)."""
    from mnemoflow.ops.target import resolve_target

    target = resolve_target(settings, args.data_dir)
    print(f"mnemoflow {args.command}: using {target.description}", file=sys.stderr)
    args.target = target.settings  # what `_service_problem` names if the services fail
    return target.settings


def _backfill_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        help="the `mnemoflow dev` stack running in this directory (default: MILVUS_URI when "
        "TEMPORAL_ADDRESS is set, else a stack running in MNEMOFLOW_DATA_DIR)",
    )


def _backfill_lines(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.ops.inspect import backfill_lines

    return _show(asyncio.run(backfill_lines(_targeted(args, settings))))


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    _target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    _dev_arguments(parser)
    parser.add_argument(
        "--out", default="demo-output/demo.json", help="where to write the JSON summary"
    )


def _with_data_dir(settings: Settings, data_dir: str | None) -> Settings:
    if not data_dir:
        return settings
    from pathlib import Path

    mnemoflow = settings.mnemoflow.model_copy(update={"data_dir": Path(data_dir)})
    return settings.model_copy(update={"mnemoflow": mnemoflow})


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from mnemoflow.devstack.demo import run_demo
    from mnemoflow.devstack.embedded import DevPorts

    ports = DevPorts(args.temporal_port, args.ui_port, args.redis_port, args.milvus_port)
    settings = _with_data_dir(settings, args.data_dir)
    return asyncio.run(run_demo(settings, Path(args.out), ports))


def _show(report: dict[str, Any], render: Callable[[dict[str, Any]], str] | None = None) -> int:
    """A report as JSON (always, when there is no text form) or rendered for a person."""
    import json

    text = render(report) if render else json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    return 0


def _inspect(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.ops.inspect import inspect_user, render

    report = asyncio.run(inspect_user(_targeted(args, settings), args.user))
    return _show(report, None if args.json else render)


def _forget_arguments(parser: argparse.ArgumentParser) -> None:
    _target_arguments(parser)
    parser.add_argument("--reason", default="operator request", help="kept in the receipt")


def _forget(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.ops.inspect import forget_user

    return _show(asyncio.run(forget_user(_targeted(args, settings), args.user, args.reason)))


def _codec_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default: MNEMOFLOW_CODEC_HOST)")
    parser.add_argument("--port", type=int, help="port (default: MNEMOFLOW_CODEC_PORT)")


def _codec_server(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.worker.codec_server import serve_codec

    encryption = settings.temporal.encryption
    host, port = args.host or encryption.codec_host, args.port or encryption.codec_port
    try:
        return asyncio.run(serve_codec(settings.temporal, host, port))
    except ValueError as err:
        print(f"mnemoflow codec-server: {err}", file=sys.stderr)
        return 2


def _rounds_arguments(parser: argparse.ArgumentParser) -> None:
    _inspect_arguments(parser)
    parser.add_argument("--failed", action="store_true", help="only the failed rounds")


def _rounds(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.ops.inspect import rounds_report
    from mnemoflow.ops.operations import render_rounds

    report = asyncio.run(rounds_report(_targeted(args, settings), args.user, args.failed))
    return _show(report, None if args.json else render_rounds)


def _retry_arguments(parser: argparse.ArgumentParser) -> None:
    _target_arguments(parser)
    parser.add_argument("event_id", metavar="EVENT_ID", help="the failed round's event id")


def _retry(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from temporalio.client import WorkflowUpdateFailedError

    from mnemoflow.ops.inspect import retry

    try:
        result = asyncio.run(retry(_targeted(args, settings), args.user, args.event_id))
    except (WorkflowUpdateFailedError, ValueError) as err:
        cause = err.cause if isinstance(err, WorkflowUpdateFailedError) else err
        print(f"mnemoflow retry: {cause}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0 if result["scheduled"] else 1


def _user_key(args: argparse.Namespace, settings: Settings) -> int:
    from mnemoflow.models.ids import search_user_value

    print(search_user_value(args.user, settings.user_key_secret()))
    return 0


def _replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="`temporal workflow show --output json` file")
    parser.add_argument("--workflow-id", default="", help="the id the history was recorded under")


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from temporalio.workflow import NondeterminismError

    from mnemoflow.ops.replay import replay_file

    try:
        print(asyncio.run(replay_file(settings, Path(args.file), args.workflow_id)))
    except (NondeterminismError, ValueError, OSError) as err:
        print(f"mnemoflow replay: {err}", file=sys.stderr)
        return 1
    return 0


COMMANDS: dict[str, Command] = {
    "dev": Command(
        "run the embedded stack (Temporal dev server + UI, Redis, Milvus Lite, a worker)",
        _dev,
        _dev_arguments,
    ),
    "worker": Command("run a worker against the configured services", _worker),
    "demo": Command(
        "play the scripted customer-service story on the embedded stack", _demo, _demo_arguments
    ),
    "inspect": Command(
        "show a user's profile, fragments, rounds and costs", _inspect, _inspect_arguments
    ),
    "forget": Command("forget everything about a user", _forget, _forget_arguments),
    "rounds": Command("list a user's rounds (Temporal visibility)", _rounds, _rounds_arguments),
    "retry": Command("re-run a user's failed round", _retry, _retry_arguments),
    "replay": Command("replay a recorded history against this code", _replay, _replay_arguments),
    "backfill-lines": Command(
        "write the line rows of fragments stored before the line collection (the per-call "
        "search finds only those), and delete fragment copies an older version kept in Redis",
        _backfill_lines,
        _backfill_arguments,
    ),
    "user-key": Command("print a user's MnemoflowUser search value", _user_key, _user_argument),
    "codec-server": Command(
        "serve the payload codec (bearer token, CORS) so the Temporal UI and CLI show plaintext",
        _codec_server,
        _codec_server_arguments,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subparser per entry of COMMANDS."""
    parser = argparse.ArgumentParser(
        prog="mnemoflow", description="Durable long-term memory for LangChain agents."
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="DEBUG for mnemoflow's own loggers (libraries stay at INFO: theirs quote payloads)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.arguments(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_problems(err: ValueError) -> list[str]:
    """A settings error as one line per problem, each naming its environment variable; the
    values given are never repeated (a URL or a key may be among them)."""
    if not isinstance(err, ValidationError):
        return [_one_line(str(err))]
    from mnemoflow.worker.settings import SECTIONS

    prefixes = {cls.__name__: str(cls.model_config.get("env_prefix", "")) for _, cls in SECTIONS}
    problems = []
    for error in err.errors(include_url=False, include_input=False, include_context=False):
        message = error["msg"].removeprefix("Value error, ")
        loc = "_".join(str(part) for part in error["loc"])
        name = f"{prefixes.get(err.title, '')}{loc.upper()}" if loc else ""
        problems.append(_one_line(f"{name}: {message}" if name else message))
    return problems


def _service_problem(err: Exception, settings: Settings) -> str:
    """What went wrong talking to the services, in one line that names the service and what
    to check."""
    from pymilvus import MilvusException
    from redis.exceptions import RedisError
    from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
    from temporalio.service import RPCError

    from mnemoflow.models.errors import MemoryUnavailableError
    from mnemoflow.worker.redact import masked

    t = settings.temporal
    where = f"Temporal at {t.address} (namespace {t.namespace})"
    text = _one_line(str(err), 300)
    if isinstance(err, RuntimeError) and text.startswith("Failed client connect"):
        reason = re.search(r'message: "([^"]+)"', text)
        cause = reason.group(1) if reason else text.removeprefix("Failed client connect: ")
        return (
            f"cannot connect to {where}: {cause}. Check that Temporal runs there (or start "
            "`mnemoflow dev`), that TEMPORAL_ADDRESS or --data-dir points at it, and the TLS "
            "and API key settings"
        )
    if isinstance(err, WorkflowUpdateRPCTimeoutOrCancelledError):
        return (
            f"the user's memory workflow did not answer in time on {where}: check that a "
            f"mnemoflow worker polls task queue {t.task_queue!r} and can reach Milvus and Redis"
        )
    if isinstance(err, MemoryUnavailableError):
        return (
            f"memory unavailable: {text} (check that a mnemoflow worker polls task queue "
            f"{t.task_queue!r} on {where}, and that Milvus and Redis answer)"
        )
    if isinstance(err, RPCError):
        return f"{where} refused the request: {err.status.name}: {_one_line(err.message, 300)}"
    if isinstance(err, TimeoutError):
        return f"timed out waiting for {where}, Milvus or Redis: {text or 'no answer'}"
    if isinstance(err, MilvusException):
        return f"Milvus at {masked(settings.milvus.uri)} failed: {text}"
    if isinstance(err, RedisError):
        return f"Redis at {masked(settings.redis.url)} failed: {text}"
    return f"{type(err).__name__}: {text} (run with -v for the traceback)"


#: Loggers `-v` turns to DEBUG: mnemoflow's own, whose lines carry counts, ids and error
#: types, never message text (docs/PRIVACY.md, "logs").
VERBOSE_LOGGERS = ("mnemoflow",)


def configure_logging(verbose: bool) -> None:
    """INFO for everything; with `verbose`, DEBUG for mnemoflow's own loggers only.

    Libraries stay at INFO whatever `-v` says: their DEBUG output quotes payloads (the
    Temporal SDK logs each activity completion with its result, which without encryption keys
    is the conversation in plain JSON; HTTP clients log request bodies sent to the LLM). URL
    credentials are masked in every line (`worker.redact.LogRedactor`).
    """
    from mnemoflow.worker.redact import redact_logs

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if verbose:
        for name in VERBOSE_LOGGERS:
            logging.getLogger(name).setLevel(logging.DEBUG)
        logging.getLogger("mnemoflow").debug(
            "verbose: DEBUG for %s; libraries at INFO (their DEBUG lines quote payloads)",
            ", ".join(VERBOSE_LOGGERS),
        )
    redact_logs()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, read the settings once, run the command; returns its exit code.

    Without `argv` this is the program itself (the `mnemoflow` script, `python -m`): it then
    never returns but ends the process with that code (`exit_without_finalising`), so the
    exit status is the command's own, never a crash of the interpreter's finalisation.
    """
    code = _main(argv)
    if argv is None:
        exit_without_finalising(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        settings = Settings.load()
    except ValueError as err:  # pydantic's ValidationError included
        for problem in config_problems(err):
            print(f"mnemoflow: invalid configuration: {problem}", file=sys.stderr)
        return 2
    from mnemoflow.ops.target import NoTargetError

    try:
        return COMMANDS[args.command].handler(args, settings)
    except NoTargetError as err:
        print(f"mnemoflow {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if args.verbose:
            logging.getLogger("mnemoflow").exception("mnemoflow %s failed", args.command)
        problem = _service_problem(err, getattr(args, "target", settings))
        print(f"mnemoflow {args.command}: {problem}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
