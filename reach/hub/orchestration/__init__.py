"""Work made of many tasks: DAG runs and broadcasts."""
