"""convert stage."""
