"""Sandboxed kernels: a jupyter_client provisioner whose kernel runs in a sandbox session.

``provisioner`` (the ``tai-sandbox-provisioner`` entry point), ``kernelspecs`` (what
``jupyter tai-sandbox kernelspec`` writes), ``tunnel`` (TCP forwarding over the exec seam)
with ``relay`` (its program in the session), and ``loop`` / ``watchdog`` (for clients that
run no event loop of their own, and for a client process that dies).
"""
