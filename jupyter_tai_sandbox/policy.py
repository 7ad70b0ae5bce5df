"""The operator's sandbox policy, enforced once at session create."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from .contract import (
    DEFAULT_TTL_SECONDS,
    ISOLATION_ORDER,
    NETWORK_ORDER,
    SandboxForbiddenError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SessionSpec,
    isolation_floor_refusal,
    isolation_rank,
    network_rank,
)
from .contract.durations import parse_duration
from .contract.limits import SessionLimits
from .labels import credential_key_problem

SCRUBBED = "[scrubbed]"
#: the consumer label of a spec that names none (SessionSpec's default): a door gives it the caller's own
UNSET_CONSUMER = "default"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
#: Egress ceiling spellings: "open" is the seeds' word for the default full egress.
_EGRESS_ALIASES = {"open": "egress", "closed": "none"}


def _env_bool(name: str, fallback: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return fallback
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def _env_number(name: str, fallback: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return fallback
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={raw!r} must be a finite number >= 0 (0: no limit)")
    return value


def _env_duration(name: str, fallback: float) -> float:
    """A maximum duration from the environment: seconds, or with units (24h, 1h30m); 0 means no limit."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return fallback
    try:
        return parse_duration(raw, f"{name}={raw!r}", allow_zero=True)
    except SandboxRequestError as e:
        raise ValueError(f"{e} (0: no limit)") from None


