"""``python -m fleetscope.cli``: the same command as the ``fleetscope`` script."""

from fleetscope.cli import main

main()
