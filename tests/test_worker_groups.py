"""The suite's xdist worker groups (tests/worker_groups.py): shared fixtures stay on one worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.worker_groups import FIRST, SHARED_GROUPS, group_of

REPO = Path(__file__).resolve().parents[1]
# Each test appends its name to a file named after the worker it ran on.
SAMPLE = (
    "import os\n\ndef test_{name}():\n"
    "    with open(os.path.join(os.environ['WORKER_RECORD'], os.environ['PYTEST_XDIST_WORKER']), 'a') as record:\n"
    "        record.write('{name} ')\n"
)


def test_every_shared_member_exists() -> None:
    """A renamed file would silently leave its group (and start its shared fixture once more)."""
    for members in SHARED_GROUPS.values():
        for member in members:
            assert (REPO / member).is_dir() if member.endswith("/") else (REPO / member).is_file(), member
    for unit in FIRST:  # a group's name or a file of its own
        assert unit in SHARED_GROUPS or ((REPO / unit).is_file() and group_of(unit) == unit), unit


def test_modules_run_in_their_group_or_alone() -> None:
    cluster_files = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "tests/cluster").glob("test_*.py"))
    groups = {path: group_of(path) for path in cluster_files}
    assert groups.pop("tests/cluster/test_real_node.py") == "real-node"
    assert groups.pop("tests/cluster/test_real_node_e2e.py") == "real-node"
    assert groups.pop("tests/cluster/test_real_node_autoscaling.py") == "autoscaling"
    assert groups and set(groups.values()) == {"cluster"}
    assert group_of("tests/predictor/test_systemone_cli.py") == group_of("tests/predictor/test_server_vllm.py")
    assert group_of("tests/predictor/test_lifecycle.py") == "tests/predictor/test_lifecycle.py"


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    """Through xdist itself, with scripts/test.sh's distribution options on two workers: the cluster folder's two
    files on one worker, in order (plain loadscope hands them to the two workers first, one each)."""
    files = {"tests/cluster/test_a.py": 6, "tests/cluster/test_b.py": 6, "tests/test_c.py": 1, "tests/test_d.py": 1}
    for name, count in files.items():
        stem = Path(name).stem.removeprefix("test_")
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("\n\n".join(SAMPLE.format(name=f"{stem}{index}") for index in range(count)))
    record = tmp_path / "record"
    record.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "WORKER_RECORD": str(record),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.worker_groups", "-p", "no:cacheprovider", "-n", "2"]
        + ["--dist", "loadscope", "--no-loadscope-reorder", "--rootdir", str(tmp_path), str(tmp_path / "tests")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    ran = {path.name: path.read_text().split() for path in record.iterdir()}
    assert sorted(ran) == ["gw0", "gw1"] and sum(map(len, ran.values())) == 14, ran
    (cluster,) = [names for names in ran.values() if "a0" in names]
    # the whole group, in collection order (as test_3_helm.py must run after the other cluster files), and first
    assert cluster[:12] == [f"{stem}{index}" for stem in "ab" for index in range(6)], ran
