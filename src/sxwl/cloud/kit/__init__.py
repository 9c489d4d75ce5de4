"""Small kits the cloud is built from, each knowing no domain: group commit, notifications, tokens
and hashing, rate limits, structured logs, metrics. Imports only errors, config and db."""
