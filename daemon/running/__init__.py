"""Running jobs: claiming them, starting and collecting worker processes."""