class SandboxPolicy(LoggingConfigurable):
    """Isolation floor, egress ceiling, durable switch, per-consumer credentials, transcript scrub.

    Every setting also reads its ``TAI_MCP_SANDBOX_*`` environment variable, which
    wins over the traitlets default but not over explicit config.
    """

    isolation = Unicode(
        help="""The isolation floor (TAI_MCP_SANDBOX_ISOLATION): none < container < vm.
        A session gets at least this level; a spec asking for less is raised to it,
        and a provider that cannot give the effective level rejects the spec.""",
    ).tag(config=True)

    egress = Unicode(
        help="""The egress ceiling (TAI_MCP_SANDBOX_EGRESS): egress (also 'open', the default),
        internal, or none (also 'closed'). A spec asking for more network than this is rejected.""",
    ).tag(config=True)

    durable = Bool(
        help="""Allow persistent sessions (TAI_MCP_SANDBOX_DURABLE, default on).
        When off, a spec with durability='persistent' is rejected.""",
    ).tag(config=True)

    scrub_transcript = Bool(
        help="""Scrub transcripts (TAI_MCP_SANDBOX_SCRUB_TRANSCRIPT, default off): replace the value of
        every injected credential with '[scrubbed]' in output shown back to consumers.""",
    ).tag(config=True)

    credentials = Dict(
        key_trait=Unicode(),
        value_trait=List(Unicode()),
        help="""Per-consumer credentials (TAI_MCP_SANDBOX_CREDENTIALS as JSON): consumer label ->
        names of server environment variables injected into that consumer's sessions (spec.env).
        Keys are typed labels: 'user:NAME' (a user's own sessions; 'user:NAME/SUB' a label under it),
        'tool:NAME' (a code tool's runs), 'kernel:ID'; the key '*' applies to every consumer. An
        untyped key is refused. A granted variable missing from the server's environment rejects
        the session loudly.""",
    ).tag(config=True)

    max_ttl_seconds = Float(
        24 * 3600.0,
        help="""Longest TTL a session may ask for, in seconds (TAI_MCP_SANDBOX_MAX_TTL_SECONDS). A spec over
        it is refused (400), never clamped. 0 means no maximum.""",
    ).tag(config=True)

    max_timeout_seconds = Float(
        6 * 3600.0,
        help="""Longest deadline (timeout_seconds) one command may ask for through any door
        (TAI_MCP_SANDBOX_MAX_TIMEOUT_SECONDS). Over it is refused (400), never clamped. 0 means no maximum.""",
    ).tag(config=True)

    max_sessions_per_user = Integer(
        20,
        help="""Most live sessions one user (principal) may hold at once (TAI_MCP_SANDBOX_MAX_SESSIONS_PER_USER);
        one more is refused with 429. Admins creating for themselves count too. 0 means no cap.""",
    ).tag(config=True)

    max_kernels_per_user = Integer(
        10,
        help="""Most sandboxed kernels one user may run at once (TAI_MCP_SANDBOX_MAX_KERNELS_PER_USER), counted
        apart from max_sessions_per_user: a kernel's session counts here only. One more kernel start is
        refused with 429. 0 means no cap.""",
    ).tag(config=True)

    @default("max_kernels_per_user")
    def _max_kernels_default(self) -> int:
        return int(_env_number("TAI_MCP_SANDBOX_MAX_KERNELS_PER_USER", 10))

    @default("max_ttl_seconds")
    def _max_ttl_default(self) -> float:
        return _env_duration("TAI_MCP_SANDBOX_MAX_TTL_SECONDS", 24 * 3600.0)

    @default("max_timeout_seconds")
    def _max_timeout_default(self) -> float:
        return _env_duration("TAI_MCP_SANDBOX_MAX_TIMEOUT_SECONDS", 6 * 3600.0)

    @default("max_sessions_per_user")
    def _max_sessions_default(self) -> int:
        return int(_env_number("TAI_MCP_SANDBOX_MAX_SESSIONS_PER_USER", 20))

    @default("isolation")
    def _isolation_default(self) -> str:
        return os.environ.get("TAI_MCP_SANDBOX_ISOLATION", "container").strip() or "container"

    @default("egress")
    def _egress_default(self) -> str:
        return os.environ.get("TAI_MCP_SANDBOX_EGRESS", "egress").strip() or "egress"

    @default("durable")
    def _durable_default(self) -> bool:
        return _env_bool("TAI_MCP_SANDBOX_DURABLE", True)

    @default("scrub_transcript")
    def _scrub_default(self) -> bool:
        return _env_bool("TAI_MCP_SANDBOX_SCRUB_TRANSCRIPT", False)

    @default("credentials")
    def _credentials_default(self) -> dict[str, list[str]]:
        raw = os.environ.get("TAI_MCP_SANDBOX_CREDENTIALS", "").strip()
        if not raw:
            return {}
        try:
            value: dict[str, list[str]] = json.loads(raw)  # as the trait's validator then checks
        except ValueError as e:
            raise ValueError(
                'TAI_MCP_SANDBOX_CREDENTIALS must be JSON like {"consumer": ["ENV_NAME"]}: ' + str(e)
            ) from None
        return value

    @validate("isolation")
    def _check_isolation(self, proposal: Any) -> str:
        value: str = proposal["value"].strip().lower()
        if value not in ISOLATION_ORDER:
            raise ValueError(
                f"isolation floor {proposal['value']!r} is unknown: use one of {', '.join(ISOLATION_ORDER)}"
            )
        return value

    @validate("egress")
    def _check_egress(self, proposal: Any) -> str:
        value: str = proposal["value"].strip().lower()
        value = _EGRESS_ALIASES.get(value, value)
        if value not in NETWORK_ORDER:
            raise ValueError(
                f"egress ceiling {proposal['value']!r} is unknown: use egress (open), internal or none"
            )
        return value

    @validate("credentials")
    def _check_credentials(self, proposal: Any) -> dict[str, list[str]]:
        value = proposal["value"]
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v)
            for k, v in value.items()
        ):
            raise ValueError("credentials must map consumer labels to lists of environment variable names")
        for key in value:
            problem = credential_key_problem(key)
            if problem:
                raise ValueError(f"credentials: {problem}")
        return dict(value)

    # ------------------------------------------------------------------ apply

    def granted_names(self, consumer: str) -> list[str]:
        names = list(self.credentials.get("*", []))
        names += [n for n in self.credentials.get(consumer, []) if n not in names]
        return names

    def effective_spec(
        self, spec: SessionSpec, limits: SessionLimits, caller: Principal | None = None
    ) -> SessionSpec:
        """The one place a request becomes the spec a provider must honour, or a typed refusal.

        With a ``caller`` (a door acting for a user): the session is the caller's (naming another owner or
        another's consumer label is an admin act, SandboxForbiddenError), and a caller who is not an admin
        asks only for an image on the provider's list. Then, for everyone: the TTL within the operator's
        maximum (an unset one, the package default, becomes the maximum when that is lower; any other TTL
        over it is refused), the isolation floor, the egress ceiling, durable workspaces, the consumer's
        credentials in ``env``; last, the provider's ``limits`` (what it cannot honour is refused, an unset
        cpu, memory or image gets its default). Deciding a decided spec again changes nothing.
        """
        if caller is not None:
            spec = _bound_to(spec, caller, limits)
        if self.max_ttl_seconds and spec.ttl_seconds > self.max_ttl_seconds:
            if spec.ttl_seconds != DEFAULT_TTL_SECONDS:
                raise SandboxSpecRejectedError(
                    f"ttl_seconds {spec.ttl_seconds:g} is over the operator's maximum of {self.max_ttl_seconds:g} s "
                    "(SandboxPolicy.max_ttl_seconds, TAI_MCP_SANDBOX_MAX_TTL_SECONDS)"
                )
            spec = spec.replace(ttl_seconds=self.max_ttl_seconds)
        floor = self.isolation
        requested = spec.isolation
        effective = (
            floor if requested is None or isolation_rank(requested) < isolation_rank(floor) else requested
        )
        if network_rank(spec.network) > network_rank(self.egress):
            raise SandboxSpecRejectedError(
                f"network={spec.network!r} exceeds the operator's egress ceiling {self.egress!r} "
                "(TAI_MCP_SANDBOX_EGRESS): ask for "
                + " or ".join(repr(n) for n in NETWORK_ORDER[: network_rank(self.egress) + 1])
            )
        if spec.durability == "persistent" and not self.durable:
            raise SandboxSpecRejectedError(
                "persistent workspaces are switched off by the operator (TAI_MCP_SANDBOX_DURABLE=off): "
                "use durability='ephemeral'"
            )
        env = dict(spec.env)
        for name in self.granted_names(spec.consumer):
            if name not in os.environ:
                raise SandboxSpecRejectedError(
                    f"credential {name} granted to consumer {spec.consumer!r} is not set in the server's "
                    "environment: set it, or remove it from TAI_MCP_SANDBOX_CREDENTIALS"
                )
            env[name] = os.environ[name]
        return within_limits(spec.replace(isolation=effective, env=env), limits)

    def injected_values(self) -> list[str]:
        names = {n for names in self.credentials.values() for n in names}
        values = {os.environ[n] for n in names if os.environ.get(n)}
        # longest first, so a value containing another is replaced whole
        return sorted(values, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """Replace every injected credential value in ``text``, whatever the scrub setting."""
        for value in self.injected_values():
            text = text.replace(value, SCRUBBED)
        return text

    def scrub(self, text: str) -> str:
        """The transcript scrubber: ``redact`` when scrub_transcript is on, else ``text`` unchanged."""
        return self.redact(text) if self.scrub_transcript else text

    def scrub_bytes(self, data: bytes) -> bytes:
        """``scrub`` for exact bytes (e.g. base64 exec output): values replaced in their UTF-8 form."""
        scrubber = self.stream_scrubber()
        return scrubber.feed(data) + scrubber.flush() if scrubber is not None else data

    def stream_scrubber(self) -> StreamScrubber | None:
        """A scrubber for one output stream, or None when scrub_transcript is off or nothing is injected."""
        if not self.scrub_transcript:
            return None
        values = self.injected_values()
        return StreamScrubber(values) if values else None

    def public_json(self, *, show_credentials: bool = True) -> dict[str, Any]:
        """The policy in force, as the status row shows it (credential names, never values).

        Which consumer holds which credential names is shown only with ``show_credentials``
        (to admins): it tells a user which label to impersonate.
        """
        data: dict[str, Any] = {
            "isolation": self.isolation,
            "egress": self.egress,
            "durable": self.durable,
            "scrub_transcript": self.scrub_transcript,
            "max_ttl_seconds": self.max_ttl_seconds,
            "max_timeout_seconds": self.max_timeout_seconds,
            "max_sessions_per_user": self.max_sessions_per_user,
            "max_kernels_per_user": self.max_kernels_per_user,
        }
        if show_credentials:
            data["credentials"] = {k: list(v) for k, v in self.credentials.items()}
        return data


class StreamScrubber:
    """Scrubs one byte stream chunk by chunk, so a value split across chunks is still replaced.

    Bytes in, bytes out (binary safe). It holds back at most ``len(longest value) - 1``
    bytes: the tail that could still grow into a value. ``flush()`` releases it at the end.
    """

    def __init__(self, values: Iterable[str | bytes], replacement: bytes = SCRUBBED.encode()) -> None:
        encoded = {v.encode() if isinstance(v, str) else bytes(v) for v in values}
        self.values = sorted((v for v in encoded if v), key=len, reverse=True)
        self.replacement = replacement
        self.longest = len(self.values[0]) if self.values else 0
        # longest first: at one position the longest value present wins
        self._pattern = re.compile(b"|".join(re.escape(v) for v in self.values)) if self.values else None
        self._pending = b""

    def _could_grow(self, tail: bytes) -> bool:
        """Whether ``tail`` is a proper prefix of a value (so more data might complete it)."""
        return len(tail) < self.longest and any(
            len(v) > len(tail) and v.startswith(tail) for v in self.values
        )

    def feed(self, data: bytes) -> bytes:
        """The scrubbed bytes that can be released now."""
        if self._pattern is None:
            return data
        buf = self._pending + data
        out = bytearray()
        pos = 0
        hold = len(buf)
        for match in self._pattern.finditer(buf):
            # look at most one value's length ahead: copying the rest of the buffer per match
            # made a stream full of secrets quadratic
            if self._could_grow(buf[match.start() : match.start() + self.longest]):
                hold = match.start()  # a longer value may start here: decide when more arrives
                break
            out += buf[pos : match.start()] + self.replacement
            pos = match.end()
        cut = hold
        for i in range(max(pos, len(buf) - self.longest + 1), hold):
            if self._could_grow(buf[i : i + self.longest]):
                cut = i
                break
        out += buf[pos:cut]
        self._pending = buf[cut:]
        return bytes(out)

    def flush(self) -> bytes:
        """The held-back tail, scrubbed (the stream has ended)."""
        tail, self._pending = self._pending, b""
        if not tail or self._pattern is None:
            return tail
        return self._pattern.sub(lambda _m: self.replacement, tail)


class Principal(Protocol):
    """Who a door acts for (``jupyter_tai_sandbox.sessions.Caller``), as the policy sees it."""

    @property
    def name(self) -> str: ...

    @property
    def manages_all(self) -> bool: ...

    @property
    def consumer(self) -> str: ...

    def owns_consumer(self, consumer: str) -> bool: ...


def _bound_to(spec: SessionSpec, caller: Principal, limits: SessionLimits) -> SessionSpec:
    """``spec`` as ``caller``'s: its owner and consumer label (an unset one is the caller's own), and, for a
    caller who is not an admin, an image on the provider's list."""
    if caller.manages_all:
        owner, consumer = spec.owner or caller.name, spec.consumer
    else:
        if spec.owner is not None and spec.owner != caller.name:
            raise SandboxForbiddenError(
                "a session belongs to the user who creates it: naming another owner needs write on "
                "jupyter_tai_sandbox:admin"
            )
        owner, consumer = caller.name, spec.consumer
        if consumer != UNSET_CONSUMER and not caller.owns_consumer(consumer):
            raise SandboxForbiddenError(
                f"the consumer label picks the operator's credentials: yours is {caller.consumer!r} (or "
                f"'{caller.consumer}/<label>'); naming another ({consumer!r}) needs write on "
                "jupyter_tai_sandbox:admin"
            )
        if not limits.image_allowed(spec.image):
            raise SandboxForbiddenError(
                f"image {spec.image!r} is not on the operator's allow-list ({limits.images_setting}); "
                "leave image unset for the default"
            )
    if consumer == UNSET_CONSUMER:
        consumer = caller.consumer
    return spec.replace(owner=owner, consumer=consumer)


def within_limits(spec: SessionSpec, limits: SessionLimits) -> SessionSpec:
    """``spec`` within a provider's ``limits``: what it cannot honour is refused loudly (never downgraded), an
    unset cpu, memory or image gets its default. Applying it twice changes nothing. The last step of
    :meth:`SandboxPolicy.effective_spec`; a provider handed a spec directly runs it itself."""
    wanted = spec.isolation or limits.max_isolation
    if isolation_rank(wanted) > isolation_rank(limits.max_isolation):
        raise isolation_floor_refusal(limits.kind, limits.max_isolation, wanted)
    if spec.network not in limits.networks:
        raise SandboxSpecRejectedError(
            f"the {limits.kind} provider cannot honour network={spec.network!r}; it supports "
            f"{', '.join(sorted(limits.networks))}"
        )
    if not limits.supports_limits:
        if spec.cpu is not None or spec.memory_mb is not None:
            raise SandboxSpecRejectedError(
                f"the {limits.kind} provider cannot enforce cpu/memory_mb caps and never runs a capped "
                "request uncapped: drop the caps or use a container provider"
            )
    else:
        spec = _capped(spec, limits)
    if limits.only_listed_images and not limits.image_allowed(spec.image):
        raise SandboxSpecRejectedError(
            f"image: {str(spec.image)[:100]!r} is not one of the {limits.kind} provider's images "
            f"({limits.default_image}, or one in {limits.images_setting})"
        )
    if spec.image is None and limits.default_image is not None:
        spec = dataclasses.replace(spec, image=limits.default_image)
    return spec


def _capped(spec: SessionSpec, limits: SessionLimits) -> SessionSpec:
    max_cpu, max_mem = limits.max_cpu, limits.max_memory_mb
    if spec.cpu is not None:
        if spec.cpu < limits.min_cpu:
            raise SandboxSpecRejectedError(
                f"cpu: {spec.cpu:g} is under {limits.floor_owner}'s minimum of {limits.min_cpu:g} CPU"
            )
        if max_cpu > 0 and spec.cpu > max_cpu:
            raise SandboxSpecRejectedError(
                f"cpu: {spec.cpu:g} is over the operator's maximum of {max_cpu:g} CPUs ({limits.settings}.max_cpu)"
            )
    if spec.memory_mb is not None:
        if spec.memory_mb < limits.min_memory_mb:
            raise SandboxSpecRejectedError(
                f"memory_mb: {spec.memory_mb} is under {limits.floor_owner}'s minimum of {limits.min_memory_mb} MiB"
            )
        if max_mem > 0 and spec.memory_mb > max_mem:
            raise SandboxSpecRejectedError(
                f"memory_mb: {spec.memory_mb} is over the operator's maximum of {max_mem} MiB "
                f"({limits.settings}.max_memory_mb)"
            )
    cpu, memory = spec.cpu, spec.memory_mb
    if cpu is None and limits.default_cpu > 0:
        cpu = min(limits.default_cpu, max_cpu) if max_cpu > 0 else limits.default_cpu
    if memory is None and limits.default_memory_mb > 0:
        memory = min(limits.default_memory_mb, max_mem) if max_mem > 0 else limits.default_memory_mb
    if limits.whole_cpus and cpu is not None and cpu != int(cpu):
        raise SandboxSpecRejectedError(f"cpu: {cpu:g}: the {limits.kind} provider gives whole vCPUs")
    if (cpu, memory) == (spec.cpu, spec.memory_mb):
        return spec
    return dataclasses.replace(spec, cpu=cpu, memory_mb=memory)
