"""The operator's sandbox policy, enforced once at session create."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from .contract import (
    DEFAULT_TTL_SECONDS,
    ISOLATION_ORDER,
    NETWORK_ORDER,
    EgressPolicy,
    SandboxForbiddenError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SecretGrant,
    SessionSpec,
    isolation_floor_refusal,
    isolation_rank,
    network_rank,
)
from .contract.durations import parse_duration
from .contract.egress import (
    PLACEHOLDER_PATTERN,
    new_placeholder,
    normalize_entries,
    uncovered,
)
from .contract.limits import SessionLimits
from .labels import credential_key_problem
from .secret_sources import AuthStateSource, SecretValues, secret_setting

if TYPE_CHECKING:
    from .egress_audit import EgressAudit

SCRUBBED = "[scrubbed]"
#: the consumer label of a spec that names none (SessionSpec's default): a door gives it the caller's own
UNSET_CONSUMER = "default"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
#: Egress ceiling spellings: "open" is the seeds' word for the default full egress.
_EGRESS_ALIASES = {"open": "egress", "closed": "none"}
_RULE_FIELDS = frozenset({"allow", "deny"})


#: a key of a JupyterHub user's auth_state: a top-level key, or a dotted path into nested objects
def _env_json(name: str, example: str) -> Any:
    """A setting given as JSON in the environment (None: not set)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{name} must be JSON like {example}: {e}") from None


