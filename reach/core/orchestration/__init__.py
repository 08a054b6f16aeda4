"""DAG definitions: their model, validation, planning and drawing."""
