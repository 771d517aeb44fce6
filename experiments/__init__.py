"""One module per experiment; each registers its schema and function on import."""
