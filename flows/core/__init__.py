"""What every flow shares: the sequenced client, session and run lifecycle, resume and
checkpoints, records, cost and budget, cleanup, cancellation and task runners."""
