"""Names the docker provider gives things on the engine: labels, prefixes, paths.

Every container, volume and network the provider makes carries labels under
``jupyter-tai-sandbox``; anything without them is never touched.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from ..contract import SessionSpec

WORKSPACE = "/workspace"
LABEL = "jupyter-tai-sandbox"
#: on a session container (or a pooled session's record volume): the session id
LABEL_SESSION = f"{LABEL}.session"
LABEL_CONSUMER = f"{LABEL}.consumer"
#: the principal a session, or a persistent workspace volume, belongs to
LABEL_OWNER = f"{LABEL}.owner"
LABEL_CREATED = f"{LABEL}.created"
LABEL_EXPIRES = f"{LABEL}.expires"
#: the session spec as JSON, env *names* only
LABEL_SPEC = f"{LABEL}.spec"
#: on a persistent workspace volume: its key
LABEL_WORKSPACE = f"{LABEL}.workspace"
#: on an internal network: "internal"
LABEL_NETWORK = f"{LABEL}.network"
#: on a warm-pool container: the process that keeps it (see _docker_pool)
LABEL_POOL = f"{LABEL}.pool"
#: on a session record volume: the id of the pooled container the session runs in
LABEL_RECORD = f"{LABEL}.record"
#: on a TTL record volume: the id of the session whose end it moves (see DockerSandbox.set_expiry)
LABEL_TTL = f"{LABEL}.ttl"
RECORD_PREFIX = "tai-rec-"
TTL_PREFIX = "tai-ttl-"
VOLUME_PREFIX = "tai-sbx-"
CONTAINER_PREFIX = "tai-"
#: where a pooled session's spec env is kept inside its container, for a restarted server
POOLED_ENV_FILE = "/tmp/.tai-sbx-env.json"
SESSION_ID = re.compile(r"^sbx-[0-9a-f]{16}$")


def session_labels(
    session_id: str, spec: SessionSpec, created: float, expires: float, extra: Mapping[str, str]
) -> dict[str, str]:
    """The labels a session's container (or service) carries: how any server finds, lists and reaps it."""
    labels = {
        **extra,
        LABEL_SESSION: session_id,
        LABEL_CONSUMER: spec.consumer,
        LABEL_CREATED: repr(created),
        LABEL_EXPIRES: repr(expires),
        LABEL_SPEC: json.dumps(spec.to_public_json()),
    }
    if spec.owner is not None:
        labels[LABEL_OWNER] = spec.owner
    return labels


def is_session_id(value: object) -> bool:
    return isinstance(value, str) and bool(SESSION_ID.match(value))


def workspace_volume(key: str) -> str:
    return VOLUME_PREFIX + key


def owner_network(base: str, owner: str | None) -> str:
    """The internal network of ``owner``'s sessions: ``base`` plus a short hash of the owner."""
    if owner is None:
        return base
    return f"{base}-{hashlib.sha256(owner.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"
