"""Fine-tunes (OpenAI-compatible): the first workload kind built on jobs, with its datasets,
estimate, progress, events and outputs. The top domain: nothing imports it but routers, pages and
the kind registry at start-up."""
