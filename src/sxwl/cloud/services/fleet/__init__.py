"""CPods: registration, heartbeats, their nodes and GPUs as providers and users see them. Imports
the domains below it (it ends the attempts of a CPod that is deleted)."""
