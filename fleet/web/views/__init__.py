"""Dashboard pages, one module per page."""
