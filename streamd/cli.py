"""Command line: `streamd decode|serve|admin|transcribe|listen ...`. Parsing and dispatch only."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from streamd.errors import EngineDied, StreamdError


def _context(text: str) -> tuple[int, int]:
    try:
        left, right = (int(v) for v in text.replace("[", "").replace("]", "").split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected L,R (e.g. 70,13), got {text!r}") from e
    return left, right


def _add_decode(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("decode", help="transcribe audio files with the model, no server (JSON lines)")
    p.add_argument("files", nargs="+", help="audio files (WAV/FLAC/OGG, any rate, mixed to mono)")
    p.add_argument("--model", help="a .nemo file or streamd checkpoint (default: the shipped model)")
    p.add_argument("--att-context-size", type=_context, help="left,right attention context, e.g. 70,13")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--streaming", dest="streaming", action="store_true", default=True,
                      help="chunked cache-aware streaming (default)")
    mode.add_argument("--offline", dest="streaming", action="store_false", help="one full pass")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (torch names accepted)")
    p.add_argument("--batch", type=int, default=16, help="files decoded together")


def _run_decode(args: argparse.Namespace) -> int:
    from streamd.decode import DecodeOptions, decode_files

    failed = decode_files(args.files, DecodeOptions(args.model, args.att_context_size, args.streaming,
                                                    args.device, args.dtype, args.batch))
    return 1 if failed else 0


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from streamd.config import add_arguments

    p = sub.add_parser("serve", help="run the daemon (websocket API, health, metrics)")
    add_arguments(p)


def _run_serve(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from streamd import log as logsetup
    from streamd.config import load_config
    from streamd.server.app import App, build_state
    from streamd.server.metrics import Metrics
    from streamd.server.ports import check_listeners

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload while starting is ignored, never fatal
    cfg = load_config(args)
    logsetup.configure(cfg.log.level, cfg.log.format, access=cfg.log.access)
    check_listeners(cfg)  # before the model loads
    app = App(build_state(cfg, Metrics()), reread=lambda: load_config(args))
    asyncio.run(app.serve())
    return 0


def _add_admin(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from streamd.config import default_admin_socket

    def connection(parser: argparse.ArgumentParser, defaults: bool) -> None:
        """Where the daemon is and how to print its answer: given before the command or after it
        (`streamd admin --json status` or `streamd admin status --json`); after it, an option only
        overrides (its default is set once, before)."""
        def default(value: object) -> object:
            return value if defaults else argparse.SUPPRESS
        path = str(default_admin_socket(os.environ))
        parser.add_argument("--socket", default=default(path), help=f"admin unix socket (default: {path})")
        parser.add_argument("--url", default=default(None), help="admin TCP endpoint http://HOST:PORT instead of the socket")
        parser.add_argument("--token-file", default=default(None), help="file with the bearer token (with --url)")
        parser.add_argument("--json", action="store_true", default=default(False), help="print the full JSON answer")

    p = sub.add_parser("admin", help="control a running daemon (status, migrate, drain, undrain)")
    connection(p, defaults=True)
    cmds = p.add_subparsers(dest="admin_command", required=True)
    s = cmds.add_parser("status", help="device, dtype, streams, capacity, encoder and decoder modes, last migration")
    d = cmds.add_parser("drain", help="stop taking new streams; live ones continue")
    d.add_argument("--handoff", action="store_true",
                   help="also end every live stream now (close 1012) so that its client resumes it on another daemon")
    d.add_argument("--exit", action="store_true",
                   help="exit (status 0) when the last stream has ended; without it the daemon stays up, draining")
    u = cmds.add_parser("undrain", help="take new streams again after a drain (/readyz back to 200)")
    m = cmds.add_parser("migrate", help="move the serving model to another device and/or dtype")
    m.add_argument("--device", help="cpu, cuda, cuda:N (default: unchanged)")
    m.add_argument("--dtype", help="fp32, bf16, fp16 (default: unchanged)")
    for command in (s, d, u, m):
        connection(command, defaults=False)


def _run_admin(args: argparse.Namespace) -> int:
    from streamd.admin_client import AdminError, run

    if args.admin_command == "migrate" and not (args.device or args.dtype):
        raise ValueError("migrate needs --device, --dtype or both, e.g. `streamd admin migrate --device cuda:1`")
    try:
        return run(args.admin_command, args)
    except AdminError as e:
        print(f"streamd admin: {e}", file=sys.stderr)
        return 1


def _add_transcribe(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from streamd.clients.common import DEFAULT_URL
    from streamd.clients.output import FORMATS

    p = sub.add_parser("transcribe", help="transcribe audio files through a running daemon")
    p.add_argument("files", nargs="+", help="audio files (WAV/FLAC/OGG, any rate and channel count)")
    p.add_argument("--url", default=DEFAULT_URL, help="the daemon, ws://HOST:PORT or wss://... (default: %(default)s)")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format; text: one line per utterance (default: %(default)s)")
    p.add_argument("--realtime", action="store_true",
                   help="send the audio in real time, like a live source (default: as fast as the daemon takes it)")
    p.add_argument("--jobs", type=int, default=4, help="files streamed concurrently (default: %(default)s)")
    p.add_argument("--output-dir", help="write DIR/NAME.txt|jsonl|srt|vtt per file instead of printing")
    p.add_argument("--cafile", help="PEM file of the CA (or self-signed certificate) to trust for wss://")
    p.add_argument("--token-file", help="file with the bearer token, for a daemon that requires one")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")


def _run_transcribe(args: argparse.Namespace) -> int:
    from streamd.clients import file

    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    return file.run(args)


def _add_listen(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from streamd.clients.common import DEFAULT_URL

    p = sub.add_parser("listen", help="transcribe the microphone live through a running daemon")
    p.add_argument("--url", default=DEFAULT_URL, help="the daemon, ws://HOST:PORT or wss://... (default: %(default)s)")
    p.add_argument("--device", help="input device: index or part of its name (default: the system's)")
    p.add_argument("--list-devices", action="store_true", help="list input devices and exit")
    p.add_argument("--rate", type=int, help="capture rate in Hz (default: the device's native rate)")
    p.add_argument("--cafile", help="PEM file of the CA (or self-signed certificate) to trust for wss://")
    p.add_argument("--token-file", help="file with the bearer token, for a daemon that requires one")


def _run_listen(args: argparse.Namespace) -> int:
    from streamd.clients import mic

    return mic.run(args)


def _version() -> str:
    """The installed distribution's version (pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("streamd")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamd", description="Real-time streaming speech recognition.")
    parser.add_argument("--version", action="version", version=f"streamd {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_decode(sub)
    _add_serve(sub)
    _add_admin(sub)
    _add_transcribe(sub)
    _add_listen(sub)
    return parser


COMMANDS = {"decode": _run_decode, "serve": _run_serve, "admin": _run_admin,
            "transcribe": _run_transcribe, "listen": _run_listen}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, OSError, StreamdError, EngineDied) as e:  # a file, a port, a device: one line, no traceback
        print(f"streamd {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
