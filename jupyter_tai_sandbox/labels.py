"""Consumer labels: one namespace of typed kinds, so a user, a code tool, a kernel and a coding agent never share
a label.

The consumer label of a session picks the operator's credentials
(``SandboxPolicy.credentials``), its egress rule (``SandboxPolicy.egress_rules``) and its secrets
(``SandboxPolicy.secrets`` consumers). Users, code tools, kernels and coding agents all make sessions,
so every label names its kind, and a name can never pass for another kind's:

``user:NAME``, ``user:NAME/SUB``
    a user's own label, and the labels under it (a sub-label a user names, or a kernel or
    tool a server acting for the user runs, such as the remote provider). ``NAME`` is the
    user name percent-encoded (``/``, ``:``, ``%`` and other reserved characters never
    appear raw), so the user ``alice/x`` (``user:alice%2Fx``) is not alice's sub-label ``x``
    (``user:alice/x``).
``tool:NAME``
    a code tool run through the tool-run chokepoint (a shared preset or a base tool).
``kernel:ID``
    a sandboxed kernel (the panel finds its kernel by this label).
``agent:KEY``
    a coding agent's session: a sandboxed ACP persona of jupyter-ai, ``KEY`` its key in
    ``SandboxAgents.personas`` (:mod:`jupyter_tai_sandbox.agents`).

The keys of ``SandboxPolicy.credentials`` and ``SandboxPolicy.egress_rules``, and the
consumers of ``SandboxPolicy.secrets``, are typed labels too (or ``*``): an untyped key is
refused when the server starts, since it could name a user as well as a tool.
"""

from __future__ import annotations

import urllib.parse

USER, TOOL, KERNEL, AGENT = "user", "tool", "kernel", "agent"
KINDS = (USER, TOOL, KERNEL, AGENT)
#: characters a user name keeps raw in its label (the URL-unreserved ones, and '@' and '+')
_SAFE = "-._~@+"


def user_label(name: str) -> str:
    """The label of the user ``name`` (its own; its sub-labels are ``user_label(name) + '/...'``)."""
    return f"{USER}:{urllib.parse.quote(name, safe=_SAFE)}"


def tool_label(name: str) -> str:
    """The label a code tool's sessions carry."""
    return f"{TOOL}:{name}"


def kernel_label(kernel_id: str) -> str:
    """The label a sandboxed kernel's session carries."""
    return f"{KERNEL}:{kernel_id}"


def agent_label(key: str) -> str:
    """The label a coding agent's sessions carry (``key``: the persona's key in SandboxAgents.personas)."""
    return f"{AGENT}:{key}"


def sub_label(label: str, sub: str) -> str:
    """A label under ``label`` (``user:alice`` + ``kernel:1`` -> ``user:alice/kernel:1``)."""
    return f"{label}/{sub}"


def kind_of(label: object) -> str | None:
    """The kind of a typed label (``user``, ``tool``, ``kernel``, ``agent``), None for an untyped one."""
    if not isinstance(label, str):
        return None
    kind, sep, rest = label.partition(":")
    return kind if sep and rest and kind in KINDS else None


def is_under(label: object, base: str) -> bool:
    """Whether ``label`` is ``base`` or a label under it."""
    return isinstance(label, str) and (label == base or label.startswith(base + "/"))


def credential_key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a key of SandboxPolicy.credentials (None: it can)."""
    if key == "*" or kind_of(key) is not None:
        return None
    return (
        f"credential key {key!r} names no kind: use '*' (every consumer), 'user:NAME' (a user; "
        f"'user:NAME/SUB' a label under it), 'tool:NAME' (a code tool), 'kernel:ID' or 'agent:KEY' (a coding "
        "agent's persona), so a user "
        "named like a tool can never take the tool's credentials"
    )


__all__ = [
    "AGENT",
    "KERNEL",
    "KINDS",
    "TOOL",
    "USER",
    "agent_label",
    "credential_key_problem",
    "is_under",
    "kernel_label",
    "kind_of",
    "sub_label",
    "tool_label",
    "user_label",
]
