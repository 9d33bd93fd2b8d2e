"""A submitted job carries its kernel source (cluster.shipping): kernels/ packed by content, stored once,
and loaded by the pool's workers for that job's trials only, on the session's real local Ray."""

from __future__ import annotations

import shutil
import zipfile
from io import BytesIO

import pytest
from test_queue_pool import pool_options, spec

from cluster.shipping import KERNELS, MAX_PACKED_BYTES, pack_kernels, unpack_kernels
from jobs.queue.pool import serve
from jobs.queue.queue import Queue
from jobs.store import Store

MARKED = 'metrics={"branch_marker": "b1", "cuda_visible_devices"'


def branch_copy(tmp_path):
    """kernels/ copied outside the repository, its probe family changed so that its trials say so."""
    root = tmp_path / "branch" / "kernels"
    shutil.copytree(KERNELS, root, ignore=shutil.ignore_patterns("__pycache__"))
    case = root / "probe" / "case.py"
    text = case.read_text()
    assert 'metrics={"cuda_visible_devices"' in text
    case.write_text(text.replace('metrics={"cuda_visible_devices"', MARKED))
    return root


def test_packing_names_the_content_and_unpacking_stays_in_its_folder(tmp_path):
    root = branch_copy(tmp_path)
    a, b = pack_kernels(root), pack_kernels(root)
    assert a.digest == b.digest and a.archive == b.archive and a.files > 10
    assert pack_kernels(KERNELS).digest != a.digest  # the probe edit changes it
    (root / "new_module.py").write_text("X = 1\n")
    assert pack_kernels(root).digest != a.digest  # a new file too
    got = unpack_kernels(a.digest, a.archive, tmp_path / "cache")
    assert (got / "kernels" / "probe" / "case.py").read_text().count(MARKED) == 1
    assert unpack_kernels(a.digest, a.archive, tmp_path / "cache") == got  # extracted once
    evil = BytesIO()
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("kernels/../../outside.py", "x")
    (tmp_path / "cache2").mkdir()
    with pytest.raises(ValueError, match="unexpected member"):
        unpack_kernels("e" * 64, evil.getvalue(), tmp_path / "cache2")
    assert not (tmp_path / "outside.py").exists()


def test_a_kernels_tree_too_large_to_ship_is_refused_naming_its_largest_file(tmp_path):
    root = tmp_path / "kernels"
    root.mkdir()
    (root / "__init__.py").write_text("")
    with open(root / "weights.bin", "wb") as f:
        f.truncate(MAX_PACKED_BYTES + 1)
    with pytest.raises(ValueError, match="weights.bin"):
        pack_kernels(root)


def test_each_job_runs_on_the_kernel_source_it_was_submitted_with(ray_local, tmp_path):
    store = Store(str(tmp_path / "farm.db"))
    queue = Queue(store)
    branch = pack_kernels(branch_copy(tmp_path))
    mainline = queue.submit(spec("main", 4, ms=5), packed=pack_kernels())  # the pool's own kernels/
    shipped = queue.submit(spec("branch", 4, ms=5), packed=branch)
    again = queue.submit(spec("branch-again", 2, ms=5), packed=branch)  # stored once
    sources: dict[int, set] = {}

    def observer(result, worker) -> None:
        sources.setdefault(store.get_trial(result.trial_id).job_id, set()).add(worker.get("source"))

    assert serve(store, pool_options(2, observer)) == 3
    assert sources == {mainline: {None}, shipped: {branch.digest}, again: {branch.digest}}
    for job in (mainline, shipped, again):
        trials = store.trials(job)
        assert [t.status for t in trials] == ["ok"] * len(trials)  # each run once, none lost
        marked = {(t.metrics or {}).get("branch_marker") for t in trials}
        assert marked == ({None} if job == mainline else {"b1"}), (job, marked)
    with store.engine.connect() as c:
        assert c.exec_driver_sql("SELECT count(*) FROM kernel_sources").scalar() == 2
    store.close()
