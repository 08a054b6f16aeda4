"""The hub: settings, runtime context, registry, monitoring and probing, submission,
delivery, outbox, dead letters, broadcasts, DAG runs, breakers, wake-ups, metrics,
storage and the HTTP API. Installed with ``agent-reach[hub]``.
"""
