"""The configured sandboxed personas in every chat: :func:`with_sandbox_agents` and the server's start hook.

jupyter-ai's persona manager (one per chat) builds its personas from the ``jupyter_ai.personas`` entry points
and ``.jupyter/personas``; its only configurable seam is ``PersonaManagerExtension.persona_manager_class``.
At the server's start (:func:`install`), when ``SandboxAgents.personas`` is not empty and jupyter-ai's
persona manager extension is loaded, that class becomes ``with_sandbox_agents(<its class>, classes)``: the
same manager, whose ``_init_personas`` adds one instance of each configured persona's class
(``Sandboxed<Key>Persona``). A persona a plugin registers itself (a :class:`SandboxedAcpPersona` subclass on
the entry points) needs none of this: the manager loads it like any other.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from typing import Any

from ..server_lookup import sandbox_app
from . import EXTRA_HINT
from .spec import AgentPersonaSpec

#: jupyter-ai's persona manager extension (jupyter_ai_persona_manager)
PERSONA_MANAGER_EXTENSION = "jupyter_ai_persona_manager"
#: the server extensions a chat with personas needs
CHAT_EXTENSIONS = ("jupyterlab_chat", "jupyter_ai_router", PERSONA_MANAGER_EXTENSION)


def with_sandbox_agents(manager_class: type, persona_classes: Sequence[type]) -> type:
    """A subclass of ``manager_class`` (a PersonaManager) whose personas include one of each of
    ``persona_classes``. Applying it to a class it made already adds the new classes to the old ones."""
    classes = list(persona_classes)
    earlier = getattr(manager_class, "sandbox_persona_classes", None)
    if earlier is not None:
        manager_class = manager_class.__bases__[0]
        classes = [c for c in earlier if c.__name__ not in {k.__name__ for k in classes}] + classes

    base: Any = manager_class

    def _init_personas(self: Any) -> dict[str, Any]:
        personas: dict[str, Any] = base._init_personas(self)
        for cls in manager.sandbox_persona_classes:  # type: ignore[attr-defined]
            try:
                persona = cls(parent=self, chat=self.chat)
            except Exception:
                self.log.error(
                    "The sandboxed persona %s could not be made:\n%s", cls.__name__, traceback.format_exc()
                )
                continue
            if persona.id in personas:
                self.log.warning(
                    "Skipping sandboxed persona %s: a persona with its id is loaded already", persona.id
                )
                continue
            self.log.info("  - Initialized sandboxed persona '%s' (ID: '%s').", persona.name, persona.id)
            personas[persona.id] = persona
        return personas

    manager = type(
        f"{manager_class.__name__}WithSandboxAgents",
        (manager_class,),
        {
            "_init_personas": _init_personas,
            "sandbox_persona_classes": tuple(classes),
            "__module__": __name__,
            "__doc__": f"{manager_class.__name__}, with the sandboxed coding agents of SandboxAgents.personas.",
        },
    )
    return manager


def _extension_app(serverapp: Any, name: str) -> Any:
    try:
        extension = serverapp.extension_manager.extensions[name]
    except (AttributeError, KeyError, TypeError):
        return None
    for point in getattr(extension, "extension_points", {}).values():
        app = getattr(point, "app", None)
        if app is not None:
            return app
    return None


def install(serverapp: Any, specs: Sequence[AgentPersonaSpec], log: logging.Logger) -> type | None:
    """Put the configured personas (``specs``) in every chat of ``serverapp`` (see the module's docstring);
    the persona manager class now in force, or None (what is missing is logged)."""
    if not specs:
        return None
    names = ", ".join(spec.key for spec in specs)
    try:
        from .persona import persona_class
    except ImportError as e:
        log.warning(
            "jupyter_tai_sandbox: SandboxAgents.personas (%s) need jupyter-ai's chat and ACP client, not "
            "installed here (%s): %s",
            names,
            e,
            EXTRA_HINT,
        )
        return None
    extension = _extension_app(serverapp, PERSONA_MANAGER_EXTENSION)
    if extension is None:
        missing = [
            name
            for name in CHAT_EXTENSIONS
            if name not in getattr(serverapp.extension_manager, "extensions", {})
        ]
        log.warning(
            "jupyter_tai_sandbox: SandboxAgents.personas (%s) are not offered: jupyter-ai's persona manager "
            "server extension is not loaded (enable %s)",
            names,
            ", ".join(missing or CHAT_EXTENSIONS),
        )
        return None
    classes = [persona_class(spec) for spec in specs]
    manager = with_sandbox_agents(extension.persona_manager_class, classes)
    extension.persona_manager_class = manager
    log.info(
        "jupyter_tai_sandbox: sandboxed coding agents in every chat: %s (PersonaManagerExtension.persona_manager_"
        "class is now %s)",
        ", ".join(
            f"{spec.name} [{cls.__name__}, scope {spec.scope}]"
            for spec, cls in zip(specs, classes, strict=True)
        ),
        manager.__name__,
    )
    return manager


def entry_point_specs(log: logging.Logger) -> list[AgentPersonaSpec]:
    """The specs of the sandboxed personas plugins register on the ``jupyter_ai.personas`` entry points (their
    secrets are granted at start like the configured ones'); none without jupyter-ai."""
    from importlib.metadata import entry_points

    specs: list[AgentPersonaSpec] = []
    for point in entry_points(group="jupyter_ai.personas"):
        # only the distributions built on this package can hold one (the others are not even imported)
        requires = getattr(getattr(point, "dist", None), "requires", None) or []
        if not any(req.replace("_", "-").lower().startswith("jupyter-tai-sandbox") for req in requires):
            continue
        try:
            from .persona import SandboxedAcpPersona

            cls = point.load()
        except Exception:  # no jupyter-ai, or a persona whose requirements are unmet (it raises on import)
            continue
        if isinstance(cls, type) and issubclass(cls, SandboxedAcpPersona) and cls.agent is not None:
            log.info(
                "jupyter_tai_sandbox: sandboxed persona %s from entry point %s", cls.__name__, point.name
            )
            specs.append(cls.agent)
    return specs


def chat_ready(serverapp: Any) -> bool:
    """Whether ``serverapp`` runs what a chat with sandboxed personas needs (jupyter-ai's extensions and ours)."""
    return (
        sandbox_app(serverapp) is not None
        and _extension_app(serverapp, PERSONA_MANAGER_EXTENSION) is not None
    )


__all__ = ["CHAT_EXTENSIONS", "chat_ready", "entry_point_specs", "install", "with_sandbox_agents"]
