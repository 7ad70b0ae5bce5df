"""The server's HTTP doors: the REST routes, the exec websocket, the code-tool routes, and the
interactive commands that outlive a websocket. ``jupyter_tai_sandbox.app.SandboxApp`` mounts them."""
