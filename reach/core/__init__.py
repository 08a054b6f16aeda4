"""Pure decisions, no I/O: scoring, health, reachability, routing, retry, breaker, the task
lifecycle, statuses, endpoints and DAGs. Inputs (clock and random source included) are
arguments; nothing here touches a socket, a thread, a database or a broker.
"""
