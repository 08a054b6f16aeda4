"""Wire formats and rules of task callbacks and the approval webhook."""
