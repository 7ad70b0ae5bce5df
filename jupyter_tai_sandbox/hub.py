"""The sandbox service for JupyterHub: hub users authenticated by JupyterHub's own service auth.

One process (``jupyter tai-sandbox serve``, run by the hub as a managed service)
holds the container engine and serves this extension's API. Users' single-user
servers hold no engine socket: they run the extension with ``provider=remote``
pointed at the service, each with its own hub token.

* :class:`HubServiceIdentityProvider` takes ``Authorization: token <hub token>``
  (or ``bearer``), resolves it with :class:`jupyterhub.services.auth.HubAuth`
  (``user_for_token``, cached for ``HubAuth.cache_max_age``), and lets in only
  hub *users* whose token holds the service's access scope
  (``access:services!service=<name>``). The user name is the hub user's, so
  every tenancy rule (owners, consumers, workspaces, quotas) keys on it. A
  request without a valid token gets 403: there is no anonymous user and no
  shared server token.
* :class:`HubServiceAuthorizer` grants this extension's resources to those
  users, the admin resource only to a token holding the operator's custom
  scope (``custom:tai-sandbox:admin`` by default), and nothing else of the
  server (kernels, contents, terminals) to anyone: code on the service's host
  would hold the engine socket.
* :class:`HubAuthState` reads a hub user's ``auth_state`` from the hub's REST API with the service's own
  token, for the secrets ``from_auth_state`` (``SandboxPolicy.secrets``): :func:`serve` sets one on the
  service's policy. The service's role needs the scopes ``admin:auth_state`` and ``read:users:name``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, urlparse

from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.auth.identity import IdentityProvider, User
from traitlets import Instance, Unicode, default

from .contract import SandboxUnavailableError
from .sessions import ADMIN_RESOURCE

#: the prefix of every Authorizer resource this extension defines
RESOURCE_PREFIX = "jupyter_tai_sandbox:"
#: the admin scope's default: a JupyterHub custom scope the operator defines and grants
DEFAULT_ADMIN_SCOPE = "custom:tai-sandbox:admin"


def _hub_auth_class() -> type:
    try:
        from jupyterhub.services.auth import HubAuth
    except ImportError as e:  # pragma: no cover - the message says what to install
        raise ImportError(
            "the sandbox service authenticates with JupyterHub's service auth: pip install jupyterhub"
        ) from e
    return HubAuth


@dataclass
class HubUser(User):
    """A hub user, with the scopes of the token that authenticated the request."""

    hub_scopes: frozenset[str] = field(default_factory=frozenset)


class HubServiceIdentityProvider(IdentityProvider):
    """Requests authenticated by a JupyterHub token, resolved through JupyterHub's HubAuth."""

    hub_auth = Instance(
        "jupyterhub.services.auth.HubAuth",
        help="""JupyterHub's service auth (configure it as c.HubAuth: api_url, api_token,
        access_scopes, cache_max_age). A hub-managed service gets all of it from the hub's
        environment: JUPYTERHUB_API_URL, JUPYTERHUB_API_TOKEN, JUPYTERHUB_SERVICE_NAME.""",
    )

    @default("hub_auth")
    def _default_hub_auth(self) -> Any:
        return _hub_auth_class()(parent=self)

    # no shared server token: a hub token names its user, jupyter_server's own token names nobody
    token_generated = False

    @property
    def token(self) -> str:  # type: ignore[override]  # a read-only property over the IdentityProvider's trait
        return ""

    @property
    def login_available(self) -> bool:
        return False

    @property
    def logout_available(self) -> bool:
        return False

    def get_handlers(self) -> list[tuple[str, object]]:
        return []  # an API for servers and scripts: no login page, no cookies

    async def get_user(self, handler: Any) -> HubUser | None:
        if hasattr(handler, "_tai_hub_user"):
            return handler._tai_hub_user
        handler._tai_hub_user = None
        hub_auth = self.hub_auth
        token = hub_auth.get_token(handler, in_cookie=False)
        if not token:
            return None
        model = await hub_auth.user_for_token(token, sync=False)
        if not model:
            self.log.info("tai-sandbox service: a token the hub does not know (%s)", handler.request.path)
            return None
        name, kind = model.get("name"), model.get("kind", "user")
        if kind != "user" or not isinstance(name, str) or not name:
            # a service's name is not a user's: it could shadow one, so services are not principals
            self.log.warning("tai-sandbox service: refused a %s token (%r): only hub users", kind, name)
            return None
        if not hub_auth.check_scopes(hub_auth.access_scopes, model):
            self.log.warning(
                "tai-sandbox service: user %r's token lacks %s",
                name,
                " or ".join(sorted(hub_auth.access_scopes)),
            )
            return None
        handler._token_authenticated = (
            True  # no XSRF cookie or origin check for a token (jupyter_server's rule)
        )
        handler._tai_hub_user = HubUser(username=name, hub_scopes=frozenset(model.get("scopes", ())))
        return handler._tai_hub_user

    def identity_model(self, user: User) -> dict[str, Any]:
        model = asdict(user)
        model.pop("hub_scopes", None)
        return model

    def validate_security(self, app: Any, ssl_options: dict[str, Any] | None = None) -> None:
        if not self.hub_auth.api_token:
            raise SystemExit(
                "tai-sandbox service: no JupyterHub API token (JUPYTERHUB_API_TOKEN, or c.HubAuth.api_token): "
                "run it as a hub-managed service, or give it the token of its service entry"
            )
        if not self.hub_auth.access_scopes:
            raise SystemExit(
                "tai-sandbox service: no access scope to require (JUPYTERHUB_SERVICE_NAME, or "
                "c.HubAuth.access_scopes such as access:services!service=tai-sandbox): every hub user "
                "would be let in"
            )


