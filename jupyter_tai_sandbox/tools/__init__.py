"""Code tools: the ``sandbox_exec`` base tool, presets over it, and the fenced admin tier.

A **base tool** is code that ships with the package. Most base tools have a fixed
input schema (``accepts_input_schema = False``): a preset over one can rename and
describe it, nothing more. ``sandbox_exec`` is the exception: it *accepts* a
schema, so a preset over it declares the exposed tool's own JSON Schema, fixes
the session settings and binds the caller's validated fields into the command --
as argv elements, stdin or environment values, never spliced into shell text.

Two chokepoints, which every door goes through:

* :meth:`ToolRegistry.author` / :meth:`ToolRegistry.remove` -- the **preset
  chokepoint** (REST ``PUT``/``DELETE tools/{name}``, the CLI's
  ``preset add|rm``, the ``SandboxApp.presets`` manifest): validation, name
  clashes, the fence, persistence.
* :meth:`ToolRegistry.run` -- the **tool-run chokepoint** (REST
  ``POST tools/{name}/run``, the CLI's ``preset run``): the fence, input
  validation, the bind kernel, then the base tool, which reaches a sandbox only
  through :func:`~jupyter_tai_sandbox.sandboxes.require_sandbox`.

A base tool in the ``fenced`` tier (``sandbox_exec``) makes authoring a preset
over it and running it admin acts: the acting :class:`Principal` must be allowed
``write`` (authoring) or ``execute`` (running) on ``jupyter_tai_sandbox:admin``.
Over REST that is the jupyter_server ``Authorizer``'s decision; the CLI and the
config door act as the operator (:data:`OPERATOR_CLI`, :data:`OPERATOR_CONFIG`),
who owns the server's files and configuration and is therefore admin.

The package, one idea a module: :mod:`.fence` (principals and the admin check),
:mod:`.base_tools` (the code a preset exposes), :mod:`.binding` (the bind kernel
and input validation), :mod:`.presets` (a preset and its validation), :mod:`.store`
(the preset file) and :mod:`.registry` (the two chokepoints).
"""

from ..contract import (
    ExecRequest,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SessionSpec,
)
from ..errors import (
    PresetConflictError,
    PresetInvalidError,
    PresetStoreError,
    ToolAccessDeniedError,
    ToolInputError,
)
from ..sessions import ADMIN_RESOURCE
from .base_tools import BASE_TOOLS, BaseTool, SandboxExecTool, SandboxStatusTool
from .binding import check_binding, validate_input
from .fence import OPERATOR_CLI, OPERATOR_CONFIG, Decided, Operator, Principal, fence
from .presets import NAME_PATTERN, SESSION_FIELDS, Preset, parse_preset
from .registry import ToolRegistry
from .store import STORE_VERSION, PresetStore, default_store_path

__all__ = [
    "ADMIN_RESOURCE",
    "BASE_TOOLS",
    "NAME_PATTERN",
    "OPERATOR_CLI",
    "OPERATOR_CONFIG",
    "SESSION_FIELDS",
    "STORE_VERSION",
    "BaseTool",
    "Decided",
    "ExecRequest",
    "Operator",
    "Preset",
    "PresetConflictError",
    "PresetInvalidError",
    "PresetStore",
    "PresetStoreError",
    "Principal",
    "SandboxError",
    "SandboxExecTool",
    "SandboxNotFoundError",
    "SandboxSpecRejectedError",
    "SandboxStatusTool",
    "SessionSpec",
    "ToolAccessDeniedError",
    "ToolInputError",
    "ToolRegistry",
    "check_binding",
    "default_store_path",
    "fence",
    "parse_preset",
    "validate_input",
]
