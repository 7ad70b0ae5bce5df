"""DataFrames across the %%sandbox handoff (Parquet, and the fallbacks), and `%sandbox extend` and `pause`, in a
real kernel."""

from __future__ import annotations

import pytest

from tests.support.live_server import local_server, magics_kernel

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from local_server(tmp_path_factory, "frames-server")


@pytest.fixture(scope="module")
def kernel(server):
    yield from magics_kernel(
        server,
        "import pandas as pd\n"
        "df = pd.DataFrame({'x': [1, 2, 3], 'name': ['a', 'b', 'c'], 'when': pd.to_datetime(['2024-01-01'] * 3)})",
    )


def test_a_dataframe_goes_as_parquet_and_comes_back(kernel):
    run = kernel.ok(
        "%%sandbox python3 --in df --out-df back --out-df named=results/frame.parquet --out text\n"
        "import os, pandas as pd\n"
        "assert os.environ['df'].endswith('/.sandbox/in/df.parquet'), os.environ['df']\n"
        "got = pd.read_parquet(os.environ['df'])\n"
        "print(str(got.dtypes['when']).startswith('datetime64'), int(got.x.sum()))\n"
        "got.assign(y=got.x * 10).to_parquet(os.environ['back'])\n"
        "got.head(1).to_parquet('results/frame.parquet')\n"
    )
    assert run.stderr == "", run.stderr
    shown = kernel.ok(
        "print(repr(text)); print(type(back).__name__, list(back.columns), back.y.tolist());"
        "print(back.drop(columns='y').equals(df), named.shape)"
    ).stdout
    assert shown == "'True 6\\n'\nDataFrame ['x', 'name', 'when', 'y'] [10, 20, 30]\nTrue (1, 3)\n"


def test_a_frame_parquet_cannot_hold_goes_as_a_pickle_with_one_line(kernel):
    kernel.ok("mixed = pd.DataFrame({'v': [1, 'a', 2.5]})")
    run = kernel.ok('%%sandbox --in mixed\necho "$mixed"')
    assert run.stdout.strip().endswith("/.sandbox/in/mixed.pkl")
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "sandbox: --in mixed: Parquet cannot hold this DataFrame"
    ), lines
    assert "sent as a pickle" in lines[0]


def test_without_pyarrow_the_old_handoff_and_one_line(kernel):
    # pyarrow.parquet made unimportable (pandas itself keeps the rest of pyarrow for its strings)
    kernel.ok(
        "import sys\nsaved = sys.modules.pop('pyarrow.parquet', None)\nsys.modules['pyarrow.parquet'] = None"
    )
    try:
        run = kernel.ok('%%sandbox --in df\necho "$df"')
        assert run.stdout.strip().endswith("/.sandbox/in/df.pkl")
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and "pyarrow is not importable in the kernel" in lines[0], lines
        assert "pip install pyarrow" in lines[0] and "sent as a pickle" in lines[0]
        run = kernel.run("%%sandbox --out-df res\necho never")
        line = run.error_line()
        assert "--out-df reads a Parquet file" in line and "pyarrow is not importable" in line, line
        assert "never" not in run.stdout
    finally:
        kernel.ok(
            "del sys.modules['pyarrow.parquet']\nif saved is not None: sys.modules['pyarrow.parquet'] = saved"
        )


def test_out_df_when_the_cell_wrote_nothing_and_a_bad_path(kernel):
    run = kernel.ok("%%sandbox --out-df nothing\ntrue")
    assert (
        "sandbox: --out-df nothing: the cell wrote no .sandbox/out/nothing.parquet; nothing is unchanged"
        in run.stderr
    )
    assert kernel.ok("print('nothing' in dir())").stdout == "False\n"
    run = kernel.run("%%sandbox --out-df bad=../../etc/x.parquet\ntrue")
    assert "leads outside the workspace" in run.error_line()
    run = kernel.run("%%sandbox --out-df 1x\ntrue")
    assert "--out-df" in run.error_line()


def test_extend_adds_to_the_ttl(kernel, server):
    kernel.ok("%sandbox new longer --ttl 60")
    run = kernel.ok("%sandbox extend longer 1h")
    assert "session 'longer' now ends in" in run.stdout and "TTL 3660 s" in run.stdout, run.stdout
    sid = kernel.ok("%sandbox sessions").stdout.split("longer *")[1].split()[0]
    info = server.request("GET", f"api/sandbox/sessions/{sid}?usage=0")
    assert info["expires_at"] - info["created_at"] == pytest.approx(3660, abs=0.01)
    kernel.ok("%sandbox extend longer 90")
    info = server.request("GET", f"api/sandbox/sessions/{sid}?usage=0")
    assert info["expires_at"] - info["created_at"] == pytest.approx(3750, abs=0.01)
    run = kernel.run("%sandbox extend longer 30h")
    assert "max_ttl_seconds" in run.error_line()
    run = kernel.run("%sandbox extend longer soon")
    assert "'soon' is not a duration: give seconds" in run.error_line()
    run = kernel.run("%sandbox extend nobody 1h")
    assert "no session named 'nobody'" in run.error_line()
    run = kernel.run("%sandbox pause longer")  # the local provider cannot: the typed refusal, in its words
    assert "cannot pause a session" in run.error_line(), run.error_line()
    run = kernel.run("%sandbox pause nobody")
    assert "no session named 'nobody'" in run.error_line()
    run = kernel.run("%sandbox fork longer copy")
    assert "cannot fork a session" in run.error_line(), run.error_line()
    kernel.ok("%sandbox rm longer")
