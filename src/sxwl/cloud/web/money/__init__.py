"""The user's statement and the provider's earnings pages."""
