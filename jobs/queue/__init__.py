"""The job queue (`farm submit`, `farm pool serve`): submitting a sweep, taking its trials from several
pools at once in the order fair share decides (fairshare.py, a pure function under the pool's config,
policy.py), preempting, cancelling, showing it (status.py, pool_metrics.py) and telling the submitter the
verdict (queue.py, pool.py, notify.py). It sits above the store, whose tables it reads and writes
(jobs.store.tables.queue), and the runner (jobs.run), whose workers it keeps warm."""
