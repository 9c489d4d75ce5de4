"""Where attempts run: the scheduler's pass, placement on nodes, the capacity cache and the
long-poll dispatch that hands an assignment to its agent. Imports the domains below it."""
