"""Workers: claim pending rollouts atomically, run them concurrently with asyncio, persist every step.

One *dispatcher* per worker process (each ``qcluster`` worker process starts one when django-q2
spawns it; the CLI runs one in-process). Rollouts do not run inside django-q2 tasks, so django-q2's
cluster-wide ``timeout`` and ``retry`` never cut a long rollout short or deliver it twice
(DESIGN.md, known pitfalls); django-q2 supervises the processes and runs the scheduled
``supervise`` job.

A claim carries a lease that the dispatcher renews. If its process dies, the lease expires and any
dispatcher (or ``supervise``) marks the attempt ``interrupted`` and queues its key again. A stop
(SIGTERM, Ctrl-C, a cluster stop) releases in-flight rollouts at once the same way.
"""
