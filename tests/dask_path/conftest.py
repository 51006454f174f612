"""The Dask tests' engines: one real ``distributed.LocalCluster`` with two worker
processes (results cross pickling), shared by the whole package so it starts once."""

from __future__ import annotations

import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="package")
def client():
    """A client of two single-threaded worker processes (restarted by their nannies when
    killed)."""
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            worker_dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c
