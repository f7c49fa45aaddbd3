"""Command line: `streamd decode|serve|admin|transcribe|listen ...`. Parsing and dispatch only."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from streamd.errors import StreamdError


def _context(text: str) -> tuple[int, int]:
    try:
        left, right = (int(v) for v in text.replace("[", "").replace("]", "").split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected L,R (e.g. 70,13), got {text!r}") from e
    return left, right


def _add_decode(sub: argparse._SubParsersAction) -> None:
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

    decode_files(args.files, DecodeOptions(args.model, args.att_context_size, args.streaming,
                                           args.device, args.dtype, args.batch))
    return 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from streamd.config import add_arguments

    p = sub.add_parser("serve", help="run the daemon (websocket API, health, metrics)")
    add_arguments(p)


def _run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from streamd import log as logsetup
    from streamd.config import load_config
    from streamd.server.app import App, build_state
    from streamd.server.metrics import Metrics

    cfg = load_config(args)
    logsetup.configure(cfg.log.level, cfg.log.format)
    app = App(build_state(cfg, Metrics()))
    asyncio.run(app.serve())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamd", description="Real-time streaming speech recognition.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_decode(sub)
    _add_serve(sub)
    return parser


COMMANDS = {"decode": _run_decode, "serve": _run_serve}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError, StreamdError) as e:
        print(f"streamd {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
