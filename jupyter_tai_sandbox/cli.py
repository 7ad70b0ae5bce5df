"""``jupyter tai-sandbox``: command-line helpers for the sandbox extension."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .contract import SandboxError
from .contract.durations import duration_type
from .images import AGENTS_IMAGE, DEFAULT_IMAGE, PYTHON_IMAGE
from .providers.docker.images.agents import DEFAULT_AGENT_PACKAGES
from .providers.docker.images.build import ImageBuildError, ensure_minimal_image
from .server_config import load_server_config

#: `preset run` exit status when the run itself failed (as `docker run` does), not the command
RUN_FAILED = 125


def _build_image(args: argparse.Namespace) -> int:
    if args.python and args.agents:
        print(
            "build-image: --agents builds on the Python image's Debian base already: give --python or --agents",
            file=sys.stderr,
        )
        return 2
    if args.npm and not args.agents:
        print("build-image: --npm adds packages to the agents image: add --agents", file=sys.stderr)
        return 2
    if args.pip and not (args.python or args.agents):
        print(
            "build-image: --pip adds packages to the Python image: add --python (or --agents for the agents image)",
            file=sys.stderr,
        )
        return 2
    if args.python:
        return _build_python_image(args)
    if args.agents:
        return _build_agents_image(args)
    name = args.name or DEFAULT_IMAGE
    try:
        image_id, imported = ensure_minimal_image(name, base_url=args.base_url, force=args.force)
    except ImageBuildError as e:
        print(f"build-image: {e}", file=sys.stderr)
        return 1
    if imported:
        print(f"built {name} ({image_id[:19]})")
    else:
        print(f"{name} ({image_id[:19]}) is up to date: kept (--force rebuilds it)")
    return 0


def _build_python_image(args: argparse.Namespace) -> int:
    from .images import PYTHON_IMAGE
    from .providers.docker.images.build import build_python_image
    from .providers.docker.images.packages import build_with_packages

    def progress(line: str) -> None:
        print(line, flush=True)

    options = {
        "suite": args.suite,
        "mirror": args.mirror,
        "force": args.force,
        "progress": progress,
        "base_url": args.base_url,
    }
    try:
        if args.pip:
            build_with_packages(args.name or PYTHON_IMAGE, args.pip, **options)
        else:
            build_python_image(args.name or PYTHON_IMAGE, **options)
    except ImageBuildError as e:
        print(f"build-image --python: {e}", file=sys.stderr)
        return 1
    return 0


def _build_agents_image(args: argparse.Namespace) -> int:
    from .providers.docker.images.agents import build_agents_image

    def progress(line: str) -> None:
        print(line, flush=True)

    try:
        build_agents_image(
            args.name or AGENTS_IMAGE,
            args.npm or (),
            args.pip or (),
            suite=args.suite,
            mirror=args.mirror,
            force=args.force,
            progress=progress,
            base_url=args.base_url,
        )
    except ImageBuildError as e:
        print(f"build-image --agents: {e}", file=sys.stderr)
        return 1
    return 0


def _kernelspec_install(args: argparse.Namespace) -> int:
    from .kernels import kernelspecs

    folder = kernelspecs.install(
        args.name,
        user=args.user,
        prefix=args.prefix,
        display_name=args.display_name,
        image=args.image,
        network=args.network,
        workspace_key=args.persistent,
        cpu=args.cpu,
        memory_mb=args.memory,
        ttl_seconds=args.ttl,
        isolation=args.isolation,
        provider=args.provider,
        egress_allow=args.egress_allow,
        egress_deny=args.egress_deny,
    )
    print(f"installed kernelspec {args.name} ({args.display_name}) in {folder}")
    if args.provider == "local" and args.image != kernelspecs.PYTHON_IMAGE:
        print(f"warning: --image {args.image} has no effect on the local provider (kernels run on this host)",
              file=sys.stderr)  # fmt: skip
    return 0


def _kernelspec_list(args: argparse.Namespace) -> int:
    from .kernels import kernelspecs

    specs = kernelspecs.list_specs()
    if args.json:
        print(json.dumps(specs, indent=2))
        return 0
    if not specs:
        print("no sandboxed kernelspecs (install one: jupyter tai-sandbox kernelspec install)")
    for name, entry in specs.items():
        spec = entry["spec"]
        config = spec["metadata"]["kernel_provisioner"].get("config", {})
        settings = " ".join(f"{k}={v}" for k, v in sorted(config.items()))
        print(f"{name:<24} {spec['display_name']!r} {settings}  [{entry['resource_dir']}]")
    return 0


def _kernelspec_remove(args: argparse.Namespace) -> int:
    from .kernels import kernelspecs

    for name in args.names:
        folder = kernelspecs.remove(name)
        print(f"removed kernelspec {name} ({folder})")
    return 0


def _kernelspec_door(handler: Any) -> Any:
    def door(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except (SandboxError, ValueError, KeyError, OSError) as e:
            message = e.args[0] if isinstance(e, KeyError) and e.args else e
            print(f"kernelspec {args.kernelspec_command}: {message}", file=sys.stderr)
            return 1

    return door


def _add_kernelspec_commands(commands: Any) -> None:
    from .images import PYTHON_IMAGE
    from .kernels.kernelspecs import DEFAULT_DISPLAY_NAME, DEFAULT_NAME, NETWORKS

    kernelspec = commands.add_parser(
        "kernelspec",
        help="install, list and remove kernelspecs of sandboxed kernels (the kernel runs in a session)",
        description="""A sandboxed kernel runs ipykernel inside a sandbox session created through the
        server's policy; its ZMQ ports are forwarded over the exec seam. Pick it in JupyterLab's launcher.
        On the local provider the kernel runs with the server's own Python on the host: not isolated.""",
    )
    sub = kernelspec.add_subparsers(dest="kernelspec_command", required=True)
    install = sub.add_parser("install", help="write a sandboxed kernelspec")
    install.add_argument(
        "--name", default=DEFAULT_NAME, help=f"the kernelspec's name (default: {DEFAULT_NAME})"
    )
    install.add_argument(
        "--display-name",
        default=DEFAULT_DISPLAY_NAME,
        help=f"shown in the launcher (default: {DEFAULT_DISPLAY_NAME!r})",
    )
    install.add_argument(
        "--image",
        default=PYTHON_IMAGE,
        help=f"the session image; it needs python3 and ipykernel (default: {PYTHON_IMAGE}; the local provider ignores it)",
    )
    install.add_argument(
        "--network",
        choices=NETWORKS,
        default="auto",
        help="the session's network; auto (default): none where the provider can, else egress (local)",
    )
    install.add_argument(
        "--persistent", metavar="KEY", default=None, help="keep the workspace in volume KEY across restarts"
    )
    install.add_argument("--cpu", type=float, default=None, help="CPUs for the session (docker)")
    install.add_argument("--memory", type=int, metavar="MB", default=None, help="memory cap in MiB (docker)")
    install.add_argument(
        "--ttl",
        type=duration_type("--ttl"),
        metavar="DURATION",
        default=None,
        help="the kernel's life, its session's TTL and its commands' deadline: seconds or 30m, 8h, 1h30m "
        "(default: the longest the policy "
        "allows, the lower of SandboxPolicy.max_ttl_seconds and max_timeout_seconds; past either the start is refused)",
    )
    install.add_argument(
        "--isolation",
        choices=("none", "container", "vm"),
        default=None,
        help="ask for at least this isolation",
    )
    install.add_argument(
        "--egress-allow",
        action="append",
        metavar="HOST",
        default=None,
        help="reach only this host (repeat; 'example.com', '*.example.com', 'host:port'), through the owner's "
        "egress gateway on network egress; within the operator's SandboxPolicy.egress_rules",
    )
    install.add_argument(
        "--egress-deny",
        action="append",
        metavar="HOST",
        default=None,
        help="never reach this host (repeat), through the owner's egress gateway on network egress",
    )
    install.add_argument(
        "--provider",
        choices=("local", "docker"),
        default=None,
        help="the provider to use where none is configured (nbclient, scripts); a server uses its own",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument(
        "--prefix", default=None, help="install under this prefix (default: this environment's, sys.prefix)"
    )
    install.set_defaults(run=_kernelspec_door(_kernelspec_install))
    listing = sub.add_parser("list", help="list the installed sandboxed kernelspecs")
    listing.add_argument("--json", action="store_true", help="as JSON")
    listing.set_defaults(run=_kernelspec_door(_kernelspec_list))
    remove = sub.add_parser("remove", help="remove sandboxed kernelspecs (others are refused)")
    remove.add_argument("names", nargs="+", metavar="NAME")
    remove.set_defaults(run=_kernelspec_door(_kernelspec_remove))


def _registry(args: argparse.Namespace) -> Any:
    from .tools import PresetStore, ToolRegistry

    config = load_server_config(getattr(args, "config", None))
    app_config = config.get("SandboxApp", {})
    store = args.store or app_config.get("presets_path") or None
    registry = ToolRegistry(PresetStore(store))
    registry.apply_manifest(app_config.get("presets", {}))
    return registry


def _read_json(source: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as e:
        raise SandboxError(f"cannot read {what} {source}: {e}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise SandboxError(f"{what} {source} is not valid JSON: {e}") from None


def _preset_add(args: argparse.Namespace) -> int:
    from .tools import OPERATOR_CLI

    definition = _read_json(args.file, "preset file")
    preset = _registry(args).author(definition, principal=OPERATOR_CLI, name=args.name, replace=args.replace)
    print(f"preset {preset.name} saved in {_registry(args).store.path}")
    return 0


def _preset_list(args: argparse.Namespace) -> int:
    tools = _registry(args).list_json()
    if args.json:
        print(json.dumps(tools, indent=2))
        return 0
    for tool in tools:
        fenced = " [fenced]" if tool["fenced"] else ""
        over = "base tool" if tool["kind"] == "base" else f"preset over {tool['base']}"
        print(f"{tool['name']:<24} {over}{fenced}: {tool['description']}")
    return 0


def _preset_rm(args: argparse.Namespace) -> int:
    from .tools import OPERATOR_CLI

    _registry(args).remove(args.name, principal=OPERATOR_CLI)
    print(f"preset {args.name} removed")
    return 0


def _preset_run(args: argparse.Namespace) -> int:
    from traitlets.config import Configurable

    from . import sandboxes
    from .policy import SandboxPolicy
    from .tools import OPERATOR_CLI

    inputs = _read_json(args.input_file, "input file") if args.input_file else json.loads(args.input)
    # the same config the server reads, so its policy (egress ceiling, credentials...) applies here too
    config = load_server_config(args.config)
    if args.isolation:
        config.SandboxPolicy.isolation = args.isolation
    name = args.provider or config.get("SandboxApp", {}).get("provider") or ""
    if name.strip().lower() not in sandboxes.OFF_VALUES:
        cls = sandboxes.load_provider_class(name.strip())
        provider = cls(config=config) if issubclass(cls, Configurable) else cls()
        limit = config.get("SandboxApp", {}).get(
            "max_output_bytes"
        )  # the server's output limit, when configured
        sandboxes.register_sandbox(
            provider,
            policy=SandboxPolicy(config=config),
            replace=True,
            output_limit=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
        )
    else:
        sandboxes.use_policy(SandboxPolicy(config=config))

    async def run() -> dict[str, Any]:
        try:
            return await _registry(args).run(args.name, inputs, principal=OPERATOR_CLI)
        finally:
            installed = sandboxes.installed()
            if installed is not None:
                await installed.close()
                sandboxes.unregister_sandbox()

    result = asyncio.run(run())
    if args.json or "exit_code" not in result:
        print(json.dumps(result, indent=2))
        return 0
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"])
    return int(result["exit_code"]) & 0xFF


def _preset_door(handler: Any) -> Any:
    def door(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except (SandboxError, ValueError) as e:
            print(f"preset {args.preset_command}: {type(e).__name__}: {e}", file=sys.stderr)
            return RUN_FAILED if args.preset_command == "run" else 1

    return door


def _add_preset_commands(commands: Any) -> None:
    preset = commands.add_parser(
        "preset",
        help="author, list, remove and run code tools (presets over sandbox_exec), as the operator",
        description="""Presets authored here go through the same chokepoint as the REST API and the
        SandboxApp.presets config, and are stored in the same file a server reads (its changes are
        seen without a restart). The CLI acts as the operator: whoever can write the store and run
        the provider is admin, so the jupyter_tai_sandbox:admin fence is passed, not asked.""",
    )
    preset.add_argument(
        "--store",
        default=None,
        help="the preset store (default: SandboxApp.presets_path, else <jupyter data dir>/tai_sandbox/presets.json)",
    )
    preset.add_argument(
        "--config",
        default=None,
        help="a Jupyter config file (.py or .json) read after the server's own jupyter_server_config files",
    )
    sub = preset.add_subparsers(dest="preset_command", required=True)
    add = sub.add_parser("add", help="add a preset from a JSON file ('-' reads stdin)")
    add.add_argument("file")
    add.add_argument("--name", default=None, help="the preset's name (default: the file's 'name')")
    add.add_argument("--replace", action="store_true", help="replace a stored preset of the same name")
    add.set_defaults(run=_preset_door(_preset_add))
    listing = sub.add_parser("list", help="list base tools and stored presets")
    listing.add_argument("--json", action="store_true", help="full definitions as JSON")
    listing.set_defaults(run=_preset_door(_preset_list))
    rm = sub.add_parser("rm", help="remove a stored preset")
    rm.add_argument("name")
    rm.set_defaults(run=_preset_door(_preset_rm))
    run = sub.add_parser(
        "run",
        help="run a tool in this process (the command's stdout/stderr and exit status; 125 if the run failed)",
    )
    run.add_argument("name")
    run.add_argument("--input", default="{}", help="the tool's input as a JSON object (default {})")
    run.add_argument("--input-file", default=None, help="read the input from a JSON file ('-' for stdin)")
    run.add_argument(
        "--provider",
        default=None,
        help="""local, docker, swarm, remote, vm or module:Class (default: SandboxApp.provider from the Jupyter config, else
        TAI_MCP_SANDBOX); the policy is the server's: Jupyter config files, then TAI_MCP_SANDBOX_*""",
    )
    run.add_argument(
        "--isolation",
        choices=("none", "container", "vm"),
        default=None,
        help="the isolation floor for this run (SandboxPolicy.isolation); --provider local needs none",
    )
    run.add_argument("--json", action="store_true", help="print the whole result as JSON")
    run.set_defaults(run=_preset_door(_preset_run))


#: what `serve` says, on one line, when JupyterHub (its service auth) is not installed
HUB_MISSING = 'serve: the sandbox service authenticates with JupyterHub, which is not installed: pip install "jupyter-tai-sandbox[hub]"'


def _serve(args: argparse.Namespace) -> int:
    try:
        import jupyterhub.services.auth  # noqa: F401 - only whether it imports
    except ImportError:
        print(HUB_MISSING, file=sys.stderr)
        return 1
    from .hub import serve

    serve(args.server_options)
    return 0


def _add_serve_command(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the sandbox service for JupyterHub: this extension alone, authenticated by hub tokens",
        description="""A jupyter_server with only this extension, as a JupyterHub (managed) service: it
        binds to JUPYTERHUB_SERVICE_URL under JUPYTERHUB_SERVICE_PREFIX and authenticates every request
        with JupyterHub's service auth (JUPYTERHUB_API_URL, JUPYTERHUB_API_TOKEN): the principal is the hub
        user, admin is the custom:tai-sandbox:admin scope (HubServiceAuthorizer.admin_scope). The server's
        kernels, contents and terminals are refused to everyone. It is the one process that holds the
        container engine; users' servers use SandboxApp.provider=remote. Options after the command are
        jupyter_server's and the extension's (--SandboxApp.provider=docker, --ServerApp.allow_root=True, ...).""",
        usage="jupyter tai-sandbox serve [-h] [--Class.trait=value ...]",
    )
    serve.set_defaults(run=_serve, takes_server_options=True)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``jupyter tai-sandbox`` (the docs' command reference is generated from it)."""
    parser = argparse.ArgumentParser(prog="jupyter tai-sandbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build-image",
        help="""build the minimal session image offline from Debian's busybox-static (no registry needed);
        --python: the Python image for sandboxed kernels, from Debian's packages (debootstrap); --agents: the
        coding agents' image (Node.js and ACP agents from npm on the Python image's base)""",
    )
    build.add_argument(
        "--name",
        default=None,
        help=f"""image name (default: {DEFAULT_IMAGE}; with --python: {PYTHON_IMAGE}; with --agents:
        {AGENTS_IMAGE})""",
    )
    build.add_argument(
        "--base-url", default=None, help="Docker engine URL (default: $DOCKER_HOST or the unix socket)"
    )
    build.add_argument(
        "--python",
        action="store_true",
        help="build the Python image (python3, ipykernel) with debootstrap and docker import; needs root",
    )
    build.add_argument(
        "--agents",
        action="store_true",
        help=f"""build the coding agents' image: Debian's nodejs and the npm packages
        {" ".join(DEFAULT_AGENT_PACKAGES)} (installed by this machine's npm, copied in; their commands in
        /usr/local/bin) on the Python image's Debian base, in a container with no network; needs root and npm""",
    )
    build.add_argument(
        "--npm",
        nargs="+",
        metavar="PACKAGE",
        default=None,
        help="""with --agents: more npm packages (e.g. @scope/agent@1.2.3; one naming a default agent re-pins
        it), installed by this machine's npm without install scripts""",
    )
    build.add_argument(
        "--force",
        action="store_true",
        help="rebuild even an up-to-date image (default: an image built from the same files is kept, not re-tagged)",
    )
    build.add_argument(
        "--pip",
        nargs="+",
        metavar="REQUIREMENT",
        default=None,
        help="""with --python or --agents: Python packages to add (pip requirements, e.g. pandas 'pyarrow>=15'):
        wheels fetched by this machine's pip for the image's Python, cached, and installed in the image offline""",
    )
    build.add_argument(
        "--suite", default="bookworm", help="with --python or --agents: the Debian suite (default: bookworm)"
    )
    build.add_argument(
        "--mirror",
        default=None,
        help="with --python or --agents: the Debian mirror (default: the one apt uses)",
    )
    build.set_defaults(run=_build_image)
    _add_preset_commands(commands)
    _add_kernelspec_commands(commands)
    _add_serve_command(commands)
    from .audit.cli import add_audit_commands

    add_audit_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "takes_server_options", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.server_options = rest
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
