"""Prices, metering, the ledger, statements and earnings: every amount an integer of micro-yuan
in a ledger whose transactions sum to zero. Imports only accounts."""
