"""`make test`'s file order (tests/conftest.py's pytest_xdist_make_scheduler): the known-slow files are
handed out first, slowest first, and a worker busy with one is given ordinary files meanwhile — driven
here through xdist's own LoadFileScheduling with stand-in workers, no process started."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

pytest.importorskip("xdist")


@pytest.fixture
def root_conftest(pytestconfig):
    """tests/conftest.py as pytest loaded it (`import conftest` may name tests/flows/conftest.py instead)."""
    mine = Path(__file__).with_name("conftest.py")
    return next(p for p in pytestconfig.pluginmanager.get_plugins()
                if getattr(p, "__file__", None) and Path(p.__file__) == mine)


def _quiet():
    from xdist.remote import Producer

    return Producer("order", enabled=False)


class _Config:
    option = types.SimpleNamespace(loadscopereorder=True)

    def getvalue(self, name):
        return {"dist": "loadfile", "tx": ["3*popen"]}[name]


class _Worker:
    def __init__(self, i):
        self.gateway = types.SimpleNamespace(id=f"gw{i}")
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True


def _files(worker, collection):
    out = []
    for i in worker.sent:
        f = collection[i].split("::")[0]
        if not out or out[-1] != f:
            out.append(f)
    return out


def test_slow_files_start_first_one_per_worker(root_conftest):
    SLOW_FILES = root_conftest.SLOW_FILES
    # ordinary files with more tests than any slow one: xdist's own order would hand them out first
    ordinary = [f"tests/x/test_{i}.py" for i in range(6)]
    collection = [f"{f}::t{j}" for f in ordinary for j in range(5)] + [f"{f}::t" for f in SLOW_FILES[:4]]
    sched = root_conftest.pytest_xdist_make_scheduler(_Config(), log=_quiet())
    workers = [_Worker(i) for i in range(3)]
    for w in workers:
        sched.add_node(w)
    for w in workers:
        sched.add_node_collection(w, collection)
    sched.schedule()
    # each worker starts on one of the three slowest files, and its queued second file is an ordinary one
    firsts = [_files(w, collection) for w in workers]
    assert [f[0] for f in firsts] == SLOW_FILES[:3]
    assert all(len(f) == 2 and f[1] in ordinary for f in firsts), firsts
    # the first worker, its slow file done and near the end of its ordinary one, gets the fourth slow file;
    # the file queued behind that one is an ordinary one again
    w = workers[0]
    got = []
    for i in list(w.sent):
        before = len(_files(w, collection))
        sched.mark_test_complete(w, i)
        got += _files(w, collection)[before:]
    assert got == [SLOW_FILES[3], ordinary[3]], got


def test_other_modes_keep_xdist_scheduler(root_conftest):
    cfg = _Config()
    cfg.getvalue = lambda name: {"dist": "load", "tx": ["3*popen"]}[name]
    assert root_conftest.pytest_xdist_make_scheduler(cfg, log=_quiet()) is None
