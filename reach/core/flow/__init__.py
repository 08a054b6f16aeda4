"""Flow-control decisions: admission, priority, retry budgets, breakers and loops, as pure
arithmetic."""
