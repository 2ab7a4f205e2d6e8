"""The sweep flow: a grid or random search over a training flow's config, trials as
deployment flow runs under a global concurrency limit, successive halving, a comparison."""