class HubServiceAuthorizer(Authorizer):
    """This extension's resources for authenticated hub users; admin only with the operator's scope."""

    admin_scope = Unicode(
        DEFAULT_ADMIN_SCOPE,
        help="""The JupyterHub scope that makes a token an admin of the sandbox service (read, write and
        execute on jupyter_tai_sandbox:admin: every user's sessions, other consumers and owners, the
        code-tool fence). Define it in c.JupyterHub.custom_scopes and grant it with a role; the users'
        server tokens carry it only if Spawner.server_token_scopes asks for it (and only for users who
        hold it). Empty: nobody is admin.""",
    ).tag(config=True)

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        if not isinstance(user, HubUser):
            return False
        if resource == ADMIN_RESOURCE:
            return bool(self.admin_scope) and self._holds(user, self.admin_scope)
        # the server's own kernels, contents and terminals would run code next to the engine socket
        return resource.startswith(RESOURCE_PREFIX)

    @staticmethod
    def _holds(user: HubUser, scope: str) -> bool:
        from jupyterhub.services.auth import check_scopes

        return bool(check_scopes({scope}, set(user.hub_scopes)))


#: the scopes the service's role needs for the secrets from_auth_state (GET /users/NAME with the auth_state)
AUTH_STATE_SCOPES = ("admin:auth_state", "read:users:name")


