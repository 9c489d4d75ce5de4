"""Users, sessions and accessKeys: who is calling. Imports no other domain."""
