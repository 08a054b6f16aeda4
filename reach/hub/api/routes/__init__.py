"""Route groups of the API, one module per resource."""
