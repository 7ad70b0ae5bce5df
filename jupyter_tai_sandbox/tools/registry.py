"""The tool registry: base tools, config presets and stored presets, and the two chokepoints.

:meth:`ToolRegistry.author` / :meth:`ToolRegistry.remove` are the preset
chokepoint; :meth:`ToolRegistry.run` is the tool-run chokepoint.

**Who sees a preset.** Config presets and *shared* stored presets are listed to
every user, so only an admin (``write`` on ``jupyter_tai_sandbox:admin``) or the
operator authors, replaces or removes them: they decide what other users' tool
lists (and their agents) read. A user who is not admin authors *private* presets,
listed, shown and run for their author alone, at most ``max_presets_per_user`` of
them; they never count against the shared store's ``max_presets``. A shared preset
shadows a private one of the same name.

**Consumer labels.** A run's sessions carry ``tool:NAME`` (a shared preset or a base
tool), or ``user:AUTHOR/tool:NAME`` for a private preset: typed labels
(:mod:`jupyter_tai_sandbox.labels`) that no user's own label can equal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .. import labels
from ..contract import SandboxError, SandboxNotFoundError, SandboxSpecRejectedError, for_door
from ..errors import (
    PresetConflictError,
    PresetInvalidError,
    PresetStoreError,
    SandboxQuotaError,
    ToolInputError,
)
from ..sandboxes import SandboxAccess
from .base_tools import BASE_TOOLS, BaseTool
from .binding import preset_invalid, validate_input
from .fence import OPERATOR_CLI, OPERATOR_CONFIG, Principal, fence
from .presets import Preset, parse_preset
from .store import PresetStore

#: the source of a user's own preset (listed to its author only)
PRIVATE = "private"


def _fenced_base(definition: Any) -> bool:
    """Whether a stored definition's base tool is fenced (an unknown base counts as fenced)."""
    base_name = definition.get("base", "sandbox_exec") if isinstance(definition, Mapping) else None
    base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
    return base is None or base.fenced


def _author_of(viewer: Principal | None) -> str | None:
    """The user whose private presets ``viewer`` sees (None: shared ones only)."""
    return getattr(viewer, "owner", None) if viewer is not None else None


