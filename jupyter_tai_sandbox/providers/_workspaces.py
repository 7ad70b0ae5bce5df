"""Whose a persistent workspace is: workspace keys are a namespace per owner.

A persistent workspace is named by its owner *and* its ``workspace_key``: alice's
``notes`` and bob's ``notes`` are two workspaces. Asking for a key gives the
caller their own workspace of that name, made empty the first time; it never
refuses because someone else holds the name, never mounts theirs, and no answer
says that another owner's exists. An admin shares a user's workspace by creating
a session that names that user as its owner (the policy lets only an admin name
another owner).

Every provider that stores workspaces maps one rule onto its storage. Each keeps
two places for a key:

- the **unscoped** place, the name the key had before workspaces were per owner
  (a local ``<root>/<key>`` folder, a ``tai-sbx-<tag>-<key>`` volume, a VM's
  ``<key>`` disk image), with the owner it records (None: none recorded);
- a **scoped** place per owner, under a name made from :func:`owner_tag` that can
  never equal an unscoped one.

:func:`unscoped_serves` says which one is the caller's:

- a spec without an owner (the Python API used directly, no principal) uses the
  unscoped place, as before;
- an unscoped place recorded to the caller stays the caller's (a workspace made
  before this rule keeps its data, no copy needed);
- the provider's ``home`` principal (its ``home_owner``: the account running the
  server, so every caller of a single-user server, who then shares a key's
  workspace with the Python API used without an owner) also takes an unscoped place no owner is recorded for, so its path stays
  the one seed 002 names (local) or the volume it always had, unless it already has a scoped place of that key (it got
  one while the unscoped place was another owner's: it keeps that one);
- anyone else gets their scoped place; an unscoped place recorded to another
  owner is simply not theirs, and not seen.

Leases, locks and removals follow the place: bob removing his ``notes`` never
waits on, or is refused because of, alice's.
"""

from __future__ import annotations

import getpass
import hashlib

#: hex digits of an owner's tag: 128 bits, so two owners' tags do not meet
OWNER_TAG_LENGTH = 32


def server_account() -> str:
    """The account running this server: the default ``home_owner`` of every provider, and the one principal
    of a server whose callers authenticate by token or password (``sessions.server_owner``)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # pragma: no cover - a uid without a passwd entry
        return "owner"


def owner_tag(owner: str, length: int = OWNER_TAG_LENGTH) -> str:
    """A fixed-length, name-safe stand-in for ``owner`` (any string) in storage names: hex of its SHA-256.

    Providers still record the owner itself beside the place and check it, so a tag never stands alone.
    """
    return hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()[:length]


def unscoped_serves(
    owner: str | None, recorded: str | None, *, home: bool = False, has_scoped: bool = False
) -> bool:
    """Whether a key's unscoped place is ``owner``'s workspace (else ``owner`` uses their scoped place).

    ``recorded``: the owner recorded for the unscoped place (None: none recorded, or no such place);
    ``home``: ``owner`` is the provider's home principal, who takes an unscoped place nobody is recorded
    for, unless ``has_scoped`` (``owner``'s scoped place of the key exists already).
    """
    if owner is None:
        return True
    if recorded is None:
        return home and not has_scoped
    return recorded == owner


def workspace_identity(owner: str | None, key: str) -> tuple[str | None, str]:
    """What tells two persistent workspaces apart, for in-process leases and in-use checks."""
    return (owner, key)
