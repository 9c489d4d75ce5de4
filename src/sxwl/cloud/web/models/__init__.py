"""The Models page: the user's base models and fine-tuned adapters."""
