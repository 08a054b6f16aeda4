"""Flow control in the store and across processes: admission, memory, priority, retry
budgets, breakers, loops."""
