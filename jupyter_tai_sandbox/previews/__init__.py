"""Web previews: a session's web apps behind Jupyter's auth, kept out of the Jupyter origin.

The route
    ``/api/sandbox/sessions/{id}/ports/{port}/{path}`` proxies every HTTP method (and websockets, see
    :mod:`.ws_relay`) to ``127.0.0.1:{port}`` inside the session, over the session's port connection
    (:meth:`~jupyter_tai_sandbox.contract.SandboxSession.open_port`: the session agent dials, so network
    ``none`` works too). The app sees ``/{path}`` with the query string kept; under
    ``.../absolute-ports/{port}/{path}`` it sees the whole request path (for an app that knows its root).
    The app gets ``X-Forwarded-Prefix`` (the stripped prefix, no trailing slash), ``-Host``, ``-Proto``,
    ``-For`` and ``-Port``; hop-by-hop headers are dropped both ways. :func:`.urls.port_path` builds a path.

Who may use it
    As every session route: jupyter_server's auth, the XSRF rule on unsafe methods, the Authorizer (the
    action of the method on the sandbox resource), the owner rules. Another user's live session answers
    404 (as an unknown one on the other routes); a well-formed id with no live session (destroyed, reaped,
    never made) answers 410 :class:`~jupyter_tai_sandbox.errors.PreviewSessionGoneError`, so the URL of a
    session that ended never reaches another app.

The security model
    The app must never act with the user's Jupyter rights. ``Cookie``, ``Authorization`` and the XSRF
    header never reach it, nor a ``token`` query parameter. Every proxied response carries
    ``Content-Security-Policy: sandbox ...`` without ``allow-same-origin``: the document's origin is opaque,
    so its script cannot read Jupyter's cookies, cannot call ``/api/*`` as the user (no CORS for ``null``,
    and unsafe methods fail XSRF) and cannot set cookies on the Jupyter origin; the app's ``Set-Cookie``
    is dropped (logged once per session), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy:
    no-referrer`` are set; the app's own Content-Security-Policy is kept (both apply).

Per-session origins (:attr:`.settings.PreviewSettings.origin_template` set, :mod:`.origin`)
    A browser's document GET of the route (after the same auth and owner rules) is redirected to the
    session port's own origin (e.g. ``http://{session}-{port}.preview.localhost:{server_port}``) with a
    one-time code, which the preview host exchanges for a cookie of its own (host-only, HttpOnly, Secure,
    SameSite=None, Partitioned, signed: user, session, port, expiry), then the clean path. That host is served
    by this server (a Host-matched rule before all others) and relays every path to the app with the cookie
    checked and the session's owner checked again on every request (gone: 410; another user's: 404); no CSP
    sandbox there: the app's own files, fetches, websockets (Origin: that origin only) and cookies work, while
    its origin is neither Jupyter's (whose cookies are host-only, so never sent to it) nor another session
    port's. A script's or tool's request (no document) and websockets on the Jupyter route are relayed there
    as before, sandboxed.

Limits
    :class:`.settings.PreviewSettings`: request body size (413), response size, websocket frame size, idle
    timeout (504 before the response head), connections per session and per user (429). Bodies stream both
    ways with flow control: the server holds a chunk at a time, never a whole body.
"""
