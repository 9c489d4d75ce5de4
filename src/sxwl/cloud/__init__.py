"""The sxwl cloud: accounts, CPods, jobs and their scheduling, fine-tunes and their files and
models, money (prices, the ledger, metering, billing, earnings), the REST and OpenAI-compatible
APIs and the web console."""
