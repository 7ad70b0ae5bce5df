"""``jupyter tai-sandbox``: command-line helpers for the sandbox extension."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .image import DEFAULT_IMAGE, ImageBuildError, build_minimal_image


def _build_image(args: argparse.Namespace) -> int:
    try:
        image_id = build_minimal_image(args.name, base_url=args.base_url)
    except ImageBuildError as e:
        print(f"build-image: {e}", file=sys.stderr)
        return 1
    print(f"built {args.name} ({image_id[:19]})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter tai-sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build-image",
        help="build the minimal session image offline from Debian's busybox-static (no registry needed)",
    )
    build.add_argument("--name", default=DEFAULT_IMAGE, help=f"image name (default: {DEFAULT_IMAGE})")
    build.add_argument("--base-url", default=None, help="Docker engine URL (default: $DOCKER_HOST or the unix socket)")
    build.set_defaults(run=_build_image)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
