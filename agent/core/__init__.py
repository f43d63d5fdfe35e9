"""The turn-taking core: leases, policies, the residency planner, restore-ahead. Pure."""