def _egress_rule(key: str, rule: Any) -> dict[str, Any]:
    """One entry of SandboxPolicy.egress_rules, normalised; ValueError naming what is wrong."""
    problem = credential_key_problem(key)
    if problem:
        raise ValueError(f"egress_rules: {problem.replace('credential key', 'key')}")
    if not isinstance(rule, Mapping) or set(rule) - _RULE_FIELDS:
        raise ValueError(
            f'egress_rules[{key!r}] must be an object like {{"allow": ["pypi.org"], "deny": []}}'
        )
    try:
        allow = rule.get("allow")
        return {
            "allow": None if allow is None else list(normalize_entries(allow, what="allow")),
            "deny": list(normalize_entries(rule.get("deny") or (), what="deny", any_name=False)),
        }
    except SandboxSpecRejectedError as e:
        raise ValueError(f"egress_rules[{key!r}]: {e}") from None


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
    """Isolation floor, egress ceiling, durable switch, per-consumer credentials, transcript scrub, and the
    egress policy of a session (egress_rules per consumer, secrets by placeholder, the audit's file).

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
        'tool:NAME' (a code tool's runs), 'kernel:ID', 'agent:KEY' (a coding agent's persona); the key '*'
        applies to every consumer. An untyped key is refused. A granted variable missing from the server's
        environment rejects the session loudly.""",
    ).tag(config=True)

    egress_rules = Dict(
        help="""Egress policy per consumer (TAI_MCP_SANDBOX_EGRESS_RULES as JSON): consumer label ->
        {"allow": [host names], "deny": [host names]}, the ceiling AND the default of the egress policy of
        that consumer's sessions (network 'egress'; on a provider with an egress gateway, docker). Keys are
        typed like credentials' ('*', 'user:NAME', 'tool:NAME', 'kernel:ID', 'agent:KEY'); the most specific
        key wins ('user:NAME/SUB', then 'user:NAME', then '*'). Entries: 'example.com' (that name, ports 80 and 443),
        '*.example.com' (any name under it), '*' (any name; allow only), 'NAME:PORT' (raw TCP to that
        port). No allow: any name on 80/443. A session of a consumer with a rule always gets a policy; a
        spec's own allow must be covered entry by entry by the rule's (else 400 naming the entry), and its
        deny is added to the rule's. A consumer with no rule may ask for any policy, or none (plain
        egress).""",
    ).tag(config=True)

    secrets = Dict(
        help="""Secrets sessions never see (TAI_MCP_SANDBOX_SECRETS as JSON): name -> {"hosts": [host
        names], "from_env": VARIABLE or "from_file": PATH, "env": VAR (default: the name), "consumers":
        ['*' or labels] (default ['*']), "query": false, "body": false}. A granted session (network
        'egress', on a provider with an egress gateway) gets a random placeholder in env[VAR] and an egress
        policy; the gateway replaces the placeholder with the real value in requests to the secret's hosts
        only (headers; the URL query with query, a bounded body with body). from_env is read from the
        server's environment once; from_file is read again when the file changes (rotation, no session
        restart); "from_auth_state": KEY (a key of the session owner's JupyterHub auth_state, or a dotted
        path 'a.b' into it) gives each owner's sessions that user's own value, in the sandbox service under
        JupyterHub only (its role needs the scopes admin:auth_state and read:users:name), read again within
        about 30 s of a change in the hub. A granted secret whose source is missing refuses the session
        (400) naming it.""",
    ).tag(config=True)

    egress_audit_path = Unicode(
        help="""Where the egress gateways' audit lines are appended, one JSON object per line (every
        allowed and refused connection and DNS answer, every substitution by secret name, never a value)
        (TAI_MCP_SANDBOX_EGRESS_AUDIT; default: tai-sandbox-egress-audit.jsonl in the Jupyter runtime
        directory; "" keeps no file, only the last lines in memory for GET /api/sandbox/egress/audit).""",
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
            value = json.loads(raw)
        except ValueError as e:
            raise ValueError(
                'TAI_MCP_SANDBOX_CREDENTIALS must be JSON like {"consumer": ["ENV_NAME"]}: ' + str(e)
            ) from None
        checked: dict[str, list[str]] = self._check_credentials(
            {"value": value}
        )  # a dynamic default skips @validate
        return checked

    @default("egress_rules")
    def _egress_rules_default(self) -> dict[str, Any]:
        value = _env_json("TAI_MCP_SANDBOX_EGRESS_RULES", '{"*": {"allow": ["pypi.org"], "deny": []}}')
        return self._checked_rules({} if value is None else value)  # a dynamic default skips @validate

    @default("secrets")
    def _secrets_default(self) -> dict[str, Any]:
        value = _env_json(
            "TAI_MCP_SANDBOX_SECRETS", '{"github": {"hosts": ["api.github.com"], "from_env": "GH_TOKEN"}}'
        )
        return self._checked_secrets({} if value is None else value)

    @default("egress_audit_path")
    def _egress_audit_default(self) -> str:
        raw = os.environ.get("TAI_MCP_SANDBOX_EGRESS_AUDIT")
        if raw is not None:
            return raw.strip()
        from jupyter_core.paths import jupyter_runtime_dir

        return os.path.join(jupyter_runtime_dir(), "tai-sandbox-egress-audit.jsonl")

    @validate("egress_rules")
    def _check_egress_rules(self, proposal: Any) -> dict[str, Any]:
        return self._checked_rules(proposal["value"])

    def _checked_rules(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError("egress_rules must map consumer labels to {allow, deny} objects")
        return {key: _egress_rule(key, rule) for key, rule in value.items()}

    @validate("secrets")
    def _check_secrets(self, proposal: Any) -> dict[str, Any]:
        return self._checked_secrets(proposal["value"])

    def _checked_secrets(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError("secrets must map secret names to {hosts, from_env | from_file, ...} objects")
        checked = {name: secret_setting(name, entry) for name, entry in value.items()}
        envs = [entry["env"] for entry in checked.values()]
        if len(set(envs)) != len(envs):
            raise ValueError("secrets: two secrets name the same env variable")
        self.secret_sources.forget()  # a secret changed: read every value again
        return checked

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

    # ---------------------------------------------------------- egress

    def egress_rule(self, consumer: str) -> dict[str, Any] | None:
        """The rule of ``consumer`` (``{"allow": [...] | None, "deny": [...]}``): its own key, else the label
        it is under ('user:NAME/SUB' is under 'user:NAME'), else '*'; None: no rule (no ceiling)."""
        rules = self.egress_rules
        label = consumer
        while True:
            if label in rules:
                return dict(rules[label])
            if "/" not in label:
                break
            label = label.rsplit("/", 1)[0]
        return dict(rules["*"]) if "*" in rules else None

    def granted_secrets(self, consumer: str) -> list[str]:
        """The names of the secrets granted to ``consumer`` ('*' in their consumers, or the label itself)."""
        return [
            name
            for name, entry in self.secrets.items()
            if "*" in entry["consumers"] or consumer in entry["consumers"]
        ]

    #: where the secrets from_auth_state are read (the sandbox service under JupyterHub sets it); None: nowhere
    auth_state_source: AuthStateSource | None = None
    #: seconds a user's auth_state values are used before a gateway's ask for one reads them again (in the
    #: background: the value read last meanwhile), and before a create reads them again first
    auth_state_max_age: float = 30.0

    @property
    def secret_sources(self) -> SecretValues:
        """The current values of the secrets (secret_sources.py)."""
        found: SecretValues | None = self.__dict__.get("_secret_values")
        if found is None:
            found = self.__dict__["_secret_values"] = SecretValues(
                lambda: self.secrets,
                lambda: self.auth_state_source,
                lambda: self.auth_state_max_age,
                self.log,
            )
        return found

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        """The current real value of secret ``name`` for ``owner``'s sessions (None: none);
        ``secret_sources.SecretValues.value``."""
        return self.secret_sources.value(name, owner)

    def secret_values(self) -> list[str]:
        """Every secret's current real value, for the transcript scrub."""
        return self.secret_sources.values()

    async def prepare_secrets(self, owner: str | None, consumer: str | None = None) -> None:
        """Before a create (or a live change, a fork) of ``owner``'s session: read ``owner``'s auth_state
        when a secret from_auth_state is granted to ``consumer`` (None: any is configured) and the copy read
        last is too old or lacks a key. A key the user's auth_state lacks is then refused by
        :meth:`effective_spec` (400, naming the secret and the key)."""
        names = None if consumer is None else self.granted_secrets(consumer)
        await self.secret_sources.prepare(owner, names)

    def _narrowed(
        self, consumer: str, allow: Any, deny: Any
    ) -> tuple[tuple[str, ...] | None, tuple[str, ...], bool]:
        """``allow`` and ``deny`` within ``consumer``'s rule: (allow, deny, whether a rule applies)."""
        rule = self.egress_rule(consumer)
        if rule is None:
            return allow, tuple(deny), False
        if allow is None:
            allow = None if rule["allow"] is None else tuple(rule["allow"])
        else:
            over = uncovered(rule["allow"], allow)
            if over is not None:
                ceiling = (
                    "any name on ports 80 and 443" if rule["allow"] is None else ", ".join(rule["allow"])
                )
                raise SandboxSpecRejectedError(
                    f"egress allow entry {over!r} is over the operator's ceiling for consumer {consumer!r} "
                    f"({ceiling}; SandboxPolicy.egress_rules)"
                )
        merged = list(rule["deny"])
        merged += [d for d in deny if d not in merged]
        return allow, tuple(merged), True

    def _egress_of(self, spec: SessionSpec) -> EgressPolicy | None:
        """The egress policy ``spec`` gets: None for plain egress (no rule, no secret, none asked for)."""
        if spec.network != "egress":
            return None
        asked = spec.egress
        allow, deny, ruled = self._narrowed(
            spec.consumer, None if asked is None else asked.allow, () if asked is None else asked.deny
        )
        names = self.granted_secrets(spec.consumer)
        held = {g.name: g for g in asked.secrets} if asked is not None else {}
        stray = sorted(set(held) - set(names))
        if stray:
            raise SandboxSpecRejectedError(
                f"secret(s) {', '.join(stray)} are not granted to consumer {spec.consumer!r} (SandboxPolicy.secrets)"
            )
        if asked is None and not ruled and not names:
            return None
        grants = []
        for name in names:
            entry = self.secrets[name]
            if self.secret_value(name, spec.owner) is None:
                raise SandboxSpecRejectedError(
                    f"secret {name} granted to consumer {spec.consumer!r} has no value: "
                    f"{self.secret_sources.missing(name, spec.owner)}; set it, or change SandboxPolicy.secrets "
                    "(TAI_MCP_SANDBOX_SECRETS)"
                )
            known = held.get(name)
            placeholder = (
                known.placeholder
                if known is not None and PLACEHOLDER_PATTERN.match(known.placeholder)
                else new_placeholder()
            )
            grants.append(
                SecretGrant(
                    name, entry["env"], placeholder, tuple(entry["hosts"]), entry["query"], entry["body"]
                )
            )
        return EgressPolicy(allow=allow, deny=deny, secrets=tuple(grants))

    def effective_egress(self, spec: SessionSpec, allow: Any = None, deny: Any = ()) -> EgressPolicy:
        """The policy a live change of ``spec``'s session to ``allow``/``deny`` puts in force: within the
        consumer's rule like at create (allow None: the rule's, or any name on 80/443), the session's secrets
        kept. SandboxSpecRejectedError for a session without egress, or entries over the ceiling."""
        if spec.network != "egress":
            raise SandboxSpecRejectedError(
                f"the session's network is {spec.network!r}: it has no egress to set a policy on"
            )
        asked = EgressPolicy(allow=allow, deny=() if deny is None else deny)  # entries checked, normalised
        allow_, deny_, _ = self._narrowed(spec.consumer, asked.allow, asked.deny)
        secrets = () if spec.egress is None else spec.egress.secrets
        return EgressPolicy(allow=allow_, deny=deny_, secrets=secrets)

    def effective_spec(
        self, spec: SessionSpec, limits: SessionLimits, caller: Principal | None = None
    ) -> SessionSpec:
        """The one place a request becomes the spec a provider must honour, or a typed refusal.

        With a ``caller`` (a door acting for a user): the session is the caller's (naming another owner or
        another's consumer label is an admin act, SandboxForbiddenError), and a caller who is not an admin
        asks only for an image on the provider's list. Then, for everyone: the TTL within the operator's
        maximum (an unset one, the package default, becomes the maximum when that is lower; any other TTL
        over it is refused), the isolation floor, the egress ceiling, durable workspaces, the consumer's
        credentials in ``env``, its egress policy (within its rule; its granted secrets as placeholders in
        ``env``); last, the provider's ``limits`` (what it cannot honour is refused, an unset
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
        egress = self._egress_of(spec)
        for grant in egress.secrets if egress is not None else ():
            env[grant.env] = grant.placeholder
        return within_limits(spec.replace(isolation=effective, env=env, egress=egress), limits)

    def injected_values(self) -> list[str]:
        """Every value the transcript scrub replaces in any session's output: the injected credentials' and
        the secrets' real values (a session's placeholders are its own: GatedSession adds them)."""
        names = {n for names in self.credentials.values() for n in names}
        values = {os.environ[n] for n in names if os.environ.get(n)}
        values.update(self.secret_values())
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

    def scrub_bytes(self, data: bytes, also: Iterable[str] = ()) -> bytes:
        """``scrub`` for exact bytes (e.g. base64 exec output): values replaced in their UTF-8 form; ``also``:
        a session's own values (its secrets' placeholders)."""
        scrubber = self.stream_scrubber(also)
        return scrubber.feed(data) + scrubber.flush() if scrubber is not None else data

    def stream_scrubber(self, also: Iterable[str] = ()) -> StreamScrubber | None:
        """A scrubber for one output stream, or None when scrub_transcript is off or nothing is injected.
        ``also``: values of the session's own to replace too (its secrets' placeholders: the transcript then
        shows neither a secret's value nor the string that stands for it)."""
        if not self.scrub_transcript:
            return None
        values = [*self.injected_values(), *also]
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
            data["egress_rules"] = {k: dict(v) for k, v in self.egress_rules.items()}
            data["secrets"] = {
                name: {k: entry[k] for k in ("hosts", "env", "consumers", "query", "body")}
                for name, entry in self.secrets.items()
            }
        return data

    @property
    def egress_audit(self) -> EgressAudit:
        """The audit sink of this policy's egress gateways (one per policy, made at first use)."""
        audit = self.__dict__.get("_egress_audit")
        if audit is None:
            from .egress_audit import EgressAudit

            audit = self.__dict__["_egress_audit"] = EgressAudit(self.egress_audit_path or None, log=self.log)
        return audit


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
    if spec.egress is not None and not limits.egress_policy:
        raise SandboxSpecRejectedError(
            (limits.egress_refusal or f"the {limits.kind} provider cannot enforce an egress policy")
            + " (the spec's egress allow/deny lists, or a secret SandboxPolicy.secrets grants its consumer)"
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
