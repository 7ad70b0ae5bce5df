"""``python -m jupyter_tai_sandbox.conformance PROVIDER``: certify a provider, print the verdict."""

from .runner import main

raise SystemExit(main())
