"""The Dask path (fastattn._dask): lazy graphs on the threaded scheduler and a LocalCluster."""
