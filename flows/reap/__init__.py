"""The reaper flow: close the Whitney sessions whose flow run is over or gone."""
