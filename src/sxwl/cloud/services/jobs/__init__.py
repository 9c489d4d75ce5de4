"""Jobs and their attempts: the state machine, events, logs, artifact windows and upload tokens.
Names no workload kind: a kind (fine-tunes, later endpoints and dev environments) registers its hooks
with the jobs domain and is called back. Imports accounts, money and catalog."""
