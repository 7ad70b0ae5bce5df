import pytest

from jupyter_tai_sandbox.providers.local import LocalSandbox


@pytest.fixture
def sandbox(tmp_path):
    """A local provider rooted in the test's own folder."""
    return LocalSandbox(root=str(tmp_path))
