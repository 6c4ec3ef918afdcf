"""Command-line parsing for starters: one-line errors, and no kernel argv.

Every starter runs two ways: as a script (``python forward_noise.py --seed 1``)
and as a notebook page that the site executes at build time. Inside a Jupyter
kernel ``sys.argv`` holds the kernel's own flags (``-f connection.json``), which
must not reach the lab's parser, so there the defaults are used.

Bad input gets ``<prog>: error: <message>`` on one line and exit code 2 (the
argparse convention), never a usage dump or a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path


class LabArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def in_notebook() -> bool:
    """True inside a Jupyter kernel, or in the build's notebook executor, which stands in for one."""
    return "ipykernel" in sys.modules


#: NumPy's generators take seeds in [0, 2**32) from a legacy ``RandomState`` caller, and any
#: non-negative integer from ``default_rng``; one range for every starter.
MAX_SEED = 2**32 - 1


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None):
    """Parse ``argv`` (default: the command line, or nothing inside a kernel), then check the
    flags every starter shares, each a one-line error: ``--seed`` in [0, 2**32), and
    ``--figures DIR`` a folder that exists or can be made (made here, before any work)."""
    if argv is None:
        argv = [] if in_notebook() else sys.argv[1:]
    args = parser.parse_args(list(argv))
    seed = getattr(args, "seed", None)
    if isinstance(seed, int) and not 0 <= seed <= MAX_SEED:
        parser.error(f"--seed must be an integer in [0, {MAX_SEED}], got {seed}")
    folder = getattr(args, "figures", None)
    if folder is not None:
        if not folder.strip():
            parser.error("--figures needs a folder name, got ''")
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--figures {folder}: cannot make that folder ({err.strerror})")
    return args


def int_at_least(minimum: int, maximum: int = 100_000):
    """argparse ``type=`` for an integer in [``minimum``, ``maximum``]: a size or a count a
    toy run can hold in memory and finish (a starter passes a tighter ``maximum`` where its
    arrays grow faster than the value)."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return convert


def int_list(text: str) -> list[int]:
    """argparse ``type=`` for a comma-separated list of integers, e.g. ``0,250,999``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def float_list(minimum: float):
    """argparse ``type=`` for comma-separated numbers >= ``minimum``, e.g. ``1,3,7.5``."""

    def convert(text: str) -> list[float]:
        try:
            values = [float(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated numbers, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one number")
        if not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"values must be finite, got {text!r}")
        if min(values) < minimum:
            raise argparse.ArgumentTypeError(f"values must be >= {minimum:g}, got {text!r}")
        return values

    return convert


def add_pipeline_arguments(parser: argparse.ArgumentParser, guidance_help: str) -> None:
    """``--guidance-scale``, ``--steps`` and ``--num-samples`` of the toy text-to-image
    pipeline (Labs 12 and 17); :func:`check_pipeline_arguments` bounds them once parsed."""
    parser.add_argument("--guidance-scale", type=float, default=7.5, help=guidance_help)
    parser.add_argument("--steps", type=int_at_least(1), default=20, help="num_inference_steps")
    parser.add_argument("--num-samples", type=int_at_least(1), default=8, help="batch size B")


def check_pipeline_arguments(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    max_steps: int = 1000,
    why: str = "num_train_timesteps",
) -> None:
    """The bounds of :func:`add_pipeline_arguments`' values, each a one-line error: a finite
    guidance scale >= 0, at most ``max_steps`` steps (num_train_timesteps, 1000, unless the
    starter's grid reaches past it sooner: ``why`` says so), at most 512 samples."""
    if not 0.0 <= args.guidance_scale < math.inf:
        parser.error(f"--guidance-scale must be a finite number >= 0, got {args.guidance_scale:g}")
    if args.steps > max_steps:
        parser.error(f"--steps must be <= {max_steps} ({why}), got {args.steps}")
    if args.num_samples > 512:
        parser.error(f"--num-samples must be <= 512, got {args.num_samples}")


def add_figures_argument(parser: argparse.ArgumentParser) -> None:
    """``--figures DIR``: also write the lab's figures there (the site build uses it)."""
    parser.add_argument(
        "--figures",
        metavar="DIR",
        default=None,
        help="also write this lab's figures (SVG charts, PNG images) into DIR",
    )
