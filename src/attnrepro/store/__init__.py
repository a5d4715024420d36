"""The run store: every finished run under its key, each entry checked against its manifest (sizes
and SHA-256) before it is served, damaged entries quarantined (run_store.py), and shared through a
remote folder or the DVC remote (remote.py). It knows nothing of what a run computes: the run
layer above it fills it. Imports only the top modules."""
