"""Ray: where the farm's trials run.

session.py      start a local Ray (the embedded default) or join a cluster
worker.py       the long-lived worker actor, one per GPU or CPU slot
dispatch.py     dynamic dispatch over the workers: timeouts, retries, batching of short trials
environment.py  what a worker runs on (host, device, driver, CUDA, libraries, clocks)
shipping.py     the kernel source a submitted job carries to its workers
submission.py   the pool's driver as a Ray job (`farm pool start`)
"""
