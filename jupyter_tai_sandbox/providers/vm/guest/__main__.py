"""``python -m jupyter_tai_sandbox.providers.vm.guest build | probe [--fresh]``: build (or find) the guest and print its
folder; say whether KVM works here and what TCG is."""

from __future__ import annotations

import asyncio
import sys

from .build import GuestBuildError, build_guest
from .probe import probe


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("build", "probe") or any(a not in ("--fresh",) for a in argv[1:]):
        print(
            "usage: python -m jupyter_tai_sandbox.providers.vm.guest build | probe [--fresh]", file=sys.stderr
        )
        return 64
    try:
        guest = build_guest()
    except GuestBuildError as e:
        print(f"vm: {e}", file=sys.stderr)
        return 1
    if argv[0] == "build":
        print(guest.path)
        return 0
    result = asyncio.run(probe(guest, fresh="--fresh" in argv[1:]))
    print("\n".join(result["lines"]))
    return 0


sys.exit(main(sys.argv[1:]))
