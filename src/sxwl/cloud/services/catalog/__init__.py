"""Models and what they take up: the base-model catalogue, adapters read by content, archives, and
each user's storage quota. Imports accounts and money."""
