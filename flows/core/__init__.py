"""What every flow shares: the one outer loop and its records, the sequenced client, session
and run lifecycle, configs, cost and budget, cleanup hooks and task runners."""
