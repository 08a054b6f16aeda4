"""The task's lifecycle and statuses, whose reports count, and the rules of progress streams."""
