"""What an agent author imports: the agent (declaration, heartbeats, HTTP server and ASGI
app, dedup guard), the caller (send, wait, broadcast), the hub's HTTP clients (requests,
and aiohttp for ``reach.aio``) and the trace.

Depends on nothing of the hub: no SQLAlchemy, Celery, kombu or FastAPI (a contract in CI).
"""