class HubAuthState:
    """Hub users' ``auth_state``, read from the hub's REST API (``GET {api_url}/users/{name}``) with the
    service's own token, through tornado's AsyncHTTPClient (the event loop is never blocked). The hub
    returns ``auth_state`` only to a token holding ``admin:auth_state``, and the user only with
    ``read:users:name`` (or ``read:users``): grant both to the service's role."""

    def __init__(self, api_url: str, api_token: str, *, timeout: float = 10.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.api_token = api_token
        self.timeout = timeout

    async def auth_state(self, user: str) -> Mapping[str, Any] | None:
        """``user``'s auth_state (None: the user has none); SandboxUnavailableError when the hub does not
        answer, does not know the user, or withholds it (the service's role lacks a scope)."""
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        request = HTTPRequest(
            f"{self.api_url}/users/{quote(user, safe='')}",
            headers={"Authorization": f"token {self.api_token}", "Accept": "application/json"},
            request_timeout=self.timeout,
            connect_timeout=self.timeout,
        )
        scopes = " and ".join(AUTH_STATE_SCOPES)
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except Exception as e:  # connection refused, DNS, timeout: the hub did not answer
            raise SandboxUnavailableError(f"JupyterHub's API ({self.api_url}) did not answer: {e}") from None
        if response.code in (401, 403, 404):
            raise SandboxUnavailableError(
                f"JupyterHub's API answered {response.code} for user {user!r}: the user is unknown to the hub, or "
                f"the sandbox service's role lacks the scopes {scopes} (needed for secrets from_auth_state)"
            )
        if response.code != 200:
            raise SandboxUnavailableError(
                f"JupyterHub's API answered {response.code} reading user {user!r}'s auth_state"
            )
        try:
            model = json.loads(response.body)
        except ValueError:
            raise SandboxUnavailableError(f"JupyterHub's API answered no JSON for user {user!r}") from None
        if not isinstance(model, dict) or "auth_state" not in model:
            raise SandboxUnavailableError(
                f"JupyterHub withheld user {user!r}'s auth_state: the sandbox service's role needs the scopes "
                f"{scopes} (needed for secrets from_auth_state)"
            )
        state = model["auth_state"]
        return state if isinstance(state, Mapping) else None


def read_auth_state_through_hub(app: Any) -> None:
    """Give the sandbox extension's policy in ``app`` (a ServerApp run by :func:`serve`) a
    :class:`HubAuthState` with the service's hub API address and token (its identity provider's HubAuth)."""
    hub_auth = getattr(app.identity_provider, "hub_auth", None)
    if hub_auth is None or not hub_auth.api_url or not hub_auth.api_token:
        return
    from .server_lookup import sandbox_app

    policy = getattr(sandbox_app(app), "policy", None)
    if policy is None:
        return
    policy.auth_state_source = HubAuthState(hub_auth.api_url, hub_auth.api_token)


def server_argv(environ: Any = None) -> list[str]:
    """ServerApp options for a hub-managed service: bind and prefix where the hub says, hub auth."""
    environ = os.environ if environ is None else environ
    argv = [
        f"--ServerApp.identity_provider_class={HubServiceIdentityProvider.__module__}.HubServiceIdentityProvider",
        f"--ServerApp.authorizer_class={HubServiceAuthorizer.__module__}.HubServiceAuthorizer",
        "--ServerApp.open_browser=False",
        "--ServerApp.terminals_enabled=False",
        # the sessions of the service's deployment are its own, a crash's survivors included: its stop ends them
        "--SandboxApp.adopt_sessions=True",
    ]
    url = environ.get("JUPYTERHUB_SERVICE_URL")
    if url:
        where = urlparse(url)
        if where.hostname:
            argv.append(f"--ServerApp.ip={where.hostname}")
        if where.port:
            argv.append(f"--ServerApp.port={where.port}")
            argv.append("--ServerApp.port_retries=0")  # the hub routes to this port, not the next free one
    prefix = environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix:
        argv.append(f"--ServerApp.base_url={prefix}")
    return argv


def serve(argv: Sequence[str] = ()) -> None:
    """Run a jupyter_server with only this extension, as a JupyterHub service; ``argv`` adds options."""
    from jupyter_server.serverapp import ServerApp

    app = ServerApp.instance(jpserver_extensions={"jupyter_tai_sandbox": True})
    # later options win: the operator's own argv may override what the hub's environment says
    app.initialize(argv=[*server_argv(), *argv], find_extensions=False)
    read_auth_state_through_hub(app)  # the secrets from_auth_state: each user's own, from the hub
    app.start()


if __name__ == "__main__":  # pragma: no cover
    serve(sys.argv[1:])
