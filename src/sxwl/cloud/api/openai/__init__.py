"""The OpenAI-compatible ``/v1``: files, fine-tuning jobs and models, shaped as the official
``openai`` client expects."""
