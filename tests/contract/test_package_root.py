"""The package root hands a user what they import, and importing it loads nothing more."""

import subprocess
import sys

import jupyter_tai_sandbox


def test_every_public_name_of_the_root_resolves_to_the_defining_modules_object():
    from jupyter_tai_sandbox import contract, sandboxes
    from jupyter_tai_sandbox.providers.local import LocalSandbox

    for name in jupyter_tai_sandbox.__all__:
        assert getattr(jupyter_tai_sandbox, name) is not None, name
    assert jupyter_tai_sandbox.require_sandbox is sandboxes.require_sandbox
    assert jupyter_tai_sandbox.SessionSpec is contract.SessionSpec
    assert jupyter_tai_sandbox.SandboxError is contract.SandboxError
    assert jupyter_tai_sandbox.LocalSandbox is LocalSandbox
    assert set(jupyter_tai_sandbox.__all__) <= set(dir(jupyter_tai_sandbox))
    assert set(jupyter_tai_sandbox._LAZY) <= set(jupyter_tai_sandbox.__all__)


def test_importing_the_root_loads_no_provider_or_server_module():
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, jupyter_tai_sandbox; print(sorted(m for m in sys.modules if m.startswith('jupyter_tai')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "['jupyter_tai_sandbox', 'jupyter_tai_sandbox._version']"


def test_an_unknown_name_is_an_attribute_error():
    try:
        jupyter_tai_sandbox.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("an unknown name resolved")
