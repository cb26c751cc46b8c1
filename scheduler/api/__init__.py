"""REST endpoints of the scheduler: its settings, the queue, and submit estimates."""
