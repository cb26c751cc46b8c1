"""fleetctl: the fleet command line (submit, list, inspect and act on jobs, nodes and usage).

Standard library only, so it installs anywhere a Python 3.11 runs.
"""
