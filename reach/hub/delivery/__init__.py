"""Delivery: every attempt from its claim to its recorded end, and every wire to agents.

* ``policy``     — the settings it runs on (`DeliveryPolicy`);
* ``claims``     — an attempt's lease: claimed, renewed, fenced;
* ``routing``    — the instance chosen, and the `Dispatch` its exchange carries;
* ``transports`` — the wires (HTTP, mTLS, channel, A2A) behind one protocol;
* ``loop``       — the event loop a process keeps its exchanges on;
* ``exchanger``  — a worker process's exchanges: many in flight, no slot held;
* ``pipeline``   — begin, exchange, conclude (`Pipeline`, `deliver_attempt`);
* ``outcomes``   — every way an exchange ends, recorded;
* ``reports``    — agents' late results and progress.

The task-record primitives they share with the rest of the hub are below them, in
``reach.hub.ledger.tasks``. Import from the modules; this package re-exports nothing, so
importing one of them never loads the rest.
"""
