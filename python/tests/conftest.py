"""The SDK's tests run against the embedded default: a local stack under a temporary home,
started with the workspace's own binaries (`ephem-batch dev up`, as the Rust tests' `Stack`)
and stopped at the end of the session. scripts/test-python.sh sets EPHEM_BIN_DIR and
EPHEM_MODEL_DIR and puts the package (with the extension the workspace built) on PYTHONPATH."""

import os
import shutil
import subprocess
import tempfile

import pytest


def _bin_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "target", "debug")
    return os.path.abspath(os.environ.get("EPHEM_BIN_DIR", default))


def _model_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", ".ephem", "models", "all-MiniLM-L6-v2")
    return os.path.abspath(os.environ.get("EPHEM_MODEL_DIR", default))


class Stack:
    """A local stack in a temporary home, and the CLI on it (for comparisons only: the SDK
    itself never runs a process)."""

    def __init__(self) -> None:
        self.home = tempfile.mkdtemp(prefix="ephem-batch-python-")
        self.bin = _bin_dir()
        for name in ("ephem-batch", "host-poller", "enclave-worker"):
            path = os.path.join(self.bin, name)
            if not os.path.isfile(path):
                raise RuntimeError(f"{path} is not built: run `cargo build --workspace --bins` first")

    def env(self) -> dict:
        env = dict(os.environ)
        env.pop("EPHEM_HOME", None)
        env.pop("EPHEM_BACKEND", None)
        env["EPHEM_MODEL_DIR"] = _model_dir()
        env["EPHEM_BIN_DIR"] = self.bin
        return env

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [os.path.join(self.bin, "ephem-batch"), "--home", self.home, *args],
            env=self.env(),
            capture_output=True,
            text=True,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"ephem-batch {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def up(self) -> None:
        self.cli("dev", "up", "--threads", "2", "--concurrency", "2")

    def down(self) -> None:
        self.cli("dev", "down", check=False)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="session")
def stack():
    s = Stack()
    try:
        s.up()
        yield s
    finally:
        s.down()


@pytest.fixture(scope="session")
def client(stack):
    import ephem_batch

    return ephem_batch.Client(home=stack.home, backend="local")