class ToolRegistry:
    """Base tools, config (manifest) presets and stored presets: the two chokepoints live here."""

    def __init__(
        self,
        store: PresetStore | None = None,
        log: Any = None,
        *,
        max_preset_bytes: int = 64 << 10,
        max_presets: int = 200,
        max_presets_per_user: int = 20,
        access: SandboxAccess | None = None,
    ) -> None:
        self.store = store if store is not None else PresetStore()
        #: the sandbox tool runs use: the server's own (SandboxApp.access); None: the process default
        self.access = access
        self.config: dict[str, Preset] = {}
        self.log = log
        self.max_preset_bytes = max_preset_bytes
        self.max_presets = max_presets
        self.max_presets_per_user = max_presets_per_user
        self._shadowed: set[str] = set()

    # --- reading (not fenced)

    def _stored(self) -> dict[str, Preset]:
        out = {}
        for name, definition in self.store.load().items():
            if name in BASE_TOOLS or name in self.config:
                # a config preset shadows a stored one of the same name
                if self.log is not None and name not in self._shadowed:
                    self._shadowed.add(name)
                    self.log.warning(
                        "preset %r in %s is shadowed by the server's config", name, self.store.path
                    )
                continue
            try:
                out[name] = parse_preset(definition, name=name, source="store")
            except PresetInvalidError as e:
                raise PresetStoreError(
                    f"preset {name!r} in {self.store.path} is invalid ({e}): remove it with "
                    f"`jupyter tai-sandbox preset rm {name}` and author it again"
                ) from None
        return out

    def _private(self, author: str, shared: Mapping[str, Any]) -> dict[str, Preset]:
        """``author``'s private presets (one a shared tool shadows is left out)."""
        out = {}
        for name, definition in self.store.load_private().get(author, {}).items():
            if name in BASE_TOOLS or name in shared:
                continue
            try:
                out[name] = parse_preset(definition, name=name, source=PRIVATE)
            except PresetInvalidError as e:
                raise PresetStoreError(
                    f"{author!r}'s private preset {name!r} in {self.store.path} is invalid ({e}): "
                    "remove it and author it again"
                ) from None
        return out

    def presets(self, viewer: Principal | None = None) -> dict[str, Preset]:
        """The presets ``viewer`` sees: config and shared ones, and its own private ones."""
        shared = {**self._stored(), **self.config}
        author = _author_of(viewer)
        if author is None:
            return shared
        return {**self._private(author, shared), **shared}

    def get(self, name: str, viewer: Principal | None = None) -> BaseTool | Preset:
        """A tool ``viewer`` sees; another user's private preset answers like an unknown name."""
        if name in BASE_TOOLS:
            return BASE_TOOLS[name]
        if name in self.config:
            return self.config[name]
        if name in self.store.load():
            return self._stored()[name]
        author = _author_of(viewer)
        if author is not None and name in self.store.load_private().get(author, {}):
            found = self.presets(viewer).get(name)
            if found is not None:
                return found
        raise SandboxNotFoundError(f"no tool named {name!r}: GET tools lists them")

    def list_json(self, viewer: Principal | None = None) -> list[dict[str, Any]]:
        tools = [t.to_json() for t in BASE_TOOLS.values()]
        return tools + [p.to_json() for _, p in sorted(self.presets(viewer).items())]

    def fingerprint(self) -> str:
        """Changes whenever any preset changes (shared or private): the MCP door's list_changed trigger."""
        return json.dumps(
            [sorted(self.config), self.store.load(), self.store.load_private()], sort_keys=True, default=str
        )

    # --- the preset chokepoint (every authoring door)

    def author(
        self,
        definition: Any,
        *,
        principal: Principal,
        name: str | None = None,
        replace: bool = False,
    ) -> Preset:
        """Validate, fence and persist a preset (a config preset is kept in memory, not stored)."""
        source = "config" if principal == OPERATOR_CONFIG else "store"
        base_name = definition.get("base", "sandbox_exec") if isinstance(definition, Mapping) else None
        base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
        # fence before validation: a refused principal learns nothing about the definition
        if base is None or base.fenced:
            fence(principal, "write", f"author a preset over {base_name or 'sandbox_exec'}")
        shared = source == "config" or principal.may("write")
        if source == "store":
            self._check_size(definition)
        preset = parse_preset(definition, name=name, source=source if shared else PRIVATE)
        if preset.name in BASE_TOOLS:
            raise PresetConflictError(f"{preset.name!r} is a base tool: give the preset another name")
        if source == "config":
            self.config[preset.name] = preset
            return preset
        if preset.name in self.config:
            raise PresetConflictError(
                f"preset {preset.name!r} is defined by the server's config (SandboxApp.presets): change it there"
            )
        if not shared:
            return self._author_private(preset, principal, replace=replace)
        with self.store.locked():
            stored = self.store.load()
            if preset.name in stored and not replace:
                raise PresetConflictError(
                    f"a preset named {preset.name!r} exists: remove it first, or replace it "
                    "(REST: PUT ...?replace=1, CLI: preset add --replace)"
                )
            if preset.name in stored:
                # replacing needs the fence of the definition it replaces, too
                if _fenced_base(stored[preset.name]):
                    fence(principal, "write", f"replace the tool {preset.name!r}")
            elif self.max_presets and len(stored) >= self.max_presets:
                raise PresetInvalidError(
                    f"the preset store holds {len(stored)} presets, the most allowed "
                    "(SandboxApp.max_presets): remove one first"
                )
            stored[preset.name] = preset.definition()
            self.store.save(stored)
        return preset

    def _author_private(self, preset: Preset, principal: Principal, *, replace: bool) -> Preset:
        """A preset of a user who is not admin: stored under its author, listed to its author only."""
        author = principal.owner
        if author is None:
            fence(principal, "write", f"author the tool {preset.name!r}")
        assert author is not None
        with self.store.locked():
            stored, private = self.store.load(), self.store.load_private()
            if preset.name in stored:
                fence(
                    principal,
                    "write",
                    f"replace the shared tool {preset.name!r} (every user's tool list shows it)",
                )
            mine = private.setdefault(author, {})
            if preset.name in mine and not replace:
                raise PresetConflictError(
                    f"you have a preset named {preset.name!r}: remove it first, or replace it "
                    "(REST: PUT ...?replace=1)"
                )
            if (
                preset.name not in mine
                and self.max_presets_per_user
                and len(mine) >= self.max_presets_per_user
            ):
                raise SandboxQuotaError(
                    f"{author!r} holds {len(mine)} private presets, the most one user may hold "
                    "(SandboxApp.max_presets_per_user): remove one first"
                )
            mine[preset.name] = preset.definition()
            self.store.save(stored, private)
        return preset

    def _check_size(self, definition: Any) -> None:
        try:
            size = len(json.dumps(definition))
        except (TypeError, ValueError):
            return  # parse_preset says what is wrong with it
        if self.max_preset_bytes and size > self.max_preset_bytes:
            raise PresetInvalidError(
                f"the preset definition is {size} bytes of JSON; the limit is {self.max_preset_bytes} "
                "(SandboxApp.max_preset_bytes)"
            )

    def remove(self, name: str, *, principal: Principal) -> None:
        """Delete a stored preset (the authoring chokepoint, so the fence applies).

        A shared one (every user's list shows it) needs ``write`` on the admin resource; a user's
        own private one is theirs to remove; another user's private one answers like an unknown name.
        """
        with self.store.locked():
            stored, private = self.store.load(), self.store.load_private()
            author = principal.owner
            mine = private.get(author, {}) if author is not None else {}
            target = self.config.get(name) or stored.get(name) or BASE_TOOLS.get(name)
            if name in mine and (target is None or not principal.may("write")):
                del mine[name]
                self.store.save(stored, private)
                return
            if target is None:
                raise SandboxNotFoundError(f"no stored preset named {name!r}")
            fence(principal, "write", f"remove the shared tool {name!r} (every user's tool list shows it)")
            if name in BASE_TOOLS:
                raise PresetConflictError(f"{name!r} is a base tool; it cannot be removed")
            if name in self.config:
                raise PresetConflictError(
                    f"preset {name!r} is defined by the server's config (SandboxApp.presets): remove it there"
                )
            del stored[name]
            self.store.save(stored, private)

    def apply_manifest(self, presets: Mapping[str, Any]) -> list[Preset]:
        """The config door (SandboxApp.presets): every entry through the chokepoint, as the operator."""
        applied, before = [], dict(self.config)
        for name, definition in presets.items():
            try:
                applied.append(self.author(definition, principal=OPERATOR_CONFIG, name=name))
            except SandboxError as e:
                self.config = before  # all or nothing
                problems = getattr(e, "problems", None) or [str(e)]
                raise preset_invalid(problems, where=f"SandboxApp.presets[{name!r}]: ") from None
        return applied

    # --- the tool-run chokepoint (every run door)

    async def run(self, name: str, inputs: Any, *, principal: Principal) -> dict[str, Any]:
        """Fence, validate the input against the tool's schema, bind, and run the base tool."""
        tool = self.get(name, principal)
        base = BASE_TOOLS[tool.base] if isinstance(tool, Preset) else tool
        if base.fenced:
            fence(principal, "execute", f"run the tool {name!r}")
        if isinstance(tool, Preset):
            data = validate_input(tool.schema(), inputs)
            bound = base.bind(tool, data)
        else:
            bound = inputs
        try:
            base_input = validate_input(base.input_schema, bound)
        except ToolInputError as e:
            if isinstance(tool, Preset):
                raise ToolInputError(
                    e.field, f"preset {name!r} bound an invalid {base.name} input: {e}"
                ) from None
            raise
        consumer = labels.tool_label(name)
        if isinstance(tool, Preset) and tool.source == PRIVATE and principal.owner is not None:
            consumer = labels.sub_label(
                labels.user_label(principal.owner), consumer
            )  # the author's, not the tool's
        try:
            # the gate applies the timeout ceiling, the output limit and the scrub to the run
            return await base.run(base_input, consumer=consumer, owner=principal.owner, access=self.access)
        except SandboxSpecRejectedError as e:
            if principal == OPERATOR_CLI and getattr(e, "isolation_floor", None):
                # `jupyter tai-sandbox preset run` lowers the floor with its own flag, not a server option
                raise for_door(e, "cli") from None
            raise
