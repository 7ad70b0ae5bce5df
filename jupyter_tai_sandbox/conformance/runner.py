"""Running the suite: the check names and their order, a run's strength, the verdict, the CLI."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from ..contract import Sandbox
from .base import FULL_STRENGTH, MAX_CERTIFYING_TIMEOUT_SCALE, NOT_A_CERTIFICATION
from .suite import CHECK_MIXINS, ConformanceSuite


def check_names() -> list[str]:
    """Every check of the suite, by name, in the order a run takes them.

    The order is :data:`~.suite.CHECK_MIXINS` (the mixins in suite order), and within
    each mixin the order its ``check_`` methods are defined in its class body.
    """
    return [
        name.removeprefix("check_")
        for mixin in CHECK_MIXINS
        for name in vars(mixin)
        if name.startswith("check_")
    ]


def check_doc(name: str) -> str:
    """The one-line description of a check."""
    doc = getattr(ConformanceSuite, f"check_{name}").__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else name.replace("_", " ")


def selected_checks(only: list[str] | None) -> list[str]:
    """The checks ``only`` names, in suite order; ValueError for an unknown name or an empty selection."""
    every = check_names()
    if only is None:
        return every
    if isinstance(only, str):
        raise ValueError(f"only must be a list of check names, not the string {only!r}")
    unknown = [name for name in only if name not in every]
    if unknown:
        raise ValueError(f"unknown conformance check(s) {unknown}; the checks are: {', '.join(every)}")
    if not only:
        raise ValueError("only=[] selects no check: pass None to run them all")
    return [name for name in every if name in only]


def weakenings(*, timeout_scale: float = 1.0, **options: Any) -> list[str]:
    """What about these options makes a run weaker than a certification asks (empty: full strength).

    ValueError for an option the suite cannot run with at all.
    """
    if not (isinstance(timeout_scale, (int, float)) and math.isfinite(timeout_scale) and timeout_scale > 0):
        raise ValueError(f"timeout_scale must be a finite number > 0, not {timeout_scale!r}")
    found = []
    if timeout_scale > MAX_CERTIFYING_TIMEOUT_SCALE:
        found.append(
            f"timeout_scale={timeout_scale:g} stretches the deadlines past the certifying "
            f"{MAX_CERTIFYING_TIMEOUT_SCALE:g}"
        )
    for option, full in FULL_STRENGTH.items():
        value = options.get(option, full)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{option} must be a positive int, not {value!r}")
        if value < full:
            found.append(f"{option}={value} is below the full-strength {full}")
    return found


async def run_checks(
    sandbox: Sandbox,
    names: list[str],
    *,
    image: str | None = None,
    timeout_scale: float = 1.0,
    **options: Any,
) -> list[str]:
    """Run the named checks against ``sandbox``; return their failures.

    A building block (the pytest face runs one check at a time with it): an
    empty return says these checks passed, and certifies nothing. Use
    :func:`run_sandbox_conformance` to certify a provider.
    """
    names = selected_checks(names)
    weakenings(timeout_scale=timeout_scale, **options)  # raises for options the suite cannot use
    suite = ConformanceSuite(sandbox, image=image, timeout_scale=timeout_scale, **options)
    return await suite.run(names)


async def run_sandbox_conformance(
    sandbox: Sandbox,
    *,
    image: str | None = None,
    timeout_scale: float = 1.0,
    only: list[str] | None = None,
    **options: Any,
) -> list[str]:
    """Run every check against ``sandbox``; return the failures (empty certifies it).

    ``image``: the session image to ask for (None: the provider's default).
    ``timeout_scale`` stretches every deadline and wait for a slow provider
    (up to ``MAX_CERTIFYING_TIMEOUT_SCALE`` a run still certifies).
    ``only`` runs a subset of the checks, by name (``lifecycle``, ``ttl_reap``...;
    see :func:`check_names`); an unknown name raises ValueError. A subset, or
    ``big_stdin_bytes``/``big_output_bytes`` below full strength, or a larger
    ``timeout_scale``, is no certification: the list then ends with entries
    starting ``"not a certification: "``, so it is never empty.
    """
    names = selected_checks(only)
    notices = [f"{NOT_A_CERTIFICATION}: {w}" for w in weakenings(timeout_scale=timeout_scale, **options)]
    if len(names) < len(check_names()):
        notices.append(
            f"{NOT_A_CERTIFICATION}: only {len(names)} of the {len(check_names())} checks ran ({', '.join(names)})"
        )
    failures = await run_checks(sandbox, names, image=image, timeout_scale=timeout_scale, **options)
    return failures + notices


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_tai_sandbox.conformance PROVIDER``: certify a provider, print the verdict.

    Exit status: 0 certified, 1 a check failed, 2 the checks run passed but the
    run was no certification (``--only``, a large ``--timeout-scale``) or the
    arguments were wrong.
    """
    import argparse

    from ..sandboxes import load_provider_class

    parser = argparse.ArgumentParser(
        prog="python -m jupyter_tai_sandbox.conformance",
        description="Run the sandbox conformance suite against a provider and print what failed. "
        "Exit status 0: certified; 1: a check failed; 2: the checks run passed but the run "
        "certifies nothing (a subset, or deadlines stretched too far).",
    )
    parser.add_argument("provider", help="local, docker, or module:Class")
    parser.add_argument("--image", help="session image to ask for (default: the provider's)")
    parser.add_argument(
        "--timeout-scale",
        type=float,
        default=1.0,
        help=f"stretch every deadline (above {MAX_CERTIFYING_TIMEOUT_SCALE:g} the run certifies nothing)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=check_names(),
        metavar="CHECK",
        help="run only this check (repeatable; the run then certifies nothing): " + ", ".join(check_names()),
    )
    args = parser.parse_args(argv)
    try:
        weakenings(timeout_scale=args.timeout_scale)
    except ValueError as e:
        parser.error(str(e))
    provider = load_provider_class(args.provider)()

    async def certify() -> list[str]:
        try:
            return await run_sandbox_conformance(
                provider, image=args.image, timeout_scale=args.timeout_scale, only=args.only
            )
        finally:
            await provider.close()

    started = time.monotonic()
    entries = asyncio.run(certify())
    failures = [e for e in entries if not e.startswith(f"{NOT_A_CERTIFICATION}:")]
    notices = [e for e in entries if e.startswith(f"{NOT_A_CERTIFICATION}:")]
    for failure in failures:
        print(f"FAIL {failure}")
    for notice in notices:
        print(f"NOTE {notice}")
    took = f"in {time.monotonic() - started:.1f}s"
    if failures:
        print(f"{provider.kind}: {len(failures)} check(s) failed {took}")
        return 1
    if notices:
        print(f"{provider.kind}: the checks run passed {took}, but this run is {NOT_A_CERTIFICATION}")
        return 2
    print(f"{provider.kind}: certified {took}")
    return 0
