"""The job queue (`farm submit`, `farm pool serve`): submitting a sweep, taking its trials in priority
order from several pools at once, cancelling, and telling the submitter the verdict (queue.py, pool.py,
notify.py). It sits above the store, whose tables it reads and writes (jobs.store.tables.queue), and the
runner (jobs.run), whose workers it keeps warm."""
