"""Names the docker provider gives things on the engine: labels, prefixes, paths, deployments.

Every container, volume, network and record the provider makes carries labels
under ``jupyter-tai-sandbox``, its deployment's among them; anything without
them, or of another deployment, is never seen or touched.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from ...contract import SessionSpec
from .._workspaces import owner_tag

WORKSPACE = "/workspace"
LABEL = "jupyter-tai-sandbox"
#: on a session container (or a pooled session's record volume): the session id
LABEL_SESSION = f"{LABEL}.session"
#: on a container (or service) whose session runs on the session agent
LABEL_AGENT = f"{LABEL}.agent"
#: on an agent session: the user its commands and file operations run as (``user``, else the image's USER)
LABEL_USER = f"{LABEL}.user"
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
#: on a warm-pool container: the process that keeps it (see docker/pool)
LABEL_POOL = f"{LABEL}.pool"
#: on a session record volume: the id of the pooled container the session runs in
LABEL_RECORD = f"{LABEL}.record"
#: on everything a provider makes: the deployment it belongs to (see Deployment)
LABEL_DEPLOYMENT = f"{LABEL}.deployment"
#: on a TTL record volume: the id of the session whose end it moves (see DockerSandbox.set_expiry)
LABEL_TTL = f"{LABEL}.ttl"
#: on a fork's image (and so on its container): the id of the fork session it belongs to (see docker/forks)
LABEL_FORK = f"{LABEL}.fork"
RECORD_PREFIX = "tai-rec-"
TTL_PREFIX = "tai-ttl-"
VOLUME_PREFIX = "tai-sbx-"
CONTAINER_PREFIX = "tai-"
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


#: the environment variable that names the deployment (DockerSandbox.deployment)
DEPLOYMENT_ENV = "TAI_SANDBOX_DEPLOYMENT"
DEPLOYMENT_MAX_LENGTH = 200


def default_deployment() -> str:
    """This server's deployment when none is configured: ``user@host:config dir``.

    The user is JupyterHub's (``JUPYTERHUB_USER``) when the server is a hub
    user's, else the OS user; the config dir is Jupyter's (``jupyter --config-dir``).
    So a restarted server finds its sessions again, while two people, two hub
    users or two config dirs on one engine get deployments of their own.
    """
    from jupyter_core.paths import jupyter_config_dir

    user = os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}:{jupyter_config_dir()}"[:DEPLOYMENT_MAX_LENGTH]


def check_deployment(name: str) -> str:
    """``name`` if it can be a deployment (1-200 printable characters), else ValueError saying why."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a deployment name cannot be empty")
    if len(name) > DEPLOYMENT_MAX_LENGTH or not name.isprintable():
        raise ValueError(
            f"a deployment name is 1-{DEPLOYMENT_MAX_LENGTH} printable characters, not {name[:40]!r}"
        )
    return name


def _short_hash(*parts: str, length: int = 12) -> str:
    joined = "\0".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(joined).hexdigest()[:length]


@dataclass(frozen=True)
class Deployment:
    """The scope a container provider works in: one label on everything it makes and on every
    engine query, and a tag in the engine-global names (workspace volumes, networks, records)."""

    name: str

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_DEPLOYMENT: self.name}

    @property
    def tag(self) -> str:
        return _short_hash(self.name, length=10)

    def owns(self, labels: Mapping[str, str] | None) -> bool:
        return (labels or {}).get(LABEL_DEPLOYMENT) == self.name

    def workspace_volume(self, key: str, owner: str | None = None) -> str:
        """A persistent workspace's volume: ``tai-sbx-<deployment tag>-<key>`` unscoped (no owner, and the
        volumes made before keys were per owner), ``tai-sbx-<deployment tag>_<owner tag>-<key>`` an owner's
        own. Two deployments' same key are two volumes; the character after the fixed-length deployment tag
        (``-`` or ``_``) keeps the two kinds of names apart whatever the key (see providers/_workspaces)."""
        if owner is None:
            return f"{VOLUME_PREFIX}{self.tag}-{key}"
        return f"{VOLUME_PREFIX}{self.tag}_{owner_tag(owner)}-{key}"

    def owner_network(self, base: str, owner: str | None) -> str:
        """The internal network of ``owner``'s sessions: ``base`` plus a short hash of deployment and owner."""
        return f"{base}-{_short_hash(self.name, '' if owner is None else owner)}"
