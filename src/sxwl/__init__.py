"""算想云 (sxwl): serverless LLM training on providers' GPUs."""

__version__ = "0.1.0"
